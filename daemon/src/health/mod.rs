//! Health that tells the truth: every long-running loop of a daemon registers with a name and a
//! period and beats on every iteration; `/healthz`, `/readyz`, the systemd watchdog pings and
//! the `smolder_<tier>_health_*` metrics all read those heartbeats.
//!
//! Input: [`Health::register`] calls from the daemon's `app.rs` and stages, then
//! [`Heartbeat::beat`] (or [`Heartbeat::degraded`] while the loop waits on a peer) from each
//! loop. Output: each loop's [`LoopState`] ([`Health::report`]), the two HTTP endpoints
//! ([`Health::routes`]), the metrics, and [`Health::live`], which gates the watchdog pings in
//! [`crate::run`]. Worker threads run under [`supervise`] (`supervise.rs`), which catches a
//! panic, logs it, counts it and restarts the loop with backoff. Owns nothing but the loops'
//! state; the loops own their threads and tasks.
//!
//! A loop is *stuck* when it has not beaten for three times its period: it is alive but makes
//! no progress, which a restart of the process may cure, so `/healthz` fails and the watchdog
//! is no longer pinged. A loop waiting on a peer (the aggregator, Prometheus) is *degraded*: it
//! works, the peer does not; it is ready, live, and never stuck. A loop whose task ended while
//! the daemon was not stopping is *stopped* (liveness fails: nothing would restart it), one
//! that panicked outside [`supervise`] or whose restarts failed too often is *dead*.

mod supervise;

use std::fmt::{self, Write as _};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

pub use self::supervise::{Supervised, supervise};

/// How many periods without a beat make a loop stuck.
pub const STUCK_PERIODS: u32 = 3;

/// What a loop is doing, as `/healthz`, `/readyz` and `smolder_<tier>_health_loop_state` say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoopState {
    /// Registered, not beaten yet.
    Starting,
    /// Beating.
    Running,
    /// Beating, but waiting on a peer (no aggregator, no Prometheus): live and ready.
    Degraded,
    /// It failed (panicked or returned an error) and waits out its backoff before a restart.
    Restarting,
    /// No beat for [`STUCK_PERIODS`] times its period.
    Stuck,
    /// It panicked where nothing restarts it, or failed too often in a row.
    Dead,
    /// Its task ended (as the daemon stops; otherwise liveness fails).
    Stopped,
}

impl LoopState {
    /// Every state, in the order the metric lists them.
    pub const ALL: [LoopState; 7] = [
        LoopState::Starting,
        LoopState::Running,
        LoopState::Degraded,
        LoopState::Restarting,
        LoopState::Stuck,
        LoopState::Dead,
        LoopState::Stopped,
    ];

    /// Its name in bodies and in the metric's `state` label.
    pub fn name(self) -> &'static str {
        match self {
            LoopState::Starting => "starting",
            LoopState::Running => "running",
            LoopState::Degraded => "degraded",
            LoopState::Restarting => "restarting",
            LoopState::Stuck => "stuck",
            LoopState::Dead => "dead",
            LoopState::Stopped => "stopped",
        }
    }

    fn from_u8(value: u8) -> LoopState {
        LoopState::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(LoopState::Dead)
    }
}

impl fmt::Display for LoopState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One loop's state as last seen.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopReport {
    /// The loop's name (the metrics' `loop` label).
    pub name: String,
    /// What it is doing.
    pub state: LoopState,
    /// Time since its last beat (or its registration, before the first).
    pub since_beat: Duration,
    /// Its declared period: it is stuck after [`STUCK_PERIODS`] of them without a beat.
    pub period: Duration,
    /// Restarts since the daemon started.
    pub restarts: u64,
    /// Why it is degraded, restarting or dead (the peer's error, the panic's message).
    pub detail: String,
}

impl LoopReport {
    /// Whether this loop lets the process count as live: not stuck, not dead, not ended.
    pub fn live(&self, stopping: bool) -> bool {
        match self.state {
            LoopState::Stuck | LoopState::Dead => false,
            LoopState::Stopped => stopping,
            _ => true,
        }
    }

