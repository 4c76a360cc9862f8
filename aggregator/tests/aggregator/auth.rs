//! Authentication and authorization over real HTTP and QUIC: every route of the router tried
//! with no, wrong, removed-from-file and out-of-scope credentials; the loopback rule without
//! credentials; a credential's tenant against `X-Scope-OrgID`; agents' tokens from the same
//! list; HTTPS; Pyroscope's Python and Node.js SDKs with a token and with basic auth; secrets
//! kept out of the log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::{Method, RequestBuilder, StatusCode};
use smolder_agent::app as agent_app;
use smolder_aggregator::app::{self, Access, Route, Scope};
use smolder_aggregator::config::Config;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::transport::{agent_config, agent_metrics, profile};
use crate::util::Aggregator;

const ADMIN: &str = "admin-token-0123456789abcdef";
const INGEST: &str = "ingest-token-0123456789abcdef";
const READ_USER: &str = "grafana";
const READ_PASSWORD: &str = "reader-password-0123456789";

/// A config from `yaml` (a whole config file).
fn config(yaml: &str) -> Config {
    smolder_daemon::parse(yaml).unwrap_or_else(|err| panic!("{err:#}\n{yaml}"))
}

/// `auth:` with the three inline credentials, and `extra` lines under it.
fn credentials_yaml(extra: &str) -> String {
    format!(
        "auth:\n  credentials:\n    - {{name: admin, token: {ADMIN}, scopes: [admin]}}\n    - {{name: reader, user: {READ_USER}, password: {READ_PASSWORD}, scopes: [read]}}\n    - {{name: ingester, token: {INGEST}, scopes: [ingest]}}\n{extra}"
    )
}

/// The inline credential that has `scope`.
fn right(scope: Scope) -> As<'static> {
    match scope {
        Scope::Ingest => As::Bearer(INGEST),
        Scope::Read => As::Basic(READ_USER, READ_PASSWORD),
        Scope::Admin => As::Bearer(ADMIN),
    }
}

/// An inline credential that lacks `scope`.
fn wrong_scope(scope: Scope) -> As<'static> {
    match scope {
        Scope::Ingest | Scope::Admin => As::Basic(READ_USER, READ_PASSWORD),
        Scope::Read => As::Bearer(INGEST),
    }
}

/// The index of the credential file's entry with `scope`.
fn from_file(scope: Scope) -> usize {
    match scope {
        Scope::Ingest => 0,
        Scope::Read => 1,
        Scope::Admin => 2,
    }
}

/// How a test request presents itself.
#[derive(Clone, Copy, Debug)]
enum As<'a> {
    Nobody,
    Bearer(&'a str),
    Basic(&'a str, &'a str),
}

impl As<'_> {
    fn apply(self, request: RequestBuilder) -> RequestBuilder {
        match self {
            As::Nobody => request,
            As::Bearer(token) => request.bearer_auth(token),
            As::Basic(user, password) => request.basic_auth(user, Some(password)),
        }
    }
}

/// A path of `route` the router matches: parameters filled in.
fn concrete(route: &Route) -> String {
    route
        .path
        .replace("{name}", "some_rule")
        .replace("{*path}", "index.js")
}

