// Every view's state lives in the query string of `/`, so a copied link reproduces the view.
// `useUrl` reads it and writes it back (pushing history for navigation, replacing it for typing).

import { useEffect, useState } from "preact/hooks";

export type Params = Record<string, string>;

function read(): Params {
  return Object.fromEntries(new URLSearchParams(window.location.search));
}

const listeners = new Set<() => void>();

/** Replaces the given keys (an empty string or undefined removes a key). */
export function navigate(patch: Record<string, string | undefined>, push = true): void {
  const params = new URLSearchParams(window.location.search);
  for (const [key, value] of Object.entries(patch)) {
    if (value === undefined || value === "") params.delete(key);
    else params.set(key, value);
  }
  const search = params.toString();
  const url = `${window.location.pathname}${search ? `?${search}` : ""}`;
  if (url === `${window.location.pathname}${window.location.search}`) return;
  if (push) window.history.pushState(null, "", url);
  else window.history.replaceState(null, "", url);
  for (const listener of listeners) listener();
}

/** The current query string as a map, re-rendering on every change. */
export function useUrl(): Params {
  const [params, setParams] = useState(read);
  useEffect(() => {
    const update = () => setParams(read());
    listeners.add(update);
    window.addEventListener("popstate", update);
    return () => {
      listeners.delete(update);
      window.removeEventListener("popstate", update);
    };
  }, []);
  return params;
}

/** A link to the UI with exactly `params` (on the page's own path, whatever prefix it has). */
export function href(params: Record<string, string | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== "") search.set(key, value);
  }
  const s = search.toString();
  return `${window.location.pathname}${s ? `?${s}` : ""}`;
}
