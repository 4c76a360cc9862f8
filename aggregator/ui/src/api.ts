// The aggregator's public HTTP API, typed. Every failure becomes an ApiError whose message is
// what the aggregator said (its 4xx bodies name the problem), so views can show it in words.
//
// Paths are relative to the page, so the UI also works behind a reverse proxy that serves the
// aggregator under a prefix (`https://tools.example/smolder/`).

export interface Timeline {
  startTime: number;
  samples: number[];
  durationDelta: number;
}

export interface Metadata {
  format: "single" | "double";
  spyName: string;
  sampleRate: number;
  units: string;
  name: string;
  appName?: string;
  startTime?: number;
  endTime?: number;
  query?: string;
}

export interface Flamebearer {
  names: string[];
  levels: number[][];
  numTicks: number;
  maxSelf: number;
}

export interface RenderResponse {
  version: number;
  flamebearer: Flamebearer;
  metadata: Metadata;
  timeline: Timeline | null;
  groups?: Record<string, Timeline> | null;
  leftTicks?: number;
  rightTicks?: number;
}

export interface App {
  name: string;
  spyName: string;
  sampleRate: number;
  units: string;
}

/** A recording rule, as `/api/recording-rules` reads and writes it. */
export interface Rule {
  name: string;
  expr: string;
  node: string;
  function: string;
  group_by: string[];
  provisioned?: boolean;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly path: string,
    message: string,
  ) {
    super(message);
  }
}

/** Who the aggregator serves this page as: `GET /api/tenant`. */
export interface TenantInfo {
  /** The tenant whose data every answer holds; `anonymous` without multitenancy. */
  tenant: string;
}

async function request(path: string, init?: RequestInit): Promise<Response> {
  let response: Response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, path, `the aggregator did not answer /${path.split("?")[0]}: ${String(err)}`);
  }
  if (!response.ok) {
    const body = (await response.text()).trim();
    const reason = body || response.statusText || "no message";
    throw new ApiError(response.status, path, `${response.status} from /${path.split("?")[0]}: ${reason}`);
  }
  return response;
}

async function json<T>(path: string, init?: RequestInit): Promise<T> {
  return (await (await request(path, init)).json()) as T;
}

function qs(params: Record<string, string | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== "") search.set(key, value);
  }
  return search.toString();
}

export interface RenderParams {
  query: string;
  from: string;
  until: string;
  maxNodes?: string;
  groupBy?: string;
}

export function renderUrl(params: RenderParams & { format?: string }): string {
  return `render?${qs({ ...params })}`;
}

export const api = {
  apps: () => json<App[]>("api/apps"),
  labelNames: (query: string, from: string, until: string) =>
    json<string[]>(`labels?${qs({ query, from, until })}`),
  labelValues: (label: string, query: string, from: string, until: string) =>
    json<string[]>(`label-values?${qs({ label, query, from, until })}`),
  render: (params: RenderParams, signal?: AbortSignal) =>
    json<RenderResponse>(renderUrl(params), { signal }),
  renderDiff: (
    params: {
      leftQuery: string;
      leftFrom: string;
      leftUntil: string;
      rightQuery: string;
      rightFrom: string;
      rightUntil: string;
      maxNodes?: string;
    },
    signal?: AbortSignal,
  ) => json<RenderResponse>(`render-diff?${qs(params)}`, { signal }),
  tenant: () => json<TenantInfo>("api/tenant"),
  rules: () => json<{ rules: Rule[] }>("api/recording-rules"),
  createRule: (rule: Rule) =>
    json<Rule>("api/recording-rules", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(rule),
    }),
  deleteRule: async (name: string) => {
    await request(`api/recording-rules/${encodeURIComponent(name)}`, { method: "DELETE" });
  },
};