async fn call(agg: &Aggregator, route: &Route, who: As<'_>) -> (StatusCode, String) {
    let method = Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
    let request = who.apply(agg.http.request(method, agg.url(&concrete(route))));
    let response = request.send().await.expect("request");
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

fn write_credential_file(path: &Path, entries: &[(&str, &str, &str)]) {
    let mut text = String::from("credentials:\n");
    for (name, token, scope) in entries {
        text.push_str(&format!(
            "  - {{name: {name}, token: {token}, scopes: [{scope}]}}\n"
        ));
    }
    // Written whole and renamed into place, as OPERATIONS.md tells operators to.
    let staging = path.with_extension("new");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

/// The must-show of issue 20: every route of the running router, tried with no credentials,
/// a wrong token, wrong basic auth, a credential without the route's scope, and a credential
/// removed from its file, gets 401 or 403; the right credential gets through each; a removed
/// credential is refused within 5 s.
#[tokio::test]
async fn every_route_refuses_missing_wrong_removed_and_out_of_scope_credentials() {
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("credentials.yaml");
    let file_tokens = [
        ("file-ingest", "file-ingest-token-0123456789", "ingest"),
        ("file-read", "file-read-token-0123456789", "read"),
        ("file-admin", "file-admin-token-0123456789", "admin"),
    ];
    write_credential_file(&file, &file_tokens);
    let agg = Aggregator::with_config(config(&credentials_yaml(&format!(
        "  credential-files: [{}]\n  open-metrics: false\n  open-health: false\n",
        file.display()
    ))))
    .await;
    let routes = agg.routes();
    for expected in [
        (Method::POST, "/ingest", Access::Scope(Scope::Ingest)),
        (Method::GET, "/render", Access::Scope(Scope::Read)),
        (Method::DELETE, "/api/apps", Access::Scope(Scope::Admin)),
        (Method::GET, "/metrics", Access::Scope(Scope::Read)),
        (Method::GET, "/", Access::Open),
    ] {
        assert!(
            routes
                .iter()
                .any(|r| r.method.as_str() == expected.0.as_str()
                    && r.path == expected.1
                    && r.access == expected.2),
            "{expected:?} is not in {routes:?}"
        );
    }
    let mut tried = 0;
    for route in &routes {
        let Access::Scope(scope) = route.access else {
            let (status, body) = call(&agg, route, As::Nobody).await;
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                "{route:?} is open: {status} {body}"
            );
            continue;
        };
        for (who, expected) in [
            (As::Nobody, StatusCode::UNAUTHORIZED),
            (As::Bearer("not-a-token"), StatusCode::UNAUTHORIZED),
            (As::Basic(READ_USER, "wrong"), StatusCode::UNAUTHORIZED),
            (wrong_scope(scope), StatusCode::FORBIDDEN),
        ] {
            let (status, body) = call(&agg, route, who).await;
            assert_eq!(status, expected, "{route:?} as {who:?}: {body}");
            tried += 1;
        }
        for who in [right(scope), As::Bearer(file_tokens[from_file(scope)].1)] {
            let (status, body) = call(&agg, route, who).await;
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
                "{route:?} as {who:?}: {status} {body}"
            );
        }
    }

    // The file loses its credentials: refused within 5 s.
    write_credential_file(&file, &[]);
    let removed_at = Instant::now();
    let reader = &routes
        .iter()
        .find(|r| r.path == "/api/apps" && r.method.as_str() == "GET")
        .expect("GET /api/apps")
        .clone();
    loop {
        let (status, _) = call(&agg, reader, As::Bearer(file_tokens[1].1)).await;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            removed_at.elapsed() < Duration::from_secs(5),
            "still {status} 5 s after the credential was removed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = removed_at.elapsed();
    for route in &routes {
        let Access::Scope(scope) = route.access else {
            continue;
        };
        let who = As::Bearer(file_tokens[from_file(scope)].1);
        let (status, body) = call(&agg, route, who).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{route:?} removed: {body}"
        );
        tried += 1;
    }
    let protected = routes.iter().filter(|r| r.access != Access::Open).count();
    assert_eq!(tried, protected * 5);
    let metrics = scrape(&agg).await;
    assert!(
        metrics.value(
            "smolder_aggregator_refused_total",
            &[("stage", "auth"), ("reason", "scope")]
        ) >= protected as f64
    );
    println!(
        "{} routes, {protected} protected, {tried} refusals checked; a removed credential refused after {took:?}",
        routes.len()
    );
    agg.stop().await;
}

