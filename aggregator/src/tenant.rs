//! `Tenant`: whose data a request reads or writes, and how a request names it.
//!
//! Input: an HTTP request's `X-Scope-OrgID` header, read by the one extractor every route takes
//! ([`Tenant`]'s `FromRequestParts`), under [`TenantConfig`] (section `tenant:`). Output: the
//! validated [`Tenant`] the handler passes to every store call. Callers: every HTTP handler of
//! ingest, query, rules and admin, `GET /api/tenant` ([`routes`]), and `app`, which installs the
//! config on the router ([`layer`]). QUIC ingest takes its tenant from the agent's token
//! instead (`ingest.quic.tenant-tokens`), never from the agent. Owns nothing.
//!
//! With `tenant.multitenancy-enabled: false`, the default, every request is
//! [`Tenant::anonymous`] (Pyroscope's and Mimir's name for the single tenant of an installation
//! without multitenancy) and the header is ignored, so that an SDK configured for Grafana Cloud
//! pushes unchanged. With it on, a request without the header is refused with 401 naming the
//! header, as Pyroscope does, and an invalid id with 400 and the rule it breaks. Credentials
//! (issue 20) will decide here too: the credential's tenant wins, and a header naming another
//! gets 403; no route reads the header by hand, so that this is the one place to change.
//!
//! A leaf: it depends on no other module of the crate. The id rules are Mimir's and Pyroscope's
//! (`tenant.ValidTenantID`), so that an id valid there is valid here and can name a directory or
//! an object-store prefix as it is.
//!
//! `GET /api/tenant` answers the tenant a request is served as, `{"tenant": "anonymous"}`
//! without multitenancy, so that the web UI shows whose data it shows, through the same
//! extractor as every other route.

use std::fmt;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::{Deserialize, Serialize};

/// The header that names a request's tenant, as Pyroscope, Mimir, Loki and Tempo read it.
pub(crate) const HEADER: &str = "X-Scope-OrgID";

/// The longest tenant id, in bytes, as Mimir and Pyroscope allow.
pub(crate) const MAX_TENANT_BYTES: usize = 150;

/// The tenant of an installation without multitenancy.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Multitenancy: whether HTTP requests name their tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct TenantConfig {
    /// Whether every HTTP API request must name its tenant in `X-Scope-OrgID` (Pyroscope's
    /// `-auth.multitenancy-enabled`): without the header it gets 401, with an invalid id 400.
    /// Off, every request is the `anonymous` tenant's and the header is ignored; agents' tokens
    /// may then name no tenant (`ingest.quic.tenant-tokens` must be empty). Default `false`.
    pub multitenancy_enabled: bool,
}

/// A validated tenant id: 1 to [`MAX_TENANT_BYTES`] bytes of ASCII letters, digits and
/// `!-_.*'()`, neither `.` nor `..`. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tenant(Arc<str>);

/// Why a string is not a tenant id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TenantError {
    /// The id is empty.
    #[error("tenant id is empty")]
    Empty,
    /// The id is longer than [`MAX_TENANT_BYTES`].
    #[error("tenant id is {len} bytes long, more than {MAX_TENANT_BYTES}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The id holds a character outside the allowed set.
    #[error("tenant id {id:?} holds {found:?}; allowed are letters, digits and ! - _ . * ' ( )")]
    BadCharacter {
        /// The id, cut to 64 characters.
        id: String,
        /// The first character not allowed.
        found: char,
    },
    /// The id is `.` or `..`, which would name a directory's parent.
    #[error("tenant id {id:?} is not allowed")]
    Reserved {
        /// The id.
        id: String,
    },
}

impl Tenant {
    /// Checks `id` against the tenant id rules.
    ///
    /// # Errors
    ///
    /// The first rule `id` breaks.
    pub(crate) fn new(id: &str) -> Result<Tenant, TenantError> {
        if id.is_empty() {
            return Err(TenantError::Empty);
        }
        if id.len() > MAX_TENANT_BYTES {
            return Err(TenantError::TooLong { len: id.len() });
        }
        if let Some(found) = id.chars().find(|&c| !allowed(c)) {
            return Err(TenantError::BadCharacter {
                id: id.chars().take(64).collect(),
                found,
            });
        }
        if id == "." || id == ".." {
            return Err(TenantError::Reserved { id: id.to_owned() });
        }
        Ok(Tenant(id.into()))
    }

    /// The tenant of an installation without multitenancy: every request's when
    /// `tenant.multitenancy-enabled` is off, and an agent's whose token names no tenant.
    pub(crate) fn anonymous() -> Tenant {
        Tenant::new(ANONYMOUS).expect("the anonymous tenant's id is valid")
    }

