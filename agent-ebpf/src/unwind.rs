//! The Rust mirror of `src/unwind.h`: the BPF unwinder's tables, mappings and samples.
//!
//! User space fills [`MAP_TABLES`] with one inner array per executable (the entries of a
//! `smolder_unwind::UnwindTable`, copied as they are) and [`MAP_MAPPINGS`] with
//! [`MappingKey`] → [`Mapping`] entries covering each process's executable mappings
//! ([`mapping_prefixes`] splits a range into trie prefixes); samples come back through
//! [`MAP_SAMPLES`] as a [`SampleHeader`] followed by its user and kernel frames, and by its
//! Python frames in a CPython process ([`parse_sample`]). The programs that walk are in
//! [`crate::OBJECT`]; the walk's depth is the global [`GLOBAL_MAX_FRAMES`].

use std::mem::offset_of;

use crate::PythonFrame;

/// HASH_OF_MAPS: executable id (`u64`, never 0) → that executable's table, an ARRAY of `u64`
/// created with [`TABLE_MAP_FLAGS`], key size 4, value size 8 and exactly as many entries as
/// the table has.
pub const MAP_TABLES: &str = "unwind_tables";
/// LPM trie: [`MappingKey`] → [`Mapping`].
pub const MAP_MAPPINGS: &str = "unwind_mappings";
/// Ring buffer of samples: [`SampleHeader`] then its user, kernel and Python frames.
pub const MAP_SAMPLES: &str = "unwind_samples";
/// Per-CPU counters, indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "unwind_counters";
/// Per-CPU scratch of [`crate::PROGRAM_CPU`].
pub const MAP_SCRATCH_CPU: &str = "scratch_cpu";
/// Per-CPU scratch of [`crate::PROGRAM_UPROBE`].
pub const MAP_SCRATCH_UPROBE: &str = "scratch_uprobe";
/// Per-CPU scratch of [`crate::offcpu::PROGRAM_SWITCH`].
pub const MAP_SCRATCH_SWITCH: &str = "scratch_switch";
/// Per-CPU scratch of [`crate::offcpu::PROGRAM_FAULT`].
pub const MAP_SCRATCH_FAULT: &str = "scratch_fault";
/// The global holding the walk's depth (at most [`MAX_FRAMES`]).
pub const GLOBAL_MAX_FRAMES: &str = "unwind_max_frames";

/// `SMOLDER_UNWIND_MAX_FRAMES`: frames a sample can hold.
pub const MAX_FRAMES: usize = 256;
/// `SMOLDER_UNWIND_DEFAULT_FRAMES`: the walk's default depth.
pub const DEFAULT_FRAMES: u32 = 128;
/// `SMOLDER_UNWIND_KERNEL_FRAMES`: kernel frames a sample can hold.
pub const KERNEL_FRAMES: usize = 127;
/// `SMOLDER_UNWIND_PYTHON_WORDS`: words a sample holds after its kernel frames, for the Python
/// frames ([`crate::PYTHON_MAX_FRAMES`], two words each).
pub const PYTHON_WORDS: usize = 2 * crate::PYTHON_MAX_FRAMES;
/// `SMOLDER_UNWIND_PAGE_BITS`: a table page spans 4 KiB of code.
pub const PAGE_BITS: u32 = 12;
/// `SMOLDER_UNWIND_SEARCH_STEPS`: binary-search steps inside a page.
pub const SEARCH_STEPS: u32 = 12;
/// `SMOLDER_UNWIND_TABLES_ENTRIES`: executables [`MAP_TABLES`] holds.
pub const TABLES_ENTRIES: u32 = 4096;
/// `SMOLDER_UNWIND_MAPPINGS_ENTRIES`: prefixes [`MAP_MAPPINGS`] holds.
pub const MAPPINGS_ENTRIES: u32 = 256 * 1024;
/// `SMOLDER_UNWIND_SAMPLES_BYTES`: the samples ring buffer's size.
pub const SAMPLES_BYTES: u32 = 2 * 1024 * 1024;
/// `SMOLDER_UNWIND_MAX_FP_FRAME`: how far above `rsp` a frame-pointer step accepts `rbp`.
pub const MAX_FP_FRAME: u64 = 8 << 20;
/// `SMOLDER_UNWIND_SIGNAL_GREGS`: where the registers of a signal frame's `ucontext` start.
pub const SIGNAL_GREGS: u64 = 40;
/// `SMOLDER_UNWIND_SIGNAL_RBP`: `rbp`'s index in them.
pub const SIGNAL_RBP: u64 = 10;
/// `SMOLDER_UNWIND_SIGNAL_RSP`: `rsp`'s index.
pub const SIGNAL_RSP: u64 = 15;
/// `SMOLDER_UNWIND_SIGNAL_RIP`: `rip`'s index.
pub const SIGNAL_RIP: u64 = 16;
/// Flags of every table array: `BPF_F_INNER_MAP | BPF_F_MMAPABLE` (tables of any size in one
/// outer map, filled through a memory mapping).
pub const TABLE_MAP_FLAGS: u32 = (1 << 12) | (1 << 10);
/// The prefix length of an LPM key that matches one exact (pid, address).
pub const FULL_PREFIX: u32 = 96;

