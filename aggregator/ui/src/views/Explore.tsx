// The label explorer: one profile type broken down by a label's values over time (`groupBy`),
// with each value's total and share; clicking a value opens the single view filtered to it.

import { useMemo } from "preact/hooks";
import { type App, api } from "../api";
import { Timeline } from "../components/Timeline";
import { AppPicker, ErrorBox, LabelFilter, TimeRange } from "../components/controls";
import { type Units, formatPercent, formatValue } from "../format";
import { useLoad } from "../hooks";
import { buildSelector, parseSelector, resolveTime } from "../query";
import { type Params, href, navigate } from "../url";

const COLORS = ["#ea580c", "#2563eb", "#16a34a", "#9333ea", "#db2777", "#0891b2", "#ca8a04", "#4b5563", "#dc2626", "#0d9488"];

/** The key of the group of series without the label. */
const OTHERS = "*";

export function Explore(props: { params: Params; apps: App[]; refresh: number }) {
  const p = props.params;
  const query = p.query ?? "";
  const from = p.from || "now-1h";
  const until = p.until || "now";
  const app = parseSelector(query).app;

  const names = useLoad(app ? JSON.stringify([app, from, until, props.refresh]) : null, () =>
    api.labelNames(`${app}{}`, from, until),
  );
  const labels = (names.data ?? []).filter((n) => n !== "__name__");
  const groupBy = p.groupBy || labels[0] || "";
  const render = useLoad(query && groupBy ? JSON.stringify([query, from, until, groupBy, props.refresh]) : null, (signal) =>
    api.render({ query, from, until, groupBy, maxNodes: "1" }, signal),
  );
  const units: Units = render.data
    ? { units: render.data.metadata.units, sampleRate: render.data.metadata.sampleRate }
    : { units: "", sampleRate: 0 };

  const rows = useMemo(() => {
    const groups = render.data?.groups ?? {};
    const list = Object.entries(groups)
      .map(([value, timeline]) => ({ value, timeline, total: timeline.samples.reduce((a, b) => a + b, 0) }))
      .filter((r) => r.value !== OTHERS || r.total > 0)
      .sort((a, b) => b.total - a.total || a.value.localeCompare(b.value));
    return list.map((r, i) => ({ ...r, color: COLORS[i % COLORS.length] }));
  }, [render.data]);
  const sum = rows.reduce((a, r) => a + r.total, 0);

  const set = (patch: Record<string, string | undefined>, push = true) => navigate(patch, push);
  const filtered = (value: string) => {
    const s = parseSelector(query);
    const matchers = s.matchers.filter((m) => m.name !== groupBy);
    // Series without the label have the empty value (README, selectors).
    matchers.push({ name: groupBy, op: "=", value: value === OTHERS ? "" : value });
    return buildSelector({ app: s.app, matchers });
  };

  return (
    <section aria-label="Label explorer">
      <div class="toolbar">
        <AppPicker apps={props.apps} query={query} onChange={(q) => set({ query: q })} />
        <TimeRange from={from} until={until} onChange={(f, u) => set({ from: f, until: u })} />
        <label for="group-by">Break down by</label>
        <select id="group-by" data-testid="group-by" value={groupBy} onChange={(e) => set({ groupBy: e.currentTarget.value })}>
          {labels.map((l) => (
            <option key={l} value={l}>
              {l}
            </option>
          ))}
        </select>
      </div>
      <LabelFilter query={query} from={from} until={until} onChange={(q) => set({ query: q })} />
      {names.error !== null && <ErrorBox error={names.error} />}
      {render.error !== null && <ErrorBox error={render.error} />}
      {names.data && labels.length === 0 && (
        <p class="empty" data-testid="no-labels">
          {app} has no labels to break down by in this range. Labels come from the ingest name (
          <code>{app}{"{env=prod}"}</code>), pprof sample labels, or the agent (<code>hostname</code>, <code>service_name</code>).
        </p>
      )}
      {render.data && (
        <>
          <Timeline
            series={rows.map((r) => ({ label: r.value, color: r.color, timeline: r.timeline }))}
            from={render.data.metadata.startTime ?? resolveTime(from)}
            until={render.data.metadata.endTime ?? resolveTime(until)}
            units={units}
            onSelect={(f, u) => set({ from: String(f), until: String(u) })}
          />
          <table class="top-table" data-testid="explore-table">
            <thead>
              <tr>
                <th>{groupBy}</th>
                <th>Total</th>
                <th>Share</th>
                <th title="Total divided by the seconds in the range">Average per second</th>
              </tr>
            </thead>
            <tbody>
              {rows.map((r) => {
                const seconds = Math.max(1, (render.data!.metadata.endTime ?? 0) - (render.data!.metadata.startTime ?? 0));
                return (
                  <tr key={r.value}>
                    <td>
                      <span class="swatch" style={{ background: r.color }} />
                      <a
                        href={href({ query: filtered(r.value), from, until })}
                        onClick={(e) => {
                          e.preventDefault();
                          navigate({ view: undefined, query: filtered(r.value), groupBy: undefined });
                        }}
                      >
                        {r.value === OTHERS ? "(no value)" : r.value || "(empty)"}
                      </a>
                    </td>
                    <td class="num">{formatValue(r.total, units)}</td>
                    <td class="num">{formatPercent(r.total, sum)}</td>
                    <td class="num">{formatValue(r.total / seconds, units)}</td>
                  </tr>
                );
              })}
              {rows.length === 0 && (
                <tr>
                  <td colSpan={4} class="muted">
                    No samples in this range.
                  </td>
                </tr>
              )}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}
