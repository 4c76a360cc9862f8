//! A fleet on one box: a thousand simulated agents over QUIC and 200 Pyroscope pushes a second
//! over HTTP (`smolder-fleet`) against one release aggregator process, in three runs, each on a
//! fresh data directory:
//!
//! - `steady`: load 1 for `SMOLDER_FLEET_MINUTES`; every interval, windows closed against
//!   windows acknowledged, the backlog, ack latency, the window's age at its ack, pushes, and
//!   the aggregator's RSS, CPU and disk. Then the fleet drains and every series is checked
//!   against `SelectSeries`: nothing acknowledged lost, nothing counted twice.
//! - `knee`: the load rises by a quarter every `SMOLDER_FLEET_STEP_SECONDS` from
//!   `SMOLDER_FLEET_KNEE_FROM` until a step sheds: fewer than 95 % of its windows acknowledged,
//!   a window's age at its ack past two windows at p99, any refusal (a reject, a 429 or 503),
//!   any send without an answer, or a push slower than half its timeout at p99. The knee is the
//!   last load that did not.
//! - `overload`: 1.5 × the knee (`SMOLDER_FLEET_KNEE`, else the `knee` run's) for
//!   `SMOLDER_FLEET_MINUTES`, then half the knee for as long: what the aggregator answers, that
//!   it stays up (`/healthz` every interval), how long the backlog takes to drain once the load
//!   drops, and the same check of every series.
//!
//! ```sh
//! cargo bench -p smolder-aggregator --bench fleet_to_store                   # all three
//! SMOLDER_FLEET_MINUTES=1 cargo bench -p smolder-aggregator --bench fleet_to_store -- steady
//! ```
//!
//! Other knobs: `SMOLDER_FLEET_AGENTS` (1,000), `SMOLDER_FLEET_PUSHES` per second (200),
//! `SMOLDER_FLEET_INTERVAL` seconds between report lines (30), `SMOLDER_FLEET_MAX_RSS_MIB`:
//! past it the bench kills the aggregator and says so, so that an aggregator without a bound on
//! its memory does not take the shared machine down with it (8,192). The generator and the
//! aggregator share the machine's cores; both CPU figures are printed, with the load average.
//! A scenario, not a micro-benchmark: it prints Markdown tables for BENCHMARKS.md.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use smolder_fleet::process::{self, Usage};
use smolder_fleet::{Fleet, FleetConfig, Record, Snapshot, Totals, verify};
use smolder_test_support::env_or;
use smolder_test_support::process::Process;
use smolder_test_support::prometheus::Metrics;

/// The knobs, from the environment.
#[derive(Clone, Debug)]
struct Options {
    agents: usize,
    pushes: f64,
    minutes: f64,
    interval: Duration,
    step: Duration,
    knee_from: f64,
    knee: Option<f64>,
    max_rss: u64,
}

impl Options {
    fn from_env() -> Options {
        Options {
            agents: env_or("SMOLDER_FLEET_AGENTS", 1_000),
            pushes: env_or("SMOLDER_FLEET_PUSHES", 200.0),
            minutes: env_or("SMOLDER_FLEET_MINUTES", 10.0),
            interval: Duration::from_secs(env_or("SMOLDER_FLEET_INTERVAL", 30)),
            step: Duration::from_secs(env_or("SMOLDER_FLEET_STEP_SECONDS", 60)),
            knee_from: env_or("SMOLDER_FLEET_KNEE_FROM", 1.0),
            knee: std::env::var("SMOLDER_FLEET_KNEE")
                .ok()
                .and_then(|v| v.parse().ok()),
            max_rss: env_or::<u64>("SMOLDER_FLEET_MAX_RSS_MIB", 8_192) << 20,
        }
    }

    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }
}

fn main() {
    let options = Options::from_env();
    let runs: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| ["steady", "knee", "overload"].contains(&a.as_str()))
        .collect();
    let all = runs.is_empty();
    let wants = |run: &str| all || runs.iter().any(|r| r == run);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        println!(
            "# fleet_to_store: {} agents, {} pushes/s, {:?}; load average {:.2}",
            options.agents,
            options.pushes,
            options,
            process::load_average()
        );
        if wants("steady") {
            steady(&options).await;
        }
        let mut knee = options.knee;
        if wants("knee") {
            knee = Some(find_knee(&options).await);
        }
        if wants("overload") {
            let knee = knee.expect("SMOLDER_FLEET_KNEE, or the knee run before");
            overload(&options, knee).await;
        }
    });
}