    /// The id.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Installs `config` on a router, for the [`Tenant`] extractor of every route under it.
pub(crate) fn layer(config: TenantConfig) -> Extension<TenantConfig> {
    Extension(config)
}

/// The tenant of an HTTP request, under the [`TenantConfig`] that [`layer`] installed: with
/// multitenancy, `X-Scope-OrgID`'s id; without, [`Tenant::anonymous`]. The one place that reads
/// the header.
impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Tenant, Refusal> {
        let config = parts
            .extensions
            .get::<TenantConfig>()
            .copied()
            .ok_or_else(|| {
                Refusal::new(parts, StatusCode::INTERNAL_SERVER_ERROR, Problem::Config)
            })?;
        if !config.multitenancy_enabled {
            return Ok(Tenant::anonymous());
        }
        let mut values = parts.headers.get_all(HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            let problem = if parts.headers.contains_key(HEADER) {
                Problem::Repeated
            } else {
                Problem::Header
            };
            let status = match problem {
                Problem::Header => StatusCode::UNAUTHORIZED,
                _ => StatusCode::BAD_REQUEST,
            };
            return Err(Refusal::new(parts, status, problem));
        };
        let id = value
            .to_str()
            .map_err(|_| Refusal::new(parts, StatusCode::BAD_REQUEST, Problem::NotText))?;
        Tenant::new(id)
            .map_err(|err| Refusal::new(parts, StatusCode::BAD_REQUEST, Problem::Invalid(err)))
    }
}

/// What was wrong with a request's tenant.
enum Problem {
    /// No `X-Scope-OrgID` while multitenancy is on.
    Header,
    /// `X-Scope-OrgID` given more than once.
    Repeated,
    /// `X-Scope-OrgID` is not visible ASCII.
    NotText,
    /// The id breaks a rule.
    Invalid(TenantError),
    /// The route is not under [`layer`]: the aggregator's own mistake.
    Config,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Header => write!(
                f,
                "no tenant: multitenancy is enabled and the request has no {HEADER} header; set it to the tenant id"
            ),
            Problem::Repeated => write!(f, "{HEADER} is given more than once; give one tenant id"),
            Problem::NotText => write!(f, "{HEADER} is not ASCII text"),
            Problem::Invalid(err) => write!(f, "{HEADER}: {err}"),
            Problem::Config => f.write_str("internal error: the route has no tenant configuration"),
        }
    }
}

/// A request refused for its tenant, answered in the protocol the request speaks: a gRPC
/// status for gRPC, Connect's JSON error for a Connect procedure (`/<package>.<Service>/<Method>`),
/// plain text for the rest, as `api_error` answers.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    message: String,
    protocol: Protocol,
}

/// How a refused request wants its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Grpc,
    Connect,
    Plain,
}

