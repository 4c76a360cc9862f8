// Benchmark: how long the browser takes to draw a flame graph of about 16k nodes, measured with
// the UI's own performance marks (`smolder-flamegraph-draw`, `smolder-flamegraph-decode`) on a
// real aggregator's /render answer. Prints one JSON line; BENCHMARKS.md records the figures.
//
//   node e2e/bench.mjs [rounds]

import { ago, launchBrowser, signIn, startAggregator } from "./harness.mjs";

const rounds = Number(process.argv[2] ?? 30);

/** 4 × 8 × 16 × 32 leaves under `main`: 16 933 nodes, every frame name distinct per position. */
function wideProfile() {
  const lines = [];
  let seed = 7;
  const next = () => {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    return seed;
  };
  for (let a = 0; a < 4; a++)
    for (let b = 0; b < 8; b++)
      for (let c = 0; c < 16; c++)
        for (let d = 0; d < 32; d++)
          lines.push(
            `main;service${a}.Serve;handler${a}_${b}.Handle;pkg${c}.work${b}_${c};leaf${c}_${d}.compute ${1 + (next() % 1000)}`,
          );
  return lines.join("\n");
}

/** 64 stacks of 264 frames under `main`: 16 897 nodes, nearly all wide enough to draw and label. */
function deepProfile() {
  const lines = [];
  for (let s = 0; s < 64; s++) {
    const frames = ["main"];
    for (let d = 0; d < 264; d++) frames.push(`module${s % 8}.depth${d}_${s}`);
    lines.push(`${frames.join(";")} ${100 + s}`);
  }
  return lines.join("\n");
}

function stats(values) {
  const sorted = [...values].sort((x, y) => x - y);
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  return { n: sorted.length, min: sorted[0], median: at(0.5), p95: at(0.95), max: sorted[sorted.length - 1] };
}

const aggregator = await startAggregator();
const browser = await launchBrowser({ width: 1920, height: 1080 });
try {
  await signIn(browser.context, aggregator);
  const at = ago(300);
  await aggregator.ingest("bench_wide.cpu", at, wideProfile(), { sampleRate: "100" });
  await aggregator.ingest("bench_deep.cpu", at, deepProfile(), { sampleRate: "100" });
  const page = await browser.context.newPage();
  const results = {};
  for (const shape of ["wide", "deep"]) {
    const draws = [];
    const decodes = [];
    let nodes = 0;
    for (let i = 0; i < rounds; i++) {
      // A fresh load each round: fetch, decode and first draw of the whole graph.
      await page.goto(
        `${aggregator.url}/?query=bench_${shape}.cpu%7B%7D&from=${at - 60}&until=${at + 60}&maxNodes=100000&tab=flame`,
      );
      await page.locator("[data-testid=flamegraph] canvas").waitFor();
      const measured = await page.evaluate(() => ({
        draw: performance.getEntriesByName("smolder-flamegraph-draw").map((e) => e.duration),
        decode: performance.getEntriesByName("smolder-flamegraph-decode").map((e) => e.duration),
        nodes: Number(document.querySelector("[data-testid=flamegraph] canvas")?.getAttribute("data-nodes")),
      }));
      draws.push(measured.draw[measured.draw.length - 1]);
      decodes.push(measured.decode[measured.decode.length - 1]);
      nodes = measured.nodes;
    }
    // Redraws of the loaded graph: a search (every bar re-coloured).
    const redraws = [];
    for (let i = 0; i < rounds; i++) {
      const before = await page.evaluate(() => performance.getEntriesByName("smolder-flamegraph-draw").length);
      await page.getByTestId("search").fill(i % 2 ? "depth1" : "module");
      await page.waitForFunction((count) => performance.getEntriesByName("smolder-flamegraph-draw").length > count, before);
      const all = await page.evaluate(() => performance.getEntriesByName("smolder-flamegraph-draw").map((e) => e.duration));
      redraws.push(all[all.length - 1]);
    }
    results[shape] = { nodes, draw_ms: stats(draws), decode_ms: stats(decodes), search_redraw_ms: stats(redraws) };
  }
  const version = browser.context.browser()?.version();
  console.log(JSON.stringify({ viewport: "1920x1080", chromium: version ?? "unknown", ...results }));
} finally {
  await browser.close();
  await aggregator.stop();
}
