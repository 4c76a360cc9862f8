// The profile model, the renderer's hit-testing and diff colours, selectors and value formats:
// pure functions, checked against Pyroscope's reference examples (pyroscope-compat.md).

import assert from "node:assert/strict";
import { test } from "node:test";
import type { RenderResponse } from "../src/api";
import { type View, diffColor, diffPercent, hit } from "../src/flamegraph";
import { formatValue } from "../src/format";
import { decode, findStack, sandwich, stackOf, topTable } from "../src/model";
import { buildSelector, parseSelector, resolveTime } from "../src/query";

function single(names: string[], levels: number[][]): RenderResponse {
  const numTicks = levels[0][1];
  return {
    version: 1,
    flamebearer: { names, levels, numTicks, maxSelf: 0 },
    metadata: { format: "single", spyName: "", sampleRate: 100, units: "samples", name: "" },
    timeline: null,
  };
}

// §2.4: `foo;bar 2`, `foo;baz 3`, `foo 1`, `qux 4`.
const REFERENCE = single(
  ["total", "qux", "foo", "baz", "bar"],
  [
    [0, 10, 0, 0],
    [0, 6, 1, 2, 0, 4, 4, 1],
    [1, 2, 2, 4, 0, 3, 3, 3],
  ],
);

test("single flamebearer levels decode to absolute offsets and parents", () => {
  const m = decode(REFERENCE);
  assert.equal(m.count, 5);
  assert.deepEqual([...m.x], [0, 0, 6, 1, 3]);
  assert.deepEqual([...m.total], [10, 6, 4, 2, 3]);
  assert.deepEqual([...m.self], [0, 1, 4, 2, 3]);
  assert.deepEqual([...m.parent], [-1, 0, 0, 1, 1]);
  assert.deepEqual(stackOf(m, 4), ["foo", "baz"]);
  assert.equal(findStack(m, ["foo", "baz"]), 4);
  assert.equal(findStack(m, ["qux", "baz"]), -1);
});

test("the top table counts a recursive function's total once", () => {
  // a;a;b 5, a 1: a's total is 6, not 6 + 5.
  const m = decode(
    single(
      ["total", "a", "b"],
      [
        [0, 6, 0, 0],
        [0, 6, 1, 1],
        [1, 5, 0, 1],
        [1, 5, 5, 2],
      ],
    ),
  );
  const rows = Object.fromEntries(topTable(m).map((r) => [r.name, r]));
  assert.deepEqual([rows.a.self, rows.a.total], [1, 6]);
  assert.deepEqual([rows.b.self, rows.b.total], [5, 5]);
});

test("the sandwich merges a function's callers and callees", () => {
  // main;x;f;g 2, main;y;f 3
  const m = decode(
    single(
      ["total", "main", "x", "y", "f", "g"],
      [
        [0, 5, 0, 0],
        [0, 5, 0, 1],
        [0, 2, 0, 2, 0, 3, 0, 3],
        [0, 2, 0, 4, 0, 3, 3, 4],
        [0, 2, 2, 5],
      ],
    ),
  );
  const { callers, callees } = sandwich(m, "f");
  assert.equal(callers.numTicks, 5);
  assert.deepEqual(
    [...callers.total].map((t, i) => `${callers.names[callers.name[i]]}:${t}`),
    ["total:5", "f:5", "x:2", "y:3", "main:2", "main:3"],
  );
  assert.deepEqual(
    [...callees.total].map((t, i) => `${callees.names[callees.name[i]]}:${t}`),
    ["total:5", "f:5", "g:2"],
  );
});

// §6: left a;b 2, a;c 2; right a;b 6, a;c 2.
const DIFF: RenderResponse = {
  version: 1,
  flamebearer: {
    names: ["total", "a", "c", "b"],
    levels: [
      [0, 4, 0, 0, 8, 0, 0],
      [0, 4, 0, 0, 8, 0, 1],
      [0, 2, 2, 0, 6, 6, 3, 0, 2, 2, 0, 2, 2, 2],
    ],
    numTicks: 12,
    maxSelf: 6,
  },
  metadata: { format: "double", spyName: "", sampleRate: 100, units: "samples", name: "diff" },
  timeline: null,
  leftTicks: 4,
  rightTicks: 8,
};

