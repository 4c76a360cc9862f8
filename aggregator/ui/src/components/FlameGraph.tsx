// A flame graph on a canvas: click a bar to zoom into it, hover for a tooltip, move with the
// arrow keys, Enter to zoom, Escape to reset. The selected bar's details and actions show
// below the toolbar.
//
// The canvas is at most a window tall and sits over the part of the graph on screen: a deep
// graph is a tall box whose canvas moves and redraws as the page scrolls (once per row), so a
// draw costs what is visible, not what the graph holds.

import type { ComponentChildren } from "preact";
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import {
  type DiffColor,
  ROW,
  type View,
  type Viewport,
  diffPercent,
  draw,
  height,
  hit,
  viewportOf,
  visibleRows,
} from "../flamegraph";
import { type Units, formatPercent, formatValue } from "../format";
import { type FlameModel, findStack, stackOf } from "../model";

/** The tallest canvas, in device pixels, that Chromium and Firefox still draw. */
const MAX_CANVAS_PIXELS = 32_000;

export interface FlameGraphProps {
  model: FlameModel;
  units: Units;
  /** Lower-cased search text. */
  search: string;
  /** A function to highlight exactly, e.g. the table row under the pointer. */
  highlight?: string | null;
  /** The zoomed node's stack, root first; empty for the whole graph. */
  focus: string[];
  onFocus: (stack: string[]) => void;
  inverted?: boolean;
  diffColor?: DiffColor;
  /** Buttons for the selected frame (sandwich, rules). */
  actions?: (frame: string) => ComponentChildren;
  label: string;
  testId?: string;
}