    /// Whether this loop lets the process count as ready: started and working (degraded is
    /// working).
    pub fn ready(&self) -> bool {
        matches!(self.state, LoopState::Running | LoopState::Degraded)
    }
}

/// What every [`Health`] handle shares.
struct Inner {
    /// `agent` or `aggregator`, for the log lines.
    tier: &'static str,
    epoch: Instant,
    loops: Mutex<Vec<Arc<Loop>>>,
    stopping: AtomicBool,
    restarts: IntCounterVec,
}

/// One registered loop; its [`Heartbeat`] writes it, reports read it.
struct Loop {
    name: String,
    period: Duration,
    /// Milliseconds from the epoch to the last beat (or the registration).
    beat: AtomicU64,
    /// A [`LoopState`] (never `Stuck`, which is derived).
    state: AtomicU8,
    restarts: AtomicU64,
    detail: Mutex<String>,
}

impl Loop {
    fn set(&self, state: LoopState, detail: Option<&str>) {
        if let Some(detail) = detail {
            // Held to replace one string; a reader copies it.
            let mut kept = self.detail.lock().unwrap_or_else(|p| p.into_inner());
            kept.clear();
            kept.push_str(detail);
        }
        self.state.store(state as u8, Ordering::Release);
    }

    fn report(&self, now_ms: u64) -> LoopReport {
        let since_beat =
            Duration::from_millis(now_ms.saturating_sub(self.beat.load(Ordering::Acquire)));
        let stored = LoopState::from_u8(self.state.load(Ordering::Acquire));
        let state = match stored {
            LoopState::Starting | LoopState::Running
                if since_beat > self.period.saturating_mul(STUCK_PERIODS) =>
            {
                LoopState::Stuck
            }
            other => other,
        };
        let detail = match state {
            LoopState::Running | LoopState::Starting | LoopState::Stopped => String::new(),
            LoopState::Stuck => format!(
                "no beat for {:.1}s, over {} periods of {:.1}s",
                since_beat.as_secs_f64(),
                STUCK_PERIODS,
                self.period.as_secs_f64()
            ),
            _ => self
                .detail
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        };
        LoopReport {
            name: self.name.clone(),
            state,
            since_beat,
            period: self.period,
            restarts: self.restarts.load(Ordering::Relaxed),
            detail,
        }
    }
}

/// The loops of one daemon and what they last said. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("tier", &self.inner.tier)
            .finish_non_exhaustive()
    }
}

