//! The spool on disk: what the agent produces while no aggregator answers stays, across
//! restarts, within its bounds; and the spool's disk failing under the real agent sampling the
//! host with eBPF: full (a small loop-mounted filesystem) and slow (a loop device throttled by
//! the block-I/O cgroup controller), with sampling going on, every window accounted for, and
//! health saying what is wrong.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use smolder_agent::app::{self, Running};
use smolder_agent::config::Config;
use smolder_common::wire::{BatchMessage, FrameKind, FrameLimits, frame};
use smolder_common::{Profile, ProfileMeta, Tree};
use smolder_test_support::health::{PATIENCE, probe, until};
use smolder_test_support::net::silent_udp;
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::util::{LoopFs, Throttle, exclusive};

/// An agent whose aggregator never answers: a UDP socket nothing reads and TLS files that do
/// not exist.
fn unreachable_config(dir: &Path) -> Config {
    let mut config = crate::util::isolated(Config::default());
    // These tests count the batches of the profiles they submit; the eBPF source would add
    // the host's own.
    config.ebpf.enabled = false;
    config.window.length = Duration::from_millis(250);
    config.window.settle = Duration::ZERO;
    config.ship.ca = dir.join("missing-ca.pem");
    config.ship.token_file = dir.join("missing-token");
    config.ship.backoff_min = Duration::from_millis(50);
    config.ship.backoff_max = Duration::from_millis(200);
    config
}

fn profile(value: u64, at: SystemTime) -> Profile {
    let mut tree = Tree::new();
    tree.insert_names(["main", "work"], value);
    Profile {
        series: "kept.cpu".parse().unwrap(),
        meta: ProfileMeta::default(),
        from: at - Duration::from_millis(1),
        until: at,
        tree,
    }
}

/// The agent's `/metrics`.
async fn metrics(agent: &Running) -> Metrics {
    Metrics::scrape(&format!("http://{}/metrics", agent.addr())).await
}

/// Waits until metric `name` with `labels` (which must exist) is `value`.
async fn wait_for(agent: &Running, name: &str, labels: &[(&str, &str)], value: f64) {
    eventually(
        Duration::from_secs(20),
        &format!("{name}{labels:?} reaching {value}"),
        || async { metrics(agent).await.value(name, labels) == value },
    )
    .await;
}

/// Three windows in the recent past, one batch each.
async fn produce_three(agent: &Running) {
    let base = SystemTime::now() - Duration::from_secs(30);
    for i in 0..3u64 {
        agent
            .submitter()
            .submit(profile(i + 1, base + Duration::from_secs(i)))
            .await
            .unwrap();
        wait_for(
            agent,
            "smolder_agent_spool_batches_written_total",
            &[],
            i as f64 + 1.0,
        )
        .await;
    }
}

#[tokio::test]
async fn batches_and_the_agent_id_survive_a_restart() {
    let state = tempfile::tempdir().unwrap();
    let config = unreachable_config(state.path());
    let agent = app::start_in(config.clone(), state.path()).await.unwrap();
    let id = agent.agent_id().to_owned();
    assert_eq!(id.len(), 32, "{id}");
    produce_three(&agent).await;
    wait_for(&agent, "smolder_agent_spool_batches", &[], 3.0).await;
    assert!(
        metrics(&agent)
            .await
            .value("smolder_agent_spool_bytes", &[])
            > 0.0
    );
    wait_for(&agent, "smolder_agent_ship_connected", &[], 0.0).await;
    assert!(
        metrics(&agent)
            .await
            .value("smolder_agent_ship_reconnects_total", &[])
            >= 1.0
    );
    agent.stop().await.unwrap();

    let agent = app::start_in(config, state.path()).await.unwrap();
    assert_eq!(agent.agent_id(), id, "the agent id is kept with the spool");
    wait_for(&agent, "smolder_agent_spool_batches", &[], 3.0).await;
    produce_three(&agent).await;
    wait_for(&agent, "smolder_agent_spool_batches", &[], 6.0).await;
    agent.stop().await.unwrap();
}

#[tokio::test]
async fn a_second_agent_on_the_same_data_dir_fails_clearly() {
    let state = tempfile::tempdir().unwrap();
    let config = unreachable_config(state.path());
    let first = app::start_in(config.clone(), state.path()).await.unwrap();
    let Err(err) = app::start_in(config, state.path()).await else {
        panic!("a second agent started on the same spool");
    };
    assert!(
        format!("{err:#}").contains("opening the spool in"),
        "{err:#}"
    );
    first.stop().await.unwrap();
}

#[tokio::test]
async fn batches_past_the_age_bound_are_dropped_and_counted() {
    let state = tempfile::tempdir().unwrap();
    let mut config = unreachable_config(state.path());
    config.spool.max_age = Duration::from_secs(1);
    let agent = app::start_in(config, state.path()).await.unwrap();
    produce_three(&agent).await;
    // The age bound is applied every 10 s.
    wait_for(
        &agent,
        "smolder_agent_dropped_batches_total",
        &[("stage", "spool"), ("reason", "expired")],
        3.0,
    )
    .await;
    assert_eq!(
        metrics(&agent)
            .await
            .value("smolder_agent_spool_batches", &[]),
        0.0
    );
    agent.stop().await.unwrap();
}

