// The renderer's culling: what it draws of deep and wide graphs, recorded on a canvas context
// that keeps the calls (the browser's real canvas is exercised by e2e/ and e2e/bench.mjs).

import assert from "node:assert/strict";
import { test } from "node:test";
import type { RenderResponse } from "../src/api";
import { ROW, type View, type Viewport, draw, height, viewportOf, visibleRows, wholeGraph } from "../src/flamegraph";
import { type FlameModel, decode, findStack } from "../src/model";

/** A flamebearer of folded stacks (`a;b;c value`), laid out as the aggregator does. */
function folded(lines: string[]): FlameModel {
  interface Node {
    name: string;
    total: number;
    self: number;
    children: Map<string, Node>;
  }
  const node = (name: string): Node => ({ name, total: 0, self: 0, children: new Map() });
  const root = node("total");
  for (const line of lines) {
    const cut = line.lastIndexOf(" ");
    const value = Number(line.slice(cut + 1));
    let at = root;
    at.total += value;
    for (const frame of line.slice(0, cut).split(";")) {
      let child = at.children.get(frame);
      if (!child) at.children.set(frame, (child = node(frame)));
      child.total += value;
      at = child;
    }
    at.self += value;
  }
  const names = ["total"];
  const ids = new Map([["total", 0]]);
  const levels: number[][] = [];
  let current = [{ n: root, x: 0 }];
  while (current.length) {
    const row: number[] = [];
    const next: { n: Node; x: number }[] = [];
    let end = 0;
    for (const { n, x } of current) {
      let id = ids.get(n.name);
      if (id === undefined) {
        id = names.length;
        names.push(n.name);
        ids.set(n.name, id);
      }
      row.push(x - end, n.total, n.self, id);
      end = x + n.total;
      let cx = x + n.self;
      for (const child of n.children.values()) {
        next.push({ n: child, x: cx });
        cx += child.total;
      }
    }
    levels.push(row);
    current = next;
  }
  const response: RenderResponse = {
    version: 1,
    flamebearer: { names, levels, numTicks: root.total, maxSelf: 0 },
    metadata: { format: "single", spyName: "", sampleRate: 100, units: "samples", name: "" },
    timeline: null,
  };
  return decode(response);
}

interface Rect {
  x: number;
  y: number;
  w: number;
  fill: string;
}

/** A 2D context that records the rectangles and texts drawn. */
function recorder() {
  const rects: Rect[] = [];
  const texts: string[] = [];
  const ctx = {
    font: "",
    textBaseline: "",
    fillStyle: "",
    strokeStyle: "",
    lineWidth: 1,
    globalAlpha: 1,
    clearRect() {},
    strokeRect() {},
    setTransform() {},
    measureText: () => ({ width: 7 }),
    fillRect(x: number, y: number, w: number) {
      rects.push({ x, y, w, fill: String(ctx.fillStyle) });
    },
    fillText(text: string) {
      texts.push(text);
    },
  };
  return { ctx: ctx as unknown as CanvasRenderingContext2D, rects, texts };
}

const VIEW: View = { width: 1920, focus: 0, search: "", highlight: "", selected: -1, inverted: false, diffColor: "relative" };

/** The benchmark's deep shape: 64 stacks of 264 frames under `main`. */
function deep(): FlameModel {
  const lines = [];
  for (let s = 0; s < 64; s++) {
    const frames = ["main"];
    for (let d = 0; d < 264; d++) frames.push(`module${s % 8}.depth${d}_${s}`);
    lines.push(`${frames.join(";")} ${100 + s}`);
  }
  return folded(lines);
}

test("a deep graph draws only the rows on screen", () => {
  const m = deep();
  assert.equal(m.count, 1 + 1 + 64 * 264);
  const all = recorder();
  const whole = draw(all.ctx, m, VIEW);
  assert.equal(whole.rows, 266);
  assert.equal(whole.bars, m.count, "with the whole graph on screen, every node is a bar");

  // The graph starts 200 px down a 1080 px window: 880 px of it show, rows 0 to 48.
  const top = recorder();
  const first = draw(top.ctx, m, VIEW, viewportOf(200, height(m), 1080));
  assert.deepEqual(visibleRows(m, viewportOf(200, height(m), 1080)), [0, 48]);
  assert.equal(first.rows, 49);
  assert.equal(first.bars, 2 + 47 * 64);
  assert.ok(first.labels <= first.bars);

  // Scrolled 3000 px into it: the canvas sits on row 166 and nothing outside it is drawn.
  const viewport = viewportOf(-3000, height(m), 1080);
  assert.equal(viewport.canvasTop, 166 * ROW);
  const mid = recorder();
  const scrolled = draw(mid.ctx, m, VIEW, viewport);
  assert.equal(scrolled.bars, scrolled.rows * 64);
  assert.ok(scrolled.rows <= Math.ceil(1080 / ROW) + 1, `${scrolled.rows} rows`);
  for (const r of mid.rects) assert.ok(r.y >= 0 && r.y + ROW - 1 <= viewport.canvasHeight, `bar at y ${r.y}`);
});