/// With no credentials configured, a client on this host is served without any (also one
/// presenting another service's credentials, as SDKs set up for Grafana Cloud do), and a client
/// elsewhere gets 401 naming the config key, unless it presents the development admin token
/// written next to the development CA.
#[tokio::test]
async fn without_credentials_only_this_host_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.http.listen = "0.0.0.0:0".parse().unwrap();
    config.ingest.quic.listen = smolder_test_support::net::LOOPBACK_ANY_PORT;
    let running = app::start(config, dir.path()).await.unwrap();
    let port = running.addr().port();
    let http = reqwest::Client::new();
    let loopback = format!("http://127.0.0.1:{port}");
    let admin = std::fs::read_to_string(dir.path().join("tls/admin-token")).unwrap();
    let admin = admin.trim();
    assert_eq!(admin.len(), 48, "a random development admin token");

    let get = |base: &str, who: As<'_>, relayed: bool| {
        let mut request = who.apply(http.get(format!("{base}/api/apps")));
        if relayed {
            request = request.header("X-Forwarded-For", "203.0.113.7");
        }
        request.send()
    };
    assert_eq!(
        get(&loopback, As::Nobody, false).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        get(&loopback, As::Bearer("grafana-cloud-token"), false)
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // A proxy on this host relaying a remote client is not this host.
    let relayed = get(&loopback, As::Nobody, true).await.unwrap();
    assert_eq!(relayed.status(), StatusCode::UNAUTHORIZED);
    let body = relayed.text().await.unwrap();
    assert!(body.contains("auth.credentials"), "{body}");
    assert_eq!(
        get(&loopback, As::Bearer(admin), true)
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // A web page of another site that a browser on this host was made to send: renamed to
    // 127.0.0.1 (its Host), or posting across sites (its Origin).
    let rebound = http
        .get(format!("{loopback}/api/apps"))
        .header("Host", format!("rebound.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::UNAUTHORIZED);
    let posted = http
        .post(format!("{loopback}/ingest?name=csrf.cpu&from=1&until=2"))
        .header("Origin", "https://evil.example")
        .header("Content-Type", "text/plain")
        .body("main;evil 1")
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::UNAUTHORIZED);
    let apps = get(&loopback, As::Nobody, false).await.unwrap();
    assert!(
        !apps.text().await.unwrap().contains("csrf"),
        "nothing stored"
    );
    // A real client on another address of this machine, when it has one.
    let local = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("192.0.2.254:9").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified());
    if let Some(ip) = local {
        let remote = format!("http://{}", SocketAddr::new(ip, port));
        let refused = get(&remote, As::Nobody, false).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "from {ip}");
        assert!(refused.text().await.unwrap().contains("auth.credentials"));
        assert_eq!(
            get(&remote, As::Bearer(admin), false)
                .await
                .unwrap()
                .status(),
            StatusCode::OK
        );
    }
    let health = http
        .get(format!("{loopback}/healthz"))
        .header("X-Forwarded-For", "203.0.113.7");
    assert_eq!(
        health.send().await.unwrap().status(),
        StatusCode::OK,
        "open"
    );
    running.stop().await.unwrap();
}

/// Under multitenancy, a credential limited to a tenant stores and reads that tenant's data
/// whatever `X-Scope-OrgID` says of it: without the header or with the same id it is served, with
/// another id it gets 403; a credential without a tenant names one with the header.
#[tokio::test]
async fn a_credentials_tenant_wins_and_another_header_is_forbidden() {
    let agg = Aggregator::with_config(config(&format!(
        "tenant:\n  multitenancy-enabled: true\n{}",
        credentials_yaml(
            "    - {name: team-a, token: team-a-token-0123456789, scopes: [ingest, read], tenant: team-a}\n"
        )
    )))
    .await;
    let team_a = "team-a-token-0123456789";
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let push = |tenant: Option<&str>| {
        let mut request = agg
            .http
            .post(agg.url("/ingest"))
            .query(&[
                ("name", "shop.cpu"),
                ("from", &(now - 10).to_string()),
                ("until", &now.to_string()),
            ])
            .bearer_auth(team_a)
            .body("main;work 5\n");
        if let Some(tenant) = tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        request.send()
    };
    assert_eq!(push(None).await.unwrap().status(), StatusCode::OK);
    assert_eq!(push(Some("team-a")).await.unwrap().status(), StatusCode::OK);
    let forbidden = push(Some("team-b")).await.unwrap();
    assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
    let body = forbidden.text().await.unwrap();
    assert!(
        body.contains("\"team-a\" is for tenant \"team-a\", but X-Scope-OrgID names \"team-b\""),
        "{body}"
    );
    let total = |who: &'static str, tenant: &'static str| {
        agg.http
            .get(agg.url("/render"))
            .query(&[
                ("query", "shop.cpu"),
                ("from", "now-1h"),
                ("until", "now+1m"),
            ])
            .bearer_auth(who)
            .header("X-Scope-OrgID", tenant)
            .send()
    };
    let a: serde_json::Value = total(ADMIN, "team-a").await.unwrap().json().await.unwrap();
    assert_eq!(a["flamebearer"]["numTicks"], 10, "both pushes, in team-a");
    let b: serde_json::Value = total(ADMIN, "team-b").await.unwrap().json().await.unwrap();
    assert_eq!(b["flamebearer"]["numTicks"], 0, "nothing in team-b");
    let whoami: serde_json::Value = agg.get_json_as("/api/tenant", team_a).await;
    assert_eq!(whoami["tenant"], "team-a");
    agg.stop().await;
}