/// The real agent binary sampling the whole host with eBPF in 1 s windows, its data directory
/// in `data`, shipping nowhere (a socket that never answers), so that every window stays in
/// the spool. The unwind tables' disk cache, in the same data directory, is kept small, so that
/// the spool's disk fills when the test says.
fn sampling_agent(data: &Path, config_dir: &Path) -> Process {
    let config = format!(
        "http:\n  listen: 127.0.0.1:0\nship:\n  aggregator: {}\n\
         window:\n  length: 1s\n  settle: 1s\n\
         ebpf:\n  unwind:\n    max-cache-bytes: 4194304\n",
        silent_udp()
    );
    let path = config_dir.join("agent.yaml");
    std::fs::write(&path, config).unwrap();
    let mut command = daemon(Path::new(env!("CARGO_BIN_EXE_smolder-agent")), "info");
    command
        .arg("--config")
        .arg(&path)
        .arg("--data-dir")
        .arg(data);
    Process::spawn(command)
}

/// What the fault tests read from the agent's `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    /// Windows the window loop closed.
    closed: f64,
    /// Batches written to the spool (one per window here: the host's windows fit one batch).
    written: f64,
    /// Batches in the spool.
    spooled: f64,
    /// Windows' batches lost because the disk was full, or failing otherwise.
    disk_full: f64,
    write_failed: f64,
    /// Windows the spool had no room for in its queue.
    spool_busy: f64,
    /// eBPF drains (one per window) and samples the kernel could not queue.
    drains: f64,
    ring_buffer_full: f64,
}

async fn figures(base: &str) -> Figures {
    let m = Metrics::scrape(&format!("{base}/metrics")).await;
    let dropped = |name: &str, stage: &str, reason: &str| {
        m.value(name, &[("stage", stage), ("reason", reason)])
    };
    Figures {
        closed: m.value("smolder_agent_window_windows_closed_total", &[]),
        written: m.value("smolder_agent_spool_batches_written_total", &[]),
        spooled: m.value("smolder_agent_spool_batches", &[]),
        disk_full: dropped("smolder_agent_dropped_batches_total", "spool", "disk_full"),
        write_failed: dropped(
            "smolder_agent_dropped_batches_total",
            "spool",
            "write_failed",
        ),
        spool_busy: dropped(
            "smolder_agent_dropped_windows_total",
            "window",
            "spool_busy",
        ),
        drains: m.value("smolder_agent_ebpf_drains_total", &[]),
        ring_buffer_full: dropped(
            "smolder_agent_dropped_samples_total",
            "ebpf",
            "ring_buffer_full",
        ),
    }
}

