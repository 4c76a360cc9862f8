//! `Tenant`: whose data a request reads or writes.
//!
//! Every call into the store names a tenant, so that the store's interface already has the
//! shape tenants need (issue 19: `X-Scope-OrgID`, a tenant per agent token). Until then every
//! request is [`Tenant::anonymous`], Pyroscope's and Mimir's name for the single tenant of an
//! installation without multitenancy; the headers SDKs send are ignored (see `ingest`).
//!
//! A leaf: it depends on no other module of the crate. The id rules are Mimir's and Pyroscope's
//! (`tenant.ValidTenantID`), so that an id valid there is valid here and can name a directory or
//! an object-store prefix as it is.
//!
//! It also answers `GET /api/tenant` ([`routes`], mounted by `app`): the tenant a request is
//! served as, `{"tenant": "anonymous"}` today, so that the web UI shows whose data it shows and
//! shows the right one once tenants exist, through the same extractor as every other route.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

/// The longest tenant id, in bytes, as Mimir and Pyroscope allow.
pub(crate) const MAX_TENANT_BYTES: usize = 150;

/// The tenant of an installation without multitenancy.
pub(crate) const ANONYMOUS: &str = "anonymous";

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

    /// The tenant of an installation without multitenancy: every request's, until tenants
    /// exist.
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

/// The tenant of an HTTP request: [`Tenant::anonymous`] for every request until tenants exist;
/// the one place that will read `X-Scope-OrgID` then.
impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Infallible;

    async fn from_request_parts(_parts: &mut Parts, _state: &S) -> Result<Tenant, Infallible> {
        Ok(Tenant::anonymous())
    }
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
    use super::*;

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