/// `enum smolder_unwind_cfa`, in order: the CFA kinds of a row.
pub const CFA_KINDS: [(&str, u8); 10] = [
    ("no_fde", 0),
    ("rsp", 1),
    ("rsp_x8", 2),
    ("rbp", 3),
    ("plt1", 4),
    ("plt2", 5),
    ("deref_rsp", 6),
    ("signal", 7),
    ("end", 8),
    ("unsupported", 9),
];
/// `enum smolder_unwind_fp`, in order: how a row recovers `rbp`.
pub const FP_KINDS: [(&str, u8); 3] = [("same", 0), ("at_cfa", 1), ("lost", 2)];

/// `enum smolder_unwind_status`: why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// An end-of-stack row (`_start`, `clone3`'s child, Go's stack roots), or a zero return
    /// address where a row said the return address is: the whole stack.
    Complete = 0,
    /// The depth limit was reached.
    Truncated = 1,
    /// A frame-pointer step where no table applies failed its checks.
    NoTable = 2,
    /// A frame-pointer step at an address without FDE failed its checks.
    BadFramePointer = 3,
    /// A row the unwinder does not compute; the header's `detail` holds the reason.
    Unsupported = 4,
    /// A frame needed `rbp`, which an earlier frame could not recover.
    FpLost = 5,
    /// The stack could not be read.
    ReadFault = 6,
    /// The computed CFA was not above `rsp`.
    NotMovingUp = 7,
    /// No user stack: a kernel thread, or no user registers.
    NoUserStack = 8,
    /// A frame-pointer step (no table applied) met `rbp` 0 or a zero return address: the
    /// stack's root only if every frame walked keeps a frame pointer; code built without them
    /// leaves `rbp` 0 from `_start` on, so it is not counted as complete.
    FpEnd = 9,
}

impl Status {
    /// Every status, in code order (`SMOLDER_UNWIND_STATUS_COUNT` of them).
    pub const ALL: [Status; 10] = [
        Status::Complete,
        Status::Truncated,
        Status::NoTable,
        Status::BadFramePointer,
        Status::Unsupported,
        Status::FpLost,
        Status::ReadFault,
        Status::NotMovingUp,
        Status::NoUserStack,
        Status::FpEnd,
    ];

    /// The status a header's `status` names, if any.
    pub fn from_raw(raw: u16) -> Option<Status> {
        Status::ALL.get(usize::from(raw)).copied()
    }

    /// A short lowercase name, used as a metric label value.
    pub fn name(self) -> &'static str {
        match self {
            Status::Complete => "complete",
            Status::Truncated => "truncated",
            Status::NoTable => "no_table",
            Status::BadFramePointer => "bad_frame_pointer",
            Status::Unsupported => "unsupported",
            Status::FpLost => "fp_lost",
            Status::ReadFault => "read_fault",
            Status::NotMovingUp => "not_moving_up",
            Status::NoUserStack => "no_user_stack",
            Status::FpEnd => "fp_end",
        }
    }
}

