//! The web UI's sign-in: a session per sign-in, named by a random id in an `HttpOnly`,
//! `SameSite=Strict` cookie (named after the listener's port, [`cookie_name`], since browsers
//! share a host's cookies between its ports), with a CSRF token the page sends back in
//! [`CSRF_HEADER`] on every request that changes something. Sessions live in memory (a restart signs everyone out), are
//! bounded in number, expire after `auth.session-ttl`, and end with their credential: a
//! credential removed from its file ends its sessions at the next request.
//!
//! Sans IO: times come in as arguments, ids from the caller's random source.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::credentials::{Hash, Key};
use sha2::{Digest, Sha256};

/// The session cookie's name for the HTTP listener on `port`: two aggregators on one host have
/// their own.
pub(crate) fn cookie_name(port: u16) -> String {
    format!("smolder_session_{port}")
}
/// The header a signed-in page sends its CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";
/// The most sessions kept; past it, the one closest to expiring goes.
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// A signed-in session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    /// The credential it was opened with.
    pub(crate) credential: Key,
    /// The token the page must send back with every change.
    pub(crate) csrf: String,
    /// When it ends.
    pub(crate) expires: Instant,
}

/// Every open session, by the hash of its id (the id itself is only in the cookie).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: HashMap<Hash, Session>,
}

fn hash(id: &str) -> Hash {
    Sha256::digest(id.as_bytes()).into()
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// Opens a session for `credential` until `now + ttl`, with `id` (the cookie's value) and
    /// `csrf`, both random; closes expired ones, and the one expiring first when full.
    pub(crate) fn open(
        &mut self,
        credential: Key,
        id: &str,
        csrf: String,
        now: Instant,
        ttl: Duration,
    ) {
        self.open.retain(|_, s| s.expires > now);
        if self.open.len() >= MAX_SESSIONS
            && let Some(first) = self
                .open
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| *k)
        {
            self.open.remove(&first);
        }
        self.open.insert(
            hash(id),
            Session {
                credential,
                csrf,
                expires: now + ttl,
            },
        );
    }

    /// The session of cookie value `id`, unless it expired.
    pub(crate) fn get(&self, id: &str, now: Instant) -> Option<&Session> {
        self.open.get(&hash(id)).filter(|s| s.expires > now)
    }

    /// Closes the session of `id`.
    pub(crate) fn close(&mut self, id: &str) {
        self.open.remove(&hash(id));
    }

    /// How many are open (expired ones included until the next sign-in sweeps them).
    pub(crate) fn len(&self) -> usize {
        self.open.len()
    }
}

/// The value of cookie `name` in a `Cookie` header's value, if there is one.
pub(crate) fn cookie_value<'h>(header: &'h str, name: &str) -> Option<&'h str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(cookie, _)| *cookie == name)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// The `Set-Cookie` value that opens a session: no `Path`, so that the browser scopes it to the
/// directory of the sign-in URL (`/login` under a proxy's `/smolder/` prefix is
/// `/smolder/login`, so the cookie's path is `/smolder`); `Secure` when the page came over
/// HTTPS.
pub(crate) fn set_cookie(name: &str, id: &str, ttl: Duration, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{name}={id}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        ttl.as_secs()
    )
}

/// The `Set-Cookie` value that ends one.
pub(crate) fn clear_cookie(name: &str) -> String {
    format!("{name}=; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn a_cookie_is_found_among_any_others(
            others in proptest::collection::vec(("[a-z_]{1,12}", "[!#-+.-:<-~]{0,20}"), 0..6),
            value in "[!#-+.-:<-~]{1,40}",
            at in 0usize..6,
        ) {
            let name = cookie_name(4040);
            let mut pairs: Vec<String> = others
                .iter()
                .filter(|(other, _)| *other != name)
                .map(|(other, v)| format!("{other}={v}"))
                .collect();
            pairs.insert(at.min(pairs.len()), format!("{name}={value}"));
            let header = pairs.join("; ");
            proptest::prop_assert_eq!(cookie_value(&header, &name), Some(value.as_str()));
        }

        #[test]
        fn any_cookie_header_is_answered(header in "\\PC{0,300}", name in "\\PC{0,20}") {
            if let Some(found) = cookie_value(&header, &name) {
                proptest::prop_assert!(header.contains(found) && !found.is_empty());
            }
        }
    }

    #[test]
    fn sessions_expire_and_are_bounded() {
        let mut sessions = Sessions::default();
        let now = Instant::now();
        let ttl = Duration::from_secs(60);
        sessions.open([1; 32], "id-a", "csrf-a".into(), now, ttl);
        assert_eq!(sessions.get("id-a", now).unwrap().csrf, "csrf-a");
        assert!(sessions.get("id-b", now).is_none());
        assert!(sessions.get("id-a", now + ttl).is_none(), "expired");
        sessions.close("id-a");
        assert!(sessions.get("id-a", now).is_none());
        for i in 0..MAX_SESSIONS + 5 {
            let at = now + Duration::from_millis(i as u64);
            sessions.open([2; 32], &format!("id-{i}"), String::new(), at, ttl);
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);
        assert!(sessions.get("id-0", now).is_none(), "the oldest went first");
        let last = format!("id-{}", MAX_SESSIONS + 4);
        assert!(sessions.get(&last, now).is_some());
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let name = cookie_name(4040);
        assert_eq!(
            cookie_value("a=1; smolder_session_4040=abc ; b=2", &name),
            Some("abc")
        );
        assert_eq!(cookie_value("smolder_session_4041=abc", &name), None);
        assert_eq!(cookie_value("a=1", &name), None);
        assert_eq!(cookie_value("smolder_session_4040=", &name), None);
        let set = set_cookie(&name, "abc", Duration::from_secs(3600), true);
        assert_eq!(
            set,
            "smolder_session_4040=abc; HttpOnly; SameSite=Strict; Max-Age=3600; Secure"
        );
        assert!(
            !set.contains("Path"),
            "scoped to the sign-in URL's directory"
        );
    }
}