impl Health {
    /// No loops yet, with `smolder_<tier>_health_restarts_total{loop}`,
    /// `smolder_<tier>_health_loop_state{loop,state}` and
    /// `smolder_<tier>_health_beat_age_seconds{loop}` registered in `registry`.
    ///
    /// # Panics
    ///
    /// When `registry` holds those metrics already (a second `Health` in one registry).
    pub fn new(tier: &'static str, registry: &Registry) -> Health {
        let restarts = IntCounterVec::new(
            Opts::new(
                format!("smolder_{tier}_health_restarts_total"),
                "Restarts of a loop after it panicked or failed, by loop.",
            ),
            &["loop"],
        )
        .expect("a valid metric");
        registry
            .register(Box::new(restarts.clone()))
            .expect("one Health per registry");
        let inner = Arc::new(Inner {
            tier,
            epoch: Instant::now(),
            loops: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            restarts,
        });
        let gauges = Gauges::new(tier, Arc::clone(&inner));
        registry
            .register(Box::new(gauges))
            .expect("one Health per registry");
        Health { inner }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Registers the loop `name` (bounded: a stage's name, a configured job's), which beats at
    /// least every `period` when healthy, in state [`LoopState::Starting`]. A loop registered
    /// again under the same name (a task started anew) replaces the old entry and keeps its
    /// restart count.
    pub fn register(&self, name: impl Into<String>, period: Duration) -> Heartbeat {
        let name = name.into();
        self.inner.restarts.with_label_values(&[&name]);
        let mut loops = self.inner.loops.lock().unwrap_or_else(|p| p.into_inner());
        let restarts = loops
            .iter()
            .position(|l| l.name == name)
            .map(|i| loops.remove(i).restarts.load(Ordering::Relaxed))
            .unwrap_or(0);
        let state = Arc::new(Loop {
            name,
            period,
            beat: AtomicU64::new(self.now_ms()),
            state: AtomicU8::new(LoopState::Starting as u8),
            restarts: AtomicU64::new(restarts),
            detail: Mutex::new(String::new()),
        });
        loops.push(Arc::clone(&state));
        Heartbeat {
            health: self.clone(),
            state,
        }
    }

    /// Says the daemon is stopping: loops that end from now on are stopped, not failed.
    pub fn stopping(&self) {
        self.inner.stopping.store(true, Ordering::Release);
    }

    fn is_stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Every loop as of now, in registration order.
    pub fn report(&self) -> Vec<LoopReport> {
        let now = self.now_ms();
        let loops = self.inner.loops.lock().unwrap_or_else(|p| p.into_inner());
        loops.iter().map(|l| l.report(now)).collect()
    }

    /// Whether every loop is live (none stuck, dead or ended unasked): what `/healthz` and the
    /// watchdog pings say.
    pub fn live(&self) -> bool {
        let stopping = self.is_stopping();
        self.report().iter().all(|l| l.live(stopping))
    }

    /// `/healthz` (200 when [`Health::live`], else 503) and `/readyz` (200 when every loop is
    /// running or degraded, else 503), each with a table of the loops in plain text.
    pub fn routes(&self) -> Router {
        let live = self.clone();
        let ready = self.clone();
        Router::new()
            .route(
                "/healthz",
                get(move || async move { live.answer(Probe::Live) }),
            )
            .route(
                "/readyz",
                get(move || async move { ready.answer(Probe::Ready) }),
            )
    }

    fn answer(&self, probe: Probe) -> impl IntoResponse + use<> {
        let stopping = self.is_stopping();
        let loops = self.report();
        let failing: Vec<&LoopReport> = loops
            .iter()
            .filter(|l| match probe {
                Probe::Live => !l.live(stopping),
                Probe::Ready => !l.ready(),
            })
            .collect();
        let mut body = String::new();
        let status = if failing.is_empty() {
            body.push_str(match probe {
                Probe::Live => "ok\n",
                Probe::Ready => "ready\n",
            });
            StatusCode::OK
        } else {
            let names: Vec<String> = failing
                .iter()
                .map(|l| format!("{} {}", l.name, l.state))
                .collect();
            let verdict = match probe {
                Probe::Live => "unhealthy",
                Probe::Ready => "not ready",
            };
            let _ = writeln!(body, "{verdict}: {}", names.join(", "));
            StatusCode::SERVICE_UNAVAILABLE
        };
        if stopping {
            body.push_str("stopping\n");
        }
        body.push_str(&table(&loops));
        (
            status,
            [("content-type", "text/plain; charset=utf-8")],
            body,
        )
    }
}

/// Which endpoint answers.
#[derive(Clone, Copy)]
enum Probe {
    Live,
    Ready,
}

/// The loops as a table: `loop state last-beat restarts detail`, one line each, columns
/// separated by runs of spaces (the detail last, free text).
pub fn table(loops: &[LoopReport]) -> String {
    let width = loops.iter().map(|l| l.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!(
        "{:width$}  {:10}  {:>9}  {:>8}  detail\n",
        "loop", "state", "last-beat", "restarts"
    );
    for l in loops {
        let _ = writeln!(
            out,
            "{:width$}  {:10}  {:>8.1}s  {:>8}  {}",
            l.name,
            l.state.name(),
            l.since_beat.as_secs_f64(),
            l.restarts,
            l.detail.replace('\n', " ")
        );
    }
    out
}

/// A registered loop's handle: the loop beats through it. Dropped while its thread panics, the
/// loop is dead; dropped otherwise, it is stopped.
pub struct Heartbeat {
    health: Health,
    state: Arc<Loop>,
}

impl fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeat")
            .field("loop", &self.state.name)
            .finish_non_exhaustive()
    }
}

