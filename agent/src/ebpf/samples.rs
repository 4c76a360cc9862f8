//! Reads the `unwind_samples` ring buffer and sums its samples per window and stack: CPU ticks,
//! off-CPU waits (joined from their switch-out and switch-in, [`super::offcpu`]) and page
//! faults ([`super::memory`]), as [`StackCount`]s of their [`SampleKind`], each with the Python
//! frames of a CPython thread as the kernel walked them ([`PythonFrames::Walked`]).
//!
//! The kernel sends every sample with its whole stack (header, user frames, kernel frames);
//! [`Sampler::read_samples`] hands each to a closure as it reads the buffer, and
//! [`WindowSamples`] sums equal stacks once per window, keyed by the record's bytes, so a
//! repeated stack costs a hash lookup and no allocation. Distinct stacks per window are bounded
//! by the samples per window (`ebpf.frequency` × CPUs × window length, plus the off-CPU and
//! memory samples, themselves bounded by `ebpf.off-cpu.max-unwinds-per-second` and
//! `ebpf.memory.period`). [`WindowSamples`] is sans IO: it sees records and times, never the
//! map or the clock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use smolder_agent_ebpf::unwind::{
    self as contract, SAMPLE_HUGE, SAMPLE_HUGE_UNKNOWN, Sample, Status,
};
use smolder_agent_ebpf::{PythonFrame, PythonStatus};

use super::offcpu::{self, Blocked, MAX_PENDING, Pending, Woke};
use super::{PythonFrames, SampleKind, Sampler, Stack, StackCount, memory};

impl Sampler {
    /// Hands every sample the kernel queued since the last call to `each`, oldest first;
    /// returns how many records were not samples (too short for what their header says).
    pub fn read_samples(&mut self, mut each: impl FnMut(&Sample<'_>)) -> u64 {
        let mut malformed = 0;
        while let Some(item) = self.samples.next() {
            match contract::parse_sample(&item) {
                Ok(sample) => each(&sample),
                Err(_) => malformed += 1,
            }
        }
        malformed
    }
}

/// One distinct stack of a window, or what an off-CPU wait will add to.
#[derive(Clone)]
struct Counted {
    kind: SampleKind,
    pid: u32,
    user: Stack,
    truncated: bool,
    kernel: Stack,
    python: PythonFrames,
    count: u64,
    samples: u64,
}

/// A thread waiting off the CPU: the key and stack its time goes to.
#[derive(Clone)]
struct Waiter {
    key: Arc<[u8]>,
    counted: Counted,
}

/// How one process's samples of a window were unwound, for the metrics: kept per process, so
/// that only the processes being profiled count (the others, dropped by relabelling, get no
/// tables).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindCounts {
    /// Samples per [`Status`], in code order.
    pub outcomes: [u64; Status::ALL.len()],
    /// Samples per user-frame count.
    pub frames: BTreeMap<u16, u64>,
    /// Frames found by frame-pointer steps.
    pub fp_frames: u64,
    /// Samples per [`PythonStatus`] of the kernel's Python walk, in code order.
    pub python: [u64; PythonStatus::ALL.len()],
}

impl UnwindCounts {
    /// Adds `other` in.
    pub fn add(&mut self, other: &UnwindCounts) {
        for (total, n) in self.outcomes.iter_mut().zip(other.outcomes) {
            *total += n;
        }
        for (&len, &n) in &other.frames {
            *self.frames.entry(len).or_default() += n;
        }
        self.fp_frames += other.fp_frames;
        for (total, n) in self.python.iter_mut().zip(other.python) {
            *total += n;
        }
    }
}

/// What the off-CPU and memory samples read since the last call came to, for the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindCounts {
    /// Switch-outs sampled (each one unwound in the kernel).
    pub off_cpu_unwinds: u64,
    /// The switch-outs those stand for: each counts 1 / the probability it was sampled with.
    pub off_cpu_switches: u64,
    /// Waits shorter than `ebpf.off-cpu.min-duration`.
    pub off_cpu_too_short: u64,
    /// Switch-ins whose switch-out is unknown (lost to a full ring buffer).
    pub off_cpu_unmatched: u64,
    /// Switch-outs not followed because too many threads were waiting already.
    pub off_cpu_pending_full: u64,
    /// Page-fault samples.
    pub memory_samples: u64,
    /// Page-fault samples whose fault mapped a huge page.
    pub memory_huge: u64,
    /// Page-fault samples the kernel could not classify (counted as base pages).
    pub memory_unclassified: u64,
}

