//! Auth: who a request is, and what it may do.
//!
//! Input: every HTTP request's `Authorization` header (`Bearer <token>`, or `Basic` with a user
//! and password: what Pyroscope's SDKs send as `authToken` or `basicAuthUser` and
//! `basicAuthPassword`), the web UI's session cookie, and the peer address; agents' hello
//! tokens over QUIC. Output: an [`Authentication`] on the request (and the credential's tenant,
//! [`Granted`](crate::tenant::Granted), for `tenant`'s extractor), which the [`Access`] of each
//! route ([`Routes`]) checks: 401 without a credential in force, 403 without the scope.
//! Callers: `app`, which builds [`Auth`] and installs [`layer`] around the router; every stage,
//! whose routes are [`Routes`] naming their access; QUIC ingest, which checks agents' tokens
//! with [`Auth::agent`]. Owns the credential files' reload task and the sessions.
//!
//! Credentials come from `auth.credentials`, from the files of `auth.credential-files` (read
//! again every second; one that changed replaces its credentials, one that no longer reads or
//! parses gives none until it does), and from the deprecated `ingest.quic.tokens` and
//! `tenant-tokens` (as `ingest` credentials). Each has scopes (`ingest`, `read`, `admin`,
//! which includes both) and optionally a tenant, which then wins over `X-Scope-OrgID` (a
//! different header is refused with 403). Secrets are kept hashed (SHA-256) and compared in
//! constant time ([`credentials`]); logs and metrics name credentials, never secrets.
//!
//! With no credentials configured (`auth.credentials` and `auth.credential-files` empty), only
//! clients on the aggregator's host are served without one (a loopback peer, and no
//! `Forwarded`, `X-Forwarded-For` or `X-Real-IP` header, which a proxy on this host would add
//! for a remote client; and no web page of another origin that a browser on this host sends:
//! `Host` names this host, and a change's `Origin` is the aggregator's own); others get 401
//! naming those keys. The first start then writes a
//! development admin token next to the development CA, `<data-dir>/tls/admin-token`
//! (`identity`; in object-storage mode the one every aggregator of the bucket shares), which
//! works from anywhere, as the development agent token does for QUIC.
//!
//! The web UI signs in with `POST /login` (a token, or a user and password, as JSON): the
//! answer sets a session cookie (`session.rs`) and carries a CSRF token the page sends with
//! every change; `POST /logout` ends it; `GET /api/session` says who the page is served as.
//! Depends on `tenant`, `api_error` and `metrics`.

mod credentials;
#[cfg(fuzzing)]
pub mod fuzzing;
mod routes;
mod session;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};
use serde::{Deserialize, Serialize};
use smolder_daemon::{Heartbeat, http::Peer};
use tracing::{debug, error, info, warn};

use crate::api_error::{Protocol, Refusal};
use crate::identity::{self, Token};
use crate::metrics::Refused;
use crate::tenant::{Granted, Tenant};
use smolder_daemon::metrics::{counter_vec, gauge, register};

pub(crate) use self::credentials::Key as CredentialKey;
use self::credentials::{Credential, CredentialSet, Key, Scopes, Source};
pub use self::credentials::{CredentialSpec, Scope, Secret};
pub(crate) use self::routes::Routes;
pub use self::routes::{Access, Route};
use self::session::{CSRF_HEADER, Sessions};

/// How often the credential files are read again: a credential removed from its file is
/// refused at most this long (plus a read) later.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// The largest sign-in body read.
const MAX_LOGIN_BYTES: usize = 4096;

/// Authentication of the HTTP API and of agents.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct AuthConfig {
    /// Credentials: each a `name`, a `token` (bearer) or a `user` and `password` (basic auth),
    /// `scopes` (`ingest`, `read`, `admin`) and an optional `tenant`. With none here and no
    /// `credential-files`, only clients on this host are served without credentials.
    /// Default none.
    pub credentials: Vec<CredentialSpec>,
    /// Files of credentials (YAML, `credentials:` and a list as above), read again every
    /// second: a credential added or removed takes effect within 2 s. Default none.
    pub credential_files: Vec<PathBuf>,
    /// Whether `/metrics` answers without credentials (else it needs `read`). Default `true`.
    pub open_metrics: bool,
    /// Whether `/healthz` and `/readyz` answer without credentials (else they need `read`).
    /// Default `true`.
    pub open_health: bool,
    /// How long a web UI sign-in lasts. Default `12h`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub session_ttl: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            credentials: Vec::new(),
            credential_files: Vec::new(),
            open_metrics: true,
            open_health: true,
            session_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