/// `/metrics`, read with the admin token.
async fn scrape(agg: &Aggregator) -> Metrics {
    let text = agg
        .http
        .get(agg.url("/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    Metrics::parse(&text).unwrap()
}

/// The apps stored, read with the admin token.
async fn apps(agg: &Aggregator) -> Vec<String> {
    let apps: Vec<serde_json::Value> = agg.get_json_as("/api/apps", ADMIN).await;
    apps.iter()
        .filter_map(|a| a["name"].as_str().map(str::to_owned))
        .collect()
}

/// The total of `query` over the last hour, read with the admin token.
async fn ticks(agg: &Aggregator, query: &str) -> u64 {
    let render: serde_json::Value = agg
        .http
        .get(agg.url("/render"))
        .query(&[("query", query), ("from", "now-1h"), ("until", "now+1m")])
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    render["flamebearer"]["numTicks"].as_u64().unwrap_or(0)
}

/// Agents' tokens are credentials like any other: one with scope `ingest` ships, one without is
/// refused at its hello, and one removed from its file gets its connection closed within 5 s,
/// its batches kept in the agent's spool until the token is back, then stored once.
#[tokio::test]
async fn agents_ship_with_ingest_credentials_and_a_removed_one_loses_nothing() {
    let files = tempfile::tempdir().unwrap();
    let file = files.path().join("agents.yaml");
    let agent_token = "agent-token-0123456789abcdef";
    write_credential_file(&file, &[("fleet", agent_token, "ingest")]);
    let agg = Aggregator::with_config(config(&credentials_yaml(&format!(
        "  credential-files: [{}]\n",
        file.display()
    ))))
    .await;
    assert!(
        !agg.dir().join("tls/agent-token").exists(),
        "no development token when credentials are configured"
    );
    let state = tempfile::tempdir().unwrap();
    let start = |name: &str, token: &str| {
        let mut config = agent_config(agg.quic_addr(), agg.dir());
        config.ship.token = token.to_owned();
        config.ship.token_file = PathBuf::from("/nonexistent");
        let dir = state.path().join(name);
        async move { agent_app::start_in(config, &dir).await.unwrap() }
    };
    let fleet = start("fleet", agent_token).await;
    let reader = start("reader", "file-read-token-is-not-here").await;
    let now = SystemTime::now();
    fleet
        .submitter()
        .submit(profile("fleet.cpu", "main;a", 3, now))
        .await
        .unwrap();
    reader
        .submitter()
        .submit(profile("reader.cpu", "main;a", 3, now))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "the fleet's batch", || async {
        ticks(&agg, "fleet.cpu").await == 3
    })
    .await;
    eventually(Duration::from_secs(10), "the reader retries", || async {
        agent_metrics(&reader)
            .await
            .value("smolder_agent_ship_reconnects_total", &[])
            >= 2.0
    })
    .await;
    assert_eq!(ticks(&agg, "reader.cpu").await, 0);

    write_credential_file(&file, &[]);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    fleet
        .submitter()
        .submit(profile("fleet.cpu", "main;b", 4, SystemTime::now()))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the fleet is refused", || async {
        agent_metrics(&fleet)
            .await
            .value("smolder_agent_ship_connected", &[])
            == 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        ticks(&agg, "fleet.cpu").await,
        3,
        "nothing stored meanwhile"
    );
    assert!(
        agent_metrics(&fleet)
            .await
            .value("smolder_agent_spool_batches", &[])
            >= 1.0,
        "kept in the spool"
    );
    write_credential_file(&file, &[("fleet", agent_token, "ingest")]);
    eventually(
        Duration::from_secs(20),
        "the spooled batch, once",
        || async { ticks(&agg, "fleet.cpu").await == 7 },
    )
    .await;
    fleet.stop().await.unwrap();
    reader.stop().await.unwrap();
    agg.stop().await;
}

