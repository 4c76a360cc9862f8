// The single view: one selection's timeline, flame graph, top table and sandwich. With
// `spanSelector` (span ids, as a trace's "profiles for this span" link carries them), the
// span view: the flame graph, table and exports of those spans' samples only, beside the
// timeline of the whole selection they ran in.

import type { ComponentChildren } from "preact";
import { useEffect, useMemo, useState } from "preact/hooks";
import { type App, api, renderUrl } from "../api";
import { FlameGraph } from "../components/FlameGraph";
import { type SortKey, Table } from "../components/Table";
import { Timeline } from "../components/Timeline";
import { AppPicker, ErrorBox, LabelFilter, TimeRange } from "../components/controls";
import type { Units } from "../format";
import { useLoad } from "../hooks";
import { decode, sandwich } from "../model";
import { parseSelector, resolveTime } from "../query";
import { type Params, href, navigate } from "../url";

type Tab = "both" | "flame" | "table" | "sandwich";

const TABS: { id: Tab; label: string }[] = [
  { id: "both", label: "Table and flame graph" },
  { id: "flame", label: "Flame graph" },
  { id: "table", label: "Table" },
  { id: "sandwich", label: "Sandwich" },
];

export function Single(props: { params: Params; apps: App[]; refresh: number }) {
  const p = props.params;
  const query = p.query ?? "";
  const from = p.from || "now-1h";
  const until = p.until || "now";
  const search = (p.search ?? "").toLowerCase();
  const focus = p.focus ? p.focus.split(";") : [];
  const tab = (TABS.some((t) => t.id === p.tab) ? p.tab : "both") as Tab;
  const sort = (p.sort as SortKey) || "self";
  const maxNodes = p.maxNodes;
  const spans = spanIds(p.spanSelector);
  const spanSelector = spans.join(",") || undefined;

  const render = useLoad(
    query ? JSON.stringify([query, from, until, maxNodes, spanSelector, props.refresh]) : null,
    (signal) => api.render({ query, from, until, maxNodes, spanSelector }, signal),
  );
  const model = useMemo(() => {
    if (!render.data) return null;
    performance.mark("smolder-flamegraph-decode-start");
    const decoded = decode(render.data);
    performance.measure("smolder-flamegraph-decode", { start: "smolder-flamegraph-decode-start", detail: { nodes: decoded.count } });
    return decoded;
  }, [render.data]);
  const units: Units = render.data
    ? { units: render.data.metadata.units, sampleRate: render.data.metadata.sampleRate }
    : { units: "", sampleRate: 0 };
  const sides = useMemo(() => (model && tab === "sandwich" && p.fn ? sandwich(model, p.fn) : null), [model, tab, p.fn]);

  const set = (patch: Record<string, string | undefined>, push = true) => navigate(patch, push);
  const app = parseSelector(query).app;
  const actions = (frame: string) => (
    <span class="actions">
      <button type="button" onClick={() => set({ tab: "sandwich", fn: frame })} data-testid="action-sandwich">
        Sandwich
      </button>
      <a
        class="button"
        data-testid="action-rule"
        href={href({ view: "rules", ruleExpr: query, ruleFunction: frame })}
        onClick={(e) => {
          e.preventDefault();
          navigate({ view: "rules", ruleExpr: query, ruleFunction: frame, ruleNode: undefined });
        }}
      >
        Create rule
      </a>
    </span>
  );

  const previous = previousPeriod(from, until);
  const [hovered, setHovered] = useState<string | null>(null);

  const downloadJson = () => {
    if (!render.data) return;
    const blob = new Blob([JSON.stringify(render.data)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `${app || "profile"}.json`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  };

  const flame = model && (
    <FlameGraph
      model={model}
      units={units}
      search={search}
      highlight={hovered}
      focus={focus}
      onFocus={(stack) => set({ focus: stack.join(";") })}
      actions={actions}
      label={app}
      testId="flamegraph"
    />
  );
  const table = model && (
    <Table
      model={model}
      units={units}
      search={search}
      sort={sort}
      onSort={(key) => set({ sort: key }, false)}
      onPick={(name) => set({ search: name }, false)}
      onHover={setHovered}
    />
  );

  return (
    <section aria-label="Single view">
      <div class="toolbar">
        <AppPicker apps={props.apps} query={query} onChange={(q) => set({ query: q, focus: undefined, fn: undefined })} />
        <TimeRange from={from} until={until} onChange={(f, u) => set({ from: f, until: u })} />
        {previous && (
          <a
            class="button"
            data-testid="diff-previous"
            title="Diff this range against the one just before it"
            href={href({ view: "diff", query, from: previous.from, until, leftFrom: previous.from, leftUntil: from, rightFrom: from, rightUntil: until })}
            onClick={(e) => {
              e.preventDefault();
              navigate({
                view: "diff",
                from: previous.from,
                leftFrom: previous.from,
                leftUntil: from,
                rightFrom: from,
                rightUntil: until,
                focus: undefined,
                tab: undefined,
                fn: undefined,
              });
            }}
          >
            Diff with previous period
          </a>
        )}
        <span class="exports" aria-label="Export">
          <span class="muted">Export</span>
          <a class="button" data-testid="export-pprof" href={renderUrl({ query, from, until, spanSelector, format: "pprof" })} download>
            pprof
          </a>
          <a
            class="button"
            data-testid="export-collapsed"
            href={renderUrl({ query, from, until, spanSelector, format: "collapsed" })}
            download
          >
            collapsed
          </a>
          <button type="button" data-testid="export-json" onClick={downloadJson} disabled={!render.data}>
            JSON
          </button>
        </span>
      </div>
      <LabelFilter query={query} from={from} until={until} onChange={(q) => set({ query: q, focus: undefined })} />
      {spans.length > 0 && (
        <SpanBanner
          spans={spans}
          wholeHref={href({ ...p, spanSelector: undefined, focus: undefined })}
          onWhole={() => set({ spanSelector: undefined, focus: undefined })}
        />
      )}
      {render.error !== null && <ErrorBox error={render.error} />}
      {render.data?.timeline && (
        <Timeline
          series={[{ label: app, color: "#ea580c", timeline: render.data.timeline }]}
          from={render.data.metadata.startTime ?? resolveTime(from)}
          until={render.data.metadata.endTime ?? resolveTime(until)}
          units={units}
          onSelect={(f, u) => set({ from: String(f), until: String(u) })}
        />
      )}
      <div class="toolbar">
        <span role="tablist" aria-label="Views of the profile" class="tabs">
          {TABS.map((t) => (
            <button
              type="button"
              role="tab"
              key={t.id}
              aria-selected={tab === t.id}
              data-testid={`tab-${t.id}`}
              onClick={() => set({ tab: t.id === "both" ? undefined : t.id })}
            >
              {t.label}
            </button>
          ))}
        </span>
        <input
          type="search"
          class="search"
          placeholder="Search frames  ( / )"
          aria-label="Search frames"
          data-testid="search"
          value={p.search ?? ""}
          onInput={(e) => set({ search: e.currentTarget.value }, false)}
        />
        <label for="max-nodes" class="muted">
          Detail
        </label>
        <select
          id="max-nodes"
          data-testid="max-nodes"
          title="Frames kept before the smallest are folded into “other”"
          value={maxNodes ?? ""}
          onChange={(e) => set({ maxNodes: e.currentTarget.value })}
        >
          <option value="1024">1 024 frames</option>
          <option value="">8 192 frames (server default)</option>
          <option value="65536">65 536 frames</option>
          <option value="0">all frames</option>
          {maxNodes && !["1024", "65536", "0"].includes(maxNodes) && <option value={maxNodes}>{maxNodes} frames</option>}
        </select>
        {render.loading && <span class="muted">loading…</span>}
        {model && (
          <span class="muted" data-testid="summary">
            {model.count.toLocaleString("en-US")} frames
            {render.data?.metadata.sampleRate ? `, ${render.data.metadata.sampleRate} Hz` : ""}
            {render.data?.metadata.units ? `, ${render.data.metadata.units}` : ""}
          </span>
        )}
      </div>
      {model && model.numTicks === 0 && !render.loading && (
        <div class="empty" data-testid="no-samples">
          {spans.length > 0 ? (
            <p>
              <strong>No samples of {spans.length === 1 ? "this span" : "these spans"} in {query} in this range.</strong>{" "}
              A span has samples only if the profiler caught it running (short spans often have none), and only its root
              span's id is on them; widen the time range or show the whole profile.
            </p>
          ) : (
            <p>
              <strong>No samples for {query} in this range.</strong> Widen the time range, remove a label filter, or pick
              another profile type.
            </p>
          )}
        </div>
      )}
      {model && model.numTicks > 0 && tab === "both" && (
        <div class="split">
          {table}
          {flame}
        </div>
      )}
      {model && model.numTicks > 0 && tab === "flame" && flame}
      {model && model.numTicks > 0 && tab === "table" && table}
      {model && model.numTicks > 0 && tab === "sandwich" && (
        <Sandwich
          fn={p.fn}
          sides={sides}
          units={units}
          search={search}
          table={
            <Table model={model} units={units} search={search} sort={sort} onSort={(key) => set({ sort: key }, false)} onPick={(fn) => set({ fn })} />
          }
        />
      )}
    </section>
  );
}

/** The span ids of a `spanSelector` parameter: comma-separated, blanks ignored. */
function spanIds(param: string | undefined): string[] {
  return (param ?? "")
    .split(",")
    .map((id) => id.trim())
    .filter(Boolean);
}

/** Says that the view holds the samples of given spans only, with the way back to the whole profile. */
function SpanBanner(props: { spans: string[]; wholeHref: string; onWhole: () => void }) {
  const shown = props.spans.slice(0, 3);
  return (
    <div class="span-banner" role="status" data-testid="span-banner">
      <span>
        <strong>Span profile</strong>: only the samples that ran in {props.spans.length === 1 ? "span" : `${props.spans.length} spans`}{" "}
        {shown.map((id) => (
          <code key={id} data-testid="span-id">
            {id}
          </code>
        ))}
        {props.spans.length > shown.length && ` and ${props.spans.length - shown.length} more`}. The timeline shows the
        whole selection they ran in.
      </span>
      <a
        class="button"
        data-testid="span-whole"
        href={props.wholeHref}
        onClick={(e) => {
          e.preventDefault();
          props.onWhole();
        }}
      >
        Whole profile
      </a>
    </div>
  );
}

function Sandwich(props: {
  fn: string | undefined;
  sides: ReturnType<typeof sandwich> | null;
  units: Units;
  search: string;
  table: ComponentChildren;
}) {
  const [callerFocus, setCallerFocus] = useState<string[]>([]);
  const [calleeFocus, setCalleeFocus] = useState<string[]>([]);
  useEffect(() => {
    setCallerFocus([]);
    setCalleeFocus([]);
  }, [props.sides]);
  return (
    <div class="split" data-testid="sandwich">
      {props.table}
      <div>
        {!props.fn || !props.sides ? (
          <p class="empty">Pick a function in the table (or “Sandwich” on a flame-graph frame) to see its callers and callees.</p>
        ) : (
          <>
            <FlameGraph
              model={props.sides.callers}
              units={props.units}
              search={props.search}
              focus={callerFocus}
              onFocus={setCallerFocus}
              inverted
              label={`Callers of ${props.fn}`}
              testId="sandwich-callers"
            />
            <FlameGraph
              model={props.sides.callees}
              units={props.units}
              search={props.search}
              focus={calleeFocus}
              onFocus={setCalleeFocus}
              label={`Callees of ${props.fn}`}
              testId="sandwich-callees"
            />
          </>
        )}
      </div>
    </div>
  );
}

/**
 * The range of the same length just before `from`..`until`, relative (`now-2h`..`now-1h` as
 * `now-7200s`) when the range is, so that the diff link keeps following "now".
 */
function previousPeriod(from: string, until: string): { from: string } | null {
  const a = resolveTime(from);
  const b = resolveTime(until);
  if (!Number.isFinite(a) || !Number.isFinite(b) || b <= a) return null;
  const span = Math.round(b - a);
  if (/^now-\d+[A-Za-z]+$/.test(from) && (until === "now" || until === "")) return { from: `now-${2 * span}s` };
  return { from: String(Math.floor(a) - span) };
}