test("diff levels decode per side and colour by change of share or of value", () => {
  const m = decode(DIFF);
  const b = m.names.indexOf("b");
  const c = m.names.indexOf("c");
  const nb = [...m.name].indexOf(b);
  const nc = [...m.name].indexOf(c);
  assert.deepEqual([m.diff!.totalL[nb], m.diff!.totalR[nb]], [2, 6]);
  assert.deepEqual([m.x[nb], m.total[nb], m.x[nc], m.total[nc]], [0, 8, 8, 4]);
  assert.equal(diffPercent(m, nb, "relative"), 50);
  assert.equal(diffPercent(m, nc, "relative"), -50);
  assert.equal(diffPercent(m, nb, "absolute"), 100, "tripled, clamped");
  assert.equal(diffPercent(m, nc, "absolute"), 0);
  assert.equal(diffColor(0), "rgb(148,142,142)");
  assert.equal(diffColor(100), "rgb(200,0,0)");
  assert.equal(diffColor(-100), "rgb(0,170,0)");
});

test("hit-testing finds the bar under a point, zoomed or not", () => {
  const m = decode(REFERENCE);
  const view: View = { width: 1000, focus: 0, search: "", highlight: "", selected: -1, inverted: false, diffColor: "relative" };
  const name = (n: number) => (n < 0 ? null : m.names[m.name[n]]);
  assert.equal(name(hit(m, view, 50, 18 + 5)), "foo");
  assert.equal(name(hit(m, view, 650, 18 + 5)), "qux");
  assert.equal(name(hit(m, view, 50, 36 + 5)), null, "foo's self, no child there");
  assert.equal(name(hit(m, view, 350, 36 + 5)), "baz");
  const zoomed = { ...view, focus: findStack(m, ["foo"]) };
  assert.equal(name(hit(m, zoomed, 999, 5)), "total", "ancestors span the width");
  assert.equal(name(hit(m, zoomed, 300, 36 + 5)), "bar");
  const inverted = { ...view, inverted: true };
  assert.equal(name(hit(m, inverted, 50, 3 * 18 - 5)), "total");
});

test("selectors round-trip, quotes and commas included", () => {
  const text = 'app.cpu{env="prod", path=~"a,b\\"c", region!="eu"}';
  const s = parseSelector(text);
  assert.equal(s.app, "app.cpu");
  assert.deepEqual(s.matchers, [
    { name: "env", op: "=", value: "prod" },
    { name: "path", op: "=~", value: 'a,b"c' },
    { name: "region", op: "!=", value: "eu" },
  ]);
  assert.equal(buildSelector(s), text);
  assert.deepEqual(parseSelector("app.cpu"), { app: "app.cpu", matchers: [] });
});

test("time expressions resolve as the aggregator reads them", () => {
  const now = 1_700_000_000;
  assert.equal(resolveTime("now", now), now);
  assert.equal(resolveTime("now-1h", now), now - 3600);
  assert.equal(resolveTime("now-30m", now), now - 1800);
  assert.equal(resolveTime("now-1800s", now), now - 1800);
  assert.equal(resolveTime("now-2mon", now), now - 60 * 86400);
  assert.equal(resolveTime("1699990000", now), 1_699_990_000);
  assert.equal(resolveTime("1699990000000", now), 1_699_990_000);
  assert.ok(Number.isNaN(resolveTime("yesterday", now)));
});

test("values read in the profile's units", () => {
  assert.equal(formatValue(1250, { units: "samples", sampleRate: 100 }), "12.50 s");
  assert.equal(formatValue(5, { units: "samples", sampleRate: 100 }), "50.0 ms");
  assert.equal(formatValue(4194304, { units: "bytes", sampleRate: 0 }), "4.00 MiB");
  assert.equal(formatValue(2_500_000, { units: "lock_nanoseconds", sampleRate: 0 }), "2.50 ms");
  assert.equal(formatValue(1234, { units: "objects", sampleRate: 0 }), "1,234 objects");
});
