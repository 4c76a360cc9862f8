// Pushes profiles with @pyroscope/nodejs (Pyroscope's Node.js SDK, pinned in package.json and
// installed by scripts/test) as an app configured for an aggregator that asks for credentials:
// `authToken` (a bearer token) or `basicAuthUser` and `basicAuthPassword`. Nothing here is
// Smolder's: the profiles go out as the SDK sends them (multipart pprof to /ingest).
//
// Usage: node sdk_push.mjs <server url> <app> token <token>
//        node sdk_push.mjs <server url> <app> basic <user> <password>
//
// Burns CPU in busyWork for about 4 s, sampled by the SDK's wall profiler with CPU time, flushes
// every second, stops (which uploads what is left), and prints one JSON object: the run's start
// and end in Unix seconds.

import Pyroscope from "@pyroscope/nodejs";

function busyWork(deadline) {
  let total = 0;
  while (Date.now() < deadline) {
    for (let i = 0; i < 2000; i++) total += i * i;
  }
  return total;
}

const [url, app, mode, first, second] = process.argv.slice(2);
const auth = mode === "token" ? { authToken: first } : { basicAuthUser: first, basicAuthPassword: second };
if (mode !== "token" && mode !== "basic") throw new Error(`unknown mode ${mode}`);
Pyroscope.init({
  serverAddress: url,
  appName: app,
  flushIntervalMs: 1000,
  wall: { samplingDurationMs: 1000, collectCpuTime: true },
  ...auth,
});
Pyroscope.start();
const start = Math.floor(Date.now() / 1000);
// In slices, so that the SDK's timers get to run and upload between them.
const end = Date.now() + 4000;
while (Date.now() < end) {
  busyWork(Date.now() + 200);
  await new Promise((resolve) => setTimeout(resolve, 10));
}
await Pyroscope.stop();
console.log(JSON.stringify({ start, end: Math.floor(Date.now() / 1000) + 1 }));