impl AuthConfig {
    /// Whether the config names any credentials of its own (the deprecated QUIC tokens aside).
    pub(crate) fn configured(&self) -> bool {
        !self.credentials.is_empty() || !self.credential_files.is_empty()
    }

    /// The access of `/metrics`.
    pub(crate) fn metrics_access(&self) -> Access {
        if self.open_metrics {
            Access::Open
        } else {
            Access::Scope(Scope::Read)
        }
    }

    /// The access of `/healthz` and `/readyz`.
    pub(crate) fn health_access(&self) -> Access {
        if self.open_health {
            Access::Open
        } else {
            Access::Scope(Scope::Read)
        }
    }

    /// Compiles the credentials of the config and its files, as [`Auth::start`] does; what
    /// `check-config` and every config load run (files only for `check-config`).
    ///
    /// # Errors
    ///
    /// An invalid credential or two with the same secret; with `files`, a file that cannot be
    /// read or parsed.
    pub(crate) fn check(
        &self,
        legacy: &[(String, Tenant)],
        multitenancy: bool,
        files: bool,
    ) -> anyhow::Result<()> {
        let mut list = self.inline(legacy, multitenancy)?;
        if files {
            for path in &self.credential_files {
                list.extend(credentials::read_file(path, multitenancy)?.1);
            }
        }
        CredentialSet::new(list)?;
        Ok(())
    }

    /// The credentials of `auth.credentials` and of the deprecated `legacy` QUIC tokens.
    fn inline(
        &self,
        legacy: &[(String, Tenant)],
        multitenancy: bool,
    ) -> Result<Vec<Credential>, credentials::CredentialError> {
        let mut list = Vec::new();
        for (i, spec) in self.credentials.iter().enumerate() {
            list.push(spec.compile(
                &format!("auth.credentials[{i}]"),
                Source::Config,
                multitenancy,
            )?);
        }
        for (i, (token, tenant)) in legacy.iter().enumerate() {
            list.push(Credential::token(
                &format!("ingest.quic token {i} of tenant {tenant}"),
                token,
                Scopes::of(&[Scope::Ingest]),
                Some(tenant.clone()),
                Source::Deprecated,
            ));
        }
        Ok(list)
    }
}

/// Who a request is, as [`layer`] found it.
#[derive(Clone, Debug)]
pub(crate) enum Authentication {
    /// A credential, a session or the loopback rule let it in.
    Principal(Principal),
    /// It presented nothing; `unconfigured` when no credentials are configured and the client
    /// is not on this host.
    Anonymous {
        /// No credentials are configured.
        unconfigured: bool,
    },
    /// It presented something that is not a credential in force; why, without the secret.
    Invalid(&'static str),
}

/// Who a request is served as.
#[derive(Clone, Debug)]
pub(crate) struct Principal {
    /// The credential's name.
    pub(crate) name: Arc<str>,
    /// What it may do.
    pub(crate) scopes: Scopes,
    /// The tenant it is limited to.
    pub(crate) tenant: Option<Tenant>,
    /// How the request showed it.
    pub(crate) via: Via,
}

/// How a request showed its credential.
#[derive(Clone, Debug)]
pub(crate) enum Via {
    /// `Authorization: Bearer`.
    Token,
    /// `Authorization: Basic`.
    Basic,
    /// The web UI's session cookie, whose changes must carry `csrf`.
    Session {
        /// The session's CSRF token.
        csrf: String,
    },
    /// No credentials are configured and the client is on this host.
    Loopback,
}

impl Via {
    fn name(&self) -> &'static str {
        match self {
            Via::Token => "token",
            Via::Basic => "basic",
            Via::Session { .. } => "session",
            Via::Loopback => "loopback",
        }
    }
}

/// A refusal of the auth layers, marked so that [`layer`] counts it under `reason`.
fn refused(refusal: Refusal, reason: &'static str) -> Response {
    let mut response = refusal.into_response();
    response.extensions_mut().insert(AuthRefused(reason));
    response
}

/// Marks a response the auth layers refused, with the `reason` label it counts under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AuthRefused(pub(crate) &'static str);

/// Auth's metrics.
#[derive(Clone)]
struct AuthMetrics {
    /// `smolder_aggregator_auth_credentials{source}`.
    credentials: IntGaugeVec,
    /// `smolder_aggregator_auth_reloads_total{outcome}`.
    reloads: IntCounterVec,
    /// `smolder_aggregator_auth_sessions`.
    sessions: IntGauge,
    /// `smolder_aggregator_refused_total{stage="auth"}`.
    refused: Refused,
}