impl Refusal {
    fn new(parts: &Parts, status: StatusCode, problem: Problem) -> Refusal {
        if matches!(problem, Problem::Config) {
            tracing::error!(path = %parts.uri.path(), "route mounted without the tenant layer");
        }
        let grpc = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        // A Connect or gRPC procedure's path is `/<package>.<Service>/<Method>`.
        let procedure = parts
            .uri
            .path()
            .trim_start_matches('/')
            .split('/')
            .next()
            .is_some_and(|service| service.contains('.'));
        let protocol = match (grpc, procedure) {
            (true, _) => Protocol::Grpc,
            (false, true) => Protocol::Connect,
            (false, false) => Protocol::Plain,
        };
        Refusal {
            status,
            message: problem.to_string(),
            protocol,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self.protocol {
            Protocol::Plain => (self.status, format!("{}\n", self.message)).into_response(),
            Protocol::Connect => {
                let code = match self.status {
                    StatusCode::UNAUTHORIZED => "unauthenticated",
                    StatusCode::BAD_REQUEST => "invalid_argument",
                    _ => "internal",
                };
                let body = serde_json::json!({ "code": code, "message": self.message });
                (
                    self.status,
                    [(CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response()
            }
            Protocol::Grpc => {
                // A trailers-only answer: HTTP 200, the status in the headers.
                let code = match self.status {
                    StatusCode::UNAUTHORIZED => "16",
                    StatusCode::BAD_REQUEST => "3",
                    _ => "13",
                };
                let mut response = StatusCode::OK.into_response();
                let headers = response.headers_mut();
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                headers.insert("grpc-status", HeaderValue::from_static(code));
                if let Ok(message) = HeaderValue::from_str(&grpc_message(&self.message)) {
                    headers.insert("grpc-message", message);
                }
                response
            }
        }
    }
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, percent-encoded.
fn grpc_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The answer of `GET /api/tenant`.
#[derive(Debug, PartialEq, Eq, Serialize)]
struct TenantAnswer {
    /// The tenant the request was served as.
    tenant: String,
}

/// `GET /api/tenant`: who the aggregator serves the caller as.
pub(crate) fn routes() -> Router {
    Router::new().route("/api/tenant", get(tenant))
}

async fn tenant(tenant: Tenant) -> Json<TenantAnswer> {
    Json(TenantAnswer {
        tenant: tenant.as_str().to_owned(),
    })
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '!' | '-' | '_' | '.' | '*' | '\'' | '(' | ')')
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    /// The extractor's answer for a request to `path` with `headers`, under `enabled`.
    async fn extract(
        enabled: Option<bool>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Tenant, Response> {
        let mut request = Request::post(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        if let Some(enabled) = enabled {
            parts.extensions.insert(TenantConfig {
                multitenancy_enabled: enabled,
            });
        }
        Tenant::from_request_parts(&mut parts, &())
            .await
            .map_err(IntoResponse::into_response)
    }

    async fn text(response: Response) -> String {
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn the_header_names_the_tenant_only_with_multitenancy() {
        let header = [(HEADER, "team-a")];
        assert_eq!(
            extract(Some(false), "/render", &header).await.unwrap(),
            Tenant::anonymous()
        );
        assert_eq!(
            extract(Some(false), "/render", &[(HEADER, "a/b")])
                .await
                .unwrap(),
            Tenant::anonymous()
        );
        assert_eq!(
            extract(Some(true), "/render", &header)
                .await
                .unwrap()
                .as_str(),
            "team-a"
        );

        let missing = extract(Some(true), "/render", &[]).await.unwrap_err();
        assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
        assert!(text(missing).await.contains("X-Scope-OrgID"));
        let bad = extract(Some(true), "/render", &[(HEADER, "a/b")])
            .await
            .unwrap_err();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        let message = text(bad).await;
        assert!(message.contains("holds '/'"), "{message}");
        let twice = extract(Some(true), "/render", &[(HEADER, "a"), (HEADER, "b")])
            .await
            .unwrap_err();
        assert_eq!(twice.status(), StatusCode::BAD_REQUEST);

        let unconfigured = extract(None, "/render", &header).await.unwrap_err();
        assert_eq!(unconfigured.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn refusals_speak_the_requests_protocol() {
        let connect = extract(Some(true), "/querier.v1.QuerierService/Series", &[])
            .await
            .unwrap_err();
        assert_eq!(connect.status(), StatusCode::UNAUTHORIZED);
        let body: serde_json::Value = serde_json::from_str(&text(connect).await).unwrap();
        assert_eq!(body["code"], "unauthenticated");
        assert!(body["message"].as_str().unwrap().contains(HEADER));

        let grpc = extract(
            Some(true),
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
            &[("content-type", "application/grpc"), (HEADER, "\u{fc}")],
        )
        .await;
        let grpc = match grpc {
            Err(response) => response,
            Ok(tenant) => panic!("accepted as {tenant}"),
        };
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()["grpc-status"], "3");
        let missing = extract(
            Some(true),
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
            &[("content-type", "application/grpc+proto")],
        )
        .await
        .unwrap_err();
        assert_eq!(missing.headers()["grpc-status"], "16");
        assert!(
            missing.headers()["grpc-message"]
                .to_str()
                .unwrap()
                .contains(HEADER)
        );
        assert_eq!(grpc_message("50% \u{fc}"), "50%25 %C3%BC");
    }

    #[test]
    fn ids_follow_mimirs_rules() {
        assert_eq!(
            Tenant::new("team-a_1.prod").unwrap().as_str(),
            "team-a_1.prod"
        );
        assert_eq!(Tenant::new("(x)*'!").unwrap().as_str(), "(x)*'!");
        assert_eq!(Tenant::anonymous().as_str(), ANONYMOUS);
        assert_eq!(Tenant::new(ANONYMOUS).unwrap(), Tenant::anonymous());
        assert_eq!(Tenant::new(""), Err(TenantError::Empty));
        assert_eq!(
            Tenant::new(&"a".repeat(151)),
            Err(TenantError::TooLong { len: 151 })
        );
        assert!(Tenant::new(&"a".repeat(150)).is_ok());
        for bad in ["a/b", "a b", "ü", "a|b"] {
            assert!(
                matches!(Tenant::new(bad), Err(TenantError::BadCharacter { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            Tenant::new(".."),
            Err(TenantError::Reserved { .. })
        ));
        assert!(matches!(
            Tenant::new("."),
            Err(TenantError::Reserved { .. })
        ));
    }
}