/// A certificate and key for `localhost`, signed by a CA of their own: (CA, cert, key) PEM files
/// in `dir`, named after `name`.
fn tls_files(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} aggregator"));
    let cert = params.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join(format!("{name}-ca.pem")),
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// `curl` (a client of its own TLS stack) against `url`, trusting `ca`; the status, or `None`
/// when the TLS or HTTP exchange failed.
fn curl(url: &str, ca: &Path, token: Option<&str>) -> Option<u16> {
    let mut command = std::process::Command::new("curl");
    command
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
        .arg(ca)
        .arg(url);
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let output = command.output().expect("curl runs");
    let code: u16 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .ok()?;
    (code != 0).then_some(code)
}

/// With `http.cert` and `http.key` the API is HTTPS only, verified by curl against the CA; a
/// renewed certificate is served without a restart.
#[tokio::test]
async fn https_with_rustls_and_a_renewed_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_files(pki.path(), "first");
    let mut config = config(&credentials_yaml(""));
    config.http.cert = Some(cert.clone());
    config.http.key = Some(key.clone());
    let agg = Aggregator::with_config(config).await;
    let port = agg.addr().port();
    let url = format!("https://localhost:{port}/api/apps");
    let check = url.clone();
    let ca_first = ca.clone();
    let answer = tokio::task::spawn_blocking(move || curl(&check, &ca_first, Some(ADMIN)))
        .await
        .unwrap();
    assert_eq!(answer, Some(200));
    let plain = agg.http.get(agg.url("/api/apps")).send().await;
    assert!(plain.is_err(), "no plain HTTP on an HTTPS listener");

    // Renewed: new files in place; served within the reload check (10 s).
    let (new_ca, new_cert, new_key) = tls_files(pki.path(), "second");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (check, ca) = (url.clone(), new_ca.clone());
        let answer = tokio::task::spawn_blocking(move || curl(&check, &ca, Some(ADMIN)))
            .await
            .unwrap();
        if answer == Some(200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate is not served"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    agg.stop().await;
}

/// Runs `script` under `program` with `args`; the JSON it prints.
async fn client(program: &str, script: PathBuf, args: Vec<String>) -> serde_json::Value {
    let program = program.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&program)
            .arg(&script)
            .args(&args)
            .output()
            .unwrap_or_else(|err| panic!("{program} runs (scripts/test installs the SDKs): {err}"))
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints json")
}

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// Pyroscope's Python SDK (pyroscope-io) and Node.js SDK (@pyroscope/nodejs), unchanged, push to
/// an aggregator that asks for credentials: with a token and with basic auth; with a wrong token
/// their profiles are refused.
#[tokio::test]
async fn pyroscope_sdks_push_with_a_token_and_with_basic_auth() {
    let agg = Aggregator::with_config(config(&credentials_yaml(
        "    - {name: sdk-basic, user: sdk, password: sdk-password-0123456789, scopes: [ingest]}\n",
    )))
    .await;
    let base = agg.url("");
    let python = |app: &str, auth: &[&str]| {
        let mut args = vec![base.clone(), app.to_owned()];
        args.extend(auth.iter().map(|s| (*s).to_owned()));
        client("python3", clients().join("sdk_push.py"), args)
    };
    let node = |app: &str, auth: &[&str]| {
        let mut args = vec![base.clone(), app.to_owned()];
        args.extend(auth.iter().map(|s| (*s).to_owned()));
        client("node", clients().join("node/sdk_push.mjs"), args)
    };
    let (py_token, py_basic, py_wrong, node_token, node_basic, node_wrong) = tokio::join!(
        python("pytoken", &["token", INGEST]),
        python("pybasic", &["basic", "sdk", "sdk-password-0123456789"]),
        python("pywrong", &["token", "wrong-token"]),
        node("nodetoken", &["token", INGEST]),
        node("nodebasic", &["basic", "sdk", "sdk-password-0123456789"]),
        node("nodewrong", &["token", "wrong-token"]),
    );
    for run in [
        &py_token,
        &py_basic,
        &py_wrong,
        &node_token,
        &node_basic,
        &node_wrong,
    ] {
        assert!(run["end"].as_u64().is_some(), "{run}");
    }
    for app in [
        "pytoken.cpu",
        "pybasic.cpu",
        "nodetoken.cpu",
        "nodebasic.cpu",
    ] {
        eventually(Duration::from_secs(10), app, || async {
            ticks(&agg, &format!("{app}{{}}")).await > 0
        })
        .await;
    }
    let names = apps(&agg).await;
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("pywrong") || n.starts_with("nodewrong")),
        "{names:?}"
    );
    let metrics = scrape(&agg).await;
    assert!(
        metrics.value(
            "smolder_aggregator_refused_total",
            &[("stage", "auth"), ("reason", "invalid")]
        ) >= 2.0,
        "{metrics:?}"
    );
    agg.stop().await;
}

