//! Checks for `fuzz/`'s `credentials` target, built only under cargo-fuzz's `--cfg fuzzing`:
//! the credential-file and header parsers are private to this module, and their properties
//! need the set they build.

use std::path::Path;

use base64::Engine;

use super::credentials::{CredentialFile, CredentialSet, parse_file};
use super::{Authorization, authorization, session};

/// Reads `bytes` as a credential file and checks that it never panics, that a refusal never
/// shows a token or password of the file, and that every credential of an accepted file is
/// found again when presented as a client would present it.
///
/// # Panics
///
/// When one of these properties does not hold.
pub fn credential_file(bytes: &[u8], multitenancy: bool) {
    let parsed = parse_file(Path::new("credentials.yaml"), bytes, multitenancy);
    let specs = std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| serde_norway::from_str::<CredentialFile>(text).ok())
        .map(|file| file.credentials)
        .unwrap_or_default();
    let set = match parsed.and_then(CredentialSet::new) {
        Ok(set) => set,
        Err(err) => {
            let text = err.to_string();
            // What a refusal may show: the file's path, names, users and tenants. A secret that
            // is also one of them, or short enough to occur in them by chance, is not checked.
            let mut public = vec!["credentials.yaml"];
            for spec in &specs {
                public.push(&spec.name);
                public.extend(spec.user.as_deref());
                public.extend(spec.tenant.as_deref());
            }
            for spec in &specs {
                for secret in [&spec.token, &spec.password].into_iter().flatten() {
                    let secret = secret.expose();
                    let shown = secret.len() >= 8
                        && !public.iter().any(|p| p.contains(secret))
                        && text.contains(secret);
                    assert!(!shown, "a refusal shows a secret: {text}");
                }
            }
            return;
        }
    };
    for spec in &specs {
        let header = match (&spec.token, &spec.user, &spec.password) {
            (Some(token), _, _) => format!("Bearer {}", token.expose()),
            (None, Some(user), Some(password)) => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{}", password.expose()))
            ),
            _ => unreachable!("an accepted credential has a token or a user and password"),
        };
        let found = match authorization(&header) {
            Ok(Authorization::Bearer(token)) => set.token(token),
            Ok(Authorization::Basic { user, password }) => set.basic(&user, &password),
            Err(why) => panic!("credential {:?} cannot be presented: {why}", spec.name),
        };
        let found = found.unwrap_or_else(|| panic!("credential {:?} is not found", spec.name));
        assert_eq!(&*found.name, spec.name.trim());
    }
}

/// Reads `value` as an `Authorization` header and as a `Cookie` header, and checks that it
/// never panics and that Basic credentials it reads encode back to the same.
///
/// # Panics
///
/// When one of these properties does not hold.
pub fn headers(value: &str) {
    if let Ok(Authorization::Basic { user, password }) = authorization(value) {
        let again = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        assert_eq!(
            authorization(&again),
            Ok(Authorization::Basic { user, password })
        );
    }
    if let Some(found) = session::cookie_value(value, &session::cookie_name(4040)) {
        assert!(!found.contains(';') && !found.is_empty(), "{found:?}");
    }
}
