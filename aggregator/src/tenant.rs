//! `Tenant`: whose data a request reads or writes, and how a request names it.
//!
//! Input: an HTTP request's `X-Scope-OrgID` header and its credential's tenant ([`Granted`]),
//! read by the one extractor every route takes ([`Tenant`]'s `FromRequestParts`), under
//! [`TenantConfig`] (section `tenant:`). Output: the validated [`Tenant`] the handler passes to
//! every store call. Callers: every HTTP handler of ingest, query, rules and admin,
//! `GET /api/tenant` ([`answer`], mounted by `auth`), and `app`, which installs the
//! config on the router ([`layer`]). QUIC ingest takes its tenant from the credential of the
//! agent's token instead, never from the agent. Owns nothing.
//!
//! With `tenant.multitenancy-enabled: false`, the default, every request is
//! [`Tenant::anonymous`] (Pyroscope's and Mimir's name for the single tenant of an installation
//! without multitenancy) and the header is ignored, so that an SDK configured for Grafana Cloud
//! pushes unchanged. With it on, a request without the header is refused with 401 naming the
//! header, as Pyroscope does, and an invalid id with 400 and the rule it breaks. A request whose
//! credential is limited to a tenant (`auth`, which puts [`Granted`] on it) is that tenant's:
//! without the header, or with the same id, it is served; a header naming another tenant gets
//! 403. No route reads the header by hand, so that this is the one place that decides.
//!
//! It depends only on `api_error`, for the refusal in the request's protocol. The id rules are Mimir's and Pyroscope's
//! (`tenant.ValidTenantID`), so that an id valid there is valid here and can name a directory or
//! an object-store prefix as it is.
//!
//! The section also holds tenants' own limits ([`TenantLimits`], `tenant.limits`), checked here
//! and applied by `admission` (ingest rate) and `ingest` (active series).
//!
//! `GET /api/tenant` answers the tenant a request is served as, `{"tenant": "anonymous"}`
//! without multitenancy, so that the web UI shows whose data it shows, through the same
//! extractor as every other route.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use crate::api_error::{Protocol, Refusal};

/// The header that names a request's tenant, as Pyroscope, Mimir, Loki and Tempo read it.
pub(crate) const HEADER: &str = "X-Scope-OrgID";

/// The longest tenant id, in bytes, as Mimir and Pyroscope allow.
pub(crate) const MAX_TENANT_BYTES: usize = 150;

/// The tenant of an installation without multitenancy.
pub(crate) const ANONYMOUS: &str = "anonymous";

/// Multitenancy: whether HTTP requests name their tenant, and tenants' own limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct TenantConfig {
    /// Whether every HTTP API request must name its tenant in `X-Scope-OrgID` (Pyroscope's
    /// `-auth.multitenancy-enabled`): without the header it gets 401, with an invalid id 400.
    /// Off, every request is the `anonymous` tenant's and the header is ignored; credentials may
    /// then name no tenant (nor may the deprecated `ingest.quic.tenant-tokens`). Default
    /// `false`.
    pub multitenancy_enabled: bool,
    /// Limits of named tenants in place of the defaults every tenant gets (Mimir's and
    /// Pyroscope's per-tenant overrides), keyed by tenant id: a key left out keeps the default.
    /// Default none.
    pub limits: BTreeMap<String, TenantLimits>,
}

/// One tenant's own limits; each left out is the default's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct TenantLimits {
    /// In place of `admission.tenant-ingest-bytes-per-second`; 0 means no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_bytes_per_second: Option<u64>,
    /// In place of `admission.tenant-ingest-burst-bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_burst_bytes: Option<u64>,
    /// In place of `ingest.max-active-series-per-tenant`; 0 means no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_active_series: Option<usize>,
}

impl TenantConfig {
    /// The tenants with limits of their own, their ids checked.
    ///
    /// # Errors
    ///
    /// A key of `tenant.limits` that is not a valid tenant id, or a limit given to a tenant
    /// other than `anonymous` without multitenancy (no request could be that tenant's).
    pub(crate) fn limits(&self) -> anyhow::Result<HashMap<Tenant, TenantLimits>> {
        self.limits
            .iter()
            .map(|(id, limits)| {
                let tenant = Tenant::new(id)
                    .map_err(|err| anyhow::anyhow!("tenant.limits: key {id:?}: {err}"))?;
                if !self.multitenancy_enabled && tenant != Tenant::anonymous() {
                    anyhow::bail!(
                        "tenant.limits names tenant {id:?}, but tenant.multitenancy-enabled is false, so every request is the anonymous tenant's; enable it, or name \"anonymous\""
                    );
                }
                Ok((tenant, *limits))
            })
            .collect()
    }
}

/// Whether requests name their tenant, as [`layer`] installs it for the [`Tenant`] extractor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Multitenancy(bool);

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
pub(crate) fn layer(config: &TenantConfig) -> Extension<Multitenancy> {
    Extension(Multitenancy(config.multitenancy_enabled))
}