/// No secret reaches the log, whatever is presented and at which level: tokens, passwords,
/// basic-auth headers, sign-ins and the development token.
#[tokio::test]
async fn secrets_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credentials.yaml");
    let in_file = "file-secret-token-0123456789";
    write_credential_file(&file, &[("from-file", in_file, "read")]);
    let config_path = dir.path().join("aggregator.yaml");
    std::fs::write(
        &config_path,
        format!(
            "http:\n  listen: 127.0.0.1:0\ningest:\n  quic:\n    listen: 127.0.0.1:0\n    tokens: [legacy-secret-token-0123456789]\n{}",
            credentials_yaml(&format!("  credential-files: [{}]\n", file.display()))
        ),
    )
    .unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-aggregator")), "trace");
    command
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config_path);
    let mut process = Process::spawn(command);
    let base = format!("http://{}", process.listening("http"));
    let http = reqwest::Client::new();
    let wrong = "wrong-secret-token-0123456789";
    let requests = [
        http.get(format!("{base}/api/apps")).bearer_auth(ADMIN),
        http.get(format!("{base}/api/apps")).bearer_auth(wrong),
        http.get(format!("{base}/api/apps")).bearer_auth(in_file),
        http.get(format!("{base}/api/apps"))
            .basic_auth(READ_USER, Some(READ_PASSWORD)),
        http.get(format!("{base}/api/apps"))
            .basic_auth(READ_USER, Some(wrong)),
        http.post(format!("{base}/login"))
            .json(&serde_json::json!({ "token": ADMIN })),
        http.post(format!("{base}/login"))
            .json(&serde_json::json!({ "user": READ_USER, "password": READ_PASSWORD })),
        http.post(format!("{base}/login"))
            .json(&serde_json::json!({ "token": wrong })),
        http.post(format!("{base}/ingest?name=a.cpu"))
            .bearer_auth(INGEST)
            .body("main 1\n"),
    ];
    let mut cookie = None;
    for request in requests {
        let response = request.send().await.unwrap();
        if let Some(set) = response.headers().get("set-cookie") {
            cookie = Some(set.to_str().unwrap().split(';').next().unwrap().to_owned());
        }
    }
    let cookie = cookie.expect("a sign-in set a cookie");
    http.get(format!("{base}/api/apps"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    process.terminate();
    process.wait();
    let log = process.log();
    assert!(
        log.contains("signed in to the web UI"),
        "the log has the events: {log}"
    );
    let session = cookie.split_once('=').unwrap().1;
    for secret in [
        ADMIN,
        INGEST,
        READ_PASSWORD,
        in_file,
        wrong,
        "legacy-secret-token-0123456789",
        session,
    ] {
        assert!(!log.contains(secret), "{secret} is in the log");
    }
    use base64::Engine;
    let basic =
        base64::engine::general_purpose::STANDARD.encode(format!("{READ_USER}:{READ_PASSWORD}"));
    assert!(!log.contains(&basic), "a basic-auth header is in the log");
}
