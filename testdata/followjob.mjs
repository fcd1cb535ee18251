// The logic of the module's followJob under node (TestClientScriptFollowJobLogic):
// a hand-driven EventSource sends overlapping, repeated and missing
// messages and a progress snapshot, then the page "reloads" twice.
// Stubs for the module's browser globals: sessionStorage, location and an
// EventSource the harness drives by hand.
const store = new Map();
globalThis.sessionStorage = {getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, String(v))};
globalThis.location = {href: "http://test/"};
const sources = [];
globalThis.EventSource = class {
  constructor(url) { this.url = url; this.l = {}; this.readyState = 1; sources.push(this); }
  addEventListener(t, f) { (this.l[t] ||= []).push(f); }
  close() { this.readyState = 2; }
  emit(type, id, data) { for (const f of this.l[type] || []) f({lastEventId: String(id), data: JSON.stringify(data)}); }
};
const { followJob } = await import(process.argv[2]);
const rec = [];
const follow = () => followJob({sse: "/events", job: "j", storageKey: "k",
  onText: (t) => rec.push(["text", t.chunk, t.offset, t.restored]),
  onEvent: (e, i) => rec.push(["event", e, i.n, i.restored]),
  onProgress: (p, i) => rec.push(["progress", p.phase, i.restored]),
  onGap: (g) => rec.push(["gap", g.reason, g.from ?? null, g.to ?? null]),
  onEnd: (e) => rec.push(["end", e.status, !!e.restored])});
const tick = () => new Promise((r) => setTimeout(r, 0)); // subscribe opens after a microtask
const a = follow();
await tick();
const es = sources[0];
es.emit("hello", 0, {cursor: 0});
es.emit("message", 2, {k: "text", o: 0, t: "hello "});
es.emit("message", 3, {k: "text", o: 3, t: "lo wor"});   // overlaps: "wor" is new
es.emit("message", 4, {k: "text", o: 0, t: "hello"});    // held already
es.emit("message", 5, {k: "event", n: 0, e: {a: 1}});
es.emit("message", 6, {k: "event", n: 0, e: {a: 1}});    // held already
es.emit("message", 7, {k: "text", o: 12, t: "d 😀"});    // "ld" missing at 9..12
es.emit("message", 8, {k: "event", n: 2, e: {b: 2}});    // event 1 missing
a.close();
rec.push(["closed", a.text, a.cursor, es.readyState]);
const b = follow(); // a reload: the state so far, then the rest
await tick();
const es2 = sources[1];
rec.push(["url", new URL(es2.url).searchParams.get("lastEventId"), new URL(es2.url).searchParams.get("topic")]);
es2.emit("message", 8, {k: "event", n: 2, e: {b: 2}});   // at the cursor: dropped
es2.emit("message", 9, {k: "progress", p: {phase: "generation"}});
es2.emit("message", 10, {k: "text", o: 16, t: "!"});
es2.emit("message", 11, {k: "end", status: "complete", meta: {}});
rec.push(["ended", b.text, es2.readyState]);
follow(); // after the end: restored, no connection
await tick();
rec.push(["sources", sources.length]);
console.log(JSON.stringify(rec));
