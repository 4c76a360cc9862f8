//! The listings (`/labels`, `/label-values`, `/api/apps`) and `DELETE /api/apps`: what they
//! list for a selector and a range, and what a deletion leaves.

use super::*;

#[tokio::test]
async fn listings_honour_the_selector_and_the_range() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(
        &agg,
        "app.cpu{env=prod,region=eu}",
        t,
        "a 1\n",
        &[("spyName", "gospy")],
    )
    .await;
    ingest(
        &agg,
        "app.cpu{env=dev}",
        t,
        "a 1\n",
        &[("spyName", "gospy")],
    )
    .await;
    ingest(
        &agg,
        "old.cpu{host=h1}",
        t - 7200,
        "a 1\n",
        &[("spyName", "pyspy")],
    )
    .await;
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let recent = [("from", from.as_str()), ("until", until.as_str())];

    for path in ["/labels", "/label-names"] {
        assert_eq!(
            get_json(&agg, path, &[]).await,
            json!(["env", "host", "region"])
        );
        assert_eq!(
            get_json(&agg, path, &recent).await,
            json!(["env", "region"])
        );
        assert_eq!(
            get_json(&agg, path, &[("query", r#"old.cpu{host="nope"}"#)]).await,
            json!(["host"]),
            "{path}: matchers are ignored, only the app counts"
        );
    }

    let values = |query: Vec<(&'static str, String)>| {
        let agg = &agg;
        async move {
            let query: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
            get_json(agg, "/label-values", &query).await
        }
    };
    assert_eq!(
        values(vec![("label", "env".into())]).await,
        json!(["dev", "prod"])
    );
    assert_eq!(
        values(vec![
            ("label", "env".into()),
            ("query", r#"app.cpu{region="eu"}"#.into())
        ])
        .await,
        json!(["prod"])
    );
    assert_eq!(
        values(vec![("label", "__name__".into())]).await,
        json!(["app.cpu", "old.cpu"])
    );
    assert_eq!(
        values(vec![
            ("label", "__name__".into()),
            ("from", from.clone()),
            ("until", until.clone())
        ])
        .await,
        json!(["app.cpu"])
    );
    assert_eq!(
        values(vec![("label", "host".into()), ("from", "now-1h".into())]).await,
        json!([])
    );

    assert_eq!(
        get_json(&agg, "/api/apps", &[]).await,
        json!([
            {"name": "app.cpu", "spyName": "gospy", "sampleRate": 100, "units": "samples"},
            {"name": "old.cpu", "spyName": "pyspy", "sampleRate": 100, "units": "samples"},
        ])
    );
}

#[tokio::test]
async fn deleting_an_app_removes_its_data() {
    let agg = Aggregator::start().await;
    let t = base();
    ingest(&agg, "gone.cpu{env=prod}", t, "a 1\n", &[]).await;
    ingest(&agg, "kept.cpu", t, "a 1\n", &[]).await;
    let delete = |body: &'static str| {
        let agg = &agg;
        async move {
            let response = agg
                .http
                .delete(agg.url("/api/apps"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("request");
            (response.status(), response.text().await.expect("body"))
        }
    };
    assert_eq!(delete(r#"{"name": "gone.cpu"}"#).await.0, StatusCode::OK);
    let apps = get_json(&agg, "/api/apps", &[]).await;
    assert_eq!(apps.as_array().map(Vec::len), Some(1));
    assert_eq!(apps[0]["name"], "kept.cpu");
    assert_eq!(
        get_json(&agg, "/label-values", &[("label", "__name__")]).await,
        json!(["kept.cpu"])
    );
    let (from, until) = ((t - 60).to_string(), (t + 60).to_string());
    let render = get_json(
        &agg,
        "/render",
        &[("query", "gone.cpu"), ("from", &from), ("until", &until)],
    )
    .await;
    assert_eq!(render["flamebearer"]["numTicks"], 0);

    let (status, body) = delete(r#"{"name": "gone.cpu"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("gone.cpu"), "{body}");
    let (status, body) = delete("{}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("name"), "{body}");
    assert_eq!(delete("not json").await.0, StatusCode::BAD_REQUEST);
    let metrics = Metrics::scrape(&agg.url("/metrics")).await;
    for (error_type, count) in [("app_not_found", 1.0), ("invalid_body", 2.0)] {
        assert_eq!(
            metrics.value(
                "smolder_aggregator_errors_total",
                &[("error_type", error_type), ("stage", "admin")]
            ),
            count,
            "{error_type}"
        );
    }
}