/// `enum smolder_sample_kind`: what a sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleKind {
    /// A cpu-clock tick.
    Cpu = 1,
    /// A uprobe hit.
    Uprobe = 2,
    /// A thread that blocked, unwound at its switch-out: `value` is the switch-out time (ktime
    /// ns), `threshold` the sampling threshold ([`crate::offcpu`]).
    OffCpu = 3,
    /// A thread preempted while runnable, as [`SampleKind::OffCpu`].
    RunQueue = 4,
    /// A thread sampled at its switch-out runs again: `value` is the switch-in time; no frames.
    OffCpuEnd = 5,
    /// A page fault: `value` is the faults it stands for (the period), `addr` the faulting
    /// address, `flags` has [`SAMPLE_HUGE`] when it mapped a huge page ([`SAMPLE_HUGE_UNKNOWN`]
    /// when that could not be told).
    Memory = 6,
}

impl SampleKind {
    /// The kind a header's `kind` names, if any.
    pub fn from_raw(raw: u32) -> Option<SampleKind> {
        match raw {
            1 => Some(SampleKind::Cpu),
            2 => Some(SampleKind::Uprobe),
            3 => Some(SampleKind::OffCpu),
            4 => Some(SampleKind::RunQueue),
            5 => Some(SampleKind::OffCpuEnd),
            6 => Some(SampleKind::Memory),
            _ => None,
        }
    }
}

/// `SMOLDER_SAMPLE_HUGE`: a flag of [`SampleHeader::flags`], the fault mapped a huge page.
pub const SAMPLE_HUGE: u32 = 1;
/// `SMOLDER_SAMPLE_HUGE_UNKNOWN`: a flag of [`SampleHeader::flags`], the page tables could not
/// be read, so a fault that mapped a huge page counts as a base page.
pub const SAMPLE_HUGE_UNKNOWN: u32 = 2;

/// `enum smolder_unwind_counter`: indexes into [`MAP_COUNTERS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// The samples ring buffer was full: a sample is lost.
    SamplesLost = 0,
    /// The process events ring buffer was full: an event is lost.
    EventsLost = 1,
    /// A frame's row came from the walk's row cache (found by an earlier walk).
    RowsCached = 2,
    /// A frame's row was searched for in its executable's table.
    RowsSearched = 3,
}

impl Counter {
    /// Every counter, in index order (`SMOLDER_UNWIND_COUNTER_COUNT` of them).
    pub const ALL: [Counter; 4] = [
        Counter::SamplesLost,
        Counter::EventsLost,
        Counter::RowsCached,
        Counter::RowsSearched,
    ];
}

/// The data of an LPM key of [`MAP_MAPPINGS`] (`struct unwind_mapping_key` without its
/// `prefixlen`, which aya's `lpm_trie::Key` adds in front): process id and address, both
/// big-endian.
#[repr(C, packed)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MappingKey {
    /// The process (thread group) id, big-endian.
    pub pid_be: u32,
    /// The address, big-endian.
    pub addr_be: u64,
}

impl MappingKey {
    /// The key of `address` in process `pid`.
    pub fn new(pid: u32, address: u64) -> MappingKey {
        MappingKey {
            pid_be: pid.to_be(),
            addr_be: address.to_be(),
        }
    }
}

// Packed: 4 + 8 bytes, as the C key lays them out after its 4-byte prefixlen.
const _: () = assert!(size_of::<MappingKey>() == 12);

// SAFETY: `MappingKey` is `repr(C, packed)`, `Copy` and made only of integers, with no padding,
// so every bit pattern is a valid value.
unsafe impl aya::Pod for MappingKey {}

/// The LPM prefixes that cover `[start, end)` of process `pid` exactly: `(prefix length, key)`
/// pairs for [`MAP_MAPPINGS`], fewest first-to-last. Empty when `start >= end`.
pub fn mapping_prefixes(pid: u32, start: u64, end: u64) -> Vec<(u32, MappingKey)> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        // The largest block aligned at `at` that ends at or before `end`; `at + size <= end`
        // keeps the addition from overflowing.
        let mut bits = if at == 0 {
            63
        } else {
            at.trailing_zeros().min(63)
        };
        while 1u64 << bits > end - at {
            bits -= 1;
        }
        out.push((FULL_PREFIX - bits, MappingKey::new(pid, at)));
        at += 1 << bits;
    }
    out
}

