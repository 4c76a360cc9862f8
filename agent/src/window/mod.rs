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

mod metrics;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use smolder_common::{Aggregation, Profile, ProfileMeta, Series, Tree};
use smolder_daemon::Heartbeat;
use tokio::sync::mpsc;
use tracing::debug;

pub use self::metrics::WindowMetrics;

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
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            length: Duration::from_secs(10),
            settle: Duration::from_secs(2),
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
#[derive(Clone, Debug)]
pub struct Submitter {
    tx: mpsc::Sender<Profile>,
}

/// The window loop has stopped (the agent is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the window loop has stopped")]
pub struct Stopped;

impl Submitter {
    /// Submits a profile, waiting while the window loop is busy.
    ///
    /// # Errors
    ///
    /// [`Stopped`] when the agent is shutting down.
    pub async fn submit(&self, profile: Profile) -> Result<(), Stopped> {
        self.tx.send(profile).await.map_err(|_| Stopped)
    }

    /// [`submit`](Self::submit) from a thread outside the async runtime (the sampler's).
    ///
    /// # Errors
    ///
    /// [`Stopped`] when the agent is shutting down.
    pub fn blocking_submit(&self, profile: Profile) -> Result<(), Stopped> {
        self.tx.blocking_send(profile).map_err(|_| Stopped)
    }
}

/// Profiles queued between sources and the window loop before sources wait.
const QUEUE: usize = 1024;

/// A submitter and the receiving end that [`run`] consumes.
pub fn channel() -> (Submitter, mpsc::Receiver<Profile>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Submitter { tx }, rx)
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

/// The windows still open, each merging its profiles.
struct Open {
    length: Duration,
    windows: BTreeMap<SystemTime, WindowSeries>,
    /// End of the latest window handed on; profiles for earlier windows are late.
    closed_until: SystemTime,
}

impl Open {
    /// Files `profile` under its window, or under the window of `now` when its own has closed
    /// or lies in the future. Returns whether it was late.
    fn add(&mut self, profile: Profile, now: SystemTime) -> bool {
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
        match series.entry((profile.series, profile.meta)) {
            std::collections::hash_map::Entry::Occupied(mut merged) => {
                let (tree, count) = merged.get_mut();
                tree.merge(&profile.tree);
                *count += 1;
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert((profile.tree, 1));
            }
        }
        late
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
/// idle; a sink that blocks the loop stops its beats.
pub async fn run(
    config: WindowConfig,
    mut profiles: mpsc::Receiver<Profile>,
    sinks: Vec<mpsc::Sender<Arc<Window>>>,
    metrics: WindowMetrics,
    heartbeat: Heartbeat,
) {
    let mut open = Open {
        length: config.length,
        windows: BTreeMap::new(),
        closed_until: UNIX_EPOCH,
    };
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
                    if open.add(profile, SystemTime::now()) {
                        metrics.late_profiles.inc();
                    }
                }
                None => break,
            },
            () = sleep => {
                for window in open.close(SystemTime::now(), config.settle) {
                    hand_on(window, &sinks, &metrics).await;
                }
            }
            _ = ticker.tick() => {}
        }
        heartbeat.beat();
    }
    let everything = SystemTime::now() + config.length + config.settle;
    for window in open.close(everything, Duration::ZERO) {
        hand_on(window, &sinks, &metrics).await;
    }
}

async fn hand_on(window: Window, sinks: &[mpsc::Sender<Arc<Window>>], metrics: &WindowMetrics) {
    let nodes: usize = window.profiles.iter().map(|p| p.tree.len()).sum();
    metrics.windows_closed.inc();
    metrics
        .series
        .set(i64::try_from(window.profiles.len()).unwrap_or(i64::MAX));
    metrics.nodes.set(i64::try_from(nodes).unwrap_or(i64::MAX));
    debug!(series = window.profiles.len(), nodes, "window closed");
    let window = Arc::new(window);
    for sink in sinks {
        // A sink that has stopped is shutting down with the agent; the others still get it.
        let _ = sink.send(Arc::clone(&window)).await;
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
        Open {
            length: Duration::from_secs(10),
            windows: BTreeMap::new(),
            closed_until: UNIX_EPOCH,
        }
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
        assert!(!open.add(profile("app.cpu{}", &["main", "a"], 2, 10, 20), now));
        assert!(!open.add(profile("app.cpu{}", &["main", "b"], 3, 12, 15), now));
        assert!(!open.add(profile("other.cpu{}", &["x"], 1, 20, 25), now));
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
        assert!(open.add(profile("app.cpu{}", &["a"], 4, 10, 20), now));
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
}