/// Load 1 for the configured minutes, then the check.
async fn steady(options: &Options) {
    println!("\n## steady: load 1 for {:.1} min\n", options.minutes);
    let mut run = Run::start(options).await;
    let deadline = Instant::now() + options.duration();
    let mut backlogs = Vec::new();
    while Instant::now() < deadline {
        let line = run.interval(options.interval).await;
        backlogs.push((
            line.snapshot.elapsed.as_secs_f64(),
            line.snapshot.totals.backlog(),
        ));
    }
    // The backlog's trend over the second half, by least squares: windows per minute.
    let half = &backlogs[backlogs.len() / 2..];
    println!(
        "\nbacklog: max {}, trend over the second half {:+.1} windows/min",
        backlogs.iter().map(|b| b.1).max().unwrap_or(0),
        slope(half) * 60.0
    );
    run.finish().await;
}

/// Raises the load a quarter at a time until a step sheds; returns the last load that did not.
async fn find_knee(options: &Options) -> f64 {
    println!(
        "\n## knee: load from {} up by 1.25× every {} s until a step sheds\n",
        options.knee_from,
        options.step.as_secs()
    );
    let mut run = Run::start(options).await;
    let mut load = options.knee_from;
    let mut knee = 0.0;
    let mut steps = Vec::new();
    loop {
        run.fleet.set_load(load);
        let before = run.fleet.snapshot().totals;
        let deadline = Instant::now() + options.step;
        let (mut age_p99, mut push_p99) = (Duration::ZERO, Duration::ZERO);
        while Instant::now() < deadline {
            let line = run.interval(options.interval.min(options.step)).await;
            age_p99 = age_p99.max(line.snapshot.age.p99);
            push_p99 = push_p99.max(line.snapshot.push.p99);
            if !line.up {
                break;
            }
        }
        let after = run.fleet.snapshot().totals;
        let period = Duration::from_secs_f64(10.0 / load);
        let verdict = shed(&before, &after, age_p99, push_p99, period, run.up);
        steps.push((load, verdict.clone()));
        match verdict {
            None => knee = load,
            Some(_) => break,
        }
        load *= 1.25;
        if load > 64.0 {
            break;
        }
    }
    println!("\n| load | agents equivalent | verdict |\n|---|---|---|");
    for (load, verdict) in &steps {
        println!(
            "| {load:.2} | {:.0} | {} |",
            load * options.agents as f64,
            verdict.as_deref().unwrap_or("keeps up")
        );
    }
    println!(
        "\nknee: load {knee:.2} ({:.0} agents, {:.0} pushes/s)",
        knee * options.agents as f64,
        knee * options.pushes
    );
    run.finish().await;
    knee
}

