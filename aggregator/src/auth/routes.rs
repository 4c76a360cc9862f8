//! [`Routes`]: a stage's routes with who may call each, so that no route can be mounted without
//! saying so. Each route gets the [`require`] layer of its [`Access`]; the table of every
//! route's method, path and access is kept beside the router, for the README's table and for
//! the test that tries every route without, and with wrong, credentials.

use std::convert::Infallible;

use axum::Router;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post, put};
use tower::{Layer, Service};

use super::credentials::Scope;
use super::{Authentication, CSRF_HEADER, Via, refused};
use crate::api_error::{Protocol, Refusal};

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone: the UI's files, the sign-in, and (unless configured otherwise) `/metrics`,
    /// `/healthz` and `/readyz`.
    Open,
    /// A credential with this scope (or `admin`); with no credentials configured, any client on
    /// this host.
    Scope(Scope),
}

/// One route: a method on a path, and who may call it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The method.
    pub method: Method,
    /// The path as the router matches it (`/api/recording-rules/{name}`).
    pub path: String,
    /// Who may call it.
    pub access: Access,
}

/// A router and the table of its routes.
pub(crate) struct Routes<S = ()> {
    router: Router<S>,
    table: Vec<Route>,
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Self {
        Routes {
            router: Router::new(),
            table: Vec::new(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    /// No routes.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `method` on `path` served by `handler` (a method router of that one method), open to
    /// `access`.
    pub(crate) fn method(
        mut self,
        method: Method,
        path: &str,
        access: Access,
        handler: MethodRouter<S>,
    ) -> Self {
        let handler = match access {
            Access::Open => handler,
            Access::Scope(_) => {
                handler.route_layer(middleware::from_fn_with_state(access, require))
            }
        };
        self.router = self.router.route(path, handler);
        self.table.push(Route {
            method,
            path: path.to_owned(),
            access,
        });
        self
    }

    /// `GET path`.
    pub(crate) fn get<H: Handler<T, S>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.method(Method::GET, path, access, get(handler))
    }

    /// `POST path`.
    pub(crate) fn post<H: Handler<T, S>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.method(Method::POST, path, access, post(handler))
    }

    /// `PUT path`.
    pub(crate) fn put<H: Handler<T, S>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.method(Method::PUT, path, access, put(handler))
    }

    /// `DELETE path`.
    pub(crate) fn delete<H: Handler<T, S>, T: 'static>(
        self,
        path: &str,
        access: Access,
        handler: H,
    ) -> Self {
        self.method(Method::DELETE, path, access, delete(handler))
    }

    /// These routes and `other`'s.
    pub(crate) fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self
    }

    /// The routes with `layer` around each (as [`Router::layer`]).
    pub(crate) fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.layer(layer);
        self
    }

    /// The routes with their state given.
    pub(crate) fn with_state<S2>(self, state: S) -> Routes<S2> {
        Routes {
            router: self.router.with_state(state),
            table: self.table,
        }
    }
}

impl Routes<()> {
    /// The routes of `router`, made elsewhere, all open to `access`; `table` lists them.
    pub(crate) fn mount(router: Router, access: Access, table: &[(Method, &str)]) -> Routes {
        let router = match access {
            Access::Open => router,
            Access::Scope(_) => router.route_layer(middleware::from_fn_with_state(access, require)),
        };
        Routes {
            router,
            table: table
                .iter()
                .map(|(method, path)| Route {
                    method: method.clone(),
                    path: (*path).to_owned(),
                    access,
                })
                .collect(),
        }
    }

    /// The router and its table.
    pub(crate) fn into_parts(self) -> (Router, Vec<Route>) {
        (self.router, self.table)
    }
}

/// Whether a method changes something, so that a cookie alone may not authorize it.
fn changes(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Lets the request through if its [`Authentication`] allows `access`; else 401 (no or an
/// invalid credential), or 403 (a credential without the scope, or a signed-in page's change
/// without its CSRF token).
async fn require(State(access): State<Access>, request: Request, next: Next) -> Response {
    let Access::Scope(scope) = access else {
        return next.run(request).await;
    };
    let protocol = Protocol::of(request.uri().path(), request.headers());
    let refuse = |status: StatusCode, reason: &'static str, message: String| {
        refused(Refusal::new(protocol, status, message), reason)
    };
    let Some(authentication) = request.extensions().get::<Authentication>() else {
        tracing::error!(path = %request.uri().path(), "route mounted without the auth layer");
        return Refusal::new(
            protocol,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error: the route has no authentication layer",
        )
        .into_response();
    };
    match authentication {
        Authentication::Principal(principal) if !principal.scopes.allow(scope) => refuse(
            StatusCode::FORBIDDEN,
            "scope",
            format!(
                "credential {:?} may not do this: the route needs scope {scope} (it has {})",
                principal.name,
                principal.scopes.names().join(", ")
            ),
        ),
        Authentication::Principal(principal) => {
            if let Via::Session { csrf } = &principal.via
                && changes(request.method())
            {
                let sent = request
                    .headers()
                    .get(CSRF_HEADER)
                    .map(|v| v.as_bytes())
                    .unwrap_or_default();
                if !bool::from(subtle::ConstantTimeEq::ct_eq(sent, csrf.as_bytes())) {
                    return refuse(
                        StatusCode::FORBIDDEN,
                        "csrf",
                        format!(
                            "a signed-in page's change must carry its CSRF token in {CSRF_HEADER}"
                        ),
                    );
                }
            }
            next.run(request).await
        }
        Authentication::Anonymous { unconfigured: true } => refuse(
            StatusCode::UNAUTHORIZED,
            "loopback_only",
            "no credentials are configured (auth.credentials, auth.credential-files), so only \
             clients on the aggregator's host are served (a loopback peer, not relayed by a \
             proxy, naming this host in Host and, for a change, in Origin: localhost, a loopback \
             address or the host's name); configure credentials and present one \
             (Authorization: Bearer <token>, or basic auth)"
                .to_owned(),
        ),
        Authentication::Anonymous {
            unconfigured: false,
        } => refuse(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            format!(
                "this route needs a credential with scope {scope}: Authorization: Bearer <token>, or basic auth (auth.credentials)"
            ),
        ),
        Authentication::Invalid(why) => refuse(
            StatusCode::UNAUTHORIZED,
            "invalid",
            format!("{why}; present a credential of auth.credentials"),
        ),
    }
}