impl KindCounts {
    /// Adds `other` in.
    pub fn add(&mut self, other: &KindCounts) {
        self.off_cpu_unwinds += other.off_cpu_unwinds;
        self.off_cpu_switches = self.off_cpu_switches.saturating_add(other.off_cpu_switches);
        self.off_cpu_too_short += other.off_cpu_too_short;
        self.off_cpu_unmatched += other.off_cpu_unmatched;
        self.off_cpu_pending_full += other.off_cpu_pending_full;
        self.memory_samples += other.memory_samples;
        self.memory_huge += other.memory_huge;
        self.memory_unclassified += other.memory_unclassified;
    }
}

/// A process whose walk left the tables: its user frames, for the unwinder to check against
/// the mappings it loaded (a library `dlopen`ed since, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Miss {
    /// The process.
    pub pid: u32,
    /// The sample's user frames, leaf first.
    pub frames: Vec<u64>,
}

/// The most distinct stacks one window holds (each up to 3 KiB with its key: frames of user
/// and kernel): a window of 10 s on 128 CPUs at 99 Hz takes at most 127 Ki samples, and
/// distinct stacks are far fewer. Past it, samples of new stacks are dropped and counted
/// (`smolder_agent_dropped_samples_total{reason="window_stacks_full"}`); samples of stacks
/// already held still count.
pub const MAX_WINDOW_STACKS: usize = 1 << 17;

/// The most walks that left the tables kept between two polls: they are hints for the
/// unwinder, one per new distinct stack, and the next poll brings more.
const MAX_MISSES: usize = 1024;

/// The samples of one window, summed per distinct stack, and the threads waiting off the CPU.
pub struct WindowSamples {
    stacks: HashMap<Box<[u8]>, Counted>,
    /// Reused for each sample's key.
    key: Vec<u8>,
    counts: HashMap<u32, UnwindCounts>,
    misses: Vec<Miss>,
    waiting: Pending<Waiter>,
    kinds: KindCounts,
    page_size: u64,
    /// Samples left out since the last [`WindowSamples::take_dropped`]: the window held
    /// [`MAX_WINDOW_STACKS`] stacks.
    dropped: u64,
    /// The Python frames of each new stack since the last call of
    /// [`WindowSamples::take_new_python`].
    new_python: Vec<(u32, Arc<[PythonFrame]>)>,
}

impl Default for WindowSamples {
    fn default() -> Self {
        WindowSamples::new(Duration::from_millis(1), memory::page_size())
    }
}

/// Flags of a key: the header fields that change how a stack reads.
const TRUNCATED: u8 = 1;
const NO_USER_STACK: u8 = 2;
const KERNEL_LOST: u8 = 4;
const PYTHON_TRUNCATED: u8 = 8;

impl WindowSamples {
    /// Samples of a window, counting off-CPU waits of at least `min_duration` and page faults
    /// of `page_size` bytes.
    pub fn new(min_duration: Duration, page_size: u64) -> Self {
        WindowSamples {
            stacks: HashMap::new(),
            key: Vec::new(),
            counts: HashMap::new(),
            misses: Vec::new(),
            waiting: Pending::new(min_duration, MAX_PENDING),
            kinds: KindCounts::default(),
            page_size,
            new_python: Vec::new(),
            dropped: 0,
        }
    }

