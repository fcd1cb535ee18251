// replayd browser module: one cursor over SSE and long polls.
//
//   import { subscribe } from "/replayd.js";
//   const sub = subscribe({sse: "/events", poll: "/poll", topics: ["room-42"],
//                          storageKey: "room-42", onEvent(ev) {}, onGap(gap) {}});
//
// onEvent gets {id, type, topic, data} (data parsed; topic only over polls)
// with strictly increasing ids; onGap gets the server's gap object before
// any later event. sub.cursor is the last id seen; sub.close() stops all.
// params (an object, or a function returning one or a promise of one) adds
// query parameters to every connection and poll, asked for again before
// each: params: async () => ({access_token: await freshToken()}).
//
//   import { followJob } from "/replayd.js";
//   const job = followJob({sse: "/events", poll: "/poll", job: "run-42", storageKey: "run-42",
//                          onText({chunk, text}) {}, onEvent(e, n) {}, onEnd(end) {}, onGap(gap) {}});
//
// followJob follows one job stream (docs/jobs.md) on topic prefix + job:
// onText gets each new piece of text with the whole text so far (a chunk
// replayed from an offset already held is cut, never repeated), onEvent
// each structured event once in emit order, onProgress the latest
// progress snapshot, onEnd the end ({status,
// meta} or {status, error}), onGap what is missing. With storageKey the
// text, events and cursor so far live in sessionStorage: after a reload
// the page first gets them at once (restored: true), then the rest.