/// `struct unwind_mapping`: the executable mapped at a range of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The executable's id in [`MAP_TABLES`]; 0 for none (frame-pointer steps there).
    pub exe_id: u64,
    /// Runtime address minus ELF address.
    pub bias: u64,
    /// The table's first page (its header's low half).
    pub first_page: u32,
    /// The table's page count (its header's high half).
    pub n_pages: u32,
    /// The table's entries.
    pub n_entries: u32,
    /// Reserved, zero.
    pub flags: u32,
    /// The mapping's runtime start: every LPM prefix of one mapping holds the same value, so
    /// that a walk reuses it for any address in `[start, end)` without a trie lookup.
    pub start: u64,
    /// The mapping's runtime end, exclusive.
    pub end: u64,
}

// 8 + 8 + 4 * 4 + 8 + 8 bytes: no padding.
const _: () = assert!(size_of::<Mapping>() == 48);

// SAFETY: `Mapping` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for Mapping {}

/// `struct unwind_sample`: the header of a sample in [`MAP_SAMPLES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleHeader {
    /// A [`SampleKind`] as a number.
    pub kind: u32,
    /// The process (thread group) id.
    pub tgid: u32,
    /// The thread id.
    pub tid: u32,
    /// The CPU it ran on.
    pub cpu: u32,
    /// Kernel frames after the user frames; 0 for a sample taken in user mode.
    pub kernel_len: u16,
    /// `-errno` of `bpf_get_stack` when reading the kernel stack failed, else 0.
    pub kernel_error: u16,
    /// A [`Status`] as a number.
    pub status: u16,
    /// User frames that follow.
    pub len: u16,
    /// Frames found by frame-pointer steps.
    pub fp_frames: u16,
    /// With [`Status::Unsupported`]: the reason (`smolder_unwind::Unsupported` as a number).
    pub detail: u16,
    /// A [`PythonStatus`](crate::PythonStatus) as a number: 0 outside CPython processes.
    pub python_status: u16,
    /// Python frames after the kernel frames.
    pub python_len: u16,
    /// What the sample counts (1 for CPU ticks and uprobe hits; see [`SampleKind`]).
    pub value: u64,
    /// Memory: the faulting address; 0 otherwise.
    pub addr: u64,
    /// Off-CPU: the sampling threshold the sample was taken with; 0 otherwise.
    pub threshold: u32,
    /// Memory: [`SAMPLE_HUGE`], [`SAMPLE_HUGE_UNKNOWN`] or 0.
    pub flags: u32,
}

// 4 * 4 + 2 * 8 + 8 + 8 + 4 + 4 = 56 bytes, the u64s at offsets 32 and 40: no padding. The
// offsets are asserted in unwind.h too, and `parse_sample` reads at them.
const _: () = assert!(size_of::<SampleHeader>() == 56);
const _: () = assert!(offset_of!(SampleHeader, python_status) == 28);
const _: () = assert!(offset_of!(SampleHeader, value) == 32);
const _: () = assert!(offset_of!(SampleHeader, addr) == 40);
const _: () = assert!(offset_of!(SampleHeader, threshold) == 48);
const _: () = assert!(offset_of!(SampleHeader, flags) == 52);

// SAFETY: `SampleHeader` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for SampleHeader {}

/// A ring-buffer record that is not a sample: shorter than its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortSample {
    /// The record's length.
    pub len: usize,
}

impl std::fmt::Display for ShortSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a ring-buffer record of {} bytes is shorter than its sample",
            self.len
        )
    }
}

impl std::error::Error for ShortSample {}

/// One [`MAP_SAMPLES`] record: its header and its frames, still as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample<'a> {
    /// The header.
    pub header: SampleHeader,
    /// `header.len` user frames then `header.kernel_len` kernel frames, little-endian `u64`s.
    frames: &'a [u8],
    /// `header.python_len` Python frames, 16 bytes each.
    python: &'a [u8],
}