/// The tenant a request's credential is limited to, put on the request by `auth`.
#[derive(Clone, Debug)]
pub(crate) struct Granted {
    /// The tenant.
    pub(crate) tenant: Tenant,
    /// The credential's name, for the refusal.
    pub(crate) credential: Arc<str>,
}

/// The tenant of an HTTP request, under the [`TenantConfig`] that [`layer`] installed: the
/// credential's ([`Granted`]) when it has one; else, with multitenancy, `X-Scope-OrgID`'s id;
/// without, [`Tenant::anonymous`]. The one place that reads the header.
impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Tenant, Response> {
        let refuse = |parts: &Parts, status: StatusCode, problem: Problem| {
            if matches!(problem, Problem::Config) {
                tracing::error!(path = %parts.uri.path(), "route mounted without the tenant layer");
            }
            Refusal::new(
                Protocol::of(parts.uri.path(), &parts.headers),
                status,
                problem.to_string(),
            )
            .into_response()
        };
        let Some(Multitenancy(multitenancy)) = parts.extensions.get::<Multitenancy>().copied()
        else {
            return Err(refuse(
                parts,
                StatusCode::INTERNAL_SERVER_ERROR,
                Problem::Config,
            ));
        };
        let granted = parts.extensions.get::<Granted>().cloned();
        if !multitenancy {
            return Ok(granted.map_or_else(Tenant::anonymous, |g| g.tenant));
        }
        let mut values = parts.headers.get_all(HEADER).iter();
        let value = match (values.next(), values.next()) {
            (Some(value), None) => value,
            (None, _) => {
                return match granted {
                    Some(granted) => Ok(granted.tenant),
                    None => Err(refuse(parts, StatusCode::UNAUTHORIZED, Problem::Header)),
                };
            }
            (Some(_), Some(_)) => {
                return Err(refuse(parts, StatusCode::BAD_REQUEST, Problem::Repeated));
            }
        };
        let Ok(id) = value.to_str() else {
            return Err(refuse(parts, StatusCode::BAD_REQUEST, Problem::NotText));
        };
        let named = Tenant::new(id)
            .map_err(|err| refuse(parts, StatusCode::BAD_REQUEST, Problem::Invalid(err)))?;
        match granted {
            Some(granted) if granted.tenant != named => Err(refuse(
                parts,
                StatusCode::FORBIDDEN,
                Problem::Other(granted, named),
            )),
            _ => Ok(named),
        }
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
    /// The credential is limited to one tenant and the header names another.
    Other(Granted, Tenant),
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
            Problem::Other(granted, named) => write!(
                f,
                "credential {:?} is for tenant {:?}, but {HEADER} names {:?}",
                granted.credential,
                granted.tenant.as_str(),
                named.as_str()
            ),
            Problem::Config => f.write_str("internal error: the route has no tenant configuration"),
        }
    }
}

/// The answer of `GET /api/tenant`.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct TenantAnswer {
    /// The tenant the request was served as.
    tenant: String,
}

/// `GET /api/tenant`: who the aggregator serves the caller as.
pub(crate) async fn answer(tenant: Tenant) -> Json<TenantAnswer> {
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
        extract_granted(enabled, path, headers, None).await
    }

    /// The same for a request whose credential is limited to `granted`.
    async fn extract_granted(
        enabled: Option<bool>,
        path: &str,
        headers: &[(&str, &str)],
        granted: Option<&str>,
    ) -> Result<Tenant, Response> {
        let mut request = Request::post(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        if let Some(enabled) = enabled {
            parts.extensions.insert(Multitenancy(enabled));
        }
        if let Some(granted) = granted {
            parts.extensions.insert(Granted {
                tenant: Tenant::new(granted).unwrap(),
                credential: "ci".into(),
            });
        }
        Tenant::from_request_parts(&mut parts, &()).await
    }

    #[tokio::test]
    async fn a_credentials_tenant_wins_and_another_header_is_forbidden() {
        let team_a = Tenant::new("team-a").unwrap();
        assert_eq!(
            extract_granted(Some(true), "/render", &[], Some("team-a"))
                .await
                .unwrap(),
            team_a
        );
        assert_eq!(
            extract_granted(Some(true), "/render", &[(HEADER, "team-a")], Some("team-a"))
                .await
                .unwrap(),
            team_a
        );
        let other = extract_granted(Some(true), "/render", &[(HEADER, "team-b")], Some("team-a"))
            .await
            .unwrap_err();
        assert_eq!(other.status(), StatusCode::FORBIDDEN);
        let message = text(other).await;
        assert!(
            message.contains("\"ci\" is for tenant \"team-a\""),
            "{message}"
        );
        assert_eq!(
            extract_granted(Some(false), "/render", &[(HEADER, "x")], Some("anonymous"))
                .await
                .unwrap(),
            Tenant::anonymous()
        );
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