export function subscribe({sse, poll, transport, topics = [], cursor = null, storageKey,
    types = ["message"], gapType = "gap", params = {}, onEvent = () => {}, onGap = () => {}}) {
  const mode = transport || (sse && poll ? "auto" : sse ? "sse" : "poll");
  const auto = mode === "auto" && !!poll;
  let es = null, ctl = null, timer, helloTimer, tries = 0, hello = false, resumed, closed = false, polling = false;

  // The stored cursor, when there is one, wins over the cursor option: it is
  // what this tab saw last. sessionStorage may be missing or refuse access
  // (workers, sandboxed frames); the cursor then lives in memory only.
  const store = (v) => {
    try {
      if (v === undefined) return sessionStorage.getItem(storageKey);
      sessionStorage.setItem(storageKey, String(v));
    } catch (_) {}
  };
  if (cursor !== null) cursor = Number(cursor);
  if (storageKey) {
    const s = store();
    if (/^\d+$/.test(s || "")) cursor = Number(s);
  }
  const save = (id) => {
    cursor = id;
    if (storageKey) store(id);
  };

  // deliver passes an event on once: ids at or below the cursor were seen.
  const deliver = (id, type, data, topic) => {
    if (cursor !== null && id <= cursor) return;
    save(id);
    if (types.includes(type)) onEvent(topic === undefined ? {id, type, data} : {id, type, topic, data});
  };

  // The endpoint URL with one topic parameter per topic, and params.
  const url = (base, params) => {
    const u = new URL(base, location.href);
    for (const t of topics) u.searchParams.append("topic", t);
    for (const k in params) if (params[k] !== null) u.searchParams.set(k, params[k]);
    return u.href;
  };

  // Exponential back-off with jitter: 0.5-1x of 1 s, 2 s, 4 s ... 30 s.
  const backoff = (n) => Math.min(30000, 500 * 2 ** n) * (0.5 + Math.random() / 2);

  // SSE. The EventSource reconnects by itself with Last-Event-ID; when it
  // gives up (a status other than 200), a new one starts from the cursor.
  // In "auto" mode, three attempts in a row that end without a hello, or
  // 10 s without one, switch to long polls, keeping the cursor.
  const arm = () => {
    clearTimeout(helloTimer);
    if (auto) helloTimer = setTimeout(fallback, 10000);
  };
  const extra = async () => (typeof params === "function" ? await params() : params) || {};
  const openSSE = async () => {
    let p;
    try {
      p = await extra();
    } catch (_) {
      if (!closed) timer = setTimeout(openSSE, backoff(++tries));
      return;
    }
    if (closed || es || polling) return;
    es = new EventSource(url(sse, {...p, lastEventId: cursor}));
    arm();
    es.addEventListener("hello", (e) => {
      // The hello's cursor is ours (or past events of types not listened
      // to), the head for a fresh connection, or the head below an unknown
      // cursor: then the gap that follows moves the cursor back to it.
      hello = true;
      tries = 0;
      clearTimeout(helloTimer);
      resumed = JSON.parse(e.data).cursor;
      if (cursor === null || resumed > cursor) save(resumed);
    });
    es.addEventListener(gapType, (e) => {
      if (resumed < cursor) save(resumed);
      onGap(JSON.parse(e.data));
    });
    for (const t of types) {
      if (t === "hello" || t === "heartbeat" || t === gapType) continue;
      es.addEventListener(t, (e) => deliver(Number(e.lastEventId), t, JSON.parse(e.data)));
    }
    es.onerror = () => {
      tries = hello ? 0 : tries + 1;
      hello = false;
      if (auto && tries >= 3) return fallback();
      arm();
      if (es.readyState === 2) {
        es = null;
        timer = setTimeout(openSSE, backoff(tries));
      }
    };
  };
  const fallback = () => {
    if (closed) return;
    polling = true;
    clearTimeout(helloTimer);
    clearTimeout(timer);
    if (es) es.close();
    es = null;
    longPoll();
  };

  // Long polls. A fresh subscription first learns the head (wait=0), so a
  // reload before any event resumes from there; then each answer's cursor is
  // sent back, at once, in a long poll of 25 s (none while more is owed).
  let fails = 0;
  const longPoll = async (wait = cursor === null ? 0 : 25) => {
    let delay = 0, next;
    const started = Date.now();
    try {
      ctl = new AbortController();
      const p = await extra();
      if (closed) return;
      const r = await fetch(url(poll, {...p, cursor, wait}), {signal: ctl.signal, cache: "no-store"});
      const retry = r.status === 503 && Number(r.headers.get("Retry-After"));
      if (retry) {
        delay = retry * 1000;
      } else {
        if (!r.ok) throw new Error("replayd poll: HTTP " + r.status);
        const a = await r.json();
        if (closed) return;
        fails = 0;
        if (a.gap) onGap(a.gap);
        for (const ev of a.events) deliver(ev.id, ev.type, ev.data, ev.topic);
        // Move to the answer's cursor: past skipped types, to the head of a
        // fresh request, or back to it after an unknown_cursor gap.
        if (cursor === null || a.cursor > cursor || (a.gap && !a.events.length)) save(a.cursor);
        next = a.more ? 0 : 25;
        // A server that does not hold polls (MaxWait off) is not hammered.
        if (wait && !a.more && !a.events.length && Date.now() - started < 1000) delay = 1000;
      }
    } catch (err) {
      if (closed) return;
      delay = backoff(++fails);
    }
    if (!closed) timer = setTimeout(() => longPoll(next), delay);
  };

  if (sse && mode !== "poll" && typeof EventSource === "function") openSSE();
  else if (poll && mode !== "sse") longPoll();
  else throw new Error("replayd: subscribe: no usable transport (" + mode + ")");

  return {
    get cursor() { return cursor; },
    close() {
      closed = true;
      if (es) es.close();
      if (ctl) ctl.abort();
      clearTimeout(timer);
      clearTimeout(helloTimer);
    },
  };
}

