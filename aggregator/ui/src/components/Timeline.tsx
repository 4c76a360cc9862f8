// The timeline: each series' value per step over the range, as an SVG chart. Dragging across it
// selects a sub-range, which becomes the view's new range (drag-to-zoom).

import { useRef, useState } from "preact/hooks";
import type { Timeline as TimelineData } from "../api";
import { type Units, formatTime, formatValue } from "../format";

export interface Series {
  label: string;
  color: string;
  timeline: TimelineData;
}

export interface TimelineProps {
  series: Series[];
  from: number;
  until: number;
  units: Units;
  onSelect: (from: number, until: number) => void;
  /** A highlighted sub-range, e.g. a comparison side. */
  marked?: { from: number; until: number; color: string };
  testId?: string;
}

const H = 110;
const PAD_TOP = 8;
const PAD_BOTTOM = 18;
const WIDTH = 1000;

export function Timeline(props: TimelineProps) {
  const { series, from, until, units } = props;
  const svg = useRef<SVGSVGElement>(null);
  const [drag, setDrag] = useState<{ start: number; end: number } | null>(null);
  const span = Math.max(until - from, 1);
  // A loop, not Math.max(...all): a groupBy of many values has millions of points.
  let max = 1;
  for (const s of series) {
    s.timeline.samples.forEach((v, i) => {
      if (v > max && inRange(s.timeline, i, from, until)) max = v;
    });
  }
  const x = (t: number) => ((t - from) / span) * WIDTH;
  const y = (v: number) => PAD_TOP + (1 - v / max) * (H - PAD_TOP - PAD_BOTTOM);

  const toTime = (clientX: number) => {
    const rect = svg.current!.getBoundingClientRect();
    const fraction = Math.min(1, Math.max(0, (clientX - rect.left) / rect.width));
    return from + fraction * span;
  };

  const finish = () => {
    if (drag) {
      const a = Math.min(drag.start, drag.end);
      const b = Math.max(drag.start, drag.end);
      // A click, or a sliver under one step, is not a selection.
      if ((b - a) / span > 0.005) props.onSelect(Math.floor(a), Math.ceil(b));
    }
    setDrag(null);
  };

  const empty = series.every((s) => s.timeline.samples.every((v) => v === 0));
  return (
    <div class="timeline" data-testid={props.testId ?? "timeline"}>
      <svg
        ref={svg}
        viewBox={`0 0 ${WIDTH} ${H}`}
        preserveAspectRatio="none"
        role="img"
        aria-label="Timeline; drag across it to zoom into a time range"
        onMouseDown={(e) => {
          e.preventDefault();
          const t = toTime(e.clientX);
          setDrag({ start: t, end: t });
        }}
        onMouseMove={(e) => drag && setDrag({ ...drag, end: toTime(e.clientX) })}
        onMouseUp={finish}
        onMouseLeave={finish}
      >
        <line x1={0} x2={WIDTH} y1={H - PAD_BOTTOM} y2={H - PAD_BOTTOM} class="axis" />
        {props.marked && (
          <rect
            x={x(props.marked.from)}
            width={Math.max(1, x(props.marked.until) - x(props.marked.from))}
            y={0}
            height={H - PAD_BOTTOM}
            fill={props.marked.color}
            opacity={0.15}
          />
        )}
        {series.map((s) => (
          <path
            key={s.label}
            d={path(s.timeline, from, until, x, y)}
            fill={series.length === 1 ? s.color : "none"}
            fill-opacity={0.35}
            stroke={s.color}
            stroke-width={1.5}
            vector-effect="non-scaling-stroke"
          />
        ))}
        {drag && (
          <rect
            class="drag"
            x={x(Math.min(drag.start, drag.end))}
            width={Math.abs(x(drag.end) - x(drag.start))}
            y={0}
            height={H - PAD_BOTTOM}
          />
        )}
      </svg>
      <div class="timeline-axis">
        <span>{formatTime(from)}</span>
        <span class="muted">{empty ? "no samples in this range" : `peak ${formatValue(max, units)} per step`}</span>
        <span>{formatTime(until)}</span>
      </div>
    </div>
  );
}

function inRange(t: TimelineData, i: number, from: number, until: number): boolean {
  const at = t.startTime + i * t.durationDelta;
  return at + t.durationDelta > from && at < until;
}

function path(
  t: TimelineData,
  from: number,
  until: number,
  x: (t: number) => number,
  y: (v: number) => number,
): string {
  const base = y(0);
  let d = "";
  let started = false;
  t.samples.forEach((v, i) => {
    if (!inRange(t, i, from, until)) return;
    const at = Math.max(from, t.startTime + i * t.durationDelta);
    const next = Math.min(until, t.startTime + (i + 1) * t.durationDelta);
    if (!started) {
      d += `M${x(at).toFixed(1)},${base.toFixed(1)}`;
      started = true;
    }
    d += `L${x(at).toFixed(1)},${y(v).toFixed(1)}L${x(next).toFixed(1)},${y(v).toFixed(1)}`;
  });
  if (started) {
    const end = Math.min(until, t.startTime + t.samples.length * t.durationDelta);
    d += `L${x(end).toFixed(1)},${base.toFixed(1)}Z`;
  }
  return d;
}
