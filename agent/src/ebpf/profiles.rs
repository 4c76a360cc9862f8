//! One drain's symbolized samples as profiles: one tree per series, that is per process labels
//! and [`SampleKind`].
//!
//! Input: [`SymbolizedSample`]s of any kind and the [`Processes`] table that names their pids.
//! Output: [`Profile`]s spanning the window, one per series, with the meta of their kind.
//! Caller: the eBPF source, after each drain. Pure: no maps, files or clock.

use std::collections::HashMap;
use std::time::SystemTime;

use smolder_common::{Profile, Tree};

use super::process::{ProcessLabels, Processes};
use super::sample::SampleKind;
use super::symbolize::SymbolizedSample;

/// Merges `samples` into one tree per series over `[from, until)`; samples of processes that
/// are unknown or dropped by relabelling are left out. `frequency` is the sampler's, for the
/// meta of sampled kinds.
pub(super) fn profiles(
    samples: &[SymbolizedSample],
    processes: &Processes,
    frequency: u64,
    from: SystemTime,
    until: SystemTime,
) -> Vec<Profile> {
    let mut trees: HashMap<(&ProcessLabels, SampleKind), Tree> = HashMap::new();
    for sample in samples {
        let Some(Some(labels)) = processes.labels(sample.pid) else {
            continue;
        };
        trees
            .entry((labels, sample.kind))
            .or_default()
            .insert_names(sample.frames.iter().map(|f| &**f), sample.count);
    }
    trees
        .into_iter()
        .map(|((labels, kind), tree)| Profile {
            series: labels.series(kind),
            meta: kind.meta(frequency),
            from,
            until,
            tree,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant, UNIX_EPOCH};

    use super::*;
    use crate::ebpf::process::{Labeller, ProcessInfo};
    use crate::relabel::Relabeler;

    fn sample(pid: u32, frames: &[&str], count: u64) -> SymbolizedSample {
        SymbolizedSample {
            kind: SampleKind::Cpu,
            pid,
            frames: frames.iter().map(|f| Arc::from(*f)).collect(),
            count,
        }
    }

    #[test]
    fn processes_with_the_same_labels_share_a_series_and_unknown_ones_are_left_out() {
        let labeller = Labeller::new(Relabeler::new(&[]).unwrap(), "host-1".to_owned());
        let worker = |pid| ProcessInfo {
            pid,
            comm: "worker".into(),
            exe: Some("/srv/worker".into()),
            systemd_unit: Some("worker.service".into()),
            ..ProcessInfo::default()
        };
        let mut processes = Processes::default();
        processes.seen(1, labeller.labels(&worker(1)), 10);
        processes.seen(2, labeller.labels(&worker(2)), 20);
        processes.seen(3, None, 30);
        processes.exited(2, Instant::now(), 0);
        let from = UNIX_EPOCH + Duration::from_secs(10);
        let until = from + Duration::from_secs(10);
        let samples = [
            sample(1, &["main", "a"], 3),
            sample(2, &["main", "b"], 4),
            sample(3, &["dropped"], 5),
            sample(4, &["unknown"], 6),
        ];
        let profiles = profiles(&samples, &processes, 99, from, until);
        assert_eq!(profiles.len(), 1);
        let profile = &profiles[0];
        assert_eq!(
            profile.series.to_string(),
            "worker.cpu{hostname=host-1,service_name=worker,systemd_unit=worker.service}"
        );
        assert_eq!(profile.tree.total(), 7);
        assert_eq!(profile.meta, SampleKind::Cpu.meta(99));
        assert_eq!(profile.meta.sample_rate, 99);
        assert_eq!((profile.from, profile.until), (from, until));
    }
}