// followJob follows one job (docs/jobs.md): the messages of topic
// prefix + job, {"k":"text","o":O,"t":T}, {"k":"event","n":N,"e":E} and
// {"k":"progress","p":P} and {"k":"end",...}, read through subscribe over
// sse and/or poll.
export function followJob({sse, poll, transport, job, prefix = "jobs/", topic, storageKey, params,
    onText = () => {}, onEvent = () => {}, onProgress = () => {}, onEnd = () => {}, onGap = () => {}}) {
  topic = topic || prefix + job;
  // st is what the page was told: the cursor (last event id applied), the
  // text and its end offset (UTF-16 units, as the job counts), the events,
  // the gaps, and the end. It is stored whole after each message, so the
  // cursor and the text it covers always agree.
  let st = {cursor: 0, text: "", next: 0, events: [], progress: null, gaps: [], end: null};
  const load = () => {
    try {
      const v = JSON.parse(sessionStorage.getItem(storageKey));
      if (v && typeof v.text === "string" && Number.isFinite(v.cursor)) return v;
    } catch (_) {}
    return null;
  };
  const keep = () => {
    if (!storageKey) return;
    try { sessionStorage.setItem(storageKey, JSON.stringify(st)); } catch (_) {}
  };
  let sub = null, closed = false;
  const stop = () => {
    if (sub) sub.close();
    sub = null;
  };
  const gap = (g) => {
    st.gaps.push(g);
    onGap(g);
  };
  const apply = (id, m) => {
    if (!m || typeof m !== "object") return;
    if (m.k === "text" && typeof m.t === "string") {
      const o = Number(m.o);
      if (o + m.t.length <= st.next) return; // held already
      if (o > st.next) gap({reason: "text_missing", from: st.next, to: o});
      const chunk = o < st.next ? m.t.slice(st.next - o) : m.t;
      st.text += chunk;
      st.next = Math.max(o, st.next) + chunk.length;
      st.cursor = id;
      keep();
      onText({chunk, text: st.text, offset: st.next - chunk.length, restored: false});
    } else if (m.k === "event") {
      const n = Number(m.n);
      if (n < st.events.length) return;
      if (n > st.events.length) gap({reason: "events_missing", from: st.events.length, to: n});
      while (st.events.length < n) st.events.push(null);
      st.events.push(m.e);
      st.cursor = id;
      keep();
      onEvent(m.e, {n, restored: false});
    } else if (m.k === "progress") {
      st.progress = m.p ?? null;
      st.cursor = id;
      keep();
      onProgress(st.progress, {restored: false});
    } else if (m.k === "end") {
      st.end = m.error ? {status: m.status, error: m.error} : {status: m.status, meta: m.meta ?? null};
      st.cursor = id;
      keep();
      stop();
      onEnd(st.end);
    }
  };
  // open subscribes from the cursor. Callbacks of a subscription that was
  // replaced are dropped, so a switch of transport repeats nothing.
  const open = (mode) => {
    stop();
    if (closed || st.end) return;
    const mine = subscribe({sse, poll, transport: mode, topics: [topic], cursor: st.cursor, params,
      onEvent(ev) {
        if (sub === mine && ev.id > st.cursor) apply(ev.id, ev.data);
      },
      onGap(g) {
        if (sub !== mine) return;
        // More was missed than the SSE endpoint replays: the events are
        // there, so read them over polls instead of naming a gap.
        if (g.reason === "replay_limit" && poll && mode !== "poll") return open("poll");
        gap(g);
        if (mine.cursor > st.cursor) {
          st.cursor = mine.cursor;
          keep();
        }
      },
    });
    sub = mine;
  };

  const saved = storageKey && load();
  if (saved) {
    st = {...st, ...saved};
    if (st.text) onText({chunk: st.text, text: st.text, offset: 0, restored: true});
    st.events.forEach((e, n) => { if (e !== null) onEvent(e, {n, restored: true}); });
    if (st.progress) onProgress(st.progress, {restored: true});
    for (const g of st.gaps) onGap({...g, restored: true});
    if (st.end) onEnd({...st.end, restored: true});
  }
  open(transport);

  return {
    get text() { return st.text; },
    get events() { return st.events.slice(); },
    get progress() { return st.progress; },
    get end() { return st.end; },
    get cursor() { return st.cursor; },
    close() {
      closed = true;
      stop();
    },
  };
}
