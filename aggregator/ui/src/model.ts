// The flame graph model: Pyroscope's flamebearer levels decoded into flat typed arrays, one entry
// per node in level order, with parents linked, so that drawing, hit-testing, the top table and
// the sandwich view all read the same structure.

import type { Flamebearer, RenderResponse } from "./api";

export interface FlameModel {
  names: string[];
  /** Number of nodes. */
  count: number;
  /** Node index range of each level: nodes of level l are levelStart[l] .. levelStart[l+1]. */
  levelStart: Int32Array;
  level: Int32Array;
  /** Absolute offset, in ticks, of the node's bar (left + right for a diff). */
  x: Float64Array;
  total: Float64Array;
  self: Float64Array;
  name: Int32Array;
  parent: Int32Array;
  /** Width of the whole graph in ticks. */
  numTicks: number;
  /** For diffs: per-side totals and selves, and each side's grand total. */
  diff?: {
    totalL: Float64Array;
    selfL: Float64Array;
    totalR: Float64Array;
    selfR: Float64Array;
    leftTicks: number;
    rightTicks: number;
  };
}

/** Decodes a `/render` or `/render-diff` answer. */
export function decode(response: RenderResponse): FlameModel {
  const fb: Flamebearer = response.flamebearer;
  const double = response.metadata.format === "double";
  const step = double ? 7 : 4;
  let count = 0;
  for (const row of fb.levels) count += row.length / step;
  const levelStart = new Int32Array(fb.levels.length + 1);
  const level = new Int32Array(count);
  const x = new Float64Array(count);
  const total = new Float64Array(count);
  const self = new Float64Array(count);
  const name = new Int32Array(count);
  const parent = new Int32Array(count).fill(-1);
  const totalL = double ? new Float64Array(count) : undefined;
  const selfL = double ? new Float64Array(count) : undefined;
  const totalR = double ? new Float64Array(count) : undefined;
  const selfR = double ? new Float64Array(count) : undefined;

  let i = 0;
  fb.levels.forEach((row, l) => {
    levelStart[l] = i;
    // x is delta-encoded per level against the end of the previous bar (per side for diffs).
    let endL = 0;
    let endR = 0;
    for (let j = 0; j < row.length; j += step, i++) {
      level[i] = l;
      if (double) {
        const xl = endL + row[j];
        const xr = endR + row[j + 3];
        endL = xl + row[j + 1];
        endR = xr + row[j + 4];
        totalL![i] = row[j + 1];
        selfL![i] = row[j + 2];
        totalR![i] = row[j + 4];
        selfR![i] = row[j + 5];
        x[i] = xl + xr;
        total[i] = row[j + 1] + row[j + 4];
        self[i] = row[j + 2] + row[j + 5];
        name[i] = row[j + 6];
      } else {
        x[i] = endL + row[j];
        total[i] = row[j + 1];
        endL = x[i] + total[i];
        self[i] = row[j + 2];
        name[i] = row[j + 3];
      }
    }
  });
  levelStart[fb.levels.length] = i;

  // Each level is in x order and children nest inside their parent's bar, after its self: a
  // single pass per level finds every parent.
  for (let l = 1; l < fb.levels.length; l++) {
    let p = levelStart[l - 1];
    const pEnd = levelStart[l];
    for (let c = levelStart[l]; c < levelStart[l + 1]; c++) {
      while (p < pEnd - 1 && x[c] >= x[p] + total[p] && !(total[p] === 0 && x[c] === x[p])) p++;
      parent[c] = p;
    }
  }

  return {
    names: fb.names,
    count,
    levelStart,
    level,
    x,
    total,
    self,
    name,
    parent,
    numTicks: fb.numTicks,
    diff: double
      ? {
          totalL: totalL!,
          selfL: selfL!,
          totalR: totalR!,
          selfR: selfR!,
          leftTicks: response.leftTicks ?? 0,
          rightTicks: response.rightTicks ?? 0,
        }
      : undefined,
  };
}

/** The frames from the root's first child down to `node`, root first. */
export function stackOf(model: FlameModel, node: number): string[] {
  const frames: string[] = [];
  for (let n = node; n > 0; n = model.parent[n]) frames.push(model.names[model.name[n]]);
  return frames.reverse();
}

/** The node reached by following `frames` from the root, or -1. */
export function findStack(model: FlameModel, frames: string[]): number {
  let node = 0;
  for (let depth = 0; depth < frames.length; depth++) {
    const l = depth + 1;
    if (l + 1 >= model.levelStart.length) return -1;
    let found = -1;
    for (let c = model.levelStart[l]; c < model.levelStart[l + 1]; c++) {
      if (model.parent[c] === node && model.names[model.name[c]] === frames[depth]) {
        found = c;
        break;
      }
    }
    if (found < 0) return -1;
    node = found;
  }
  return node;
}

