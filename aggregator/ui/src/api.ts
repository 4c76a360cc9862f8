// The aggregator's public HTTP API, typed. Every failure becomes an ApiError whose message is
// what the aggregator said (its 4xx bodies name the problem), so views can show it in words.
//
// Paths are relative to the page, so the UI also works behind a reverse proxy that serves the
// aggregator under a prefix (`https://tools.example/smolder/`). That includes the sign-in: the
// session cookie `login` sets has no path of its own, so the browser scopes it to the page's
// directory under the proxy. A signed-in page sends the session's CSRF token with every change.

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

/** Who the aggregator serves this page as: `GET /api/session`, and `POST /login`'s answer. */
export interface Session {
  /** Whether the page may call the API: signed in, or served without credentials. */
  authenticated: boolean;
  /** Whether the aggregator has credentials configured, so that signing in means something. */
  signIn: boolean;
  name?: string;
  scopes: string[];
  tenant?: string;
  /** `session` (signed in here), `token`, `basic` or `loopback`. */
  via?: string;
  csrfToken?: string;
}

/** The header a signed-in page sends its CSRF token in. */
const CSRF_HEADER = "x-csrf-token";
let csrfToken: string | undefined;

/** Fired on `window` when the aggregator answers 401: the sign-in is gone or never was. */
export const UNAUTHENTICATED = "smolder-unauthenticated";

function remember(session: Session): Session {
  csrfToken = session.csrfToken;
  return session;
}

async function request(path: string, init?: RequestInit): Promise<Response> {
  let response: Response;
  const method = (init?.method ?? "GET").toUpperCase();
  if (csrfToken && method !== "GET" && method !== "HEAD") {
    const headers = new Headers(init?.headers);
    headers.set(CSRF_HEADER, csrfToken);
    init = { ...init, headers };
  }
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, path, `the aggregator did not answer /${path.split("?")[0]}: ${String(err)}`);
  }
  if (response.status === 401 && path !== "login") window.dispatchEvent(new Event(UNAUTHENTICATED));
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
  /** Span ids, comma-separated: only the samples that ran in those spans. */
  spanSelector?: string;
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
  session: async () => remember(await json<Session>("api/session")),
  /** Signs in with a token, or a user and password; opens a session (a cookie). */
  login: async (credentials: { token: string } | { user: string; password: string }) =>
    remember(
      await json<Session>("login", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(credentials),
      }),
    ),
  logout: async () => {
    await request("logout", { method: "POST" });
    csrfToken = undefined;
  },
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
