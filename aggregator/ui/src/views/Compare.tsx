// Comparison: a baseline and a comparison selection (query and time range each), shown side by
// side or as one diff flame graph coloured by the change of each frame.

import { useMemo, useState } from "preact/hooks";
import { type App, api } from "../api";
import { FlameGraph } from "../components/FlameGraph";
import { type SortKey, Table } from "../components/Table";
import { Timeline } from "../components/Timeline";
import { AppPicker, DiffLegend, ErrorBox, LabelFilter, TimeRange, rangeText } from "../components/controls";
import type { DiffColor } from "../flamegraph";
import type { Units } from "../format";
import { useLoad } from "../hooks";
import { decode } from "../model";
import { resolveTime } from "../query";
import { type Params, navigate } from "../url";

interface Side {
  key: "left" | "right";
  title: string;
  color: string;
  query: string;
  from: string;
  until: string;
}

/**
 * The middle of the overall range, as a time expression: relative (`now-1800s`) when the range
 * is `now-X` to `now`, so that defaults stay put between renders and follow a refresh.
 */
function middle(from: string, until: string): string | null {
  const a = resolveTime(from);
  const b = resolveTime(until);
  if (!Number.isFinite(a) || !Number.isFinite(b)) return null;
  const relative = /^now-\d+[A-Za-z]+$/.test(from) && (until === "now" || until === "");
  if (relative) return `now-${Math.round((b - a) / 2)}s`;
  return String(Math.floor((a + b) / 2));
}

/** The two sides, defaulting to the halves of the overall range. */
function sides(p: Params): { left: Side; right: Side; from: string; until: string } {
  const from = p.from || "now-1h";
  const until = p.until || "now";
  const mid = middle(from, until);
  const query = p.query ?? "";
  return {
    from,
    until,
    left: {
      key: "left",
      title: "Baseline",
      color: "#16a34a",
      query: p.leftQuery || query,
      from: p.leftFrom || from,
      until: p.leftUntil || (mid ?? until),
    },
    right: {
      key: "right",
      title: "Comparison",
      color: "#dc2626",
      query: p.rightQuery || query,
      from: p.rightFrom || (mid ?? from),
      until: p.rightUntil || until,
    },
  };
}

