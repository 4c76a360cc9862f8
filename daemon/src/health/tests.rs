use std::sync::atomic::AtomicU32;

use super::*;

fn health() -> (Health, Registry) {
    let registry = Registry::new();
    (Health::new("test", &registry), registry)
}

fn state(health: &Health, name: &str) -> LoopReport {
    health
        .report()
        .into_iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no loop {name}"))
}

/// Polls `check` until it holds; no bound but the test harness's, so a loaded machine is slow,
/// not failing.
fn until(mut check: impl FnMut() -> bool) {
    while !check() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_loop_starts_runs_and_stops() {
    let (health, _registry) = health();
    let beat = health.register("window", Duration::from_secs(3600));
    assert_eq!(state(&health, "window").state, LoopState::Starting);
    assert!(health.live());
    beat.beat();
    assert_eq!(state(&health, "window").state, LoopState::Running);
    drop(beat);
    // Ended while the daemon runs: nothing would restart it.
    assert_eq!(state(&health, "window").state, LoopState::Stopped);
    assert!(!health.live());
    health.stopping();
    assert!(health.live());
}

#[test]
fn no_beat_for_three_periods_is_stuck_and_degraded_never_is() {
    let (health, _registry) = health();
    let stuck = health.register("stuck", Duration::from_millis(5));
    let waiting = health.register("ship", Duration::from_millis(5));
    waiting.degraded("cannot reach the aggregator: timed out");
    stuck.beat();
    std::thread::sleep(Duration::from_millis(50));
    let report = state(&health, "stuck");
    assert_eq!(report.state, LoopState::Stuck);
    assert!(report.detail.contains("no beat for"), "{}", report.detail);
    let ship = state(&health, "ship");
    assert_eq!(ship.state, LoopState::Degraded);
    assert_eq!(ship.detail, "cannot reach the aggregator: timed out");
    assert!(ship.ready() && ship.live(false));
    assert!(!health.live());
    stuck.beat();
    assert!(health.live());
    // `alive` keeps a degraded loop degraded; `beat` ends it.
    waiting.alive();
    assert_eq!(state(&health, "ship").state, LoopState::Degraded);
    waiting.beat();
    assert_eq!(state(&health, "ship").state, LoopState::Running);
}

#[test]
fn a_panicking_task_is_dead() {
    let (health, _registry) = health();
    let beat = health.register("spool", Duration::from_secs(60));
    let joined = std::thread::spawn(move || {
        let _beat = beat;
        panic!("boom");
    })
    .join();
    assert!(joined.is_err());
    assert_eq!(state(&health, "spool").state, LoopState::Dead);
    health.stopping();
    assert!(!health.live(), "a dead loop stays dead while stopping");
}

#[test]
fn a_supervised_loop_restarts_after_a_panic_and_counts_it() {
    let (health, registry) = health();
    let runs = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (r, s) = (Arc::clone(&runs), Arc::clone(&stop));
    let thread = supervise(
        health.register("symbolize", Duration::from_secs(60)),
        "test-supervised",
        move |beat| {
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("an odd ELF");
            }
            while !s.load(Ordering::SeqCst) {
                beat.beat();
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        },
    )
    .unwrap();
    until(|| state(&health, "symbolize").state == LoopState::Restarting);
    let restarting = state(&health, "symbolize");
    assert_eq!(restarting.restarts, 1);
    assert_eq!(restarting.detail, "panicked: an odd ELF");
    assert!(health.live() && !restarting.ready());
    until(|| state(&health, "symbolize").state == LoopState::Running);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        text.contains("smolder_test_health_restarts_total{loop=\"symbolize\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("smolder_test_health_loop_state{loop=\"symbolize\",state=\"running\"} 1"),
        "{text}"
    );
    assert!(text.contains("smolder_test_health_beat_age_seconds{loop=\"symbolize\"}"));
    stop.store(true, Ordering::SeqCst);
    thread.join();
    assert_eq!(state(&health, "symbolize").state, LoopState::Stopped);
}

#[test]
fn errors_restart_too() {
    let (health, _registry) = health();
    let runs = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&runs);
    let thread = supervise(
        health.register("ebpf", Duration::from_secs(60)),
        "test-errors",
        move |_| match r.fetch_add(1, Ordering::SeqCst) {
            0 => anyhow::bail!("reading the ring buffer failed"),
            _ => Ok(()),
        },
    )
    .unwrap();
    thread.join();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(state(&health, "ebpf").restarts, 1);
}

#[tokio::test]
async fn the_endpoints_name_each_loop() {
    let (health, _registry) = health();
    let window = health.register("window", Duration::from_secs(60));
    let ship = health.register("ship", Duration::from_secs(60));
    // What the routes answer, without a listener.
    let get = |path: &'static str| {
        let probe = if path == "/readyz" {
            Probe::Ready
        } else {
            Probe::Live
        };
        let response = health.answer(probe).into_response();
        async move {
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body.starts_with("not ready: window starting, ship starting\n"),
        "{body}"
    );
    let (status, _) = get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    window.beat();
    ship.degraded("cannot reach the aggregator");
    let (status, body) = get("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let row = body
        .lines()
        .find(|l| l.starts_with("ship "))
        .unwrap_or_else(|| panic!("{body}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[1], "degraded", "{row}");
    assert_eq!(columns[3], "0", "{row}");
    assert!(row.ends_with("cannot reach the aggregator"), "{row}");
}
