// Subscribes to the URL given as the first argument with the npm package
// eventsource and prints one JSON object a line for each event and error it
// dispatches, for interop's tests to read. With "reopen" as the second
// argument, an EventSource that gives up (readyState CLOSED) is replaced
// after REOPEN_MS by a new one that resumes from the last event id, given
// as the lastEventId query parameter.
import { EventSource } from 'eventsource';

const REOPEN_MS = 200;
const url = process.argv[2];
const reopen = process.argv[3] === 'reopen';
const print = (o) => process.stdout.write(JSON.stringify(o) + '\n');
let lastId = '';

function open(u) {
  const es = new EventSource(u);
  for (const type of ['hello', 'message', 'gap']) {
    es.addEventListener(type, (e) => {
      if (e.lastEventId) lastId = e.lastEventId;
      print({ type, id: e.lastEventId, data: e.data });
    });
  }
  es.addEventListener('error', (e) => {
    print({ type: 'error', readyState: es.readyState, message: String(e.message ?? ''), reopen });
    if (es.readyState !== es.CLOSED) return;
    if (!reopen) process.exit(0);
    const next = new URL(url);
    if (lastId) next.searchParams.set('lastEventId', lastId);
    setTimeout(() => open(next.toString()), REOPEN_MS);
  });
}

open(url);
