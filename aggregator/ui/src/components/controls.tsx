// The pickers every view shares: service and profile type, label filter, time range; and the
// boxes for errors, empty states and the diff legend.

import { useEffect, useState } from "preact/hooks";
import { type App, ApiError, api } from "../api";
import { formatTime } from "../format";
import {
  type Matcher,
  type Op,
  PRESETS,
  buildSelector,
  parseSelector,
  resolveTime,
  splitApp,
} from "../query";

/** Picks the service, then one of its profile types; answers the new query. */
export function AppPicker(props: { apps: App[]; query: string; onChange: (query: string) => void; id?: string }) {
  const selector = parseSelector(props.query);
  const { service, type } = splitApp(selector.app);
  const services = [...new Set(props.apps.map((a) => splitApp(a.name).service))].sort();
  const types = props.apps
    .map((a) => splitApp(a.name))
    .filter((a) => a.service === service)
    .map((a) => a.type)
    .sort();
  const id = props.id ?? "app";
  const pick = (nextService: string, nextType: string) => {
    const available = props.apps.map((a) => splitApp(a.name)).filter((a) => a.service === nextService);
    const chosen = available.find((a) => a.type === nextType) ?? available.find((a) => a.type === "cpu") ?? available[0];
    if (!chosen) return;
    const app = chosen.type ? `${chosen.service}.${chosen.type}` : chosen.service;
    // Label filters carry over between types of the same service.
    props.onChange(buildSelector({ app, matchers: nextService === service ? selector.matchers : [] }));
  };
  return (
    <span class="picker">
      <label for={`${id}-service`}>Service</label>
      <select id={`${id}-service`} data-testid={`${id}-service`} value={service} onChange={(e) => pick(e.currentTarget.value, type)}>
        {!services.includes(service) && <option value={service}>{service || "—"}</option>}
        {services.map((s) => (
          <option key={s} value={s}>
            {s}
          </option>
        ))}
      </select>
      <label for={`${id}-type`}>Profile type</label>
      <select id={`${id}-type`} data-testid={`${id}-type`} value={type} onChange={(e) => pick(service, e.currentTarget.value)}>
        {!types.includes(type) && <option value={type}>{type || "—"}</option>}
        {types.map((t) => (
          <option key={t} value={t}>
            {t}
          </option>
        ))}
      </select>
    </span>
  );
}

const OPS: Op[] = ["=", "!=", "=~", "!~"];

/** The label matchers of a query: chips to remove, and a form to add one from known names and values. */
export function LabelFilter(props: { query: string; from: string; until: string; onChange: (query: string) => void; id?: string }) {
  const selector = parseSelector(props.query);
  const [names, setNames] = useState<string[]>([]);
  const [values, setValues] = useState<string[]>([]);
  const [name, setName] = useState("");
  const [op, setOp] = useState<Op>("=");
  const [value, setValue] = useState("");
  const [error, setError] = useState<string | null>(null);
  const id = props.id ?? "filter";

  useEffect(() => {
    if (!selector.app) return;
    api
      .labelNames(`${selector.app}{}`, props.from, props.until)
      .then((n) => {
        const usable = n.filter((l) => l !== "__name__");
        setNames(usable);
        setError(null);
        if (!usable.includes(name)) setName(usable[0] ?? "");
      })
      .catch((e: unknown) => setError(String((e as Error).message)));
  }, [selector.app, props.from, props.until]);

  useEffect(() => {
    if (!name) {
      setValues([]);
      return;
    }
    api
      .labelValues(name, `${selector.app}{}`, props.from, props.until)
      .then((v) => {
        setValues(v);
        setValue((current) => (v.includes(current) ? current : (v[0] ?? "")));
      })
      .catch((e: unknown) => setError(String((e as Error).message)));
  }, [name, selector.app, props.from, props.until]);

  const update = (matchers: Matcher[]) => props.onChange(buildSelector({ app: selector.app, matchers }));

  return (
    <div class="label-filter" data-testid={id}>
      <span class="muted">Labels</span>
      {selector.matchers.map((m, i) => (
        <span class="chip" key={`${m.name}${m.op}${m.value}`}>
          {m.name}
          {m.op}
          {`"${m.value}"`}
          <button
            type="button"
            aria-label={`Remove filter ${m.name}${m.op}${m.value}`}
            onClick={() => update(selector.matchers.filter((_, j) => j !== i))}
          >
            ×
          </button>
        </span>
      ))}
      {names.length === 0 ? (
        <span class="muted">{selector.app ? "this service has no labels" : ""}</span>
      ) : (
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            if (name) update([...selector.matchers.filter((m) => m.name !== name || m.op !== op), { name, op, value }]);
          }}
        >
          <select aria-label="Label name" data-testid={`${id}-name`} value={name} onChange={(e) => setName(e.currentTarget.value)}>
            {names.map((n) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
          </select>
          <select aria-label="Operator" value={op} onChange={(e) => setOp(e.currentTarget.value as Op)}>
            {OPS.map((o) => (
              <option key={o} value={o}>
                {o}
              </option>
            ))}
          </select>
          {op === "=" || op === "!=" ? (
            <select aria-label="Label value" data-testid={`${id}-value`} value={value} onChange={(e) => setValue(e.currentTarget.value)}>
              {values.map((v) => (
                <option key={v} value={v}>
                  {v || "(empty)"}
                </option>
              ))}
            </select>
          ) : (
            <input aria-label="Regular expression" placeholder="regex, anchored" value={value} onInput={(e) => setValue(e.currentTarget.value)} />
          )}
          <button type="submit" data-testid={`${id}-add`}>
            Add filter
          </button>
        </form>
      )}
      {error && <span class="error-inline">{error}</span>}
    </div>
  );
}