/// Why a step shed, or `None` when it kept up.
fn shed(
    before: &Totals,
    after: &Totals,
    age_p99: Duration,
    push_p99: Duration,
    period: Duration,
    up: bool,
) -> Option<String> {
    let windows = after.windows - before.windows;
    let acked = after.acked - before.acked;
    let refused =
        (after.rejected_retryable + after.rejected + after.pushes_refused + after.pushes_failed)
            - (before.rejected_retryable
                + before.rejected
                + before.pushes_refused
                + before.pushes_failed);
    let unanswered =
        (after.failed + after.pushes_unanswered + after.pushes_unreachable + after.pushes_skipped)
            - (before.failed
                + before.pushes_unanswered
                + before.pushes_unreachable
                + before.pushes_skipped);
    let mut why = Vec::new();
    if !up {
        why.push("the aggregator went down".to_owned());
    }
    if (acked as f64) < 0.95 * windows as f64 {
        why.push(format!("{acked} of {windows} windows acknowledged"));
    }
    if age_p99 > period * 2 {
        why.push(format!(
            "window age at ack p99 {:.1} s",
            age_p99.as_secs_f64()
        ));
    }
    if refused > 0 {
        why.push(format!("{refused} refused"));
    }
    if unanswered > 0 {
        why.push(format!("{unanswered} without an answer"));
    }
    if push_p99 > Duration::from_secs(5) {
        why.push(format!("push p99 {:.1} s", push_p99.as_secs_f64()));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// 1.5 × the knee, then half the knee, each for the configured minutes; then the check.
async fn overload(options: &Options, knee: f64) {
    let high = knee * 1.5;
    let low = knee * 0.5;
    println!(
        "\n## overload: load {high:.2} (1.5 × the knee {knee:.2}) for {:.1} min, then {low:.2} for as long\n",
        options.minutes
    );
    let mut run = Run::start(options).await;
    run.fleet.set_load(high);
    let over = Instant::now() + options.duration();
    while Instant::now() < over && run.up {
        run.interval(options.interval).await;
    }
    let at_peak = run.fleet.snapshot().totals;
    println!("\n(load drops to {low:.2})\n");
    run.fleet.set_load(low);
    let dropped = Instant::now();
    let end = dropped + options.duration();
    let mut drained_after = None;
    while Instant::now() < end && run.up {
        let line = run.interval(options.interval).await;
        if drained_after.is_none() && line.snapshot.totals.backlog() <= options.agents as u64 / 10 {
            drained_after = Some(dropped.elapsed());
        }
    }
    let after = run.fleet.snapshot().totals;
    println!(
        "\nat the peak: {} windows, {} acked, backlog {}, {} retryable rejects, {} rejects, {} pushes refused ({} with Retry-After), {} failed, {} without an answer, {} sends without an answer",
        at_peak.windows,
        at_peak.acked,
        at_peak.backlog(),
        at_peak.rejected_retryable,
        at_peak.rejected,
        at_peak.pushes_refused,
        at_peak.pushes_retry_after,
        at_peak.pushes_failed,
        at_peak.pushes_unanswered,
        at_peak.failed
    );
    println!(
        "after the drop: backlog {} at the end, down to a tenth of a window per agent after {}",
        after.backlog(),
        drained_after.map_or("never".to_owned(), |d| format!("{:.0} s", d.as_secs_f64()))
    );
    run.finish().await;
}

/// One aggregator process and the fleet against it.
struct Run {
    aggregator: Option<Process>,
    pid: u32,
    http: SocketAddr,
    data: tempfile::TempDir,
    fleet: Fleet,
    client: reqwest::Client,
    max_rss: u64,
    /// The aggregator was up at the last interval.
    up: bool,
    last: Option<(Instant, Usage, Usage)>,
    previous: Option<Totals>,
    started: Instant,
    peak_rss: u64,
}

/// One interval's figures.
struct Line {
    snapshot: Snapshot,
    up: bool,
}

impl Run {
    async fn start(options: &Options) -> Run {
        let data = tempfile::tempdir().expect("a temporary directory");
        let aggregator = support::spawn(data.path(), "");
        let http = aggregator.listening("http");
        let quic = aggregator.listening("quic");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a client");
        let tls = data.path().join("data/tls");
        let token = std::fs::read_to_string(tls.join("agent-token")).expect("the agent token");
        let mut config = FleetConfig::new(quic, http, tls.join("ca.pem"), token.trim().to_owned());
        config.agents = options.agents;
        config.pushes_per_second = options.pushes;
        let fleet = Fleet::start(config).await;
        let shape = fleet.shape();
        println!(
            "a host's window: {} series, {:.0} nodes, {:.0} KiB of trees, {:.0} CPU samples; {:.1} batches/s and {:.0} k nodes/s at load 1\n",
            shape.series,
            shape.nodes,
            shape.bytes / 1024.0,
            shape.cpu_samples,
            options.agents as f64 / 10.0,
            options.agents as f64 / 10.0 * shape.nodes / 1e3
        );
        println!(
            "| t s | load | windows/s | acked/s | backlog | ack p50 ms | ack p99 ms | age p99 s | pushes ok/s | refused/s | no answer | agg RSS MiB | agg CPU % | fleet CPU % | disk MiB | load avg |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let pid = aggregator.id();
        Run {
            aggregator: Some(aggregator),
            pid,
            http,
            data,
            fleet,
            client,
            max_rss: options.max_rss,
            up: true,
            last: None,
            previous: None,
            started: Instant::now(),
            peak_rss: 0,
        }
    }

    /// Waits `length` (watching the aggregator's memory every second), then prints a line.
    async fn interval(&mut self, length: Duration) -> Line {
        let end = Instant::now() + length;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_secs(1).min(end - Instant::now())).await;
            if let Some(usage) = process::usage(self.pid) {
                self.peak_rss = self.peak_rss.max(usage.rss);
                if usage.rss > self.max_rss
                    && let Some(mut aggregator) = self.aggregator.take()
                {
                    println!(
                        "\n**the aggregator passed {} MiB of RSS; the bench killed it**\n",
                        self.max_rss >> 20
                    );
                    aggregator.kill();
                }
            }
        }
        let now = Instant::now();
        let snapshot = self.fleet.snapshot();
        let usage = process::usage(self.pid).unwrap_or_default();
        let me = process::usage(std::process::id()).unwrap_or_default();
        self.up = self.healthy().await;
        let (since, cpu_percent, fleet_percent, rates) = match self.last {
            Some((at, agg, fleet)) => {
                let secs = now.duration_since(at).as_secs_f64();
                (
                    secs,
                    usage.cpu.saturating_sub(agg.cpu).as_secs_f64() / secs * 100.0,
                    me.cpu.saturating_sub(fleet.cpu).as_secs_f64() / secs * 100.0,
                    true,
                )
            }
            None => (
                now.duration_since(self.started).as_secs_f64(),
                0.0,
                0.0,
                false,
            ),
        };
        let previous = self.previous.unwrap_or_default();
        let per_second = |a: u64, b: u64| a.saturating_sub(b) as f64 / since;
        let t = &snapshot.totals;
        println!(
            "| {:.0} | {:.2} | {:.1} | {:.1} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {:.1} |",
            snapshot.elapsed.as_secs_f64(),
            snapshot.load,
            per_second(t.windows, previous.windows),
            per_second(t.acked, previous.acked),
            t.backlog(),
            snapshot.ack.p50.as_secs_f64() * 1e3,
            snapshot.ack.p99.as_secs_f64() * 1e3,
            snapshot.age.p99.as_secs_f64(),
            per_second(t.pushes_ok, previous.pushes_ok),
            per_second(
                t.rejected_retryable + t.rejected + t.pushes_refused + t.pushes_failed,
                previous.rejected_retryable
                    + previous.rejected
                    + previous.pushes_refused
                    + previous.pushes_failed
            ),
            (t.failed + t.pushes_unanswered + t.pushes_unreachable + t.pushes_skipped)
                - (previous.failed
                    + previous.pushes_unanswered
                    + previous.pushes_unreachable
                    + previous.pushes_skipped),
            if self.up || usage.rss > 0 {
                (usage.rss >> 20).to_string()
            } else {
                "down".to_owned()
            },
            if rates {
                format!("{cpu_percent:.0}")
            } else {
                "-".to_owned()
            },
            if rates {
                format!("{fleet_percent:.0}")
            } else {
                "-".to_owned()
            },
            dir_size(self.data.path()) >> 20,
            process::load_average()
        );
        self.last = Some((now, usage, me));
        self.previous = Some(*t);
        Line {
            snapshot,
            up: self.up,
        }
    }

    async fn healthy(&self) -> bool {
        if self.aggregator.is_none() {
            return false;
        }
        matches!(
            self.client.get(format!("http://{}/healthz", self.http)).send().await,
            Ok(r) if r.status().is_success()
        )
    }

    /// Stops the fleet, lets it drain for up to two minutes, and checks every series.
    async fn finish(mut self) {
        let record: Record = self.fleet.stop(Duration::from_secs(120)).await;
        let t = record.totals;
        println!(
            "\nwhole run: {} windows, {} acknowledged ({} duplicates), {} dropped, {} rejected, {} retryable rejects, {} sends without an answer, {} connections ({} failed attempts); {} pushes, {} ok, {} refused ({} with Retry-After), {} failed, {} without an answer, {} could not connect, {} skipped; {:.1} MiB of batch frames sent",
            t.windows,
            t.acked,
            t.duplicates,
            t.dropped_full,
            t.rejected,
            t.rejected_retryable,
            t.failed,
            t.connects,
            t.connect_errors,
            t.pushes,
            t.pushes_ok,
            t.pushes_refused,
            t.pushes_retry_after,
            t.pushes_failed,
            t.pushes_unanswered,
            t.pushes_unreachable,
            t.pushes_skipped,
            t.batch_bytes as f64 / 1048576.0
        );
        println!(
            "ack latency {}\nwindow age at ack {}\npush latency {}\naggregator peak RSS {} MiB",
            record.ack,
            record.age,
            record.push,
            self.peak_rss >> 20
        );
        if self.aggregator.is_none() {
            println!("the aggregator is down: no check");
            return;
        }
        let base = format!("http://{}", self.http);
        let started = Instant::now();
        match verify(
            &self.client,
            &base,
            &record.tallies,
            record.started,
            record.stopped,
        )
        .await
        {
            Ok(check) => println!(
                "check ({:.0} s): {check}{}",
                started.elapsed().as_secs_f64(),
                if check.passed() {
                    " — passed"
                } else {
                    " — FAILED"
                }
            ),
            Err(err) => println!("check failed to run: {err}"),
        }
        let served = Metrics::scrape(&format!("{base}/metrics")).await;
        println!(
            "aggregator's metrics: {} batches acked, {} duplicates, profiles stored over QUIC {}, over HTTP {}",
            served.value("smolder_aggregator_ingest_quic_batches_acked_total", &[]),
            served.value(
                "smolder_aggregator_ingest_quic_batches_duplicate_total",
                &[]
            ),
            served.value(
                "smolder_aggregator_ingest_profiles_total",
                &[("transport", "quic")]
            ),
            served.value(
                "smolder_aggregator_ingest_profiles_total",
                &[("transport", "http")]
            ),
        );
        if let Some(mut aggregator) = self.aggregator.take() {
            aggregator.kill();
        }
    }
}

/// Bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Least-squares slope of `(x, y)` points, y per x.
fn slope(points: &[(f64, u64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 as f64 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}
