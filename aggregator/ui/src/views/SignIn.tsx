// Signing in: a token (what Pyroscope's SDKs call authToken) or a user and password (basic auth),
// checked by the aggregator, which answers with a session cookie.

import { useState } from "preact/hooks";
import { ApiError, type Session, api } from "../api";

export function SignIn(props: { onSignedIn: (session: Session) => void; why?: string }) {
  const [mode, setMode] = useState<"token" | "password">("token");
  const [token, setToken] = useState("");
  const [user, setUser] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const session = await api.login(mode === "token" ? { token } : { user, password });
      props.onSignedIn(session);
    } catch (err) {
      setError(err instanceof ApiError ? err.message : String(err));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section class="sign-in" data-testid="sign-in">
      <h1>Sign in</h1>
      <p class="muted">{props.why ?? "This aggregator needs a credential with the read scope (auth.credentials)."}</p>
      <div class="tabs" role="tablist">
        <button type="button" role="tab" aria-selected={mode === "token"} onClick={() => setMode("token")} data-testid="sign-in-token-tab">
          Token
        </button>
        <button type="button" role="tab" aria-selected={mode === "password"} onClick={() => setMode("password")} data-testid="sign-in-password-tab">
          User and password
        </button>
      </div>
      <form onSubmit={submit}>
        {mode === "token" ? (
          <label>
            Token
            <input type="password" autocomplete="current-password" value={token} onInput={(e) => setToken(e.currentTarget.value)} data-testid="sign-in-token" required />
          </label>
        ) : (
          <>
            <label>
              User
              <input autocomplete="username" value={user} onInput={(e) => setUser(e.currentTarget.value)} data-testid="sign-in-user" required />
            </label>
            <label>
              Password
              <input type="password" autocomplete="current-password" value={password} onInput={(e) => setPassword(e.currentTarget.value)} data-testid="sign-in-password" required />
            </label>
          </>
        )}
        <button type="submit" disabled={busy} data-testid="sign-in-submit">
          Sign in
        </button>
      </form>
      {error && (
        <div class="error" role="alert" data-testid="sign-in-error">
          {error}
        </div>
      )}
    </section>
  );
}
