//! UI: the web UI, a single-page app served from assets embedded in the binary.
//!
//! Input: `GET /` and `GET /assets/...`. Output: the page and its hashed scripts and styles.
//! Caller: `app`, which hands [`routes`] to the router in `http.rs`. Owns the asset table that
//! `build.rs` generates from `aggregator/ui/dist` at build time (each file with a gzipped
//! copy); nothing at run time.
//!
//! The page talks to the aggregator only through its public HTTP API (`/render`,
//! `/render-diff`, `/labels`, `/label-values`, `/api/apps`, `/api/recording-rules`,
//! `/api/tenant`, and `/api/session`, `/login`, `/logout` to sign in when credentials are
//! configured). Its views keep their state in the query string of `/`, so the API's paths stay
//! the API's. The page and its assets need no credential; everything it reads does.
//!
//! A binary built without the UI (no `npm run build` before `cargo build`, as backend-only
//! builds and tests do) answers `/` with 404 and a page that says how to build it.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use crate::auth::{Access, Routes};

/// One embedded file of `aggregator/ui/dist`.
pub(crate) struct Asset {
    /// Its path under `/`, such as `/index.html` or `/assets/index-3f2a1b.js`.
    pub(crate) path: &'static str,
    /// The file as built.
    pub(crate) body: &'static [u8],
    /// The same, gzipped at build time.
    pub(crate) gzip: &'static [u8],
}

/// The built UI; empty when the aggregator was built without it.
static ASSETS: &[Asset] = include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));

/// The page `/` answers when the binary holds no UI.
const NOT_BUILT: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Smolder: UI not built</title></head>
<body style="font-family: sans-serif; max-width: 44em; margin: 3em auto; line-height: 1.5">
<h1>UI not built</h1>
<p>This aggregator was built without its web UI. Its HTTP API works as usual
(<a href="/api/apps">/api/apps</a>, <code>/render</code>, <a href="/metrics">/metrics</a>).</p>
<p>To get the UI, build it and then the aggregator, from the repository's root:</p>
<pre>scripts/run</pre>
<p>or by hand:</p>
<pre>npm --prefix aggregator/ui ci &amp;&amp; npm --prefix aggregator/ui run build
cargo build --release -p smolder-aggregator</pre>
</body></html>
"#;

/// The UI's routes: the page at `/` (and `/index.html`) and its assets under `/assets/`, open
/// to anyone: the page signs in through the API.
pub(crate) fn routes() -> Routes {
    Routes::new()
        .get("/", Access::Open, index)
        .get("/index.html", Access::Open, index)
        .get("/assets/{*path}", Access::Open, asset)
}

async fn index(headers: HeaderMap) -> Response {
    match find(ASSETS, "/index.html") {
        Some(page) => serve(page, &headers, CachePolicy::Revalidate),
        None => (StatusCode::NOT_FOUND, Html(NOT_BUILT)).into_response(),
    }
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match find(ASSETS, &format!("/assets/{path}")) {
        // Vite puts a content hash in every asset's name: a new build gets new names.
        Some(found) => serve(found, &headers, CachePolicy::Immutable),
        None => (StatusCode::NOT_FOUND, format!("no UI asset {path:?}\n")).into_response(),
    }
}

/// How long a browser may keep a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CachePolicy {
    /// The page: ask every time, so a new build shows on the next load.
    Revalidate,
    /// Hashed assets: keep for a year.
    Immutable,
}

fn find(assets: &'static [Asset], path: &str) -> Option<&'static Asset> {
    assets.iter().find(|asset| asset.path == path)
}

/// The asset, gzipped when the client accepts it.
fn serve(asset: &'static Asset, headers: &HeaderMap, cache: CachePolicy) -> Response {
    let cache_control = match cache {
        CachePolicy::Revalidate => "no-cache",
        CachePolicy::Immutable => "public, max-age=31536000, immutable",
    };
    let mut response = if accepts_gzip(headers) {
        let mut response = asset.gzip.into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        response
    } else {
        asset.body.into_response()
    };
    let out = response.headers_mut();
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(asset.path)),
    );
    out.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(cache_control),
    );
    out.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    response
}

/// Whether `Accept-Encoding` lists `gzip` (or `*`) with a non-zero quality.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or_default();
            let refused = parts.any(|param| {
                param
                    .strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// The media type of a built file, by extension.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json" | "map") => "application/json",
        Some("woff2") => "font/woff2",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(accept).unwrap(),
        );
        headers
    }

    #[test]
    fn gzip_is_served_only_to_clients_that_accept_it() {
        assert!(accepts_gzip(&headers("gzip, deflate, br")));
        assert!(accepts_gzip(&headers("br;q=1.0, GZIP;q=0.5")));
        assert!(accepts_gzip(&headers("*")));
        assert!(!accepts_gzip(&headers("gzip;q=0")));
        assert!(!accepts_gzip(&headers("br, deflate")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn built_files_get_their_media_types() {
        assert_eq!(content_type("/index.html"), "text/html; charset=utf-8");
        assert_eq!(
            content_type("/assets/index-3f2a.js"),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            content_type("/assets/index-3f2a.css"),
            "text/css; charset=utf-8"
        );
        assert_eq!(content_type("/assets/noext"), "application/octet-stream");
    }

    static BUILT: &[Asset] = &[Asset {
        path: "/assets/app-1.js",
        body: b"console.log(1)",
        gzip: b"\x1f\x8b",
    }];

    #[test]
    fn assets_are_found_by_exact_path() {
        assert!(find(BUILT, "/assets/app-1.js").is_some());
        assert!(find(BUILT, "/assets/app-1.j").is_none());
        let response = serve(&BUILT[0], &headers("gzip"), CachePolicy::Immutable);
        assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(
            response.headers()[header::CACHE_CONTROL],
            "public, max-age=31536000, immutable"
        );
        let plain = serve(&BUILT[0], &HeaderMap::new(), CachePolicy::Revalidate);
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        assert_eq!(plain.headers()[header::CACHE_CONTROL], "no-cache");
    }
}
