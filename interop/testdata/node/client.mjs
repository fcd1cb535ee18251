// Subscribes to the URL given as the first argument with the npm package
// eventsource and prints one JSON object a line for each event and error it
// dispatches, for interop's tests to read.
import { EventSource } from 'eventsource';

const es = new EventSource(process.argv[2]);
const print = (o) => process.stdout.write(JSON.stringify(o) + '\n');
for (const type of ['hello', 'message', 'gap']) {
  es.addEventListener(type, (e) => print({ type, id: e.lastEventId, data: e.data }));
}
es.addEventListener('error', (e) => {
  print({ type: 'error', readyState: es.readyState, message: String(e.message ?? '') });
  if (es.readyState === es.CLOSED) process.exit(0);
});