    /// Counts one sample. Samples of a kind the agent does not profile (uprobe hits, which
    /// only the tests' point check attaches) are left out.
    pub fn add(&mut self, sample: &Sample<'_>) {
        let header = &sample.header;
        match contract::SampleKind::from_raw(header.kind) {
            Some(contract::SampleKind::Cpu) => {
                let counted = self.stack(sample, SampleKind::Cpu);
                self.credit(counted, header.value, 1);
            }
            Some(contract::SampleKind::Memory) => {
                let huge = header.flags & SAMPLE_HUGE != 0;
                self.kinds.memory_samples += 1;
                self.kinds.memory_huge += u64::from(huge);
                self.kinds.memory_unclassified +=
                    u64::from(header.flags & SAMPLE_HUGE_UNKNOWN != 0);
                let bytes = memory::bytes(header.value, huge, self.page_size);
                let counted = self.stack(sample, SampleKind::MemoryGrowth);
                self.credit(counted, bytes, 1);
            }
            Some(raw @ (contract::SampleKind::OffCpu | contract::SampleKind::RunQueue)) => {
                let kind = if raw == contract::SampleKind::OffCpu {
                    SampleKind::OffCpu
                } else {
                    SampleKind::RunQueue
                };
                self.kinds.off_cpu_unwinds += 1;
                // At most 2^32 (a threshold of 1): the float converts exactly.
                let switches = offcpu::weight(header.threshold).round() as u64;
                self.kinds.off_cpu_switches = self.kinds.off_cpu_switches.saturating_add(switches);
                let counted = match self.stack(sample, kind) {
                    Some(counted) => counted,
                    None => match self.stacks.get(&self.key[..]) {
                        Some(counted) => counted.clone(),
                        // The window is full: the wait is not followed (its switch-in is
                        // counted unmatched), its sample counted as dropped.
                        None => return,
                    },
                };
                let waiter = Waiter {
                    key: Arc::from(self.key.as_slice()),
                    counted,
                };
                if !self
                    .waiting
                    .switched_out(header.tid, waiter, header.value, header.threshold)
                {
                    self.kinds.off_cpu_pending_full += 1;
                }
            }
            Some(contract::SampleKind::OffCpuEnd) => {
                match self.waiting.switched_in(header.tid, header.value) {
                    Woke::Counted(blocked) => self.blocked(blocked),
                    Woke::TooShort => self.kinds.off_cpu_too_short += 1,
                    Woke::Unmatched => self.kinds.off_cpu_unmatched += 1,
                }
            }
            Some(contract::SampleKind::Uprobe) | None => {}
        }
    }

    /// Accounts a sample's walk, sets `self.key` to its stack's key, and returns the stack's
    /// entry: a new one (with a zero count) when the window does not have the stack, else
    /// none (the window's own, or, when the window is full, none at all: dropped).
    fn stack(&mut self, sample: &Sample<'_>, kind: SampleKind) -> Option<Counted> {
        let header = &sample.header;
        let status = Status::from_raw(header.status);
        let counts = self.counts.entry(header.tgid).or_default();
        if let Some(status) = status {
            counts.outcomes[status as usize] += 1;
        }
        *counts.frames.entry(header.len).or_default() += 1;
        counts.fp_frames += u64::from(header.fp_frames);
        let python_status = PythonStatus::from_raw(header.python_status);
        if let Some(python) = python_status {
            counts.python[python as usize] += 1;
        }

        let mut flags = 0;
        if status == Some(Status::Truncated) {
            flags |= TRUNCATED;
        }
        if status == Some(Status::NoUserStack) {
            flags |= NO_USER_STACK;
        }
        if header.kernel_error != 0 {
            flags |= KERNEL_LOST;
        }
        if python_status == Some(PythonStatus::Truncated) {
            flags |= PYTHON_TRUNCATED;
        }
        self.key.clear();
        self.key.extend_from_slice(&header.kind.to_le_bytes());
        self.key.extend_from_slice(&header.tgid.to_le_bytes());
        self.key.extend_from_slice(&header.len.to_le_bytes());
        self.key.push(flags);
        self.key.extend_from_slice(sample.frame_bytes());
        // Python frames by code object and entry mark: their instruction pointers move with
        // every bytecode instruction, and a frame is named per function, not per line.
        for frame in sample.python() {
            self.key.extend_from_slice(&frame.code.to_le_bytes());
        }
        if self.stacks.contains_key(&self.key[..]) {
            return None;
        }
        if self.stacks.len() >= MAX_WINDOW_STACKS {
            // One record is one sample, whatever its value measures (a count, a switch-out
            // time, a fault period).
            self.dropped += 1;
            return None;
        }
        let user: Arc<[u64]> = sample.user().collect();
        if (status == Some(Status::NoTable) || header.fp_frames > 0)
            && self.misses.len() < MAX_MISSES
        {
            self.misses.push(Miss {
                pid: header.tgid,
                frames: user.to_vec(),
            });
        }
        let python: Arc<[PythonFrame]> = sample.python().collect();
        let python = if python.is_empty() {
            PythonFrames::None
        } else {
            self.new_python.push((header.tgid, Arc::clone(&python)));
            PythonFrames::Walked {
                frames: python,
                truncated: flags & PYTHON_TRUNCATED != 0,
                native_complete: status == Some(Status::Complete),
            }
        };
        let kernel: Arc<[u64]> = sample.kernel().collect();
        Some(Counted {
            kind,
            pid: header.tgid,
            user: if flags & NO_USER_STACK != 0 {
                Stack::None
            } else {
                Stack::Frames(user)
            },
            truncated: flags & TRUNCATED != 0,
            kernel: if flags & KERNEL_LOST != 0 {
                Stack::Lost
            } else if kernel.is_empty() {
                Stack::None
            } else {
                Stack::Frames(kernel)
            },
            python,
            count: 0,
            samples: 0,
        })
    }