export interface TableRow {
  name: string;
  self: number;
  total: number;
  /** For diffs: left and right totals and selves. */
  selfL?: number;
  selfR?: number;
  totalL?: number;
  totalR?: number;
}

/**
 * One row per function: self summed over its nodes; total summed over the nodes that have no
 * ancestor of the same function, so recursion is not counted twice.
 */
export function topTable(model: FlameModel): TableRow[] {
  const rows = new Map<number, TableRow>();
  const d = model.diff;
  for (let n = 1; n < model.count; n++) {
    const id = model.name[n];
    let row = rows.get(id);
    if (!row) {
      row = { name: model.names[id], self: 0, total: 0 };
      if (d) Object.assign(row, { selfL: 0, selfR: 0, totalL: 0, totalR: 0 });
      rows.set(id, row);
    }
    row.self += model.self[n];
    if (d) {
      row.selfL! += d.selfL[n];
      row.selfR! += d.selfR[n];
    }
    let nested = false;
    for (let a = model.parent[n]; a > 0; a = model.parent[a]) {
      if (model.name[a] === id) {
        nested = true;
        break;
      }
    }
    if (!nested) {
      row.total += model.total[n];
      if (d) {
        row.totalL! += d.totalL[n];
        row.totalR! += d.totalR[n];
      }
    }
  }
  return [...rows.values()];
}

/** A tree built in the browser (for the sandwich view), laid out into a FlameModel. */
interface TreeNode {
  name: string;
  self: number;
  total: number;
  children: Map<string, TreeNode>;
}

function treeNode(name: string): TreeNode {
  return { name, self: 0, total: 0, children: new Map() };
}

/** Adds `value` along `frames` (self at the last one); returns how many nodes it created. */
function insert(root: TreeNode, frames: string[], value: number): number {
  let created = 0;
  root.total += value;
  let node = root;
  for (const frame of frames) {
    let child = node.children.get(frame);
    if (!child) {
      child = treeNode(frame);
      node.children.set(frame, child);
      created++;
    }
    child.total += value;
    node = child;
  }
  node.self += value;
  return created;
}

function layout(root: TreeNode): FlameModel {
  const names: string[] = ["total"];
  const nameIds = new Map<string, number>([["total", 0]]);
  const levels: number[][] = [];
  // Breadth-first by level keeps each level in x order: self first, then children by name.
  let current: { node: TreeNode; x: number }[] = [{ node: root, x: 0 }];
  while (current.length) {
    const row: number[] = [];
    const next: { node: TreeNode; x: number }[] = [];
    let end = 0;
    for (const { node, x } of current) {
      let id = nameIds.get(node.name);
      if (id === undefined) {
        id = names.length;
        names.push(node.name);
        nameIds.set(node.name, id);
      }
      row.push(x - end, node.total, node.self, id);
      end = x + node.total;
      let childX = x + node.self;
      for (const key of [...node.children.keys()].sort()) {
        const child = node.children.get(key)!;
        next.push({ node: child, x: childX });
        childX += child.total;
      }
    }
    levels.push(row);
    current = next;
  }
  return decode({
    version: 1,
    flamebearer: { names, levels, numTicks: root.total, maxSelf: 0 },
    metadata: { format: "single", spyName: "", sampleRate: 0, units: "", name: "" },
    timeline: null,
  });
}

/**
 * The sandwich of function `fn`: its callees (every call of it merged, with what it calls) and
 * its callers (the stacks that lead to it, leaf-first), each as a flame graph rooted at `fn`.
 */
export function sandwich(model: FlameModel, fn: string): { callers: FlameModel; callees: FlameModel } {
  const callers = treeNode("total");
  const callees = treeNode("total");
  const id = model.names.indexOf(fn);
  // Callees: each outermost call of fn contributes its subtree, re-rooted at fn.
  const rootOf = new Int32Array(model.count).fill(-1);
  const path = new Map<number, string[]>();
  for (let n = 1; n < model.count; n++) {
    const p = model.parent[n];
    if (rootOf[p] >= 0) {
      rootOf[n] = rootOf[p];
      const frames = [...path.get(p)!, model.names[model.name[n]]];
      path.set(n, frames);
      insert(callees, frames, model.self[n]);
    } else if (model.name[n] === id) {
      rootOf[n] = n;
      path.set(n, [fn]);
      insert(callees, [fn], model.self[n]);
      const stack = stackOf(model, n).reverse();
      insert(callers, stack, model.total[n]);
    }
  }
  return { callers: layout(callers), callees: layout(callees) };
}