impl AuthMetrics {
    fn new(registry: &Registry, refused: Refused) -> AuthMetrics {
        AuthMetrics {
            credentials: register(
                registry,
                IntGaugeVec::new(
                    prometheus::Opts::new(
                        "smolder_aggregator_auth_credentials",
                        "Credentials in force, by source (config, file, deprecated, development).",
                    ),
                    &["source"],
                )
                .expect("valid metric"),
            ),
            reloads: counter_vec(
                registry,
                "smolder_aggregator_auth_reloads_total",
                "Credential files read again because they changed, by outcome (loaded, failed).",
                &["outcome"],
            ),
            sessions: gauge(
                registry,
                "smolder_aggregator_auth_sessions",
                "Web UI sessions open (expired ones until the next sign-in sweeps them).",
            ),
            refused,
        }
    }
}

/// A credential file as last read.
struct File {
    path: PathBuf,
    /// Its bytes when last read; `None` when it did not read.
    bytes: Option<Vec<u8>>,
    /// What it gave: nothing when it did not read or parse.
    credentials: Vec<Credential>,
}

/// What [`Auth::start`] needs besides its config.
#[derive(Clone, Copy)]
pub(crate) struct Setup<'a> {
    /// The deprecated `ingest.quic.tokens` and `tenant-tokens`, with their tenants.
    pub(crate) legacy: &'a [(String, Tenant)],
    /// `tenant.multitenancy-enabled`.
    pub(crate) multitenancy: bool,
    /// Where the development tokens go, under `tls/`.
    pub(crate) data_dir: &'a Path,
    /// Whether agents may need the development agent token (no `ingest.quic.client-ca`).
    pub(crate) agent_token: bool,
    /// The HTTP listener's port, which names the session cookie.
    pub(crate) http_port: u16,
}

impl Setup<'_> {
    /// Which development tokens an aggregator of `config` uses: (admin, agent). Without
    /// credentials configured, the admin token; and, without deprecated tokens and with agents
    /// that may need a token, the agent token.
    pub(crate) fn development_tokens(&self, config: &AuthConfig) -> (bool, bool) {
        let admin = !config.configured();
        (admin, admin && self.legacy.is_empty() && self.agent_token)
    }
}

/// The credentials in force and what they came from; the UI's sessions.
pub(crate) struct Auth {
    config: AuthConfig,
    multitenancy: bool,
    /// `auth.credentials`, the deprecated tokens and the development tokens, which do not
    /// change while running.
    fixed: Vec<Credential>,
    /// The credential files, as last read. Held by the reload task while it reads them.
    files: Mutex<Vec<File>>,
    /// What requests are checked against; replaced whole on a reload.
    set: RwLock<Arc<CredentialSet>>,
    /// Held for a session lookup or change, never across I/O.
    sessions: Mutex<Sessions>,
    /// The session cookie's name.
    cookie: String,
    metrics: AuthMetrics,
}

impl Auth {
    /// Compiles the credentials of `config`, reads its credential files, and, with no
    /// credentials configured, makes the development tokens under `setup.data_dir`.
    ///
    /// # Errors
    ///
    /// An invalid credential, a credential file that cannot be read or parsed at start, or a
    /// development token that cannot be written.
    pub(crate) fn start(
        config: AuthConfig,
        setup: &Setup<'_>,
        registry: &Registry,
        refused: Refused,
    ) -> anyhow::Result<Auth> {
        let Setup {
            legacy,
            multitenancy,
            data_dir,
            agent_token: _,
            http_port,
        } = *setup;
        let mut fixed = config.inline(legacy, multitenancy)?;
        if !legacy.is_empty() {
            warn!(
                "ingest.quic.tokens and ingest.quic.tenant-tokens are deprecated; move each token to auth.credentials with scopes [ingest] (and its tenant)"
            );
        }
        let (admin_token, dev_agent_token) = setup.development_tokens(&config);
        if admin_token {
            let admin = identity::token(data_dir, Token::Admin)?;
            fixed.push(Credential::token(
                "development admin token",
                &admin,
                Scopes::ALL,
                None,
                Source::Development,
            ));
            if dev_agent_token {
                let agent = identity::token(data_dir, Token::Agent)?;
                fixed.push(Credential::token(
                    "development agent token",
                    &agent,
                    Scopes::of(&[Scope::Ingest]),
                    None,
                    Source::Development,
                ));
            }
            info!(
                "no credentials are configured (auth.credentials): the HTTP API serves clients on this host only, and others presenting the development admin token"
            );
        }
        let mut files = Vec::new();
        for path in &config.credential_files {
            let (bytes, credentials) = credentials::read_file(path, multitenancy)?;
            files.push(File {
                path: path.clone(),
                bytes: Some(bytes),
                credentials,
            });
        }
        let set = combine(&fixed, &files)?;
        let auth = Auth {
            config,
            multitenancy,
            fixed,
            files: Mutex::new(files),
            set: RwLock::new(Arc::new(set)),
            sessions: Mutex::new(Sessions::default()),
            cookie: session::cookie_name(http_port),
            metrics: AuthMetrics::new(registry, refused),
        };
        auth.count();
        Ok(auth)
    }

