//! What the eBPF source samples: the kind of each sample and its stacks as the kernel recorded
//! them.
//!
//! A ring-buffer reader ([`samples`](super::samples) today) turns kernel records into
//! [`StackCount`]s; [`python`](super::python) names the Python frames of CPython processes and
//! places them in the native stack; the symbolizer names the native frames;
//! [`profiles`](super::profiles) files them under one series per process and [`SampleKind`].
//! Nothing here reads a map or a file.

use std::sync::Arc;

use smolder_agent_ebpf::PythonFrame;
use smolder_common::{Aggregation, ProfileMeta};

/// The spy name of the profiles, as Pyroscope's eBPF agent calls itself.
pub const SPY_NAME: &str = "ebpfspy";

/// What a sample measures: the profile type of the series it goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// On-CPU time: one sample per `ebpf.frequency` tick of a CPU the process ran on.
    Cpu,
    /// Time blocked off the CPU (sleeping, waiting for a lock, I/O or an event), in
    /// nanoseconds weighted by 1 / the sampling probability (`ebpf.off-cpu`).
    OffCpu,
    /// Time waiting in the run queue for a CPU after a preemption, in nanoseconds weighted the
    /// same way (`ebpf.off-cpu.run-queue`).
    RunQueue,
    /// Memory first touched (page faults), in bytes (`ebpf.memory`).
    MemoryGrowth,
}

impl SampleKind {
    /// Every kind.
    pub const ALL: [SampleKind; 4] = [
        SampleKind::Cpu,
        SampleKind::OffCpu,
        SampleKind::RunQueue,
        SampleKind::MemoryGrowth,
    ];

    /// The profile type that ends the series' app name (`checkout.cpu`, `checkout.off_cpu`,
    /// `checkout.run_queue`, `checkout.memory_growth`): `smolder_common::ProfileTypeId`'s
    /// table names their ids.
    pub fn profile_type(self) -> &'static str {
        match self {
            SampleKind::Cpu => "cpu",
            SampleKind::OffCpu => "off_cpu",
            SampleKind::RunQueue => "run_queue",
            SampleKind::MemoryGrowth => "memory_growth",
        }
    }

    /// The meta of this kind's profiles, for a sampler running at `frequency` Hz.
    pub fn meta(self, frequency: u64) -> ProfileMeta {
        let (sample_rate, units) = match self {
            SampleKind::Cpu => (u32::try_from(frequency).unwrap_or(u32::MAX), "samples"),
            SampleKind::OffCpu | SampleKind::RunQueue => (0, "nanoseconds"),
            SampleKind::MemoryGrowth => (0, "bytes"),
        };
        ProfileMeta {
            spy_name: SPY_NAME.to_owned(),
            sample_rate,
            units: units.to_owned(),
            aggregation: Aggregation::Sum,
        }
    }
}

/// A stack as the kernel recorded it, leaf first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stack {
    /// Instruction addresses, the leaf (innermost frame) first.
    Frames(Arc<[u64]>),
    /// Frames named at the source, the leaf first: the Python frames of a CPython thread whose
    /// native stack could not be mixed with them (see [`PythonFrames`]).
    Named(Arc<[Arc<str>]>),
    /// The sample has no stack of this kind (no kernel stack for a sample in user mode, no user
    /// stack for a kernel thread).
    None,
    /// The stack was not recorded (the helper reading it failed).
    Lost,
}

/// What the samples of one kind one process had with one pair of stacks add up to, over one
/// window: the reader sums them per (process, kind, user stack, kernel stack).
#[derive(Clone, Debug)]
pub struct StackCount {
    /// What the samples measure.
    pub kind: SampleKind,
    /// The process (thread group) id.
    pub pid: u32,
    /// The user-space stack.
    pub user: Stack,
    /// Whether the user stack is cut at the unwinder's depth limit (`ebpf.max-frames`): its
    /// root part is missing, and it is shown under a `[truncated]` root.
    pub truncated: bool,
    /// The kernel stack.
    pub kernel: Stack,
    /// The Python frames of a thread of a CPython process.
    pub python: PythonFrames,
    /// What the samples add up to in the kind's unit: samples (CPU), weighted nanoseconds
    /// (off-CPU, run queue) or bytes (memory growth).
    pub count: u64,
    /// How many samples of the kernel's this is.
    pub samples: u64,
}

/// The Python frames of a sample, from the kernel's walk to their place in the user stack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PythonFrames {
    /// None: not a thread of a CPython process the kernel walks, or one running no Python code.
    #[default]
    None,
    /// As the kernel walked them, innermost first (code objects, entry marks); the reader keeps
    /// the first sample's instruction pointers.
    Walked {
        /// The frames.
        frames: Arc<[PythonFrame]>,
        /// Whether the walk stopped at its frame limit: the outermost frames are missing.
        truncated: bool,
        /// Whether the native walk of the same sample reached the stack's end.
        native_complete: bool,
    },
    /// Named and placed in the user stack (a [`Stack::Frames`]): each native frame at a
    /// splice's depth gives way to the splice's names; a splice one past the root-most native
    /// frame goes above it (the Python frames the native walk did not reach).
    Mixed(Arc<[Splice]>),
}

/// Python frames standing for one native frame of a mixed stack: the frames one call of the
/// interpreter loop ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Splice {
    /// The native frame's depth in the user stack, 0 for the leaf.
    pub depth: usize,
    /// The Python frames' names, innermost first.
    pub names: Arc<[Arc<str>]>,
}
