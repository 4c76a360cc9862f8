// Loading API answers into views: the latest request wins, an older one in flight is aborted.

import { useEffect, useState } from "preact/hooks";

export interface Loaded<T> {
  data: T | null;
  error: unknown;
  loading: boolean;
}

/** Runs `load` whenever `key` changes; `key` null means nothing to load. */
export function useLoad<T>(key: string | null, load: (signal: AbortSignal) => Promise<T>): Loaded<T> {
  const [state, setState] = useState<Loaded<T>>({ data: null, error: null, loading: key !== null });
  useEffect(() => {
    if (key === null) {
      setState({ data: null, error: null, loading: false });
      return undefined;
    }
    const controller = new AbortController();
    setState((s) => ({ data: s.data, error: null, loading: true }));
    load(controller.signal).then(
      (data) => {
        if (!controller.signal.aborted) setState({ data, error: null, loading: false });
      },
      (error: unknown) => {
        if (!controller.signal.aborted) setState({ data: null, error, loading: false });
      },
    );
    return () => controller.abort();
  }, [key]);
  return state;
}
