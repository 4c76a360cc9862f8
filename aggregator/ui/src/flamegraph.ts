// The canvas flame-graph renderer: draws the part of a FlameModel on screen, zoomed to one node,
// and hit-tests a point back to a node. Plain functions over the model's typed arrays; what is
// off screen is neither laid out nor drawn, and runs of sub-pixel nodes draw as one bar, so that
// a 16k-node graph draws in a few milliseconds however deep (BENCHMARKS.md, "ui: flame-graph
// render").

import type { FlameModel } from "./model";

/** Height of one row, CSS pixels. */
export const ROW = 18;
/** Bars (or runs of coalesced nodes) narrower than this, CSS pixels, are not drawn: they would be invisible. */
const MIN_WIDTH = 0.35;

export type DiffColor = "relative" | "absolute";

export interface View {
  /** Width of the canvas, CSS pixels. */
  width: number;
  /** The node zoomed to; 0 is the root. */
  focus: number;
  /** Lower-cased search text; frames containing it are highlighted, the rest dimmed. */
  search: string;
  /** A function to highlight exactly (hovered in the table), or "". */
  highlight: string;
  /** Node with a keyboard or click selection, or -1. */
  selected: number;
  /** Callers' graphs grow upwards. */
  inverted: boolean;
  diffColor: DiffColor;
}

export function height(model: FlameModel): number {
  return (model.levelStart.length - 1) * ROW;
}

// Soft, distinguishable hues; a frame's package picks one, so a package reads as one colour.
const PALETTE = [
  "#f2b179", "#e8a0a0", "#a8c8e8", "#b5d99c", "#d7b4e6", "#f4d58d", "#9ed8cf",
  "#f0a6c8", "#c9c37d", "#a9b7f0", "#e6b58a", "#8fd1a8", "#d9a3f0",
];

function packageOf(name: string): string {
  const m = /^(.*?)(\.|::|\/)[^.:/]*$/.exec(name);
  return m ? m[1] : name;
}

function hashColor(name: string): string {
  const pkg = packageOf(name);
  let h = 0;
  for (let i = 0; i < pkg.length; i++) h = (h * 31 + pkg.charCodeAt(i)) | 0;
  return PALETTE[Math.abs(h) % PALETTE.length];
}

/**
 * The change of a diff node in percent, clamped to [-100, 100]: of its share of each side's
 * total ("relative", Pyroscope's colouring) or of its raw value ("absolute"). New frames are
 * +100; vanished ones -100.
 */
export function diffPercent(model: FlameModel, node: number, mode: DiffColor): number {
  const d = model.diff!;
  return changePercent(d.totalL[node], d.totalR[node], d.leftTicks, d.rightTicks, mode);
}

/** The change `diffPercent` computes, of raw side values: a node's, or a run of coalesced nodes' summed. */
function changePercent(left: number, right: number, leftTicks: number, rightTicks: number, mode: DiffColor): number {
  if (mode === "relative") {
    left = leftTicks > 0 ? left / leftTicks : 0;
    right = rightTicks > 0 ? right / rightTicks : 0;
  }
  if (left === 0) return right > 0 ? 100 : 0;
  const change = ((right - left) / left) * 100;
  return Math.max(-100, Math.min(100, change));
}

const GREY = [148, 142, 142];
const RED = [200, 0, 0];
const GREEN = [0, 170, 0];