impl<'a> Sample<'a> {
    /// The frames' bytes: user frames then kernel frames, 8 bytes each. Equal stacks have equal
    /// bytes, which is what a reader aggregating samples hashes.
    pub fn frame_bytes(&self) -> &'a [u8] {
        self.frames
    }

    /// The user frames, leaf first.
    pub fn user(&self) -> impl Iterator<Item = u64> + 'a {
        words(&self.frames[..8 * usize::from(self.header.len)])
    }

    /// The kernel frames, leaf first.
    pub fn kernel(&self) -> impl Iterator<Item = u64> + 'a {
        words(&self.frames[8 * usize::from(self.header.len)..])
    }

    /// The Python frames of a thread of a CPython process, innermost first (none elsewhere).
    pub fn python(&self) -> impl Iterator<Item = PythonFrame> + 'a {
        self.python
            .chunks_exact(size_of::<PythonFrame>())
            .map(|chunk| {
                let mut pair = words(chunk);
                PythonFrame {
                    code: pair.next().expect("16 bytes"),
                    instr: pair.next().expect("16 bytes"),
                }
            })
    }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes")))
}

/// Reads one [`MAP_SAMPLES`] record.
///
/// # Errors
///
/// [`ShortSample`] when the record is shorter than a header or than its frames, or says it
/// holds more frames than a sample can.
pub fn parse_sample(record: &[u8]) -> Result<Sample<'_>, ShortSample> {
    let short = ShortSample { len: record.len() };
    let u32_at = |i: usize| -> Result<u32, ShortSample> {
        Ok(u32::from_le_bytes(
            record
                .get(i..i + 4)
                .ok_or(short)?
                .try_into()
                .expect("4 bytes"),
        ))
    };
    let u16_at = |i: usize| -> Result<u16, ShortSample> {
        Ok(u16::from_le_bytes(
            record
                .get(i..i + 2)
                .ok_or(short)?
                .try_into()
                .expect("2 bytes"),
        ))
    };
    let u64_at = |i: usize| -> Result<u64, ShortSample> {
        Ok(u64::from_le_bytes(
            record
                .get(i..i + 8)
                .ok_or(short)?
                .try_into()
                .expect("8 bytes"),
        ))
    };
    let header = SampleHeader {
        kind: u32_at(0)?,
        tgid: u32_at(4)?,
        tid: u32_at(8)?,
        cpu: u32_at(12)?,
        kernel_len: u16_at(16)?,
        kernel_error: u16_at(18)?,
        status: u16_at(20)?,
        len: u16_at(22)?,
        fp_frames: u16_at(24)?,
        detail: u16_at(26)?,
        python_status: u16_at(28)?,
        python_len: u16_at(30)?,
        value: u64_at(32)?,
        addr: u64_at(40)?,
        threshold: u32_at(48)?,
        flags: u32_at(52)?,
    };
    let (user, kernel) = (usize::from(header.len), usize::from(header.kernel_len));
    let python = usize::from(header.python_len);
    let native_end = size_of::<SampleHeader>() + 8 * (user + kernel);
    let end = native_end + size_of::<PythonFrame>() * python;
    if user > MAX_FRAMES
        || kernel > KERNEL_FRAMES
        || python > crate::PYTHON_MAX_FRAMES
        || record.len() < end
    {
        return Err(short);
    }
    Ok(Sample {
        header,
        frames: &record[size_of::<SampleHeader>()..native_end],
        python: &record[native_end..end],
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the ring buffer holds, reading it never panics, and a sample's frames are
        /// exactly the ones its header counts.
        #[test]
        fn any_record_reads_or_is_refused(record in proptest::collection::vec(any::<u8>(), 0..700)) {
            if let Ok(sample) = parse_sample(&record) {
                prop_assert_eq!(sample.user().count(), usize::from(sample.header.len));
                prop_assert_eq!(sample.kernel().count(), usize::from(sample.header.kernel_len));
                prop_assert_eq!(sample.python().count(), usize::from(sample.header.python_len));
            }
        }
    }

    #[test]
    fn prefixes_cover_a_range_exactly() {
        for (start, end) in [
            (0x1000, 0x3000),
            (0x7f12_3456_7000, 0x7f12_3460_1000),
            (5, 6),
            (0, 1 << 20),
        ] {
            let prefixes = mapping_prefixes(42, start, end);
            let mut at = start;
            for (len, key) in &prefixes {
                let bits = FULL_PREFIX - len;
                let addr = u64::from_be(key.addr_be);
                assert_eq!(addr, at);
                assert_eq!(addr & ((1u64 << bits) - 1), 0, "aligned");
                assert_eq!(u32::from_be(key.pid_be), 42);
                at += 1 << bits;
            }
            assert_eq!(at, end, "{start:#x}..{end:#x}");
        }
        assert!(mapping_prefixes(1, 10, 10).is_empty());
    }

    #[test]
    fn samples_parse_and_short_records_are_errors() {
        let mut record = Vec::new();
        for word in [1u32, 100, 101, 1] {
            record.extend_from_slice(&word.to_le_bytes());
        }
        // One kernel frame, no error, status 0, two user frames.
        for half in [1u16, 0, 0, 2, 0, 0] {
            record.extend_from_slice(&half.to_le_bytes());
        }
        // No Python frames, value 1, addr 0, threshold and flags 0.
        record.extend_from_slice(&0u32.to_le_bytes());
        record.extend_from_slice(&1u64.to_le_bytes());
        record.extend_from_slice(&0u64.to_le_bytes());
        record.extend_from_slice(&[0; 8]);
        for frame in [0x1111u64, 0x2222, 0xffff_ffff_8100_0000] {
            record.extend_from_slice(&frame.to_le_bytes());
        }
        let sample = parse_sample(&record).unwrap();
        assert_eq!(
            (
                sample.header.tgid,
                sample.header.kernel_len,
                sample.header.len
            ),
            (100, 1, 2)
        );
        assert_eq!(sample.user().collect::<Vec<_>>(), [0x1111, 0x2222]);
        assert_eq!(sample.kernel().collect::<Vec<_>>(), [0xffff_ffff_8100_0000]);
        assert_eq!(sample.frame_bytes().len(), 24);
        assert_eq!(
            parse_sample(&record[..record.len() - 1]),
            Err(ShortSample {
                len: record.len() - 1
            })
        );
        assert!(parse_sample(&record[..10]).is_err());
        assert!(parse_sample(&record[..50]).is_err());
    }

    #[test]
    fn python_frames_follow_the_kernel_frames() {
        let mut record = Vec::new();
        for word in [1u32, 100, 101, 1] {
            record.extend_from_slice(&word.to_le_bytes());
        }
        // One kernel frame, one user frame, python_status 1 (ok), two Python frames.
        for half in [1u16, 0, 0, 1, 0, 0, 1, 2] {
            record.extend_from_slice(&half.to_le_bytes());
        }
        record.extend_from_slice(&1u64.to_le_bytes());
        // addr, threshold, flags.
        record.extend_from_slice(&[0; 16]);
        for word in [
            0x1111u64,
            0xffff_ffff_8100_0000,
            0x7000 | 1,
            0x7100,
            0x8000,
            0x8100,
        ] {
            record.extend_from_slice(&word.to_le_bytes());
        }
        let sample = parse_sample(&record).unwrap();
        assert_eq!(sample.user().collect::<Vec<_>>(), [0x1111]);
        assert_eq!(sample.kernel().collect::<Vec<_>>(), [0xffff_ffff_8100_0000]);
        let python: Vec<PythonFrame> = sample.python().collect();
        assert_eq!(
            python,
            [
                PythonFrame {
                    code: 0x7001,
                    instr: 0x7100
                },
                PythonFrame {
                    code: 0x8000,
                    instr: 0x8100
                }
            ]
        );
        assert!(python[0].is_entry() && !python[1].is_entry());
        assert_eq!(sample.frame_bytes().len(), 16);
        assert!(parse_sample(&record[..record.len() - 8]).is_err());
    }
}