    /// Adds `value` and `samples` to the stack of `self.key`, which is `new` when the window
    /// does not have it yet.
    fn credit(&mut self, new: Option<Counted>, value: u64, samples: u64) {
        if let Some(counted) = self.stacks.get_mut(&self.key[..]) {
            counted.count += value;
            counted.samples += samples;
        } else if let Some(mut counted) = new {
            counted.count = value;
            counted.samples = samples;
            self.stacks.insert(self.key.as_slice().into(), counted);
        }
    }

    /// Adds an off-CPU wait's time to its stack; a wait that ended counts as one sample.
    fn blocked(&mut self, blocked: Blocked<Waiter>) {
        let Waiter { key, counted } = blocked.stack;
        let samples = u64::from(blocked.ended);
        if let Some(existing) = self.stacks.get_mut(&key[..]) {
            existing.count += blocked.nanoseconds;
            existing.samples += samples;
        } else {
            self.stacks.insert(
                Box::from(&key[..]),
                Counted {
                    count: blocked.nanoseconds,
                    samples,
                    ..counted
                },
            );
        }
    }

    /// The window ends at `boundary` (kernel monotonic nanoseconds): the threads still waiting
    /// add the part of their wait since the last boundary.
    pub fn close(&mut self, boundary: u64) {
        for blocked in self.waiting.close(boundary) {
            self.blocked(blocked);
        }
    }

    /// Forgets the waits of the threads of `pids` (processes that exited).
    pub fn forget(&mut self, pids: &HashSet<u32>) {
        self.waiting
            .retain(|waiter| !pids.contains(&waiter.counted.pid));
    }

    /// Threads sampled at switch-out and not back yet.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The walks that left the tables since the last call: one per new distinct stack.
    pub fn take_misses(&mut self) -> Vec<Miss> {
        std::mem::take(&mut self.misses)
    }

    /// Samples left out since the last call because the window was full.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// The Python frames of each new stack since the last call, by process: to be named while
    /// the process lives.
    pub fn take_new_python(&mut self) -> Vec<(u32, Arc<[PythonFrame]>)> {
        std::mem::take(&mut self.new_python)
    }

    /// How each process's samples since the last call were unwound.
    pub fn take_counts(&mut self) -> HashMap<u32, UnwindCounts> {
        std::mem::take(&mut self.counts)
    }

    /// What the off-CPU and memory samples since the last call came to.
    pub fn take_kinds(&mut self) -> KindCounts {
        std::mem::take(&mut self.kinds)
    }