export function FlameGraph(props: FlameGraphProps) {
  const { model, units } = props;
  const canvas = useRef<HTMLCanvasElement>(null);
  const box = useRef<HTMLDivElement>(null);
  const [width, setWidth] = useState(800);
  const [hover, setHover] = useState<{ node: number; x: number; y: number } | null>(null);
  const [selected, setSelected] = useState(-1);
  const drawn = useRef<Viewport | null>(null);
  const focus = useMemo(() => {
    const node = props.focus.length ? findStack(model, props.focus) : 0;
    return node < 0 ? 0 : node;
  }, [model, props.focus.join(";")]);

  const view: View = {
    width,
    focus,
    search: props.search,
    highlight: props.highlight ?? "",
    selected,
    inverted: props.inverted ?? false,
    diffColor: props.diffColor ?? "relative",
  };

  useEffect(() => setSelected(-1), [model]);

  useLayoutEffect(() => {
    const element = box.current;
    if (!element) return undefined;
    const observer = new ResizeObserver(() => setWidth(Math.max(200, Math.floor(element.clientWidth))));
    observer.observe(element);
    setWidth(Math.max(200, Math.floor(element.clientWidth)));
    return () => observer.disconnect();
  }, []);

  // Draws what is on screen; `force` redraws even when the visible rows did not change.
  const paint = (force: boolean) => {
    const c = canvas.current;
    const element = box.current;
    if (!c || !element) return;
    const h = height(model);
    const viewport = viewportOf(element.getBoundingClientRect().top, h, window.innerHeight || h);
    const last = drawn.current;
    if (!force && last && sameRows(model, last, viewport)) return;
    // Browsers refuse canvases taller than about 32k device pixels: trade sharpness for size.
    const ratio = Math.min(window.devicePixelRatio || 1, MAX_CANVAS_PIXELS / Math.max(viewport.canvasHeight, 1));
    const w = Math.floor(width * ratio);
    const ch = Math.floor(viewport.canvasHeight * ratio);
    // Assigning a canvas's size reallocates it, even to the same size: only on a change.
    if (c.width !== w) c.width = w;
    if (c.height !== ch) c.height = ch;
    c.style.width = `${width}px`;
    c.style.height = `${viewport.canvasHeight}px`;
    c.style.top = `${viewport.canvasTop}px`;
    const ctx = c.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    performance.mark("smolder-flamegraph-draw-start");
    const stats = draw(ctx, model, view, viewport);
    performance.measure("smolder-flamegraph-draw", {
      start: "smolder-flamegraph-draw-start",
      detail: { nodes: model.count, ...stats },
    });
    c.dataset.rows = String(stats.rows);
    drawn.current = viewport;
  };
  const painter = useRef(paint);
  painter.current = paint;

  useLayoutEffect(
    () => paint(true),
    [model, width, focus, props.search, props.highlight, selected, props.inverted, props.diffColor],
  );
  // After any other render (a bar above the graph that grew, say): draw what newly shows.
  useLayoutEffect(() => paint(false));

  useEffect(() => {
    let frame = 0;
    const schedule = () => {
      if (frame === 0)
        frame = requestAnimationFrame(() => {
          frame = 0;
          painter.current(false);
        });
    };
    // Capture: a scroll of any scrolling ancestor moves the graph too.
    window.addEventListener("scroll", schedule, { passive: true, capture: true });
    window.addEventListener("resize", schedule);
    return () => {
      window.removeEventListener("scroll", schedule, { capture: true });
      window.removeEventListener("resize", schedule);
      cancelAnimationFrame(frame);
    };
  }, []);

  /** The graph coordinates (CSS pixels from its top-left corner) of a pointer event. */
  const point = (event: MouseEvent) => {
    const rect = box.current!.getBoundingClientRect();
    return { x: event.clientX - rect.left, y: event.clientY - rect.top };
  };
  const at = (event: MouseEvent) => {
    const { x, y } = point(event);
    return hit(model, view, x, y);
  };

  const zoom = (node: number) => {
    setSelected(node);
    props.onFocus(node <= 0 ? [] : stackOf(model, node));
  };

  const onKey = (event: KeyboardEvent) => {
    let next = selected < 0 ? focus : selected;
    const level = model.level[next];
    const up = props.inverted ? "ArrowDown" : "ArrowUp";
    const down = props.inverted ? "ArrowUp" : "ArrowDown";
    switch (event.key) {
      case up:
        if (model.parent[next] >= 0) next = model.parent[next];
        break;
      case down: {
        const start = model.levelStart[level + 1] ?? model.count;
        const end = model.levelStart[level + 2] ?? model.count;
        let best = -1;
        for (let c = start; c < end; c++) {
          if (model.parent[c] === next && (best < 0 || model.total[c] > model.total[best])) best = c;
        }
        if (best >= 0) next = best;
        break;
      }
      case "ArrowLeft":
        if (next > model.levelStart[level]) next -= 1;
        break;
      case "ArrowRight":
        if (next < model.levelStart[level + 1] - 1) next += 1;
        break;
      case "Enter":
        zoom(next);
        event.preventDefault();
        return;
      case "Escape":
        setSelected(-1);
        props.onFocus([]);
        return;
      default:
        return;
    }
    event.preventDefault();
    setSelected(next);
  };

  const shown = hover?.node ?? -1;
  const info = selected >= 0 ? selected : -1;
  const frameName = (n: number) => model.names[model.name[n]];

  return (
    <div class="flamegraph" data-testid={props.testId}>
      <div class="flamegraph-bar">
        <span class="flamegraph-title">{props.label}</span>
        {props.focus.length > 0 && (
          <button type="button" onClick={() => zoom(0)} data-testid="reset-zoom">
            Reset zoom
          </button>
        )}
        {info >= 0 && (
          <span class="selection" data-testid="selection">
            <strong>{frameName(info)}</strong> {describe(model, info, units)}
            {props.actions?.(frameName(info))}
          </span>
        )}
      </div>
      <div class="flamegraph-canvas" ref={box} style={{ height: model.numTicks === 0 ? undefined : `${height(model)}px` }}>
        {model.numTicks === 0 ? (
          <p class="muted">No samples in this range.</p>
        ) : (
          <canvas
            ref={canvas}
            tabIndex={0}
            role="img"
            aria-label={`${props.label}: flame graph with ${model.count} frames. Arrow keys move, Enter zooms, Escape resets.`}
            data-nodes={model.count}
            data-focus={props.focus.join(";")}
            onMouseMove={(e) => {
              const node = at(e);
              setHover(node >= 0 ? { node, ...point(e) } : null);
            }}
            onMouseLeave={() => setHover(null)}
            onClick={(e) => {
              const node = at(e);
              if (node >= 0) zoom(node);
            }}
            onKeyDown={onKey}
          />
        )}
        {shown >= 0 && hover && (
          <div
            class="tooltip"
            role="tooltip"
            data-testid="tooltip"
            style={{
              left: `${Math.min(hover.x + 12, width - 320)}px`,
              top: `${hover.y + ROW}px`,
            }}
          >
            <div class="tooltip-name">{frameName(shown)}</div>
            <Details model={model} node={shown} units={units} diffColor={props.diffColor ?? "relative"} />
          </div>
        )}
      </div>
    </div>
  );
}

