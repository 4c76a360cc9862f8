//! Pull mode against real targets: a Go program serving `net/http/pprof`, real HTTP servers
//! that misbehave, real discovery files and a real discovery endpoint.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::response::{IntoResponse, Redirect};
use axum::routing::get;
use serde_json::Value;
use smolder_agent::config::{Config, ScrapeConfig};
use smolder_agent::metrics::Metrics;
use smolder_agent::scrape::{self, Scraper};
use smolder_agent::window;
use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::{Profile, Tree};
use smolder_test_support::net::LOOPBACK_ANY_PORT;
use smolder_test_support::process::Process;
use smolder_test_support::prometheus;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// HTTPS targets (CA, client certificates, skip-verify) and authentication.
mod tls;

/// How long a test waits for an outcome before failing; generous, because the machine is shared.
const PATIENCE: Duration = Duration::from_secs(90);

/// Builds the Go target once per test run (Debian's `golang-go`; `scripts/test` installs it).
fn go_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("scrape-go");
        std::fs::create_dir_all(&dir).unwrap();
        let source =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agent/testdata/pprof_target.go");
        let binary = dir.join("pprof_target");
        let output = Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg(&source)
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOFLAGS", "-mod=mod")
            .output()
            .expect("running `go build`: install Debian's golang-go (scripts/test does)");
        assert!(
            output.status.success(),
            "go build failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        binary
    })
}

/// The Go program, listening on a loopback port it chose; killed on drop.
struct GoTarget {
    _process: Process,
    addr: SocketAddr,
}

impl GoTarget {
    async fn start() -> GoTarget {
        let mut command = Command::new(go_binary());
        command
            .arg(LOOPBACK_ANY_PORT.to_string())
            .stdout(Stdio::null());
        let process = Process::spawn(command);
        let line = process.wait_for_line("its address", |line| line.starts_with("listening "));
        let addr: SocketAddr = line["listening ".len()..].parse().unwrap();
        let target = GoTarget {
            _process: process,
            addr,
        };
        let deadline = Instant::now() + PATIENCE;
        while reqwest::get(format!("http://{addr}/debug/pprof/"))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "the Go target did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        target
    }
}

/// Serves `router` on a loopback port.
async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

/// A heap profile as Go's would look, with one stack in `main.work`.
fn heap_profile() -> Vec<u8> {
    let mut tree = Tree::new();
    tree.insert_names(["main.main", "main.work"], 4096);
    pprof::encode(&tree, &EncodeOptions::new("inuse_space", "bytes")).to_bytes(true)
}

fn scrape_config(yaml: &str) -> ScrapeConfig {
    serde_norway::from_str(yaml).unwrap()
}

/// Starts the scraper alone, with the window channel's receiving end for the test to read.
fn start_scraper(configs: &[ScrapeConfig]) -> (Scraper, mpsc::Receiver<Profile>) {
    let metrics = Metrics::new();
    let (submitter, profiles) = window::channel(&metrics.window);
    let scraper = scrape::start(configs, &submitter, &metrics.scrape, &metrics.health).unwrap();
    (scraper, profiles)
}

async fn next_profile(profiles: &mut mpsc::Receiver<Profile>, deadline: Instant) -> Profile {
    let left = deadline.saturating_duration_since(Instant::now());
    tokio::time::timeout(left, profiles.recv())
        .await
        .expect("no profile before the deadline")
        .expect("the scraper stopped")
}

/// The value of the stacks through a frame named `function`.
fn through(tree: &Tree, function: &str) -> u64 {
    let mut total = 0;
    tree.for_each_stack(|stack, value| {
        if stack.iter().any(|f| tree.frames().name(*f) == function) {
            total += value;
        }
    });
    total
}

fn targets_json(scraper: &Scraper) -> Value {
    serde_json::to_value(scraper.status().snapshot()).unwrap()
}

