//! Windows: every source's profiles, merged per series into wall-clock-aligned spans.
//!
//! Sources (the eBPF sampler, the pprof scraper) [`submit`](Submitter::submit) profiles whenever
//! they have them. The window loop ([`run`]) files each profile under the window its `until`
//! falls in (windows start at multiples of [`WindowConfig::length`] since the epoch, so agents
//! on different hosts agree), merges trees of the same series and profile meta, and, once a
//! window has ended and [`WindowConfig::settle`] has passed for stragglers, hands it to every
//! sink as one [`Window`]. Trees of a series whose values add up (CPU samples, allocations) are
//! summed; snapshots ([`Aggregation::Average`]: in-use memory, goroutines) are averaged over the
//! snapshots that fell in the window, so a scrape interval shorter than the window does not
//! double them. A profile that arrives after its window was handed on goes into the
//! window that is open now and is counted as late: late data is moved, never dropped.
//!
//! Nothing downstream stalls a source: sources submit without waiting
//! ([`Submitter::try_submit`]; a profile that finds the loop's queue full is dropped and
//! counted), a window holds at most [`WindowConfig::max_series`] series (a new series past it is
//! dropped and counted, the window's others go on), and a closed window is offered to each sink
//! without waiting: a sink whose queue is full (a spool on a slow or failing disk) does not get
//! it, and the loss is counted as `<sink>_busy`, so that the loop, and the eBPF thread behind
//! it, keep going. The bookkeeping ([`Open`]) is sans IO, driven with explicit times.

mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use smolder_common::{Aggregation, Profile, ProfileMeta, Series, Tree};
use smolder_daemon::Heartbeat;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use self::metrics::{MAX_SERIES, QUEUE_FULL};
pub use self::metrics::{RULES_BUSY, SPOOL_BUSY, WindowMetrics};
use crate::tier::{DropCause, DroppedUnit, StageCounters};

/// How stacks are grouped in time.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct WindowConfig {
    /// Length of a window. Default `10s`, the aggregator's bucket.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub length: Duration,
    /// How long a window stays open after it ends, for sources that drain at the boundary.
    /// Default `2s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub settle: Duration,
    /// Most series one window holds: a profile of a new series past it is dropped and counted
    /// (`smolder_agent_dropped_profiles_total{stage="window",reason="max_series"}`), the
    /// window's other series go on. Bounds the agent's memory against a source that makes a
    /// series per request id or pid. Default 10 000, the aggregator's default series per batch.
    pub max_series: usize,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            length: Duration::from_secs(10),
            settle: Duration::from_secs(2),
            max_series: 10_000,
        }
    }
}

/// One closed window: a profile per series, each spanning the whole window.
#[derive(Debug)]
pub struct Window {
    /// Inclusive start.
    pub start: SystemTime,
    /// Exclusive end.
    pub end: SystemTime,
    /// One profile per series and profile meta, in no particular order.
    pub profiles: Vec<Profile>,
}

/// The handle sources submit profiles through; cheap to clone.
#[derive(Clone)]
pub struct Submitter {
    tx: mpsc::Sender<Profile>,
    /// Where a profile that finds the queue full is counted.
    tier: StageCounters,
}

impl std::fmt::Debug for Submitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitter")
            .field("queued", &(QUEUE - self.tx.capacity()))
            .finish()
    }
}

/// The window loop has stopped (the agent is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the window loop has stopped")]
pub struct Stopped;

impl Submitter {
    /// Submits a profile, waiting while the window loop's queue is full: for callers that
    /// produce a bounded number of profiles and would rather wait than lose one (tests,
    /// embedding). Sources use [`try_submit`](Self::try_submit).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a cancelled call submitted nothing.
    ///
    /// # Errors
    ///
    /// [`Stopped`] when the agent is shutting down.
    pub async fn submit(&self, profile: Profile) -> Result<(), Stopped> {
        self.tx.send(profile).await.map_err(|_| Stopped)
    }