    /// Whether credentials are configured (else the loopback rule holds).
    pub(crate) fn configured(&self) -> bool {
        self.config.configured()
    }

    /// The config, for the routes' access.
    pub(crate) fn config(&self) -> &AuthConfig {
        &self.config
    }

    fn current(&self) -> Arc<CredentialSet> {
        Arc::clone(
            &self
                .set
                .read()
                .expect("credential set lock: held to clone an Arc"),
        )
    }

    fn count(&self) {
        let counts = self.current().count_by_source();
        for source in [
            Source::Config,
            Source::File,
            Source::Deprecated,
            Source::Development,
        ] {
            self.metrics
                .credentials
                .with_label_values(&[source.as_str()])
                .set(i64::try_from(counts.get(&source).copied().unwrap_or(0)).unwrap_or(i64::MAX));
        }
    }

    /// Reads every credential file again and, if any changed, replaces the set: what the
    /// reload task does every [`RELOAD_INTERVAL`].
    pub(crate) fn reload(&self) {
        let mut files = self
            .files
            .lock()
            .expect("credential files lock: held by the reload task only");
        let mut changed = false;
        for file in files.iter_mut() {
            let bytes = std::fs::read(&file.path).ok();
            if bytes == file.bytes {
                continue;
            }
            changed = true;
            file.credentials = match &bytes {
                None => {
                    self.metrics.reloads.with_label_values(&["failed"]).inc();
                    error!(path = %file.path.display(), "credential file does not read; its credentials are refused until it does");
                    Vec::new()
                }
                Some(read) => match credentials::parse_file(&file.path, read, self.multitenancy) {
                    Ok(credentials) => {
                        self.metrics.reloads.with_label_values(&["loaded"]).inc();
                        info!(path = %file.path.display(), credentials = credentials.len(), "credential file read again");
                        credentials
                    }
                    Err(err) => {
                        self.metrics.reloads.with_label_values(&["failed"]).inc();
                        error!(error = %err, "credential file is invalid; its credentials are refused until it is fixed");
                        Vec::new()
                    }
                },
            };
            file.bytes = bytes;
        }
        if !changed {
            return;
        }
        let set = match combine(&self.fixed, &files) {
            Ok(set) => set,
            Err(err) => {
                // Two files give the same secret: neither may be trusted with it.
                error!(error = %err, "the credential files conflict; their credentials are refused until fixed");
                for file in files.iter_mut() {
                    file.credentials.clear();
                }
                combine(&self.fixed, &files).expect("the fixed credentials were checked at start")
            }
        };
        *self
            .set
            .write()
            .expect("credential set lock: held to swap an Arc") = Arc::new(set);
        drop(files);
        self.count();
    }

    /// Reads the credential files every [`RELOAD_INTERVAL`] until aborted.
    pub(crate) async fn run_reload(self: Arc<Self>, beat: Heartbeat) {
        let mut ticks = tokio::time::interval(RELOAD_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let auth = Arc::clone(&self);
            // File reads block: off the runtime's workers.
            if tokio::task::spawn_blocking(move || auth.reload())
                .await
                .is_err()
            {
                error!("reading the credential files panicked");
            }
            beat.beat();
        }
    }