export function Compare(props: { params: Params; apps: App[]; refresh: number; diff: boolean }) {
  const p = props.params;
  const s = sides(p);
  const search = (p.search ?? "").toLowerCase();
  const color = (p.color === "absolute" ? "absolute" : "relative") as DiffColor;
  const focus = p.focus ? p.focus.split(";") : [];
  const sort = (p.sort as SortKey) || (props.diff ? "change" : "self");

  const left = useLoad(
    !props.diff && s.left.query ? JSON.stringify([s.left, props.refresh]) : null,
    (signal) => api.render({ query: s.left.query, from: s.left.from, until: s.left.until }, signal),
  );
  const right = useLoad(
    !props.diff && s.right.query ? JSON.stringify([s.right, props.refresh]) : null,
    (signal) => api.render({ query: s.right.query, from: s.right.from, until: s.right.until }, signal),
  );
  const diff = useLoad(
    props.diff && s.left.query && s.right.query ? JSON.stringify([s.left, s.right, props.refresh]) : null,
    (signal) =>
      api.renderDiff(
        {
          leftQuery: s.left.query,
          leftFrom: s.left.from,
          leftUntil: s.left.until,
          rightQuery: s.right.query,
          rightFrom: s.right.from,
          rightUntil: s.right.until,
        },
        signal,
      ),
  );
  const leftModel = useMemo(() => (left.data ? decode(left.data) : null), [left.data]);
  const rightModel = useMemo(() => (right.data ? decode(right.data) : null), [right.data]);
  const diffModel = useMemo(() => (diff.data ? decode(diff.data) : null), [diff.data]);
  const meta = (diff.data ?? left.data ?? right.data)?.metadata;
  const units: Units = meta ? { units: meta.units, sampleRate: meta.sampleRate } : { units: "", sampleRate: 0 };

  const set = (patch: Record<string, string | undefined>, push = true) => navigate(patch, push);
  const [hovered, setHovered] = useState<string | null>(null);

  return (
    <section aria-label={props.diff ? "Diff view" : "Comparison view"}>
      <div class="toolbar">
        <TimeRange
          id="overall"
          from={s.from}
          until={s.until}
          onChange={(f, u) =>
            set({ from: f, until: u, leftFrom: undefined, leftUntil: undefined, rightFrom: undefined, rightUntil: undefined })
          }
        />
        <input
          type="search"
          class="search"
          placeholder="Search frames  ( / )"
          aria-label="Search frames"
          data-testid="search"
          value={p.search ?? ""}
          onInput={(e) => set({ search: e.currentTarget.value }, false)}
        />
      </div>
      <div class="sides">
        {[s.left, s.right].map((side) => (
          <SidePicker key={side.key} side={side} apps={props.apps} overall={[s.from, s.until]} refresh={props.refresh} />
        ))}
      </div>
      {props.diff ? (
        <>
          <DiffLegend mode={color} onMode={(mode) => set({ color: mode === "relative" ? undefined : mode }, false)} />
          {diff.error !== null && <ErrorBox error={diff.error} />}
          {diff.loading && <p class="muted">loading…</p>}
          {diffModel && diffModel.numTicks === 0 && <p class="empty">Neither side has samples in its range.</p>}
          {diffModel && diffModel.numTicks > 0 && (
            <div class="split">
              <Table
                model={diffModel}
                units={units}
                search={search}
                sort={sort}
                onSort={(key) => set({ sort: key }, false)}
                onPick={(name) => set({ search: name }, false)}
                onHover={setHovered}
              />
              <FlameGraph
                model={diffModel}
                units={units}
                search={search}
                highlight={hovered}
                focus={focus}
                onFocus={(stack) => set({ focus: stack.join(";") })}
                diffColor={color}
                label={`Diff: ${s.left.query} → ${s.right.query}`}
                testId="diff-flamegraph"
              />
            </div>
          )}
        </>
      ) : (
        <div class="side-by-side">
          {[
            { side: s.left, load: left, model: leftModel },
            { side: s.right, load: right, model: rightModel },
          ].map(({ side, load, model }) => (
            <div key={side.key}>
              {load.error !== null && <ErrorBox error={load.error} />}
              {model && model.numTicks === 0 && <p class="empty">No samples for {side.query} from {rangeText(side.from, side.until)}.</p>}
              {model && model.numTicks > 0 && (
                <FlameGraph
                  model={model}
                  units={units}
                  search={search}
                  focus={focus}
                  onFocus={(stack) => set({ focus: stack.join(";") })}
                  label={`${side.title}: ${side.query}`}
                  testId={`${side.key}-flamegraph`}
                />
              )}
            </div>
          ))}
        </div>
      )}
    </section>
  );
}

/** One side's query, label filter and range, with a timeline of the overall range to drag on. */
function SidePicker(props: { side: Side; apps: App[]; overall: [string, string]; refresh: number }) {
  const { side } = props;
  const k = side.key;
  const timeline = useLoad(side.query ? JSON.stringify([side.query, props.overall, props.refresh]) : null, (signal) =>
    api.render({ query: side.query, from: props.overall[0], until: props.overall[1], maxNodes: "1" }, signal),
  );
  const patch = (values: Partial<Record<"Query" | "From" | "Until", string>>) =>
    navigate(Object.fromEntries(Object.entries(values).map(([name, v]) => [`${k}${name}`, v])));
  const meta = timeline.data?.metadata;
  return (
    <div class="side" style={{ borderTopColor: side.color }} data-testid={`side-${k}`}>
      <h3>
        {side.title} <span class="muted">{rangeText(side.from, side.until)}</span>
      </h3>
      <div class="toolbar">
        <AppPicker id={`${k}-app`} apps={props.apps} query={side.query} onChange={(q) => patch({ Query: q })} />
        <TimeRange id={`${k}-range`} from={side.from} until={side.until} onChange={(f, u) => patch({ From: f, Until: u })} />
      </div>
      <LabelFilter id={`${k}-filter`} query={side.query} from={side.from} until={side.until} onChange={(q) => patch({ Query: q })} />
      {timeline.error !== null && <ErrorBox error={timeline.error} />}
      {timeline.data?.timeline && (
        <Timeline
          testId={`${k}-timeline`}
          series={[{ label: side.query, color: side.color, timeline: timeline.data.timeline }]}
          from={meta?.startTime ?? resolveTime(props.overall[0])}
          until={meta?.endTime ?? resolveTime(props.overall[1])}
          units={{ units: meta?.units ?? "", sampleRate: meta?.sampleRate ?? 0 }}
          marked={{ from: resolveTime(side.from), until: resolveTime(side.until), color: side.color }}
          onSelect={(f, u) => patch({ From: String(f), Until: String(u) })}
        />
      )}
    </div>
  );
}