    /// Submits a profile without waiting, from any thread: a profile that finds the loop's
    /// queue full is dropped and counted
    /// (`smolder_agent_dropped_profiles_total{stage="window",reason="queue_full"}`), so that a
    /// source never waits on the windows. Returns whether it was queued.
    ///
    /// # Errors
    ///
    /// [`Stopped`] when the agent is shutting down.
    pub fn try_submit(&self, profile: Profile) -> Result<bool, Stopped> {
        match self.tx.try_send(profile) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.tier.dropped(DroppedUnit::Profiles, QUEUE_FULL, 1);
                Ok(false)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Stopped),
        }
    }
}

/// Profiles queued between sources and the window loop; past it, sources' profiles are dropped.
/// The loop takes a profile in microseconds and never waits on its sinks, so the queue only
/// fills when the agent is starved of CPU; 1024 holds a busy host's whole window (one profile
/// per series and kind).
const QUEUE: usize = 1024;

/// A submitter and the receiving end that [`run`] consumes; drops are counted in `metrics`.
pub fn channel(metrics: &WindowMetrics) -> (Submitter, mpsc::Receiver<Profile>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let tier = metrics.tier.clone();
    (Submitter { tx, tier }, rx)
}

/// A consumer of closed windows (the spool, the rules), with the reason its losses are counted
/// under when its queue is full.
#[derive(Debug)]
pub struct Sink {
    tx: mpsc::Sender<Arc<Window>>,
    busy: DropCause,
}

impl Sink {
    /// A sink fed through `tx`; windows it has no room for are counted as `busy`
    /// ([`SPOOL_BUSY`], [`RULES_BUSY`]).
    pub fn new(tx: mpsc::Sender<Arc<Window>>, busy: DropCause) -> Sink {
        Sink { tx, busy }
    }
}

/// The start of the window that contains `t`.
pub fn window_start(t: SystemTime, length: Duration) -> SystemTime {
    let since_epoch = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let length_ns = length.as_nanos().max(1);
    let start_ns = since_epoch.as_nanos() / length_ns * length_ns;
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(start_ns).unwrap_or(u64::MAX))
}

/// One open window's series and meta, each with its merged tree and how many profiles made it.
type WindowSeries = HashMap<(Series, ProfileMeta), (Tree, u64)>;

/// What became of a profile handed to [`Open::add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Added {
    /// Merged into its window.
    OnTime,
    /// Its window had closed: merged into the one open now.
    Late,
    /// A new series of a window at `window.max-series`: dropped.
    OverMaxSeries,
}

/// The windows still open, each merging its profiles.
struct Open {
    length: Duration,
    max_series: usize,
    windows: BTreeMap<SystemTime, WindowSeries>,
    /// End of the latest window handed on; profiles for earlier windows are late.
    closed_until: SystemTime,
}

impl Open {
    fn new(length: Duration, max_series: usize) -> Open {
        Open {
            length,
            max_series,
            windows: BTreeMap::new(),
            closed_until: UNIX_EPOCH,
        }
    }

    /// Files `profile` under its window, or under the window of `now` when its own has closed
    /// or lies in the future; a new series of a full window is dropped.
    fn add(&mut self, profile: Profile, now: SystemTime) -> Added {
        let at = profile
            .until
            .checked_sub(Duration::from_nanos(1))
            .filter(|t| *t >= profile.from)
            .unwrap_or(profile.from);
        let mut start = window_start(at, self.length);
        let late = start < self.closed_until;
        if late || start > now {
            start = window_start(now, self.length).max(self.closed_until);
        }
        let series = self.windows.entry(start).or_default();
        let full = series.len() >= self.max_series;
        match series.entry((profile.series, profile.meta)) {
            std::collections::hash_map::Entry::Occupied(mut merged) => {
                let (tree, count) = merged.get_mut();
                tree.merge(&profile.tree);
                *count += 1;
            }
            std::collections::hash_map::Entry::Vacant(_) if full => {
                return Added::OverMaxSeries;
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert((profile.tree, 1));
            }
        }
        if late { Added::Late } else { Added::OnTime }
    }

