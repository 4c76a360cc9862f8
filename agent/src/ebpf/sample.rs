//! What the eBPF source samples: the kind of each sample and its stacks as the kernel recorded
//! them.
//!
//! A map reader ([`counts`](super::counts) today) turns kernel records into [`StackCount`]s;
//! the symbolizer names their frames; [`profiles`](super::profiles) files them under one series
//! per process and [`SampleKind`]. Nothing here reads a map or a file.

use std::sync::Arc;

use smolder_agent_ebpf::{PythonStackKey, PythonStatus};
use smolder_common::{Aggregation, ProfileMeta};

/// The spy name of the profiles, as Pyroscope's eBPF agent calls itself.
pub const SPY_NAME: &str = "ebpfspy";

/// What a sample measures: the profile type of the series it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// On-CPU time: one sample per `ebpf.frequency` tick of a CPU the process ran on.
    Cpu,
}

impl SampleKind {
    /// The profile type that ends the series' app name (`checkout.cpu`).
    pub fn profile_type(self) -> &'static str {
        match self {
            SampleKind::Cpu => "cpu",
        }
    }

    /// The meta of this kind's profiles, for a sampler running at `frequency` Hz.
    pub fn meta(self, frequency: u64) -> ProfileMeta {
        match self {
            SampleKind::Cpu => ProfileMeta {
                spy_name: SPY_NAME.to_owned(),
                sample_rate: u32::try_from(frequency).unwrap_or(u32::MAX),
                units: "samples".to_owned(),
                aggregation: Aggregation::Sum,
            },
        }
    }
}

/// A stack as the kernel recorded it, leaf first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stack {
    /// Instruction addresses, the leaf (innermost frame) first.
    Frames(Arc<[u64]>),
    /// A CPython stack the kernel walked, by its key; [`python`](super::python) names it.
    Python(PythonStackKey),
    /// Frames named at the source (Python frames), the leaf first.
    Named(Arc<[Arc<str>]>),
    /// The sample has no stack of this kind (no kernel stack for a sample in user mode, no user
    /// stack for a kernel thread).
    None,
    /// The stack was not recorded (its slot in the stacks map was taken, or the helper failed).
    Lost,
}

/// How many samples of one kind one process had with one pair of stacks, over one drain: the
/// kernel counts samples per (process, user stack, kernel stack) key rather than sending each.
#[derive(Clone, Debug)]
pub struct StackCount {
    /// What the samples measure.
    pub kind: SampleKind,
    /// The process (thread group) id.
    pub pid: u32,
    /// The user-space stack.
    pub user: Stack,
    /// The kernel stack.
    pub kernel: Stack,
    /// What the kernel's Python walk found ([`PythonStatus::None`] outside CPython processes).
    pub python: PythonStatus,
    /// How many times this pair was sampled.
    pub count: u64,
}
