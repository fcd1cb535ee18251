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