    /// Removes and returns every window that ended at least `settle` before `now`.
    fn close(&mut self, now: SystemTime, settle: Duration) -> Vec<Window> {
        let mut closed = Vec::new();
        while let Some(entry) = self.windows.first_entry() {
            let start = *entry.key();
            let end = start + self.length;
            if end + settle > now {
                break;
            }
            let profiles = entry
                .remove()
                .into_iter()
                .map(|((series, meta), (mut tree, count))| {
                    if meta.aggregation == Aggregation::Average && count > 1 {
                        tree.scale(1, count);
                    }
                    Profile {
                        series,
                        meta,
                        from: start,
                        until: end,
                        tree,
                    }
                })
                .collect();
            self.closed_until = self.closed_until.max(end);
            closed.push(Window {
                start,
                end,
                profiles,
            });
        }
        closed
    }

    /// When the earliest open window may close.
    fn next_close(&self, settle: Duration) -> Option<SystemTime> {
        self.windows
            .keys()
            .next()
            .map(|start| *start + self.length + settle)
    }
}

/// Runs the window loop until every [`Submitter`] is dropped, then hands on what is still
/// open and returns. Beats `heartbeat` on every profile, every close and every period while
/// idle. Windows are offered to `sinks` without waiting while the loop runs; the last ones, as
/// it stops, are waited for, since nothing more comes behind them.
pub async fn run(
    config: WindowConfig,
    mut profiles: mpsc::Receiver<Profile>,
    sinks: Vec<Sink>,
    metrics: WindowMetrics,
    heartbeat: Heartbeat,
) {
    let mut open = Open::new(config.length, config.max_series);
    let mut ticker = tokio::time::interval(heartbeat.period());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wait = open
            .next_close(config.settle)
            .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default());
        let sleep = async {
            match wait {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            received = profiles.recv() => match received {
                Some(profile) => {
                    metrics.profiles_submitted.inc();
                    match open.add(profile, SystemTime::now()) {
                        Added::OnTime => {}
                        Added::Late => metrics.late_profiles.inc(),
                        Added::OverMaxSeries => {
                            metrics.tier.dropped(DroppedUnit::Profiles, MAX_SERIES, 1);
                        }
                    }
                }
                None => break,
            },
            () = sleep => {
                for window in open.close(SystemTime::now(), config.settle) {
                    offer(window, &sinks, &metrics);
                }
            }
            _ = ticker.tick() => {}
        }
        heartbeat.beat();
    }
    let everything = SystemTime::now() + config.length + config.settle;
    for window in open.close(everything, Duration::ZERO) {
        let window = closed(window, &metrics);
        for sink in &sinks {
            // A sink that has stopped is shutting down with the agent; the others still get it.
            let _ = sink.tx.send(Arc::clone(&window)).await;
        }
    }
}

/// Counts a closed window in the metrics.
fn closed(window: Window, metrics: &WindowMetrics) -> Arc<Window> {
    let nodes: usize = window.profiles.iter().map(|p| p.tree.len()).sum();
    metrics.windows_closed.inc();
    metrics
        .series
        .set(i64::try_from(window.profiles.len()).unwrap_or(i64::MAX));
    metrics.nodes.set(i64::try_from(nodes).unwrap_or(i64::MAX));
    debug!(series = window.profiles.len(), nodes, "window closed");
    Arc::new(window)
}