function toLocalInput(unix: number): string {
  if (!Number.isFinite(unix)) return "";
  const d = new Date(unix * 1000);
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** Presets, and a custom range in local time. */
export function TimeRange(props: { from: string; until: string; onChange: (from: string, until: string) => void; id?: string }) {
  const [custom, setCustom] = useState(false);
  const [start, setStart] = useState(toLocalInput(resolveTime(props.from)));
  const [end, setEnd] = useState(toLocalInput(resolveTime(props.until)));
  const [error, setError] = useState<string | null>(null);
  const id = props.id ?? "range";
  const preset = PRESETS.find((p) => p.from === props.from && (props.until === "now" || props.until === ""));
  useEffect(() => {
    setStart(toLocalInput(resolveTime(props.from)));
    setEnd(toLocalInput(resolveTime(props.until)));
  }, [props.from, props.until]);
  return (
    <span class="time-range" data-testid={id}>
      <label for={`${id}-preset`}>Time</label>
      <select
        id={`${id}-preset`}
        data-testid={`${id}-preset`}
        value={preset ? preset.from : "custom"}
        onChange={(e) => {
          const v = e.currentTarget.value;
          if (v === "custom") setCustom(true);
          else {
            setCustom(false);
            props.onChange(v, "now");
          }
        }}
      >
        {PRESETS.map((p) => (
          <option key={p.from} value={p.from}>
            Last {p.label}
          </option>
        ))}
        <option value="custom">{preset ? "Custom…" : rangeText(props.from, props.until)}</option>
      </select>
      {(custom || !preset) && (
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            const a = Math.floor(new Date(start).getTime() / 1000);
            const b = Math.floor(new Date(end).getTime() / 1000);
            if (!Number.isFinite(a) || !Number.isFinite(b)) setError("enter both a start and an end");
            else if (b <= a) setError("the end must be after the start");
            else {
              setError(null);
              setCustom(false);
              props.onChange(String(a), String(b));
            }
          }}
        >
          <input type="datetime-local" aria-label="From" data-testid={`${id}-from`} value={start} onInput={(e) => setStart(e.currentTarget.value)} />
          <span>to</span>
          <input type="datetime-local" aria-label="Until" data-testid={`${id}-until`} value={end} onInput={(e) => setEnd(e.currentTarget.value)} />
          <button type="submit" data-testid={`${id}-apply`}>
            Apply
          </button>
          {error && <span class="error-inline">{error}</span>}
        </form>
      )}
    </span>
  );
}

export function rangeText(from: string, until: string): string {
  const a = resolveTime(from);
  const b = resolveTime(until);
  if (!Number.isFinite(a) || !Number.isFinite(b)) return `${from} to ${until}`;
  return `${formatTime(a)} to ${formatTime(b)}`;
}

export function ErrorBox(props: { error: unknown }) {
  const e = props.error;
  const message = e instanceof ApiError || e instanceof Error ? e.message : String(e);
  return (
    <div class="error" role="alert" data-testid="error">
      <strong>The aggregator could not answer.</strong> {message}
    </div>
  );
}

/** What to do when the aggregator holds no profiles at all. */
export function NoData() {
  // Where this page is served from, prefix included: what SDKs and curl should talk to.
  const base = `${window.location.origin}${window.location.pathname.replace(/[^/]*$/, "")}`;
  return (
    <div class="empty" data-testid="no-data">
      <h2>No profiles yet</h2>
      <p>This aggregator has not received any profile. Point an agent or an SDK at it:</p>
      <ul>
        <li>
          <strong>Smolder agent</strong> on each host: it samples every process with eBPF and ships to this
          aggregator (QUIC port 4041).
        </li>
        <li>
          <strong>Pyroscope SDKs</strong> (Go, Python, Ruby, Java, .NET, Node.js, Rust): set the server address
          to <code>{base.replace(/\/$/, "")}</code>.
        </li>
        <li>
          <strong>By hand</strong>, a folded profile:
          <pre>{`printf 'main;handler;json.Marshal 37\\nmain;gc 5\\n' |
  curl -g --data-binary @- '${base}ingest?name=checkout.cpu{env=prod}&sampleRate=100'`}</pre>
        </li>
      </ul>
      <p>Then reload this page.</p>
    </div>
  );
}

export function DiffLegend(props: { mode: "relative" | "absolute"; onMode: (mode: "relative" | "absolute") => void }) {
  return (
    <div class="legend" data-testid="diff-legend">
      <span class="legend-scale">
        <span>shrank −100%</span>
        <span class="gradient" aria-hidden="true" />
        <span>grew +100%</span>
      </span>
      <span class="muted">
        {props.mode === "relative"
          ? "Colour: change of each frame's share of its side's total (baseline vs comparison). Grey: same share; green: smaller share; red: larger share or new."
          : "Colour: change of each frame's absolute value (baseline vs comparison), regardless of the totals. Grey: unchanged; green: less; red: more or new."}
      </span>
      <span class="toggle" role="group" aria-label="Diff colouring">
        <button type="button" aria-pressed={props.mode === "relative"} onClick={() => props.onMode("relative")} data-testid="color-relative">
          Share of total
        </button>
        <button type="button" aria-pressed={props.mode === "absolute"} onClick={() => props.onMode("absolute")} data-testid="color-absolute">
          Absolute
        </button>
      </span>
    </div>
  );
}
