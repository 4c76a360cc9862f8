//! The web UI as the aggregator serves it: the page at `/`, its hashed assets under
//! `/assets/` (gzipped for clients that accept it), and the API's routes left as they were.
//!
//! Whether the binary holds the UI depends on whether `aggregator/ui` was built before cargo
//! ran (`scripts/test` builds it; a backend-only `cargo test` does not), so each test checks the
//! answer for the binary at hand; with `SMOLDER_REQUIRE_UI` set, as `scripts/test` sets it, a
//! binary without its UI fails. The browser scenarios are in `aggregator/ui/e2e/`.

use std::io::Read;

use reqwest::StatusCode;
use reqwest::header::{ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE};

use crate::util::Aggregator;

/// The `/assets/...` paths the page loads (it names them relative to itself, `./assets/...`, so
/// that a reverse proxy may serve the UI under a prefix).
fn asset_paths(page: &str) -> Vec<String> {
    page.split('"')
        .filter_map(|part| part.strip_prefix("./assets/"))
        .map(|name| format!("/assets/{name}"))
        .collect()
}

#[tokio::test]
async fn the_page_or_how_to_build_it_is_served_at_the_root() {
    let agg = Aggregator::start().await;
    let response = agg.http.get(agg.url("/")).send().await.expect("GET /");
    let status = response.status();
    assert_eq!(response.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
    let page = response.text().await.expect("body");
    if status == StatusCode::NOT_FOUND {
        assert!(
            std::env::var_os("SMOLDER_REQUIRE_UI").is_none(),
            "SMOLDER_REQUIRE_UI is set but this aggregator was built without its UI: build \
             aggregator/ui (npm run build) before cargo"
        );
        assert!(page.contains("UI not built"), "{page}");
        assert!(
            page.contains(
                "npm --prefix aggregator/ui ci &amp;&amp; npm --prefix aggregator/ui run build"
            ),
            "{page}"
        );
        return;
    }
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(r#"<div id="app">"#), "{page}");
    let assets = asset_paths(&page);
    assert!(
        assets.iter().any(|path| path.ends_with(".js")),
        "the page loads a script: {page}"
    );
    for path in assets {
        let plain = agg.http.get(agg.url(&path)).send().await.expect("asset");
        assert_eq!(plain.status(), StatusCode::OK, "{path}");
        assert_eq!(
            plain.headers()[CACHE_CONTROL],
            "public, max-age=31536000, immutable"
        );
        assert!(plain.headers().get(CONTENT_ENCODING).is_none());
        let expected_type = if path.ends_with(".js") {
            "text/javascript; charset=utf-8"
        } else {
            "text/css; charset=utf-8"
        };
        assert_eq!(plain.headers()[CONTENT_TYPE], expected_type, "{path}");
        let plain = plain.bytes().await.expect("asset body");

        let gzipped = agg
            .http
            .get(agg.url(&path))
            .header(ACCEPT_ENCODING, "gzip, deflate, br")
            .send()
            .await
            .expect("asset");
        assert_eq!(gzipped.headers()[CONTENT_ENCODING], "gzip", "{path}");
        let compressed = gzipped.bytes().await.expect("asset body");
        assert!(compressed.len() < plain.len(), "{path} is smaller gzipped");
        let mut unzipped = Vec::new();
        flate2::read::GzDecoder::new(&compressed[..])
            .read_to_end(&mut unzipped)
            .expect("valid gzip");
        assert_eq!(unzipped, plain, "{path}");
    }
}

#[tokio::test]
async fn unknown_assets_are_404_and_the_api_is_untouched() {
    let agg = Aggregator::start().await;
    let missing = agg
        .http
        .get(agg.url("/assets/no-such-file.js"))
        .send()
        .await
        .expect("GET");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(
        missing.text().await.unwrap().contains("no UI asset"),
        "says what is missing"
    );
    // Paths outside the UI's are not swallowed by it.
    let unknown = agg.http.get(agg.url("/nope")).send().await.expect("GET");
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let apps = agg
        .http
        .get(agg.url("/api/apps"))
        .send()
        .await
        .expect("GET");
    assert_eq!(apps.status(), StatusCode::OK);
    assert_eq!(apps.text().await.unwrap(), "[]");
    let render = agg.http.get(agg.url("/render")).send().await.expect("GET");
    assert_eq!(render.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_tenant_the_page_shows_is_anonymous_without_multitenancy() {
    let agg = Aggregator::start().await;
    let response = agg
        .http
        .get(agg.url("/api/tenant"))
        .send()
        .await
        .expect("GET");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(
        response.json::<serde_json::Value>().await.expect("json"),
        serde_json::json!({"tenant": "anonymous"})
    );
}
