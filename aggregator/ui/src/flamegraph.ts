// The canvas flame-graph renderer: draws a FlameModel zoomed to one node, hit-tests a point back
// to a node. Plain functions over the model's typed arrays, so that a 16k-node graph draws in a
// few milliseconds (BENCHMARKS.md, "ui: flame graph render").

import type { FlameModel } from "./model";

/** Height of one row, CSS pixels. */
export const ROW = 18;
/** Bars narrower than this (CSS pixels) are not drawn: they would be invisible anyway. */
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
  let left = d.totalL[node];
  let right = d.totalR[node];
  if (mode === "relative") {
    left = d.leftTicks > 0 ? left / d.leftTicks : 0;
    right = d.rightTicks > 0 ? right / d.rightTicks : 0;
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

/** Per-model caches by name id: colours and lower-cased names, computed once per answer. */
const caches = new WeakMap<FlameModel, { colors: string[]; lower: string[] }>();

function cacheOf(model: FlameModel) {
  let cache = caches.get(model);
  if (!cache) {
    cache = { colors: model.names.map(hashColor), lower: model.names.map((n) => n.toLowerCase()) };
    caches.set(model, cache);
  }
  return cache;
}

/** Draws `model` on `ctx` (already scaled for the device pixel ratio). */
export function draw(ctx: CanvasRenderingContext2D, model: FlameModel, view: View): void {
  const levels = model.levelStart.length - 1;
  const h = levels * ROW;
  ctx.clearRect(0, 0, view.width, h);
  if (model.count === 0 || model.numTicks === 0) return;
  const focus = Math.min(Math.max(view.focus, 0), model.count - 1);
  const fLevel = model.level[focus];
  const fx = model.x[focus];
  const fTotal = model.total[focus] || 1;
  const scale = view.width / fTotal;

  ctx.font = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
  ctx.textBaseline = "middle";
  const charWidth = ctx.measureText("M").width || 7;

  const { colors, lower } = cacheOf(model);
  const matches =
    view.highlight !== ""
      ? model.names.map((n) => n === view.highlight)
      : view.search === ""
        ? null
        : lower.map((n) => n.includes(view.search));
  // Labels are drawn after all bars, in two colours, so the canvas switches state rarely.
  const labels: { text: string; x: number; y: number; dark: boolean }[] = [];
  let lastFill = "";
  let lastAlpha = 1;

  const ancestors = new Set<number>();
  for (let a = focus; a >= 0; a = model.parent[a]) ancestors.add(a);

  for (let l = 0; l < levels; l++) {
    const y = view.inverted ? h - (l + 1) * ROW : l * ROW;
    const start = model.levelStart[l];
    const end = model.levelStart[l + 1];
    for (let n = start; n < end; n++) {
      let px: number;
      let pw: number;
      let faded = false;
      if (l < fLevel) {
        if (!ancestors.has(n)) continue;
        px = 0;
        pw = view.width;
        faded = true;
      } else {
        const nx = model.x[n];
        if (nx + model.total[n] <= fx || nx >= fx + fTotal) continue;
        px = (nx - fx) * scale;
        pw = model.total[n] * scale;
      }
      if (pw < MIN_WIDTH) continue;
      const id = model.name[n];
      const matched = matches !== null && matches[id];
      let fill = model.diff ? diffColor(diffPercent(model, n, view.diffColor)) : colors[id];
      if (matches !== null && !matched) fill = "#e4e4e7";
      const alpha = faded ? 0.55 : 1;
      if (alpha !== lastAlpha) ctx.globalAlpha = lastAlpha = alpha;
      if (fill !== lastFill) ctx.fillStyle = lastFill = fill;
      ctx.fillRect(px, y, Math.max(pw - (pw > 2 ? 1 : 0), MIN_WIDTH), ROW - 1);
      if (matched || n === view.selected) {
        ctx.strokeStyle = matched && n !== view.selected ? "#1d4ed8" : "#111827";
        ctx.lineWidth = 2;
        ctx.strokeRect(px + 1, y + 1, Math.max(pw - 3, 0), ROW - 3);
      }
      const chars = Math.floor((pw - 6) / charWidth);
      if (chars >= 3) {
        const name = model.names[id];
        const text = name.length <= chars ? name : `${name.slice(0, chars - 1)}…`;
        labels.push({ text, x: px + 3, y: y + ROW / 2, dark: !(model.diff && !(matches !== null && !matched)) });
      }
    }
  }
  ctx.globalAlpha = 1;
  for (const dark of [true, false]) {
    ctx.fillStyle = dark ? "#1f2937" : "#fff";
    for (const label of labels) if (label.dark === dark) ctx.fillText(label.text, label.x, label.y);
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