function describe(model: FlameModel, node: number, units: Units): string {
  const d = model.diff;
  if (d) {
    return `baseline ${formatValue(d.totalL[node], units)} (${formatPercent(d.totalL[node], d.leftTicks)}), comparison ${formatValue(d.totalR[node], units)} (${formatPercent(d.totalR[node], d.rightTicks)})`;
  }
  return `total ${formatValue(model.total[node], units)} (${formatPercent(model.total[node], model.numTicks)}), self ${formatValue(model.self[node], units)}`;
}

function Details(props: { model: FlameModel; node: number; units: Units; diffColor: DiffColor }) {
  const { model, node, units } = props;
  const d = model.diff;
  if (d) {
    const change = diffPercent(model, node, props.diffColor);
    return (
      <table>
        <tbody>
          <tr>
            <th />
            <th>baseline</th>
            <th>comparison</th>
          </tr>
          <tr>
            <td>share</td>
            <td>{formatPercent(d.totalL[node], d.leftTicks)}</td>
            <td>{formatPercent(d.totalR[node], d.rightTicks)}</td>
          </tr>
          <tr>
            <td>total</td>
            <td>{formatValue(d.totalL[node], units)}</td>
            <td>{formatValue(d.totalR[node], units)}</td>
          </tr>
          <tr>
            <td>self</td>
            <td>{formatValue(d.selfL[node], units)}</td>
            <td>{formatValue(d.selfR[node], units)}</td>
          </tr>
          <tr>
            <td>change</td>
            <td colSpan={2}>
              {change > 0 ? "+" : ""}
              {change.toFixed(1)}% {props.diffColor === "relative" ? "of share" : "of value"}
            </td>
          </tr>
        </tbody>
      </table>
    );
  }
  return (
    <table>
      <tbody>
        <tr>
          <td>total</td>
          <td>{formatValue(model.total[node], units)}</td>
          <td>{formatPercent(model.total[node], model.numTicks)}</td>
        </tr>
        <tr>
          <td>self</td>
          <td>{formatValue(model.self[node], units)}</td>
          <td>{formatPercent(model.self[node], model.numTicks)}</td>
        </tr>
        {units.units === "samples" && (
          <tr>
            <td>samples</td>
            <td colSpan={2}>
              {model.total[node].toLocaleString("en-US")} total, {model.self[node].toLocaleString("en-US")} self
            </td>
          </tr>
        )}
      </tbody>
    </table>
  );
}

/** Whether two viewports draw the same: the canvas in the same place, the same rows on it. */
function sameRows(model: FlameModel, a: Viewport, b: Viewport): boolean {
  if (a.canvasTop !== b.canvasTop || a.canvasHeight !== b.canvasHeight) return false;
  const [af, al] = visibleRows(model, a);
  const [bf, bl] = visibleRows(model, b);
  return af === bf && al === bl;
}