    /// The tenant an agent presenting `token` ships for, and the credential's key (checked
    /// again for every batch with [`Auth::still`]); why not, without the token.
    pub(crate) fn agent(&self, token: &str) -> Result<(Tenant, Key, Arc<str>), &'static str> {
        if token.is_empty() {
            return Err("no credentials; present a token of auth.credentials with scope ingest");
        }
        let set = self.current();
        let credential = set
            .token(token)
            .filter(|c| c.is_token())
            .ok_or("invalid token; present a token of auth.credentials with scope ingest")?;
        if !credential.scopes.allow(Scope::Ingest) {
            return Err("the token's credential lacks scope ingest");
        }
        Ok((
            credential.tenant.clone().unwrap_or_else(Tenant::anonymous),
            credential.key(),
            Arc::clone(&credential.name),
        ))
    }

    /// Whether the credential of `key` is still in force.
    pub(crate) fn still(&self, key: &Key) -> bool {
        self.current().get(key).is_some()
    }

    /// Counts a refusal of agents' credentials.
    pub(crate) fn count_refusal(&self, reason: &str) {
        self.metrics.refused.inc("auth", reason);
    }

    /// Who a request is: its credential or session first; then, with no credentials
    /// configured, the loopback rule (which also serves a client on this host presenting a
    /// credential that is not one of ours, as SDKs configured for another service do).
    fn authenticate(&self, request: &Request, peer: Option<&Peer>) -> Authentication {
        let headers = request.headers();
        let configured = self.configured();
        let local = || {
            let authority = authority_of(request);
            loopback(peer, request.method(), authority.as_deref(), headers)
        };
        match self.presented(headers) {
            Some(found @ Authentication::Principal(_)) => found,
            _ if !configured && local() => Authentication::Principal(Principal {
                name: "loopback".into(),
                scopes: Scopes::ALL,
                tenant: None,
                via: Via::Loopback,
            }),
            Some(invalid) => invalid,
            None => Authentication::Anonymous {
                unconfigured: !configured,
            },
        }
    }

    /// What the request presented, if anything: its `Authorization` header, else its session
    /// cookie.
    fn presented(&self, headers: &HeaderMap) -> Option<Authentication> {
        let set = self.current();
        if let Some(value) = headers.get(AUTHORIZATION) {
            let Ok(value) = value.to_str() else {
                return Some(Authentication::Invalid(
                    "the Authorization header is not text",
                ));
            };
            let (credential, via) = match authorization(value) {
                Ok(Authorization::Bearer(token)) => (set.token(token), Via::Token),
                Ok(Authorization::Basic { user, password }) => {
                    (set.basic(&user, &password), Via::Basic)
                }
                Err(why) => return Some(Authentication::Invalid(why)),
            };
            return Some(match credential {
                Some(credential) => Authentication::Principal(principal(credential, via)),
                None => Authentication::Invalid("unknown credentials"),
            });
        }
        let id = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| session::cookie_value(v, &self.cookie))?;
        let found = self
            .sessions
            .lock()
            .expect("sessions lock: held for a lookup")
            .get(id, Instant::now())
            .cloned();
        Some(match found {
            None => Authentication::Invalid("the sign-in has expired; sign in again"),
            Some(session) => match set.get(&session.credential) {
                None => Authentication::Invalid(
                    "the credential of this sign-in is no longer in force; sign in again",
                ),
                Some(credential) => Authentication::Principal(principal(
                    credential,
                    Via::Session { csrf: session.csrf },
                )),
            },
        })
    }
}

fn principal(credential: &Credential, via: Via) -> Principal {
    Principal {
        name: Arc::clone(&credential.name),
        scopes: credential.scopes,
        tenant: credential.tenant.clone(),
        via,
    }
}

/// The set of the fixed credentials and the files'.
fn combine(
    fixed: &[Credential],
    files: &[File],
) -> Result<CredentialSet, credentials::CredentialError> {
    let mut list = fixed.to_vec();
    for file in files {
        list.extend(file.credentials.iter().cloned());
    }
    CredentialSet::new(list)
}

/// What an `Authorization` header's value presents.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Authorization<'v> {
    /// `Bearer <token>`.
    Bearer(&'v str),
    /// `Basic <base64 of user:password>`.
    Basic {
        /// The user, before the first colon.
        user: String,
        /// The password, after it.
        password: String,
    },
}

/// Reads an `Authorization` header's value: the scheme is matched without regard to case, as
/// RFC 9110 says; why it cannot be read, without the secret.
pub(crate) fn authorization(value: &str) -> Result<Authorization<'_>, &'static str> {
    let value = value.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("bearer") {
        Ok(Authorization::Bearer(rest.trim()))
    } else if scheme.eq_ignore_ascii_case("basic") {
        let (user, password) =
            basic(rest.trim()).ok_or("the Basic credentials are not base64 of user:password")?;
        Ok(Authorization::Basic { user, password })
    } else {
        Err("unsupported Authorization scheme; use Bearer or Basic")
    }
}