/// Waits until `check` holds for the scraper's `/targets` document.
async fn wait_for_status(scraper: &Scraper, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let doc = targets_json(scraper);
        if check(&doc) {
            return doc;
        }
        assert!(Instant::now() < deadline, "{what}: {doc:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_program_profiles_and_allocation_deltas() {
    let go = GoTarget::start().await;
    let config = scrape_config(&format!(
        "job-name: go\nscrape-interval: 2s\nscrape-timeout: 5s\n\
         enabled-profiles: [cpu, mem, goroutines, mutex, block]\n\
         static-configs:\n  - application: gotest\n    spy-name: gospy\n    \
         targets: ['{}']\n    labels: {{env: test}}\n",
        go.addr
    ));
    let (scraper, mut profiles) = start_scraper(&[config]);
    let deadline = Instant::now() + PATIENCE;
    let instance = go.addr.to_string();

    let mut seen = std::collections::BTreeSet::new();
    let mut first_inuse: Option<SystemTime> = None;
    let mut cpu_ok = false;
    let mut inuse_ok = false;
    // Phase 1: wait for the first allocation delta, checking CPU and heap profiles meanwhile.
    loop {
        let profile = next_profile(&mut profiles, deadline).await;
        let app = profile.series.app().to_owned();
        seen.insert(app.clone());
        let labels = profile.series.labels();
        assert_eq!(labels.get("job"), Some("go"), "{}", profile.series);
        assert_eq!(labels.get("instance"), Some(instance.as_str()));
        assert_eq!(labels.get("env"), Some("test"));
        assert_eq!(profile.meta.spy_name, "gospy");
        match app.as_str() {
            "gotest.cpu" => {
                assert_eq!(profile.meta.sample_rate, 100);
                assert_eq!(profile.meta.units, "samples");
                if through(&profile.tree, "main.burnCPU") > 0 {
                    assert_eq!(labels.get("worker"), Some("burner"), "{}", profile.series);
                    cpu_ok = true;
                }
            }
            "gotest.inuse_space" => {
                first_inuse.get_or_insert(profile.until);
                let retained = through(&profile.tree, "main.retainMemory");
                assert!(retained >= 4 << 20, "retainMemory holds {retained} bytes");
                inuse_ok = true;
            }
            "gotest.alloc_space" => {
                let first = first_inuse.expect("a heap snapshot before any allocation delta");
                assert!(
                    profile.until > first,
                    "the first heap scrape only primes the allocation deltas"
                );
                break;
            }
            _ => {}
        }
    }

    // Phase 2: allocate a known amount between two scrapes; the deltas that follow hold it.
    let response = reqwest::get(format!("http://{}/alloc?mib=10", go.addr))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let allocated_by = SystemTime::now();
    let mut delta = 0;
    loop {
        let profile = next_profile(&mut profiles, deadline).await;
        let app = profile.series.app().to_owned();
        seen.insert(app.clone());
        if profile.series.app() == "gotest.alloc_space" {
            delta += through(&profile.tree, "main.allocateMemory");
            if profile.until > allocated_by {
                break;
            }
        }
    }
    let expected = 10u64 << 20;
    assert!(
        delta.abs_diff(expected) <= expected / 100,
        "allocation delta {delta} bytes, expected {expected}"
    );

    // By now every profile type has been scraped at least twice.
    let deadline = Instant::now() + PATIENCE;
    let wanted = [
        "gotest.cpu",
        "gotest.inuse_space",
        "gotest.inuse_objects",
        "gotest.alloc_space",
        "gotest.alloc_objects",
        "gotest.goroutines",
        "gotest.mutex_count",
        "gotest.mutex_duration",
        "gotest.block_count",
        "gotest.block_duration",
    ];
    // The burner's CPU samples are a series of their own (worker=burner), which may come after
    // the other CPU series.
    while !(cpu_ok && wanted.iter().all(|w| seen.contains(*w))) {
        let profile = next_profile(&mut profiles, deadline).await;
        match profile.series.app() {
            "gotest.mutex_duration" => assert!(through(&profile.tree, "main.contend") > 0),
            "gotest.cpu" if through(&profile.tree, "main.burnCPU") > 0 => {
                assert_eq!(profile.series.labels().get("worker"), Some("burner"));
                cpu_ok = true;
            }
            _ => {}
        }
        seen.insert(profile.series.app().to_owned());
    }
    assert!(inuse_ok);

    let doc = targets_json(&scraper);
    let active = doc["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 5);
    assert!(active.iter().all(|t| t["health"] == "up"), "{doc:#}");
    scraper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_fail_alone_with_clear_errors() {
    let good = serve(Router::new().fallback(get(|| async {
        (
            [("content-type", "application/octet-stream")],
            heap_profile(),
        )
    })))
    .await;
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let slow = serve(Router::new().fallback(get(|| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        heap_profile()
    })))
    .await;
    let html = serve(Router::new().fallback(get(|| async {
        (
            [("content-type", "text/html; charset=utf-8")],
            "<html><body>not here</body></html>",
        )
    })))
    .await;
    let oversize = serve(Router::new().fallback(get(|| async { vec![7u8; 200_000] }))).await;
    let bomb_body = {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&vec![0u8; 16 << 20]).unwrap();
        encoder.finish().unwrap()
    };
    assert!(
        bomb_body.len() < 100_000,
        "the bomb fits under the body cap"
    );
    let bomb = serve(Router::new().fallback(get(move || {
        let body = bomb_body.clone();
        async move { body }
    })))
    .await;
    let redirect = serve(Router::new().fallback(get(|| async {
        Redirect::temporary("/debug/pprof/heap").into_response()
    })))
    .await;
    // A raw protobuf sent with `Content-Encoding: gzip`, as a compressing proxy would: fine.
    let encoded_body = {
        use std::io::Write as _;
        let mut tree = Tree::new();
        tree.insert_names(["main.main", "main.work"], 4096);
        let raw = pprof::encode(&tree, &EncodeOptions::new("inuse_space", "bytes")).to_bytes(false);
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(&raw).unwrap();
        encoder.finish().unwrap()
    };
    let encoded = serve(Router::new().fallback(get(move || {
        let body = encoded_body.clone();
        async move { ([("content-encoding", "gzip")], body) }
    })))
    .await;

    let mut config = crate::util::isolated(Config::default());
    let targets = [good, refused, slow, html, oversize, bomb, redirect, encoded]
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(", ");
    config.scrape_configs = vec![scrape_config(&format!(
        "job-name: bad\nenabled-profiles: [mem]\nscrape-interval: 2s\nscrape-timeout: 1s\n\
         body-size-limit: 100000\ndecompressed-size-limit: 1048576\n\
         static-configs: [{{application: app, targets: [{targets}]}}]\n"
    ))];
    let agent = smolder_agent::app::start(config).await.unwrap();
    let base = format!("http://{}", agent.addr());

    let deadline = Instant::now() + PATIENCE;
    let doc = loop {
        let doc: Value = reqwest::get(format!("{base}/targets"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let active = doc["activeTargets"].as_array().unwrap();
        if active.len() == 8 && active.iter().all(|t| t["health"] != "unknown") {
            break doc;
        }
        assert!(
            Instant::now() < deadline,
            "targets never all scraped: {doc:#}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_instance = |addr: SocketAddr| {
        doc["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["labels"]["instance"] == addr.to_string())
            .unwrap_or_else(|| panic!("no target {addr}: {doc:#}"))
            .clone()
    };
    assert_eq!(by_instance(encoded)["health"], "up", "{doc:#}");
    let good_target = by_instance(good);
    assert_eq!(good_target["health"], "up", "{good_target:#}");
    assert_eq!(good_target["lastError"], "");
    assert!(good_target["lastScrapeDuration"].as_f64().unwrap() >= 0.0);
    let expectations = [
        (refused, "Connection refused"),
        (slow, "timed out after 1s"),
        (
            html,
            "response is not a usable pprof profile (content-type \"text/html",
        ),
        (
            oversize,
            "response body is larger than body-size-limit (100000 bytes)",
        ),
        (bomb, "profile is larger than the limit of 1048576 bytes"),
        (redirect, "too many redirects"),
    ];
    for (addr, expected) in expectations {
        let target = by_instance(addr);
        assert_eq!(target["health"], "down", "{target:#}");
        let error = target["lastError"].as_str().unwrap();
        assert!(
            error.contains(expected),
            "{addr}: {error:?} lacks {expected:?}"
        );
    }

    let metrics = prometheus::Metrics::scrape(&format!("{base}/metrics")).await;
    let bad = [("job", "bad"), ("profile", "mem")];
    // Each of these series exists (a missing one fails the lookup).
    for reason in ["connect", "timeout", "decode", "too_large", "redirects"] {
        let labels = [bad[0], bad[1], ("reason", reason)];
        metrics.value("smolder_agent_scrape_failures_total", &labels);
    }
    metrics.value("smolder_agent_scrape_profiles_submitted_total", &bad);
    metrics.value("smolder_agent_scrape_duration_seconds_count", &bad);
    for (health, count) in [("up", 2.0), ("down", 6.0)] {
        assert_eq!(
            metrics.value(
                "smolder_agent_scrape_targets",
                &[("health", health), ("job", "bad")]
            ),
            count,
            "{health}"
        );
    }
    agent.stop().await.unwrap();
}

/// The target file of the discovery tests, written whole and renamed into place, as tools do.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyroscope_config_with_file_discovery_and_relabelling() {
    let good = serve(Router::new().fallback(get(|| async { heap_profile() }))).await;
    let other = serve(Router::new().fallback(get(|| async { heap_profile() }))).await;
    let dir = tempfile::tempdir().unwrap();
    let targets = dir.path().join("shop.json");
    write_atomically(
        &targets,
        &format!(
            r#"[{{"application": "shop", "spy-name": "gospy", "targets": ["{good}"],
                 "labels": {{"env": "prod", "k8s_pod": "p1"}}}},
               {{"application": "shop", "targets": ["{other}"], "labels": {{"env": "staging"}}}}]"#
        ),
    );
    // A Pyroscope server config's section, pasted as is, with Prometheus' snake_case relabel keys.
    let config_file = dir.path().join("agent.yml");
    std::fs::write(
        &config_file,
        format!(
            r#"
http:
  listen: 127.0.0.1:0
scrape-configs:
  - job-name: files
    enabled-profiles: [mem]
    scrape-interval: 1s
    scrape-timeout: 900ms
    file-sd-configs:
      - files: ['{}/*.json']
        refresh-interval: 1m
    relabel-configs:
      - source_labels: [__meta_filepath]
        regex: '.*/(.*)\.json'
        target_label: source_file
      - source_labels: [env]
        regex: staging
        action: drop
      - action: labelmap
        regex: 'k8s_(.*)'
      - action: labeldrop
        regex: 'k8s_.*'
"#,
            dir.path().display()
        ),
    )
    .unwrap();
    let config: Config = smolder_daemon::load(Some(&config_file)).unwrap();
    let (scraper, mut profiles) = start_scraper(&config.scrape_configs);

    let doc = wait_for_status(&scraper, "the file's targets", |doc| {
        doc["activeTargets"].as_array().unwrap().len() == 1
    })
    .await;
    let target = &doc["activeTargets"][0];
    assert_eq!(
        target["labels"],
        serde_json::json!({"env": "prod", "instance": good.to_string(), "job": "files",
            "pod": "p1", "source_file": "shop"})
    );
    assert_eq!(
        target["scrapeUrl"],
        format!("http://{good}/debug/pprof/heap")
    );
    assert_eq!(
        target["discoveredLabels"]["__meta_filepath"],
        targets.display().to_string()
    );
    let dropped = doc["droppedTargets"].as_array().unwrap();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0]["reason"], "dropped by relabel-configs");
    assert_eq!(
        dropped[0]["discoveredLabels"]["__address__"],
        other.to_string()
    );

    let deadline = Instant::now() + PATIENCE;
    let profile = next_profile(&mut profiles, deadline).await;
    assert_eq!(
        profile.series.to_string(),
        format!("shop.inuse_space{{env=prod,instance={good},job=files,pod=p1,source_file=shop}}")
    );
    assert_eq!(profile.meta.spy_name, "gospy");
    assert_eq!(profile.meta.units, "bytes");
    assert_eq!(through(&profile.tree, "main.work"), 4096);

    // A change to the file is picked up: staging is now production.
    write_atomically(
        &targets,
        &format!(
            r#"[{{"application": "shop", "targets": ["{good}", "{other}"], "labels": {{"env": "prod"}}}}]"#
        ),
    );
    wait_for_status(&scraper, "the rewritten file's targets", |doc| {
        doc["activeTargets"].as_array().unwrap().len() == 2
            && doc["droppedTargets"].as_array().unwrap().is_empty()
    })
    .await;

    // A broken file is reported, and the targets it listed are kept.
    write_atomically(&targets, r#"[{"application": "shop", "targets": ["#);
    let doc = wait_for_status(&scraper, "the broken file reported", |doc| {
        doc["discovery"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| !d["errors"].as_array().unwrap().is_empty())
    })
    .await;
    assert_eq!(doc["activeTargets"].as_array().unwrap().len(), 2, "{doc:#}");
    let source = doc["discovery"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["source"].as_str().unwrap().starts_with("file:"))
        .unwrap();
    let error = source["errors"][0].as_str().unwrap();
    assert!(
        error.contains("shop.json: invalid JSON target groups"),
        "{error}"
    );
    scraper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_discovery_refreshes_and_keeps_targets_on_bad_documents() {
    let good = serve(Router::new().fallback(get(|| async { heap_profile() }))).await;
    let document: Arc<Mutex<(&'static str, String)>> = Arc::new(Mutex::new((
        "application/json",
        format!(
            r#"[{{"application": "api", "targets": ["{good}"], "labels": {{"team": "core"}}}}]"#
        ),
    )));
    let served = Arc::clone(&document);
    let sd = serve(Router::new().route(
        "/sd",
        get(move || {
            let (content_type, body) = served.lock().unwrap().clone();
            async move { ([("content-type", content_type)], body) }
        }),
    ))
    .await;
    let config = scrape_config(&format!(
        "job-name: http\nenabled-profiles: [mem]\nscrape-interval: 1s\nscrape-timeout: 900ms\n\
         http-sd-configs: [{{url: 'http://{sd}/sd', refresh-interval: 1s}}]\n"
    ));
    let (scraper, _profiles) = start_scraper(&[config]);
    let doc = wait_for_status(&scraper, "the endpoint's target scraped", |doc| {
        doc["activeTargets"]
            .as_array()
            .unwrap()
            .first()
            .is_some_and(|t| t["health"] == "up")
    })
    .await;
    assert_eq!(doc["activeTargets"][0]["labels"]["team"], "core");
    assert_eq!(
        doc["activeTargets"][0]["discoveredLabels"]["__meta_url"],
        format!("http://{sd}/sd")
    );

    *document.lock().unwrap() = ("application/json", "{not json".to_owned());
    let doc = wait_for_status(&scraper, "the bad document reported", |doc| {
        doc["discovery"][1]["errors"]
            .as_array()
            .is_some_and(|e| !e.is_empty())
    })
    .await;
    assert!(
        doc["discovery"][1]["errors"][0]
            .as_str()
            .unwrap()
            .contains("invalid JSON target groups"),
        "{doc:#}"
    );
    assert_eq!(doc["activeTargets"].as_array().unwrap().len(), 1);

    *document.lock().unwrap() = ("text/plain", "[]".to_owned());
    let doc = wait_for_status(&scraper, "the wrong content type reported", |doc| {
        doc["discovery"][1]["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("is not application/json"))
    })
    .await;
    assert_eq!(doc["activeTargets"].as_array().unwrap().len(), 1);

    *document.lock().unwrap() = ("application/json; charset=utf-8", "[]".to_owned());
    wait_for_status(&scraper, "the emptied endpoint applied", |doc| {
        doc["activeTargets"].as_array().unwrap().is_empty()
    })
    .await;
    scraper.stop().await;
}