test("the canvas is at most a window and a row tall, snapped to rows, inside the graph", () => {
  assert.deepEqual(viewportOf(100, 500, 1080), { canvasTop: 0, canvasHeight: 500, visibleTop: 0, visibleBottom: 500 });
  const tall = 100 * ROW;
  const v = viewportOf(-(10 * ROW + 5), tall, 20 * ROW);
  assert.equal(v.canvasTop, 10 * ROW);
  assert.equal(v.canvasHeight, 21 * ROW);
  assert.equal(v.visibleTop, 10 * ROW + 5);
  assert.equal(v.visibleBottom, 30 * ROW + 5);
  // Scrolled past the bottom: the canvas stays on the graph's last rows, none visible.
  const past = viewportOf(-tall - 400, tall, 20 * ROW);
  assert.equal(past.canvasTop + past.canvasHeight, tall);
  const [first, last] = visibleRows(folded(["a 1"]), past);
  assert.ok(last < first);
  // Below the window: nothing visible.
  const below = viewportOf(2000, tall, 1080);
  assert.equal(below.visibleBottom, below.visibleTop);
});

test("runs of sub-pixel nodes draw as one bar; a lone one keeps its colour", () => {
  const lines = ["main;big 10000"];
  for (let i = 0; i < 10_000; i++) lines.push(`main;small.f${i} 1`);
  const m = folded(lines);
  const rec = recorder();
  const stats = draw(rec.ctx, m, { ...VIEW, width: 1000 });
  // total, main and big are wide; the 10 000 leaves (0.05 px each) are one 500 px bar.
  assert.equal(stats.bars, 3);
  assert.equal(stats.coalesced, 1);
  const run = rec.rects.find((r) => r.fill === "#c9c9cf");
  assert.ok(run && Math.abs(run.w - 500) < 1e-6, JSON.stringify(run));

  const lone = folded(["main;big 10000", "main;tiny.one 5"]);
  const one = recorder();
  const s = draw(one.ctx, lone, { ...VIEW, width: 1000 });
  assert.equal(s.coalesced, 1);
  assert.notEqual(one.rects[one.rects.length - 1].fill, "#c9c9cf", "a run of one node keeps its package colour");

  // A search that matches inside a run colours the run; one that does not dims it.
  const hit = recorder();
  draw(hit.ctx, m, { ...VIEW, width: 1000, search: "small.f77" });
  assert.ok(!hit.rects.some((r) => r.fill === "#c9c9cf"));
  assert.equal(hit.rects.filter((r) => r.fill === "#e4e4e7").length, 3, "total, main and big dimmed");
});

test("zoomed, only the focus's range and its ancestors are laid out", () => {
  const lines = [];
  for (let a = 0; a < 100; a++) lines.push(`main;svc${a}.serve;svc${a}.work 10`);
  const m = folded(lines);
  const focus = findStack(m, ["main", "svc42.serve"]);
  const rec = recorder();
  const stats = draw(rec.ctx, m, { ...VIEW, focus }, wholeGraph(m));
  // total and main as faded ancestors, then svc42.serve and svc42.work across the width.
  assert.equal(stats.bars, 4);
  assert.equal(stats.coalesced, 0);
  assert.deepEqual(rec.texts, ["total", "main", "svc42.serve", "svc42.work"]);
});

test("a viewport below every row draws nothing", () => {
  const m = deep();
  const rec = recorder();
  const stats = draw(rec.ctx, m, VIEW, viewportOf(5000, height(m), 1080));
  assert.deepEqual(stats, { rows: 0, bars: 0, coalesced: 0, labels: 0 });
  const v: Viewport = { canvasTop: 0, canvasHeight: 0, visibleTop: 0, visibleBottom: 0 };
  assert.equal(draw(rec.ctx, m, VIEW, v).bars, 0);
});