/// Waits until every window closed is accounted for: written, or dropped and counted.
async fn accounted(base: &str) -> Figures {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let f = figures(base).await;
        if f.closed == f.written + f.disk_full + f.write_failed + f.spool_busy {
            return f;
        }
        assert!(Instant::now() < deadline, "windows unaccounted for: {f:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The frames in a spool directory's batch files, each decoded.
/// The size of the largest batch file in the spool, in bytes.
fn largest_batch_file(spool: &Path) -> u64 {
    std::fs::read_dir(spool.join("batches"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.metadata().ok())
        .map(|meta| meta.len())
        .max()
        .unwrap_or(0)
}

fn spooled_batches(spool: &Path) -> Vec<BatchMessage> {
    let own = FrameLimits {
        max_compressed: u32::MAX,
        max_uncompressed: u32::MAX,
    };
    let mut batches = Vec::new();
    for entry in std::fs::read_dir(spool.join("batches")).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let batch: BatchMessage =
            frame::decode(&bytes[8..], FrameKind::Batch, own).expect("every batch file whole");
        batches.push(batch);
    }
    batches
}

#[test]
fn a_full_spool_disk_drops_counted_windows_and_sampling_goes_on() {
    let _host = exclusive();
    let disk = LoopFs::new(32);
    let data = disk.path().join("agent");
    let dir = tempfile::tempdir().unwrap();
    let mut agent = sampling_agent(&data, dir.path());
    let base = format!("http://{}", agent.listening("http"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        eventually(PATIENCE, "windows spooled", || async {
            figures(&base).await.written >= 3.0
        })
        .await;
        let before = figures(&base).await;
        let filler = disk.fill();
        // Windows now find no room: lost, counted, and the spool says why.
        let ready = until(&base, "/readyz", "the spool degraded", |a| {
            a.is("spool", "degraded")
        })
        .await;
        assert_eq!(ready.status, 200, "degraded is ready:\n{}", ready.body);
        assert!(
            ready
                .row("spool")
                .detail
                .contains("No space left on device"),
            "{}",
            ready.body
        );
        eventually(PATIENCE, "windows dropped for the full disk", || async {
            figures(&base).await.disk_full >= 3.0
        })
        .await;
        let full = accounted(&base).await;
        let live = probe(&base, "/healthz").await;
        assert_eq!(live.status, 200, "{}", live.body);
        for name in ["ebpf", "window", "symbolize"] {
            assert_eq!(live.row(name).state, "running", "{}", live.body);
        }
        // The sampler went on draining every window, and the kernel never had to drop a
        // sample for want of a reader.
        assert!(full.drains >= before.drains + 3.0, "{before:?} {full:?}");
        assert_eq!(full.ring_buffer_full, before.ring_buffer_full, "{full:?}");
        // What was spooled before is still there, whole.
        assert_eq!(full.spooled, full.written, "{full:?}");
        assert_eq!(full.write_failed, 0.0, "{full:?}");

        // Space again (acks would free it the same way): windows are spooled again.
        std::fs::remove_file(&filler).unwrap();
        until(&base, "/readyz", "the spool running again", |a| {
            a.is("spool", "running")
        })
        .await;
        let after = accounted(&base).await;
        assert!(after.written > full.written, "{full:?} {after:?}");
        assert_eq!(after.disk_full, full.disk_full, "{after:?}");
        // BENCHMARKS.md's figures ("The spool's disk full and slow").
        eprintln!("full disk: before {before:?}\n  full {full:?}\n  after {after:?}");
    });
    agent.terminate();
    assert!(agent.wait().success(), "{}", agent.log());
    assert!(!agent.log().contains("panicked"), "{}", agent.log());

    // Nothing spooled was lost or damaged: every batch file decodes, and a restart finds them.
    let on_disk = spooled_batches(&data.join("spool"));
    assert!(!on_disk.is_empty());
    let mut agent = sampling_agent(&data, dir.path());
    let base = format!("http://{}", agent.listening("http"));
    runtime.block_on(async {
        let restarted = figures(&base).await;
        assert!(
            restarted.spooled >= on_disk.len() as f64,
            "{restarted:?}, {} on disk",
            on_disk.len()
        );
    });
    agent.terminate();
    assert!(agent.wait().success(), "{}", agent.log());
}

#[test]
fn a_slow_spool_disk_never_stalls_sampling() {
    let _host = exclusive();
    let disk = LoopFs::new(128);
    let data = disk.path().join("agent");
    let dir = tempfile::tempdir().unwrap();
    let mut agent = sampling_agent(&data, dir.path());
    let base = format!("http://{}", agent.listening("http"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        eventually(PATIENCE, "windows spooled", || async {
            figures(&base).await.written >= 2.0
        })
        .await;
        let before = accounted(&base).await;
        // One write a second, and a byte rate at which a window's batch (its file write and
        // sync) takes about four seconds: longer than the window and than the spool's slow
        // limit (2 s), so the spool falls behind, and far from its stuck limit (30 s). The rate
        // follows the batches this host spooled so far, as their size follows what it runs,
        // counted in whole pages as the sync writes them.
        let pages = largest_batch_file(&data.join("spool"))
            .div_ceil(4096)
            .max(1);
        let rate = pages * 4096 / 4;
        let throttle = Throttle::new(&disk.numbers(), rate, 1, agent.id());
        let ready = until(&base, "/readyz", "the spool degraded by a slow disk", |a| {
            a.is("spool", "degraded")
        })
        .await;
        assert!(
            ready.row("spool").detail.contains("disk is slow"),
            "{}",
            ready.body
        );
        // The spool falls behind; the window loop drops the newest windows for it rather than
        // wait, and every other loop keeps its pace.
        eventually(PATIENCE, "windows dropped for the busy spool", || async {
            figures(&base).await.spool_busy >= 1.0
        })
        .await;
        let slow = figures(&base).await;
        let live = probe(&base, "/healthz").await;
        assert_eq!(live.status, 200, "{}", live.body);
        for name in ["ebpf", "window", "symbolize"] {
            assert_eq!(live.row(name).state, "running", "{}", live.body);
        }
        assert!(
            slow.drains >= before.drains + (slow.closed - before.closed) - 2.0,
            "a drain per window: {before:?} {slow:?}"
        );
        assert_eq!(slow.ring_buffer_full, before.ring_buffer_full, "{slow:?}");

        throttle.lift();
        until(&base, "/readyz", "the spool running again", |a| {
            a.is("spool", "running")
        })
        .await;
        let after = accounted(&base).await;
        // BENCHMARKS.md's figures ("The spool's disk full and slow").
        eprintln!(
            "slow disk: {rate} B/s, 1 write/s\n  before {before:?}\n  slow {slow:?}\n  after {after:?}"
        );
        assert!(after.spool_busy >= 1.0, "{after:?}");
        assert_eq!(after.disk_full + after.write_failed, 0.0, "{after:?}");
        assert_eq!(
            after.spooled, after.written,
            "nothing spooled lost: {after:?}"
        );
    });
    agent.terminate();
    assert!(agent.wait().success(), "{}", agent.log());
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
    assert!(!spooled_batches(&data.join("spool")).is_empty());
}
