//! Prometheus' HTTP client settings, as a scrape job and an HTTP discovery config both write
//! them inline: basic auth, an `Authorization` header, a bearer token (or its file), TLS and
//! redirects, read into [`ClientSettings`] for the [`Fetcher`](super::fetch::Fetcher), and
//! [`check`]ed when the config loads.
//!
//! The keys are declared in each config type (`ScrapeConfig`, `HttpSdConfig`) rather than in a
//! struct flattened into both: serde's `flatten` reads a buffered value, so `password: 0123`
//! would become the number 123 (or fail as a number where a string is expected).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::fetch::ClientSettings;

/// HTTP basic authentication.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BasicAuth {
    /// The user name.
    pub username: String,
    /// The password.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password, read at every request.
    #[serde(default, alias = "password_file")]
    pub password_file: Option<PathBuf>,
}

/// An `Authorization: <type> <credentials>` header.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Authorization {
    /// The scheme. Default `Bearer`.
    #[serde(default = "default_auth_type", rename = "type")]
    pub kind: String,
    /// The credentials.
    #[serde(default)]
    pub credentials: Option<String>,
    /// A file holding the credentials, read at every request.
    #[serde(default, alias = "credentials_file")]
    pub credentials_file: Option<PathBuf>,
}

/// TLS settings for `https` targets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct TlsConfig {
    /// PEM file of the CAs that sign the targets' certificates, instead of the system's.
    #[serde(alias = "ca_file", skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for targets that require one.
    #[serde(alias = "cert_file", skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[serde(alias = "key_file", skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// Accept any certificate, for targets with self-signed ones. Default false.
    #[serde(alias = "insecure_skip_verify")]
    pub insecure_skip_verify: bool,
}

fn default_auth_type() -> String {
    "Bearer".to_owned()
}

/// Checks that `settings` do not contradict each other: at most one way to authenticate, at
/// most one source of each secret, a client certificate with its key.
///
/// # Errors
///
/// What contradicts what, naming the keys as written in the config.
pub(crate) fn check(settings: &ClientSettings<'_>) -> Result<(), String> {
    let ClientSettings {
        basic_auth: basic,
        authorization,
        bearer_token: bearer,
        bearer_token_file: bearer_file,
        tls,
        ..
    } = settings;
    let set = [
        basic.is_some(),
        authorization.is_some(),
        bearer.is_some() || bearer_file.is_some(),
    ];
    if set.iter().filter(|s| **s).count() > 1 {
        return Err(
            "at most one of basic-auth, authorization and bearer-token(-file) may be set"
                .to_owned(),
        );
    }
    if bearer.is_some() && bearer_file.is_some() {
        return Err("at most one of bearer-token and bearer-token-file may be set".to_owned());
    }
    if let Some(basic) = basic
        && basic.password.is_some()
        && basic.password_file.is_some()
    {
        return Err("basic-auth: at most one of password and password-file".to_owned());
    }
    if let Some(auth) = authorization {
        if auth.credentials.is_some() && auth.credentials_file.is_some() {
            return Err(
                "authorization: at most one of credentials and credentials-file".to_owned(),
            );
        }
        if auth.kind.eq_ignore_ascii_case("basic") {
            return Err("authorization: type basic is written as basic-auth".to_owned());
        }
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err("tls-config: cert-file and key-file go together".to_owned());
    }
    Ok(())
}