/// The user and password of a Basic credential.
fn basic(encoded: &str) -> Option<(String, String)> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Whether a request comes from this host itself: a loopback peer, not relaying anyone, and
/// not a web page that a browser on this host was made to send. Such a page either renamed its
/// own site to 127.0.0.1 (DNS rebinding: the authority it addresses, `Host` or HTTP/2's
/// `:authority`, is the site's name, not one of this host's) or posts from another origin (a
/// browser sends `Origin` with every request but GET and HEAD from another origin, and lets no
/// page read another origin's answer): a change must come from no page or from this origin.
fn loopback(
    peer: Option<&Peer>,
    method: &Method,
    authority: Option<&str>,
    headers: &HeaderMap,
) -> bool {
    let on_host = peer.is_some_and(|p| match p.addr.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.to_canonical().is_loopback(),
    });
    let relayed = ["forwarded", "x-forwarded-for", "x-real-ip"]
        .iter()
        .any(|name| headers.contains_key(*name));
    if !on_host || relayed || !authority.is_none_or(this_host) {
        return false;
    }
    if *method == Method::GET || *method == Method::HEAD {
        return true;
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return true;
    };
    let Some(origin) = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .map(|(_, rest)| rest)
    else {
        return false;
    };
    match authority {
        Some(authority) => origin.eq_ignore_ascii_case(authority),
        None => this_host(origin),
    }
}

/// The authority a request addresses: its `Host`, else (HTTP/2) its URI's.
fn authority_of(request: &Request) -> Option<String> {
    match request.headers().get(HOST) {
        Some(host) => Some(host.to_str().unwrap_or_default().to_owned()),
        None => request.uri().authority().map(|a| a.as_str().to_owned()),
    }
}

/// Whether `authority` (`name[:port]`, as `Host` and `Origin` carry it) names this host: a
/// loopback address, `localhost` or a name under it, or this machine's own host name.
fn this_host(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if let Ok(ip) = host.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(ip) => ip.is_loopback(),
            IpAddr::V6(ip) => ip.to_canonical().is_loopback(),
        };
    }
    host == "localhost" || host.ends_with(".localhost") || machine_names().contains(&host)
}

/// This machine's host name, as the kernel has it, and its first label (`web1` of
/// `web1.example.com`), lower case; read once.
fn machine_names() -> &'static [String] {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") else {
            return Vec::new();
        };
        let name = name.trim().to_ascii_lowercase();
        let short = name.split('.').next().unwrap_or_default().to_owned();
        [name, short]
            .into_iter()
            .filter(|name| !name.is_empty())
            .collect()
    })
}

/// The auth layer: authenticates every request ([`Authentication`] and, for a credential with
/// a tenant, [`Granted`] on it) and counts the refusals of the routes' [`Access`].
pub(crate) async fn layer(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<Peer>().copied();
    let authentication = auth.authenticate(&request, peer.as_ref());
    if let Authentication::Principal(principal) = &authentication {
        debug!(credential = %principal.name, via = principal.via.name(), "authenticated");
        if let Some(tenant) = &principal.tenant {
            request.extensions_mut().insert(Granted {
                tenant: tenant.clone(),
                credential: Arc::clone(&principal.name),
            });
        }
    }
    request.extensions_mut().insert(authentication);
    let response = next.run(request).await;
    if let Some(AuthRefused(reason)) = response.extensions().get::<AuthRefused>() {
        auth.metrics.refused.inc("auth", reason);
    }
    response
}

/// The sign-in routes, `POST /login`, `POST /logout` and `GET /api/session`, open to anyone;
/// and `GET /api/tenant` (`tenant`'s answer) for credentials with scope `read`.
pub(crate) fn routes(auth: Arc<Auth>) -> Routes {
    Routes::new()
        .post("/login", Access::Open, login)
        .post("/logout", Access::Open, logout)
        .get("/api/session", Access::Open, whoami)
        .get(
            "/api/tenant",
            Access::Scope(Scope::Read),
            crate::tenant::answer,
        )
        .with_state(auth)
}

/// What `POST /login` reads: a token, or a user and password.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Who the page is served as: `GET /api/session` and `POST /login` answer it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Whoami {
    /// Whether the page may call the API (signed in, a credential, or the loopback rule).
    authenticated: bool,
    /// Whether credentials are configured, so that signing in means something.
    sign_in: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    scopes: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    /// `token`, `basic`, `session` or `loopback`.
    #[serde(skip_serializing_if = "Option::is_none")]
    via: Option<&'static str>,
    /// The CSRF token a signed-in page sends with every change.
    #[serde(skip_serializing_if = "Option::is_none")]
    csrf_token: Option<String>,
}

