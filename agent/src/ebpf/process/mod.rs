//! The processes the eBPF source knows of: what each is called and where it is in its life.
//!
//! Input: process events (first sight, exec, exit) and drain numbers from the source's thread.
//! Output: the [`ProcessLabels`] of a sampled pid, or that a relabel rule dropped it, or that
//! it is unknown; the pids whose exit grace is over. Caller: the eBPF source ([`crate::ebpf`]).
//! Owns no files or tasks.
//!
//! `info.rs` reads a process from `/proc` once, at first sight or after an exec; `labels.rs`
//! turns what it read into labels through `ebpf.relabel-configs`; `maps.rs` reads its
//! executable mappings and opens the files they map, for the symbolizer and the unwinder;
//! [`Processes`] is the table, the sans-IO core of the source: time and drain numbers come in
//! as arguments.

mod info;
mod labels;
mod maps;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use info::{CgroupInfo, ProcessError, ProcessInfo, parse_cgroup, process_start_time};
pub use labels::{Labeller, ProcessLabels};
pub use maps::{FileKey, Mapping, Object, OpenedVia, ProcessMap, open_mapped};

/// A process the source knows of.
#[derive(Clone, Debug, PartialEq)]
struct Known {
    /// Its labels; `None` when a relabel rule drops it.
    labels: Option<ProcessLabels>,
    /// When it started (`ProcessInfo::start_time`).
    start_time: u64,
    /// When it exited, and the number of the drain that was next at that moment.
    exited: Option<(Instant, u64)>,
}

/// Known processes and their lifecycle.
#[derive(Debug, Default)]
pub struct Processes {
    known: HashMap<u32, Known>,
}

impl Processes {
    /// Records a process seen for the first time, or exec'd, with its labels (`None`: dropped)
    /// and start time. A pid that exited and came back (pid reuse) starts afresh.
    pub fn seen(&mut self, pid: u32, labels: Option<ProcessLabels>, start_time: u64) {
        self.known.insert(
            pid,
            Known {
                labels,
                start_time,
                exited: None,
            },
        );
    }

    /// The start time recorded for `pid`, if it is known.
    pub fn start_time(&self, pid: u32) -> Option<u64> {
        self.known.get(&pid).map(|known| known.start_time)
    }

    /// Whether `pid` is known (alive or in its grace period).
    pub fn contains(&self, pid: u32) -> bool {
        self.known.contains_key(&pid)
    }

    /// Whether `pid` is known and has not exited.
    pub fn is_alive(&self, pid: u32) -> bool {
        self.known
            .get(&pid)
            .is_some_and(|known| known.exited.is_none())
    }

    /// The labels of `pid`: `None` if unknown, `Some(None)` if dropped by relabelling.
    pub fn labels(&self, pid: u32) -> Option<Option<&ProcessLabels>> {
        self.known.get(&pid).map(|known| known.labels.as_ref())
    }

    /// Records that `pid` exited at `now`, while drain number `next_drain` had not started.
    pub fn exited(&mut self, pid: u32, now: Instant, next_drain: u64) {
        if let Some(known) = self.known.get_mut(&pid) {
            known.exited.get_or_insert((now, next_drain));
        }
    }

    /// Forgets processes whose exit is at least `grace` before `now` and whose last samples have
    /// been drained (`drained` drains have completed); returns their pids.
    pub fn purge(&mut self, now: Instant, drained: u64, grace: Duration) -> Vec<u32> {
        let mut gone = Vec::new();
        self.known.retain(|pid, known| match known.exited {
            Some((at, next_drain)) if drained > next_drain && now >= at + grace => {
                gone.push(*pid);
                false
            }
            _ => true,
        });
        gone
    }

    /// How many processes are known.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether no process is known.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolder_common::Labels;

    #[test]
    fn exited_processes_stay_for_the_grace_period_and_the_next_drain() {
        let mut processes = Processes::default();
        let labels = ProcessLabels {
            service: "a".to_owned(),
            labels: Labels::new(),
        };
        processes.seen(7, Some(labels.clone()), 100);
        processes.seen(8, None, 100);
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        // Exit during drain 3 (3 drains done, the 4th pending).
        processes.exited(7, t0, 3);
        assert!(processes.purge(t0 + grace, 3, grace).is_empty());
        assert!(
            processes
                .purge(t0 + Duration::from_secs(1), 4, grace)
                .is_empty()
        );
        assert_eq!(processes.labels(7), Some(Some(&labels)));
        assert_eq!(processes.purge(t0 + grace, 4, grace), vec![7]);
        assert_eq!(processes.labels(7), None);
        assert_eq!(processes.labels(8), Some(None));
        assert!(processes.is_alive(8));
        // The pid comes back: it is alive again and stays.
        processes.seen(8, Some(labels), 100);
        processes.exited(8, t0, 0);
        assert_eq!(processes.start_time(8), Some(100));
        processes.seen(8, None, 200);
        assert!(processes.purge(t0 + grace * 2, 9, grace).is_empty());
        assert_eq!(processes.len(), 1);
    }
}