/** Grey at 0, red towards +100 (grew), green towards -100 (shrank). */
export function diffColor(percent: number): string {
  const target = percent >= 0 ? RED : GREEN;
  const t = Math.min(1, Math.abs(percent) / 100);
  const c = GREY.map((g, i) => Math.round(g + (target[i] - g) * t));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

/** Per-model caches by name id: colours, lower-cased names and the last search's matches. */
const caches = new WeakMap<
  FlameModel,
  { colors: string[]; lower: string[]; matchKey: string | null; matches: boolean[] | null }
>();

function cacheOf(model: FlameModel) {
  let cache = caches.get(model);
  if (!cache) {
    cache = {
      colors: model.names.map(hashColor),
      lower: model.names.map((n) => n.toLowerCase()),
      matchKey: null,
      matches: null,
    };
    caches.set(model, cache);
  }
  return cache;
}

/** Per name id, whether the search or highlight of `view` matches it; null when neither is set. */
function matchesOf(model: FlameModel, view: View): boolean[] | null {
  if (view.highlight === "" && view.search === "") return null;
  const cache = cacheOf(model);
  // Scrolling redraws with the same search: match the names once per search.
  const key = view.highlight !== "" ? `=${view.highlight}` : `~${view.search}`;
  if (cache.matchKey !== key) {
    cache.matches =
      view.highlight !== ""
        ? model.names.map((n) => n === view.highlight)
        : cache.lower.map((n) => n.includes(view.search));
    cache.matchKey = key;
  }
  return cache.matches;
}

/**
 * Where a canvas sits on the graph and what of it is on screen, in CSS pixels from the graph's
 * top edge. The canvas is at most a window tall however deep the graph is, and only the rows
 * meeting the visible range are drawn.
 */
export interface Viewport {
  /** Graph y of the canvas's top edge. */
  canvasTop: number;
  /** Height of the canvas. */
  canvasHeight: number;
  /** First graph y on screen. */
  visibleTop: number;
  /** First graph y below the screen. */
  visibleBottom: number;
}

/** The whole graph on one canvas, all of it drawn: for graphs drawn off screen (tests). */
export function wholeGraph(model: FlameModel): Viewport {
  const h = height(model);
  return { canvasTop: 0, canvasHeight: h, visibleTop: 0, visibleBottom: h };
}

/**
 * The viewport of a graph `graphHeight` tall whose top edge is `graphTop` CSS pixels below the
 * window's top (negative when scrolled past) in a window `windowHeight` tall. The canvas is one
 * row taller than the window and snapped to rows, so scrolling moves it once per row, not once
 * per pixel.
 */
export function viewportOf(graphTop: number, graphHeight: number, windowHeight: number): Viewport {
  const canvasHeight = Math.min(graphHeight, Math.ceil(windowHeight) + ROW);
  const scrolled = Math.max(0, -graphTop);
  const canvasTop = Math.max(0, Math.min(Math.floor(scrolled / ROW) * ROW, graphHeight - canvasHeight));
  const visibleTop = Math.max(canvasTop, scrolled);
  const visibleBottom = Math.min(canvasTop + canvasHeight, windowHeight - graphTop);
  return { canvasTop, canvasHeight, visibleTop, visibleBottom: Math.max(visibleTop, visibleBottom) };
}

/** The first and last row (top to bottom) a viewport shows; last < first when none. */
export function visibleRows(model: FlameModel, viewport: Viewport): [number, number] {
  const rows = model.levelStart.length - 1;
  const first = Math.max(0, Math.floor(viewport.visibleTop / ROW));
  const last = Math.min(rows - 1, Math.ceil(viewport.visibleBottom / ROW) - 1);
  return [first, last];
}

/** What one draw did: bars drawn one per node, bars standing for runs of sub-pixel nodes, labels. */
export interface DrawStats {
  rows: number;
  bars: number;
  coalesced: number;
  labels: number;
}

/** Bars narrower than this (CSS pixels) are merged with their sub-pixel neighbours. */
const COALESCE_WIDTH = 1;
/** The colour of a bar standing for several sub-pixel nodes (one keeps its own). */
const COALESCED = "#c9c9cf";
/** The colour of a frame a search does not match. */
const DIMMED = "#e4e4e7";

/**
 * Draws `model` on `ctx` (already scaled for the device pixel ratio): only the rows of
 * `viewport` on screen, only the nodes inside the zoomed node's range, each found by binary
 * search; a run of adjacent nodes each narrower than a pixel becomes one grey bar (coloured by
 * its summed change in a diff, by a match in a search), as flame-graph renderers collapse them.
 */
export function draw(
  ctx: CanvasRenderingContext2D,
  model: FlameModel,
  view: View,
  viewport: Viewport = wholeGraph(model),
): DrawStats {
  const stats: DrawStats = { rows: 0, bars: 0, coalesced: 0, labels: 0 };
  const levels = model.levelStart.length - 1;
  ctx.clearRect(0, 0, view.width, viewport.canvasHeight);
  if (model.count === 0 || model.numTicks === 0) return stats;
  const focus = Math.min(Math.max(view.focus, 0), model.count - 1);
  const fLevel = model.level[focus];
  const fx = model.x[focus];
  const fTotal = model.total[focus] || 1;
  const fEnd = fx + fTotal;
  const scale = view.width / fTotal;

  ctx.font = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
  ctx.textBaseline = "middle";
  const charWidth = ctx.measureText("M").width || 7;

  const { colors } = cacheOf(model);
  const matches = matchesOf(model, view);
  const d = model.diff;
  // Labels are drawn after all bars, in two colours, so the canvas switches state rarely.
  const labels: { text: string; x: number; y: number; dark: boolean }[] = [];
  let lastFill = "";
  let lastAlpha = 1;
  const fill = (color: string, alpha: number) => {
    if (alpha !== lastAlpha) ctx.globalAlpha = lastAlpha = alpha;
    if (color !== lastFill) ctx.fillStyle = lastFill = color;
  };

  // The focus's ancestors span the width, one per level above it.
  const ancestorAt = new Int32Array(fLevel);
  for (let a = model.parent[focus]; a >= 0; a = model.parent[a]) ancestorAt[model.level[a]] = a;

  // One pending run of sub-pixel nodes: its pixel range, whether a search matched in it (the
  // first match's colour), and for diffs its summed sides.
  let runStart = 0;
  let runEnd = -1;
  let runFirst = -1;
  let runCount = 0;
  let runMatch = -1;
  let runLeft = 0;
  let runRight = 0;
  let runY = 0;
  const flush = () => {
    if (runEnd < 0) return;
    const w = runEnd - runStart;
    if (w >= MIN_WIDTH) {
      let color: string;
      if (matches !== null && runMatch < 0) color = DIMMED;
      else if (d) color = diffColor(changePercent(runLeft, runRight, d.leftTicks, d.rightTicks, view.diffColor));
      else if (runCount === 1) color = colors[model.name[runFirst]];
      else color = runMatch >= 0 ? colors[runMatch] : COALESCED;
      fill(color, 1);
      ctx.fillRect(runStart, runY, w, ROW - 1);
      stats.coalesced++;
    }
    runEnd = -1;
  };

  const [firstRow, lastRow] = visibleRows(model, viewport);
  for (let row = firstRow; row <= lastRow; row++) {
    const l = view.inverted ? levels - 1 - row : row;
    const y = row * ROW - viewport.canvasTop;
    stats.rows++;
    if (l < fLevel) {
      bar(ancestorAt[l], 0, view.width, y, 0.55);
      continue;
    }
    // The first node of the level ending after the focus's start: ends are sorted, as nodes
    // of a level do not overlap.
    let lo = model.levelStart[l];
    let hi = model.levelStart[l + 1];
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (model.x[mid] + model.total[mid] <= fx) lo = mid + 1;
      else hi = mid;
    }
    for (let n = lo; n < model.levelStart[l + 1] && model.x[n] < fEnd; n++) {
      const px = (model.x[n] - fx) * scale;
      const pw = model.total[n] * scale;
      if (pw < COALESCE_WIDTH) {
        // Adjacent sub-pixel nodes (gaps under a pixel) join the pending run.
        if (runEnd >= 0 && px - runEnd >= 1) flush();
        if (runEnd < 0) {
          runStart = px;
          runFirst = n;
          runCount = 0;
          runMatch = -1;
          runLeft = 0;
          runRight = 0;
          runY = y;
        }
        runEnd = Math.max(runEnd, px + pw);
        runCount++;
        if (matches !== null && runMatch < 0 && matches[model.name[n]]) runMatch = model.name[n];
        if (d) {
          runLeft += d.totalL[n];
          runRight += d.totalR[n];
        }
        continue;
      }
      flush();
      bar(n, px, pw, y, 1);
    }
    flush();
  }
  ctx.globalAlpha = 1;
  for (const dark of [true, false]) {
    ctx.fillStyle = dark ? "#1f2937" : "#fff";
    for (const l of labels) if (l.dark === dark) ctx.fillText(l.text, l.x, l.y);
  }
  stats.labels = labels.length;
  return stats;

  function bar(n: number, px: number, pw: number, y: number, alpha: number) {
    const id = model.name[n];
    const matched = matches !== null && matches[id];
    let color = d ? diffColor(diffPercent(model, n, view.diffColor)) : colors[id];
    if (matches !== null && !matched) color = DIMMED;
    fill(color, alpha);
    ctx.fillRect(px, y, Math.max(pw - (pw > 2 ? 1 : 0), MIN_WIDTH), ROW - 1);
    stats.bars++;
    if (matched || n === view.selected) {
      ctx.strokeStyle = matched && n !== view.selected ? "#1d4ed8" : "#111827";
      ctx.lineWidth = 2;
      ctx.strokeRect(px + 1, y + 1, Math.max(pw - 3, 0), ROW - 3);
    }
    const chars = Math.floor((pw - 6) / charWidth);
    if (chars < 3) return;
    const name = model.names[id];
    const text = name.length <= chars ? name : `${name.slice(0, chars - 1)}…`;
    labels.push({ text, x: px + 3, y: y + ROW / 2, dark: !(d && !(matches !== null && !matched)) });
  }
}

/** The node under CSS pixel (`px`, `py`), or -1. */
export function hit(model: FlameModel, view: View, px: number, py: number): number {
  const levels = model.levelStart.length - 1;
  if (model.count === 0 || px < 0 || px > view.width) return -1;
  const row = Math.floor(py / ROW);
  const l = view.inverted ? levels - 1 - row : row;
  if (l < 0 || l >= levels) return -1;
  const focus = Math.min(Math.max(view.focus, 0), model.count - 1);
  const fLevel = model.level[focus];
  if (l < fLevel) {
    let a = focus;
    while (a >= 0 && model.level[a] > l) a = model.parent[a];
    return a;
  }
  const fTotal = model.total[focus] || 1;
  const tick = model.x[focus] + (px / view.width) * fTotal;
  // Binary search for the last node of the level starting at or before `tick`.
  let lo = model.levelStart[l];
  let hi = model.levelStart[l + 1] - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (model.x[mid] <= tick) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (found < 0 || tick >= model.x[found] + model.total[found]) return -1;
  return found;
}