impl Whoami {
    fn of(auth: &Auth, authentication: Option<&Authentication>) -> Whoami {
        let principal = match authentication {
            Some(Authentication::Principal(p)) => Some(p),
            _ => None,
        };
        Whoami {
            authenticated: principal.is_some(),
            sign_in: auth.configured(),
            name: principal.map(|p| p.name.to_string()),
            scopes: principal.map(|p| p.scopes.names()).unwrap_or_default(),
            tenant: principal.and_then(|p| p.tenant.as_ref().map(|t| t.to_string())),
            via: principal.map(|p| p.via.name()),
            csrf_token: principal.and_then(|p| match &p.via {
                Via::Session { csrf } => Some(csrf.clone()),
                _ => None,
            }),
        }
    }
}

async fn whoami(State(auth): State<Arc<Auth>>, request: Request) -> Json<Whoami> {
    Json(Whoami::of(
        &auth,
        request.extensions().get::<Authentication>(),
    ))
}

/// `POST /login`: `{"token": ...}` or `{"user": ..., "password": ...}` as JSON (a type a form
/// on another site cannot send without the browser asking this one first). A credential with
/// `read` opens a session.
async fn login(State(auth): State<Arc<Auth>>, request: Request) -> Response {
    let protocol = Protocol::Plain;
    let json = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !json {
        return Refusal::new(
            protocol,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "sign in with a JSON body: {\"token\": ...} or {\"user\": ..., \"password\": ...}",
        )
        .into_response();
    }
    let secure = request.extensions().get::<Peer>().is_some_and(|p| p.tls)
        || request
            .headers()
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let body: Bytes = match axum::body::to_bytes(request.into_body(), MAX_LOGIN_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            return Refusal::new(
                protocol,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a sign-in body is at most {MAX_LOGIN_BYTES} bytes"),
            )
            .into_response();
        }
    };
    let login: Login = match serde_json::from_slice(&body) {
        Ok(login) => login,
        Err(err) => {
            return Refusal::new(
                protocol,
                StatusCode::BAD_REQUEST,
                format!("invalid sign-in body: {err}"),
            )
            .into_response();
        }
    };
    let set = auth.current();
    let credential = match (&login.token, &login.user, &login.password) {
        (Some(token), None, None) => set.token(token),
        (None, Some(user), Some(password)) => set.basic(user, password),
        _ => {
            return Refusal::new(
                protocol,
                StatusCode::BAD_REQUEST,
                "give either token, or user and password",
            )
            .into_response();
        }
    };
    let Some(credential) = credential else {
        auth.metrics.refused.inc("auth", "invalid");
        return Refusal::new(protocol, StatusCode::UNAUTHORIZED, "unknown credentials")
            .into_response();
    };
    if !credential.scopes.allow(Scope::Read) {
        auth.metrics.refused.inc("auth", "scope");
        return Refusal::new(
            protocol,
            StatusCode::FORBIDDEN,
            format!(
                "credential {:?} may not sign in: the web UI needs scope read",
                credential.name
            ),
        )
        .into_response();
    }
    let id = session::hex(&rand::random::<[u8; 32]>());
    let csrf = session::hex(&rand::random::<[u8; 16]>());
    let ttl = auth.config.session_ttl;
    let open = {
        let mut sessions = auth
            .sessions
            .lock()
            .expect("sessions lock: held to open one");
        sessions.open(credential.key(), &id, csrf.clone(), Instant::now(), ttl);
        sessions.len()
    };
    auth.metrics
        .sessions
        .set(i64::try_from(open).unwrap_or(i64::MAX));
    info!(credential = %credential.name, "signed in to the web UI");
    let whoami = Whoami::of(
        &auth,
        Some(&Authentication::Principal(principal(
            credential,
            Via::Session { csrf },
        ))),
    );
    let mut response = Json(whoami).into_response();
    if let Ok(cookie) = HeaderValue::from_str(&session::set_cookie(&auth.cookie, &id, ttl, secure))
    {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

/// `POST /logout`: ends the page's session, if it has one.
async fn logout(State(auth): State<Arc<Auth>>, headers: HeaderMap) -> Response {
    if let Some(id) = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| session::cookie_value(v, &auth.cookie))
    {
        let open = {
            let mut sessions = auth
                .sessions
                .lock()
                .expect("sessions lock: held to close one");
            sessions.close(id);
            sessions.len()
        };
        auth.metrics
            .sessions
            .set(i64::try_from(open).unwrap_or(i64::MAX));
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(cookie) = HeaderValue::from_str(&session::clear_cookie(&auth.cookie)) {
        response.headers_mut().insert(SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn peer(addr: &str) -> Peer {
        Peer {
            addr: addr.parse::<SocketAddr>().unwrap(),
            tls: false,
        }
    }

    #[test]
    fn loopback_is_this_host_not_relaying() {
        let none = HeaderMap::new();
        let get = &Method::GET;
        assert!(loopback(Some(&peer("127.0.0.1:5")), get, None, &none));
        assert!(loopback(Some(&peer("[::1]:5")), get, None, &none));
        assert!(loopback(
            Some(&peer("[::ffff:127.0.0.1]:5")),
            get,
            None,
            &none
        ));
        assert!(!loopback(Some(&peer("10.0.0.1:5")), get, None, &none));
        assert!(!loopback(None, get, None, &none));
        let mut relayed = HeaderMap::new();
        relayed.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.9"));
        assert!(!loopback(Some(&peer("127.0.0.1:5")), get, None, &relayed));
    }

    #[test]
    fn loopback_is_not_a_page_of_another_origin() {
        let on_host = Some(peer("127.0.0.1:5"));
        let origin = |value: &'static str| {
            let mut map = HeaderMap::new();
            map.insert("origin", HeaderValue::from_static(value));
            map
        };
        let none = HeaderMap::new();
        // This host by any of its names.
        for host in [
            "localhost:4040",
            "127.0.0.1:4040",
            "[::1]:4040",
            "app.localhost",
        ] {
            assert!(loopback(on_host.as_ref(), &Method::GET, Some(host), &none));
        }
        // The UI's own page posting, and a client that is no page.
        let own = origin("http://localhost:4040");
        assert!(loopback(
            on_host.as_ref(),
            &Method::POST,
            Some("localhost:4040"),
            &own
        ));
        assert!(loopback(
            on_host.as_ref(),
            &Method::POST,
            Some("localhost:4040"),
            &none
        ));
        // A site renamed to 127.0.0.1 addresses its own name.
        let rebound = Some("evil.example:4040");
        assert!(!loopback(on_host.as_ref(), &Method::GET, rebound, &none));
        // Pages of other origins posting: another site, another port of this host, no origin.
        for other in ["https://evil.example", "http://localhost:8080", "null"] {
            let headers = origin(other);
            let host = Some("localhost:4040");
            assert!(!loopback(on_host.as_ref(), &Method::POST, host, &headers));
            assert!(!loopback(on_host.as_ref(), &Method::DELETE, host, &headers));
            assert!(loopback(on_host.as_ref(), &Method::GET, host, &headers));
        }
    }

    #[test]
    fn this_host_is_read_from_host_and_origin_authorities() {
        assert!(this_host("localhost"));
        assert!(this_host("LOCALHOST.:80"));
        assert!(this_host("127.1.2.3:1"));
        assert!(this_host("[::1]"));
        assert!(!this_host("[2001:db8::1]:4040"));
        assert!(!this_host("localhost.evil.example"));
        assert!(!this_host("10.0.0.1:4040"));
        assert!(!this_host(""));
        if let Some(name) = machine_names().first() {
            assert!(this_host(&format!("{name}:4040")));
        }
    }

    proptest::proptest! {
        #[test]
        fn basic_credentials_round_trip(user in "[^:]{0,40}", password in "\\PC{0,40}") {
            let encoded = base64::engine::general_purpose::STANDARD
                .encode(format!("{user}:{password}"));
            proptest::prop_assert_eq!(basic(&encoded), Some((user, password)));
        }

        #[test]
        fn any_authorization_header_is_answered(header in "\\PC{0,200}", bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = authorization(&header);
            let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let _ = authorization(&format!("Basic {encoded}"));
        }
    }

    #[test]
    fn authorization_schemes_are_read_without_regard_to_case() {
        assert_eq!(
            authorization(" bearer  t0k "),
            Ok(Authorization::Bearer("t0k"))
        );
        assert_eq!(authorization("BEARER t"), Ok(Authorization::Bearer("t")));
        let encoded = base64::engine::general_purpose::STANDARD.encode("u:p");
        assert_eq!(
            authorization(&format!("bAsIc {encoded}")),
            Ok(Authorization::Basic {
                user: "u".into(),
                password: "p".into()
            })
        );
        assert!(authorization("Basic !!").unwrap_err().contains("base64"));
        assert!(
            authorization("Digest x")
                .unwrap_err()
                .contains("Bearer or Basic")
        );
        assert!(authorization("").is_err());
    }

    #[test]
    fn basic_credentials_decode() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("u:p:q");
        assert_eq!(basic(&encoded), Some(("u".into(), "p:q".into())));
        assert_eq!(basic("!!"), None);
        let no_colon = base64::engine::general_purpose::STANDARD.encode("u");
        assert_eq!(basic(&no_colon), None);
    }
}