    /// The window's stacks and their sums, emptying it.
    pub fn take(&mut self) -> Vec<StackCount> {
        self.stacks
            .drain()
            .map(|(_, counted)| StackCount {
                kind: counted.kind,
                pid: counted.pid,
                user: counted.user,
                truncated: counted.truncated,
                kernel: counted.kernel,
                python: counted.python,
                count: counted.count,
                samples: counted.samples,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring-buffer record as the kernel writes it.
    fn record(tgid: u32, status: Status, fp_frames: u16, user: &[u64], kernel: &[u64]) -> Vec<u8> {
        raw(1, tgid, tgid, status, fp_frames, user, kernel, (0, 1, 0, 0))
    }

    /// Any record: `kind`, ids, walk, and (threshold, value, addr, flags).
    #[allow(clippy::too_many_arguments, reason = "one argument per header field")]
    fn raw(
        kind: u32,
        tgid: u32,
        tid: u32,
        status: Status,
        fp_frames: u16,
        user: &[u64],
        kernel: &[u64],
        (threshold, value, addr, flags): (u32, u64, u64, u32),
    ) -> Vec<u8> {
        let mut bytes = Vec::new();
        for word in [kind, tgid, tid, 0] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        for half in [
            kernel.len() as u16,
            0,
            status as u16,
            user.len() as u16,
            fp_frames,
            0,
        ] {
            bytes.extend_from_slice(&half.to_le_bytes());
        }
        // No Python frames: python_status and python_len 0.
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&value.to_le_bytes());
        bytes.extend_from_slice(&addr.to_le_bytes());
        bytes.extend_from_slice(&threshold.to_le_bytes());
        bytes.extend_from_slice(&flags.to_le_bytes());
        for frame in user.iter().chain(kernel) {
            bytes.extend_from_slice(&frame.to_le_bytes());
        }
        bytes
    }

    fn add(window: &mut WindowSamples, bytes: &[u8]) {
        window.add(&contract::parse_sample(bytes).unwrap());
    }

    /// A record of a CPython thread: `python` as (code, instr) pairs after the native frames.
    fn python_record(status: PythonStatus, user: &[u64], python: &[(u64, u64)]) -> Vec<u8> {
        let mut bytes = record(5, Status::Complete, 0, user, &[]);
        bytes[28..30].copy_from_slice(&(status as u16).to_le_bytes());
        bytes[30..32].copy_from_slice(&(python.len() as u16).to_le_bytes());
        for &(code, instr) in python {
            bytes.extend_from_slice(&code.to_le_bytes());
            bytes.extend_from_slice(&instr.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn python_frames_count_per_code_object_not_per_instruction() {
        let mut window = WindowSamples::default();
        add(
            &mut window,
            &python_record(PythonStatus::Ok, &[1, 2], &[(0x101, 0x150), (0x200, 0x260)]),
        );
        add(
            &mut window,
            &python_record(PythonStatus::Ok, &[1, 2], &[(0x101, 0x158), (0x200, 0x260)]),
        );
        add(
            &mut window,
            &python_record(PythonStatus::NoFrames, &[1, 2], &[]),
        );
        let new = window.take_new_python();
        assert_eq!(new.len(), 1);
        assert_eq!(new[0].0, 5);
        let counts = &window.take_counts()[&5];
        assert_eq!(counts.python[PythonStatus::Ok as usize], 2);
        assert_eq!(counts.python[PythonStatus::NoFrames as usize], 1);
        let stacks = window.take();
        assert_eq!(stacks.len(), 2);
        let walked = stacks.iter().find(|s| s.count == 2).unwrap();
        match &walked.python {
            PythonFrames::Walked {
                frames,
                truncated,
                native_complete,
            } => {
                assert_eq!(frames.len(), 2);
                assert!(frames[0].is_entry());
                assert!(!truncated && *native_complete);
            }
            other => panic!("{other:?}"),
        }
        let native = stacks.iter().find(|s| s.count == 1).unwrap();
        assert_eq!(native.python, PythonFrames::None);
    }

    #[test]
    fn equal_stacks_count_once_and_kernel_frames_are_kept_apart() {
        let mut window = WindowSamples::default();
        let a = record(7, Status::Complete, 0, &[1, 2, 3], &[]);
        let b = record(7, Status::Complete, 0, &[1, 2], &[3]);
        for _ in 0..3 {
            add(&mut window, &a);
        }
        add(&mut window, &b);
        add(
            &mut window,
            &record(7, Status::Truncated, 0, &[1, 2, 3], &[]),
        );
        let counts = &window.take_counts()[&7];
        assert_eq!(counts.outcomes[Status::Complete as usize], 4);
        assert_eq!(counts.outcomes[Status::Truncated as usize], 1);
        assert_eq!((counts.frames[&3], counts.frames[&2]), (4, 1));
        let mut stacks = window.take();
        stacks.sort_by_key(|s| std::cmp::Reverse(s.count));
        assert_eq!(stacks.len(), 3);
        assert_eq!(stacks[0].count, 3);
        assert_eq!(
            stacks[0].user,
            Stack::Frames(Arc::from([1u64, 2, 3].as_slice()))
        );
        assert_eq!(stacks[0].kernel, Stack::None);
        let split = stacks.iter().find(|s| s.kernel != Stack::None).unwrap();
        assert_eq!(split.user, Stack::Frames(Arc::from([1u64, 2].as_slice())));
        assert_eq!(split.kernel, Stack::Frames(Arc::from([3u64].as_slice())));
        assert!(stacks.iter().any(|s| s.truncated));
        assert!(window.take().is_empty());
    }

    #[test]
    fn a_full_window_drops_new_stacks_and_counts_them_but_keeps_counting_known_ones() {
        let mut window = WindowSamples::default();
        for i in 0..MAX_WINDOW_STACKS as u64 {
            add(&mut window, &record(1, Status::Complete, 0, &[i], &[]));
        }
        assert_eq!(window.take_dropped(), 0);
        add(
            &mut window,
            &record(1, Status::Complete, 0, &[u64::MAX], &[]),
        );
        add(
            &mut window,
            &record(1, Status::NoTable, 0, &[u64::MAX - 1], &[]),
        );
        add(&mut window, &record(1, Status::Complete, 0, &[0], &[]));
        assert_eq!(window.take_dropped(), 2);
        assert_eq!(window.take_dropped(), 0);
        assert!(
            window.take_misses().is_empty(),
            "a dropped stack is no miss"
        );
        let stacks = window.take();
        assert_eq!(stacks.len(), MAX_WINDOW_STACKS);
        assert_eq!(
            stacks.iter().map(|s| s.count).sum::<u64>(),
            MAX_WINDOW_STACKS as u64 + 1
        );
        // Emptied by the drain: room again.
        add(
            &mut window,
            &record(1, Status::Complete, 0, &[u64::MAX], &[]),
        );
        assert_eq!((window.take().len(), window.take_dropped()), (1, 0));
    }

    #[test]
    fn walks_off_the_tables_are_misses_once_per_stack() {
        let mut window = WindowSamples::default();
        let off = record(9, Status::Complete, 2, &[5, 6, 7], &[]);
        add(&mut window, &off);
        add(&mut window, &off);
        add(&mut window, &record(9, Status::NoTable, 0, &[8], &[]));
        add(&mut window, &record(9, Status::Complete, 0, &[1], &[]));
        let misses = window.take_misses();
        assert_eq!(
            misses,
            [
                Miss {
                    pid: 9,
                    frames: vec![5, 6, 7]
                },
                Miss {
                    pid: 9,
                    frames: vec![8]
                }
            ]
        );
        assert_eq!(window.take_counts()[&9].fp_frames, 4);
    }

    #[test]
    fn kernel_threads_and_failed_kernel_stacks_read_as_such() {
        let mut window = WindowSamples::default();
        add(
            &mut window,
            &record(2, Status::NoUserStack, 0, &[], &[0xffff_ffff_8100_0000]),
        );
        let mut lost = record(3, Status::Complete, 0, &[1], &[]);
        lost[18] = 14; // kernel_error = EFAULT
        add(&mut window, &lost);
        let stacks = window.take();
        let kthread = stacks.iter().find(|s| s.pid == 2).unwrap();
        assert_eq!(kthread.user, Stack::None);
        assert_eq!(
            kthread.kernel,
            Stack::Frames(Arc::from([0xffff_ffff_8100_0000_u64].as_slice()))
        );
        let failed = stacks.iter().find(|s| s.pid == 3).unwrap();
        assert_eq!(failed.kernel, Stack::Lost);
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn off_cpu_waits_join_by_thread_and_split_at_boundaries() {
        let mut window = WindowSamples::new(Duration::from_millis(1), 4096);
        let always = smolder_agent_ebpf::offcpu::ALWAYS;
        let out = |tid, start| {
            raw(
                3,
                7,
                tid,
                Status::Complete,
                0,
                &[1, 2],
                &[9],
                (always, start, 0, 0),
            )
        };
        let back = |tid, end| raw(5, 7, tid, Status::NoUserStack, 0, &[], &[], (0, end, 0, 0));
        // Two threads blocked at the same stack, 5 ms and 2 s; one too short; one unmatched.
        add(&mut window, &out(8, 100 * MS));
        add(&mut window, &back(8, 105 * MS));
        add(&mut window, &out(9, 100 * MS));
        add(&mut window, &out(10, 100 * MS));
        add(&mut window, &back(10, 100 * MS + 10));
        add(&mut window, &back(11, 100 * MS));
        assert_eq!(window.waiting(), 1);
        window.close(1100 * MS);
        let stacks = window.take();
        assert_eq!(stacks.len(), 1);
        assert_eq!(stacks[0].kind, SampleKind::OffCpu);
        assert_eq!(stacks[0].count, 5 * MS + 1000 * MS);
        assert_eq!(stacks[0].samples, 1);
        add(&mut window, &back(9, 2100 * MS));
        let stacks = window.take();
        assert_eq!((stacks[0].count, stacks[0].samples), (1000 * MS, 1));
        let kinds = window.take_kinds();
        assert_eq!(
            (
                kinds.off_cpu_unwinds,
                kinds.off_cpu_switches,
                kinds.off_cpu_too_short,
                kinds.off_cpu_unmatched
            ),
            (3, 3, 1, 1)
        );
        // A process that exits while its threads wait: their waits are forgotten.
        add(&mut window, &out(12, 0));
        window.forget(&HashSet::from([7]));
        assert_eq!(window.waiting(), 0);
    }

    #[test]
    fn page_faults_count_pages_and_huge_pages() {
        let mut window = WindowSamples::new(Duration::from_millis(1), 4096);
        let fault = |flags| {
            raw(
                6,
                4,
                4,
                Status::Complete,
                0,
                &[1],
                &[],
                (0, 1024, 0x7f00_0000_1000, flags),
            )
        };
        add(&mut window, &fault(0));
        add(&mut window, &fault(SAMPLE_HUGE));
        let stacks = window.take();
        assert_eq!(stacks.len(), 1);
        assert_eq!(stacks[0].kind, SampleKind::MemoryGrowth);
        assert_eq!(stacks[0].count, 1024 * 4096 + 1024 * (2 << 20));
        assert_eq!(stacks[0].samples, 2);
        let kinds = window.take_kinds();
        assert_eq!((kinds.memory_samples, kinds.memory_huge), (2, 1));
    }

    /// Python frames after the native ones of an off-CPU or memory record, as the kernel
    /// appends them.
    fn with_python(mut bytes: Vec<u8>, python: &[(u64, u64)]) -> Vec<u8> {
        bytes[28..30].copy_from_slice(&(PythonStatus::Ok as u16).to_le_bytes());
        bytes[30..32].copy_from_slice(&(python.len() as u16).to_le_bytes());
        for &(code, instr) in python {
            bytes.extend_from_slice(&code.to_le_bytes());
            bytes.extend_from_slice(&instr.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn off_cpu_and_memory_samples_keep_their_python_frames() {
        let mut window = WindowSamples::new(Duration::from_millis(1), 4096);
        let always = smolder_agent_ebpf::offcpu::ALWAYS;
        let python = [(0x101, 0x150), (0x200, 0x260)];
        let out = raw(
            3,
            7,
            8,
            Status::Complete,
            0,
            &[1, 2],
            &[9],
            (always, 0, 0, 0),
        );
        add(&mut window, &with_python(out, &python));
        add(
            &mut window,
            &raw(5, 7, 8, Status::NoUserStack, 0, &[], &[], (0, 5 * MS, 0, 0)),
        );
        let fault = raw(6, 7, 8, Status::Complete, 0, &[1], &[], (0, 1, 0x1000, 0));
        add(&mut window, &with_python(fault, &python));
        assert_eq!(window.take_new_python().len(), 2);
        let stacks = window.take();
        assert_eq!(stacks.len(), 2);
        for kind in [SampleKind::OffCpu, SampleKind::MemoryGrowth] {
            let stack = stacks.iter().find(|s| s.kind == kind).unwrap();
            match &stack.python {
                PythonFrames::Walked { frames, .. } => assert_eq!(frames.len(), 2, "{kind:?}"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        let off_cpu = stacks
            .iter()
            .find(|s| s.kind == SampleKind::OffCpu)
            .unwrap();
        assert_eq!((off_cpu.count, off_cpu.samples), (5 * MS, 1));
    }
}
