// FlameQL selectors and time expressions as the UI builds and reads them. The aggregator is the
// judge of both: what it rejects comes back as an error in words.

export type Op = "=" | "!=" | "=~" | "!~";

export interface Matcher {
  name: string;
  op: Op;
  value: string;
}

export interface Selector {
  app: string;
  matchers: Matcher[];
}

const MATCHER = /^\s*([A-Za-z0-9_.]+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$/;

/** Reads `app{k="v", ...}`; matchers the UI cannot read are dropped (the text is kept as is). */
export function parseSelector(query: string): Selector {
  const open = query.indexOf("{");
  if (open < 0) return { app: query.trim(), matchers: [] };
  const app = query.slice(0, open).trim();
  const body = query.slice(open + 1, query.lastIndexOf("}") > open ? query.lastIndexOf("}") : undefined);
  const matchers: Matcher[] = [];
  // Split on commas outside quotes.
  let current = "";
  let quoted = false;
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (c === "\\" && quoted) {
      current += c + (body[i + 1] ?? "");
      i++;
      continue;
    }
    if (c === '"') quoted = !quoted;
    if (c === "," && !quoted) {
      pushMatcher(current, matchers);
      current = "";
    } else {
      current += c;
    }
  }
  pushMatcher(current, matchers);
  return { app, matchers };
}

function pushMatcher(text: string, into: Matcher[]): void {
  const m = MATCHER.exec(text);
  if (m) into.push({ name: m[1], op: m[2] as Op, value: m[3].replace(/\\(.)/g, "$1") });
}

export function buildSelector(s: Selector): string {
  const escape = (v: string) => v.replace(/\\/g, "\\\\").replace(/"/g, '\\"');
  const inner = s.matchers.map((m) => `${m.name}${m.op}"${escape(m.value)}"`).join(", ");
  return `${s.app}{${inner}}`;
}

/** `checkout.cpu` → service `checkout`, profile type `cpu`. */
export function splitApp(app: string): { service: string; type: string } {
  const dot = app.lastIndexOf(".");
  if (dot < 0) return { service: app, type: "" };
  return { service: app.slice(0, dot), type: app.slice(dot + 1) };
}

const UNITS: [string, number][] = [
  ["mon", 30 * 86400],
  ["min", 60],
  ["M", 30 * 86400],
  ["s", 1],
  ["m", 60],
  ["h", 3600],
  ["d", 86400],
  ["w", 7 * 86400],
  ["y", 365 * 86400],
];

/**
 * Unix seconds of a time expression as the aggregator reads it (`now`, `now-1h`, unix seconds
 * or milliseconds), or NaN when the UI cannot tell.
 */
export function resolveTime(expr: string, now = Date.now() / 1000): number {
  const text = expr.trim();
  if (text === "" || text === "now") return now;
  if (/^\d+$/.test(text)) {
    const n = Number(text);
    if (text.length === 13) return n / 1000;
    if (text.length === 16) return n / 1e6;
    if (text.length === 19) return n / 1e9;
    return n;
  }
  const m = /^(?:now)?([+-])(\d+)([A-Za-z]+)$/.exec(text);
  if (!m) return NaN;
  const unit = UNITS.find(([prefix]) => m[3].startsWith(prefix));
  if (!unit) return NaN;
  const offset = Number(m[2]) * unit[1];
  return m[1] === "-" ? now - offset : now + offset;
}

export const PRESETS: { label: string; from: string }[] = [
  { label: "5 min", from: "now-5m" },
  { label: "15 min", from: "now-15m" },
  { label: "1 hour", from: "now-1h" },
  { label: "6 hours", from: "now-6h" },
  { label: "24 hours", from: "now-24h" },
  { label: "7 days", from: "now-7d" },
  { label: "30 days", from: "now-30d" },
];
