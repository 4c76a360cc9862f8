// The shell: signing in when the aggregator asks for it, navigation between the views, the list
// of apps every view picks from, and the default selection when the URL names none.

import { useEffect, useState } from "preact/hooks";
import { type App as AppInfo, type Session, UNAUTHENTICATED, api } from "./api";
import { ErrorBox, NoData } from "./components/controls";
import { useLoad } from "./hooks";
import { buildSelector, splitApp } from "./query";
import { type Params, href, navigate, useUrl } from "./url";
import { Compare } from "./views/Compare";
import { Explore } from "./views/Explore";
import { Rules } from "./views/Rules";
import { SignIn } from "./views/SignIn";
import { Single } from "./views/Single";

type ViewId = "single" | "compare" | "diff" | "explore" | "rules";

const VIEWS: { id: ViewId; label: string }[] = [
  { id: "single", label: "Single view" },
  { id: "compare", label: "Comparison" },
  { id: "diff", label: "Diff" },
  { id: "explore", label: "Label explorer" },
  { id: "rules", label: "Recording rules" },
];

/** The app shown when the URL names none: a CPU profile if there is one. */
function defaultQuery(apps: AppInfo[]): string {
  const app = apps.find((a) => splitApp(a.name).type === "cpu") ?? apps[0];
  return app ? buildSelector({ app: app.name, matchers: [] }) : "";
}

/** The parameters a view keeps when switching to another. */
function carried(params: Params, to: ViewId): Record<string, string | undefined> {
  const keep: Record<string, string | undefined> = { view: to === "single" ? undefined : to };
  for (const key of ["query", "from", "until", "search"]) keep[key] = params[key];
  if ((to === "compare" || to === "diff") && (params.view === "compare" || params.view === "diff")) {
    for (const key of ["leftQuery", "leftFrom", "leftUntil", "rightQuery", "rightFrom", "rightUntil", "color"]) keep[key] = params[key];
  }
  return keep;
}

export function App() {
  const [session, setSession] = useState<Session | null>(null);
  const [sessionError, setSessionError] = useState<unknown>(null);
  const [ended, setEnded] = useState(false);

  useEffect(() => {
    api.session().then(setSession, setSessionError);
    // A 401 anywhere means the sign-in is gone (expired, or its credential removed): ask again.
    const recheck = () =>
      api.session().then((s) => {
        if (!s.authenticated) setEnded(true);
        setSession(s);
      }, setSessionError);
    window.addEventListener(UNAUTHENTICATED, recheck);
    return () => window.removeEventListener(UNAUTHENTICATED, recheck);
  }, []);

  if (sessionError !== null) return <ErrorBox error={sessionError} />;
  if (session === null) return <p class="muted">loading…</p>;
  if (!session.authenticated)
    return (
      <SignIn
        why={ended ? "Your sign-in has ended; sign in again." : undefined}
        onSignedIn={(s) => {
          setEnded(false);
          setSession(s);
        }}
      />
    );
  return (
    <Shell
      session={session}
      onSignedOut={() => {
        api.logout().then(() => api.session().then(setSession, setSessionError), setSessionError);
      }}
    />
  );
}

function Shell(props: { session: Session; onSignedOut: () => void }) {
  const params = useUrl();
  const [refresh, setRefresh] = useState(0);
  const apps = useLoad(JSON.stringify([refresh]), () => api.apps());
  const tenant = useLoad(JSON.stringify([refresh]), () => api.tenant());
  const view = (VIEWS.some((v) => v.id === params.view) ? params.view : "single") as ViewId;

  useEffect(() => {
    if (!params.query && apps.data && apps.data.length > 0) navigate({ query: defaultQuery(apps.data) }, false);
  }, [params.query, apps.data]);

  useEffect(() => {
    const label = VIEWS.find((v) => v.id === view)?.label ?? "";
    const subject = view === "rules" ? "" : (params.query ?? "").replace(/\{\}$/, "");
    document.title = [subject, label, "Smolder"].filter(Boolean).join(" · ");
  }, [view, params.query]);

  useEffect(() => {
    const onKey = (event: KeyboardEvent) => {
      const target = event.target as HTMLElement;
      const typing = target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA";
      if (event.key === "/" && !typing) {
        const search = document.querySelector<HTMLInputElement>("input.search");
        if (search) {
          event.preventDefault();
          search.focus();
        }
      }
    };
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, []);

  let body;
  if (apps.error !== null) body = <ErrorBox error={apps.error} />;
  else if (!apps.data) body = <p class="muted">loading…</p>;
  else if (apps.data.length === 0 && view !== "rules") body = <NoData />;
  else if (view === "single") body = <Single params={params} apps={apps.data} refresh={refresh} />;
  else if (view === "compare" || view === "diff")
    body = <Compare params={params} apps={apps.data} refresh={refresh} diff={view === "diff"} />;
  else if (view === "explore") body = <Explore params={params} apps={apps.data} refresh={refresh} />;
  else body = <Rules params={params} refresh={refresh} />;

  return (
    <>
      <header>
        <a class="brand" href={window.location.pathname} aria-label="Smolder home">
          <span class="logo" aria-hidden="true" />
          Smolder
        </a>
        <nav aria-label="Views">
          {VIEWS.map((v) => (
            <a
              key={v.id}
              href={href(carried(params, v.id))}
              aria-current={view === v.id ? "page" : undefined}
              data-testid={`nav-${v.id}`}
              onClick={(e) => {
                e.preventDefault();
                const keep = carried(params, v.id);
                const cleared = Object.fromEntries(Object.keys(params).map((k) => [k, undefined]));
                navigate({ ...cleared, ...keep });
              }}
            >
              {v.label}
            </a>
          ))}
        </nav>
        {tenant.data && (
          <span class="tenant" data-testid="tenant" title="The tenant whose profiles this page shows">
            Tenant <strong>{tenant.data.tenant}</strong>
          </span>
        )}
        <button type="button" class="refresh" onClick={() => setRefresh((r) => r + 1)} title="Reload from the aggregator" data-testid="refresh">
          Refresh
        </button>
        {props.session.via === "session" && (
          <span class="user" data-testid="user">
            Signed in as <strong>{props.session.name}</strong>
            <button type="button" onClick={props.onSignedOut} data-testid="sign-out">
              Sign out
            </button>
          </span>
        )}
      </header>
      <main>{body}</main>
    </>
  );
}