impl Heartbeat {
    /// Says the loop made progress: it is running (again, if it was degraded).
    pub fn beat(&self) {
        self.touch();
        self.state.set(LoopState::Running, None);
    }

    /// Says the loop made progress but waits on a peer, for `why` (the peer's error): degraded,
    /// which is ready and live, until the next [`Heartbeat::beat`].
    pub fn degraded(&self, why: impl fmt::Display) {
        self.touch();
        self.state.set(LoopState::Degraded, Some(&why.to_string()));
    }

    /// Records a beat without changing a degraded loop's state: the loop is alive and still
    /// waits.
    pub fn alive(&self) {
        self.touch();
        let current = LoopState::from_u8(self.state.state.load(Ordering::Acquire));
        if current != LoopState::Degraded {
            self.state.set(LoopState::Running, None);
        }
    }

    fn touch(&self) {
        self.state
            .beat
            .store(self.health.now_ms(), Ordering::Release);
    }

    /// The loop's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The period it declared.
    pub fn period(&self) -> Duration {
        self.state.period
    }

    /// Awaits `future` (an idle wait for work, or a wait on a peer bounded by its own timeout)
    /// while beating with [`Heartbeat::alive`] every period, so that waiting is not stuck.
    ///
    /// # Cancel safety
    ///
    /// As cancel safe as `future`.
    pub async fn beating<F: Future>(&self, future: F) -> F::Output {
        let mut ticker = tokio::time::interval(self.state.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut future = std::pin::pin!(future);
        loop {
            tokio::select! {
                output = &mut future => return output,
                _ = ticker.tick() => self.alive(),
            }
        }
    }

    fn restarting(&self, why: &str) {
        self.state.restarts.fetch_add(1, Ordering::Relaxed);
        self.health
            .inner
            .restarts
            .with_label_values(&[&self.state.name])
            .inc();
        self.touch();
        self.state.set(LoopState::Restarting, Some(why));
    }

    fn dead(&self, why: &str) {
        self.state.set(LoopState::Dead, Some(why));
    }

    fn restarts(&self) -> u64 {
        self.state.restarts.load(Ordering::Relaxed)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let current = LoopState::from_u8(self.state.state.load(Ordering::Acquire));
        if std::thread::panicking() {
            self.dead("panicked; nothing restarts it");
            tracing::error!(
                tier = self.health.inner.tier,
                loop_name = %self.state.name,
                "a loop panicked and is not restarted; the daemon reports itself unhealthy"
            );
        } else if current != LoopState::Dead {
            self.state.set(LoopState::Stopped, None);
        }
    }
}

/// The gauges, computed from the loops at every scrape.
struct Gauges {
    inner: Arc<Inner>,
    state: IntGaugeVec,
    age: GaugeVec,
}

impl Gauges {
    fn new(tier: &str, inner: Arc<Inner>) -> Gauges {
        Gauges {
            inner,
            state: IntGaugeVec::new(
                Opts::new(
                    format!("smolder_{tier}_health_loop_state"),
                    "1 for the state each loop is in, 0 for the others.",
                ),
                &["loop", "state"],
            )
            .expect("a valid metric"),
            age: GaugeVec::new(
                Opts::new(
                    format!("smolder_{tier}_health_beat_age_seconds"),
                    "Seconds since each loop last beat.",
                ),
                &["loop"],
            )
            .expect("a valid metric"),
        }
    }
}

impl Collector for Gauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.state.desc();
        descs.extend(self.age.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let health = Health {
            inner: Arc::clone(&self.inner),
        };
        self.state.reset();
        self.age.reset();
        for report in health.report() {
            for state in LoopState::ALL {
                self.state
                    .with_label_values(&[report.name.as_str(), state.name()])
                    .set(i64::from(state == report.state));
            }
            self.age
                .with_label_values(&[report.name.as_str()])
                .set(report.since_beat.as_secs_f64());
        }
        let mut families = self.state.collect();
        families.extend(self.age.collect());
        families
    }
}

#[cfg(test)]
mod tests;