/// Offers a closed window to every sink without waiting: a sink with a full queue does not get
/// it (the newest is dropped, the ones it queued stay), and that is counted.
fn offer(window: Window, sinks: &[Sink], metrics: &WindowMetrics) {
    let window = closed(window, metrics);
    for sink in sinks {
        match sink.tx.try_send(Arc::clone(&window)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                metrics.tier.dropped(DroppedUnit::Windows, sink.busy, 1);
                warn!(
                    reason = sink.busy.reason,
                    series = window.profiles.len(),
                    "a window sink is busy; this window is dropped for it"
                );
            }
            // A sink that has stopped is shutting down with the agent; the others still get it.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(name: &str, stack: &[&str], value: u64, from: u64, until: u64) -> Profile {
        let mut tree = Tree::new();
        tree.insert_names(stack.iter().copied(), value);
        Profile {
            series: name.parse().unwrap(),
            meta: ProfileMeta::default(),
            from: UNIX_EPOCH + Duration::from_secs(from),
            until: UNIX_EPOCH + Duration::from_secs(until),
            tree,
        }
    }

    fn open() -> Open {
        Open::new(Duration::from_secs(10), 10)
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        let t = UNIX_EPOCH + Duration::from_millis(1_234_567);
        assert_eq!(
            window_start(t, Duration::from_secs(10)),
            UNIX_EPOCH + Duration::from_secs(1_230)
        );
    }

    #[test]
    fn same_series_merge_and_windows_close_after_settling() {
        let mut open = open();
        let now = UNIX_EPOCH + Duration::from_secs(25);
        let on_time = |added| added == Added::OnTime;
        assert!(on_time(
            open.add(profile("app.cpu{}", &["main", "a"], 2, 10, 20), now)
        ));
        assert!(on_time(
            open.add(profile("app.cpu{}", &["main", "b"], 3, 12, 15), now)
        ));
        assert!(on_time(
            open.add(profile("other.cpu{}", &["x"], 1, 20, 25), now)
        ));
        let settle = Duration::from_secs(2);
        assert!(
            open.close(UNIX_EPOCH + Duration::from_secs(21), settle)
                .is_empty()
        );
        let closed = open.close(UNIX_EPOCH + Duration::from_secs(22), settle);
        assert_eq!(closed.len(), 1);
        let window = &closed[0];
        assert_eq!(window.start, UNIX_EPOCH + Duration::from_secs(10));
        assert_eq!(window.profiles.len(), 1);
        assert_eq!(window.profiles[0].tree.total(), 5);
        assert_eq!(window.profiles[0].from, window.start);
        assert_eq!(window.profiles[0].until, window.end);
        assert_eq!(
            open.next_close(settle),
            Some(UNIX_EPOCH + Duration::from_secs(32))
        );
    }

    #[test]
    fn snapshots_in_one_window_are_averaged_not_summed() {
        let mut open = open();
        let now = UNIX_EPOCH + Duration::from_secs(25);
        let snapshot = |value, from| {
            let mut p = profile(
                "app.inuse_space{}",
                &["main", "alloc"],
                value,
                from,
                from + 5,
            );
            p.meta.aggregation = Aggregation::Average;
            p
        };
        open.add(snapshot(100, 10), now);
        open.add(snapshot(300, 15), now);
        open.add(profile("app.cpu{}", &["main"], 7, 10, 15), now);
        open.add(profile("app.cpu{}", &["main"], 5, 15, 20), now);
        let closed = open.close(UNIX_EPOCH + Duration::from_secs(40), Duration::ZERO);
        let total = |name: &str| {
            closed[0]
                .profiles
                .iter()
                .find(|p| p.series.app() == name)
                .map(|p| p.tree.total())
        };
        assert_eq!(total("app.inuse_space"), Some(200));
        assert_eq!(total("app.cpu"), Some(12));
    }

    #[test]
    fn late_profiles_move_to_the_open_window() {
        let mut open = open();
        let now = UNIX_EPOCH + Duration::from_secs(25);
        open.add(profile("app.cpu{}", &["a"], 1, 10, 20), now);
        open.close(now, Duration::from_secs(2));
        assert_eq!(
            open.add(profile("app.cpu{}", &["a"], 4, 10, 20), now),
            Added::Late
        );
        let closed = open.close(UNIX_EPOCH + Duration::from_secs(40), Duration::ZERO);
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].start, UNIX_EPOCH + Duration::from_secs(20));
        assert_eq!(closed[0].profiles[0].tree.total(), 4);
    }

    #[test]
    fn profiles_from_the_future_go_to_now() {
        let mut open = open();
        let now = UNIX_EPOCH + Duration::from_secs(25);
        open.add(profile("app.cpu{}", &["a"], 1, 100, 110), now);
        let closed = open.close(UNIX_EPOCH + Duration::from_secs(40), Duration::ZERO);
        assert_eq!(closed[0].start, UNIX_EPOCH + Duration::from_secs(20));
    }

    #[test]
    fn a_full_window_drops_new_series_and_keeps_merging_its_own() {
        let mut open = Open::new(Duration::from_secs(10), 2);
        let now = UNIX_EPOCH + Duration::from_secs(25);
        for name in ["a.cpu{}", "b.cpu{}"] {
            assert_eq!(
                open.add(profile(name, &["x"], 1, 20, 21), now),
                Added::OnTime
            );
        }
        assert_eq!(
            open.add(profile("c.cpu{}", &["x"], 1, 20, 21), now),
            Added::OverMaxSeries
        );
        assert_eq!(
            open.add(profile("a.cpu{}", &["y"], 5, 21, 22), now),
            Added::OnTime
        );
        // The cap is per window: the next one takes new series again.
        assert_eq!(
            open.add(
                profile("c.cpu{}", &["x"], 1, 30, 31),
                now + Duration::from_secs(10)
            ),
            Added::OnTime
        );
        let closed = open.close(UNIX_EPOCH + Duration::from_secs(60), Duration::ZERO);
        let totals: Vec<Vec<(String, u64)>> = closed
            .iter()
            .map(|w| {
                let mut t: Vec<(String, u64)> = w
                    .profiles
                    .iter()
                    .map(|p| (p.series.app().to_owned(), p.tree.total()))
                    .collect();
                t.sort();
                t
            })
            .collect();
        assert_eq!(
            totals,
            [
                vec![("a.cpu".to_owned(), 6), ("b.cpu".to_owned(), 1)],
                vec![("c.cpu".to_owned(), 1)]
            ]
        );
    }

    #[tokio::test]
    async fn a_busy_sink_loses_the_newest_window_and_nobody_waits() {
        let registry = prometheus::Registry::new();
        let window_metrics =
            WindowMetrics::new(&registry, &crate::tier::TierCounters::new(&registry));
        let (slow_tx, mut slow_rx) = mpsc::channel(1);
        let (fast_tx, mut fast_rx) = mpsc::channel(8);
        let sinks = vec![
            Sink::new(slow_tx, SPOOL_BUSY),
            Sink::new(fast_tx, RULES_BUSY),
        ];
        let window = |start: u64| Window {
            start: UNIX_EPOCH + Duration::from_secs(start),
            end: UNIX_EPOCH + Duration::from_secs(start + 10),
            profiles: vec![profile("a.cpu{}", &["x"], 1, start, start + 1)],
        };
        for start in [10, 20, 30] {
            offer(window(start), &sinks, &window_metrics);
        }
        let text = smolder_daemon::metrics::render(&registry).unwrap();
        assert!(
            text.contains(
                "smolder_agent_dropped_windows_total{intentional=\"false\",reason=\"spool_busy\",stage=\"window\"} 2"
            ),
            "{text}"
        );
        assert_eq!(
            slow_rx.recv().await.unwrap().start,
            UNIX_EPOCH + Duration::from_secs(10)
        );
        for start in [10, 20, 30] {
            assert_eq!(
                fast_rx.recv().await.unwrap().start,
                UNIX_EPOCH + Duration::from_secs(start)
            );
        }
        // A source submitting into a full queue loses that profile and goes on.
        let (submitter, _held) = channel(&window_metrics);
        let mut queued = 0;
        for i in 0..QUEUE + 5 {
            if submitter
                .try_submit(profile("a.cpu{}", &["x"], 1, i as u64, i as u64 + 1))
                .unwrap()
            {
                queued += 1;
            }
        }
        assert_eq!(queued, QUEUE);
        assert!(
            smolder_daemon::metrics::render(&registry).unwrap().contains(
                "smolder_agent_dropped_profiles_total{intentional=\"false\",reason=\"queue_full\",stage=\"window\"} 5"
            )
        );
    }
}
