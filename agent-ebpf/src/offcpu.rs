//! The Rust mirror of `src/offcpu.h`: off-CPU and memory-growth sampling.
//!
//! Off-CPU: user space attaches [`PROGRAM_SWITCH`] to the BTF tracepoint [`TRACEPOINT_SWITCH`]
//! and writes an [`OffCpuConfig`] into [`MAP_CONFIG`] (its threshold can change at any time);
//! samples of kind `OffCpu`/`RunQueue` (switch-out, with stacks) and `OffCpuEnd` (switch-in)
//! come back through [`crate::unwind::MAP_SAMPLES`]. Memory growth: [`PROGRAM_FAULT`] on the
//! page-faults-min software event, every N faults per CPU; its samples carry
//! [`crate::unwind::SAMPLE_HUGE`] when the fault mapped a transparent huge page (the PMD of its
//! block maps a writable huge page once the fault is handled, in an anonymous private mapping;
//! the page tables are read through the kernel's direct map, which the program finds itself
//! with [`GLOBAL_PHYS_ADDRESS_BITS`] and [`GLOBAL_DIRECT_MAP_CANDIDATES`]). Both unwind only the
//! processes user space puts in [`MAP_PROFILED`].

/// The `tp_btf/sched_switch` program (`on_switch` in C).
pub const PROGRAM_SWITCH: &str = "on_switch";
/// The BTF tracepoint [`PROGRAM_SWITCH`] attaches to.
pub const TRACEPOINT_SWITCH: &str = "sched_switch";
/// The perf_event program sampling page faults (`on_fault` in C).
pub const PROGRAM_FAULT: &str = "on_fault";
/// The global the agent sets to the CPU's physical address bits (`/proc/cpuinfo`'s "address
/// sizes"): the bits of a page-table entry that hold an address. 52 unless set.
pub const GLOBAL_PHYS_ADDRESS_BITS: &str = "phys_address_bits";
/// The global the agent sets to the 1 GiB bases the program tries when it looks for the
/// kernel's direct map: the highest physical address of RAM in GiB, plus one.
pub const GLOBAL_DIRECT_MAP_CANDIDATES: &str = "direct_map_candidates";
/// ARRAY of one [`OffCpuConfig`].
pub const MAP_CONFIG: &str = "offcpu_config";
/// HASH u32 → u8: the processes (tgid) off-CPU and memory-growth samples are unwound for; the
/// others are announced instead (a first-sight event), for user space to decide.
pub const MAP_PROFILED: &str = "profiled";
/// TASK_STORAGE: what the kernel keeps of a thread sampled at switch-out (user space never
/// reads it).
pub const MAP_PENDING: &str = "offcpu_pending";

/// `SMOLDER_OFF_CPU_ALWAYS`: the threshold that samples every switch.
pub const ALWAYS: u32 = u32::MAX;
/// `SMOLDER_OFF_CPU_RUN_QUEUE`: a flag of [`OffCpuConfig`], sample preempted threads too.
pub const FLAG_RUN_QUEUE: u32 = 1;
/// `SMOLDER_SWITCH_SKIP_FRAMES`: the program's own kernel frames left out of its samples.
pub const SWITCH_SKIP_FRAMES: u32 = 2;
/// `SMOLDER_HUGE_PAGE_SHIFT`: a huge page (a PMD's mapping) is 2 MiB on x86-64.
pub const HUGE_PAGE_SHIFT: u32 = 21;

/// `struct offcpu_config`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuConfig {
    /// A switch is sampled when a uniform random number from 1 to 2³²−1 is `<= threshold`;
    /// 0 never, [`ALWAYS`] always.
    pub threshold: u32,
    /// [`FLAG_RUN_QUEUE`] or 0.
    pub flags: u32,
}

// Two 4-byte fields: no padding.
const _: () = assert!(size_of::<OffCpuConfig>() == 8);

// SAFETY: `OffCpuConfig` is `repr(C)`, `Copy`, made only of integers and has no padding.
unsafe impl aya::Pod for OffCpuConfig {}

/// The threshold that samples with `probability` (clamped to [0, 1]).
pub fn threshold(probability: f64) -> u32 {
    if probability >= 1.0 {
        ALWAYS
    } else if probability > 0.0 {
        // In range: the product is below u32::MAX.
        (probability * f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// The probability a sample taken with `threshold` was taken with; 0 for 0.
pub fn probability(threshold: u32) -> f64 {
    f64::from(threshold) / f64::from(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_probabilities_round_trip() {
        assert_eq!(threshold(1.0), ALWAYS);
        assert_eq!(threshold(2.0), ALWAYS);
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(-1.0), 0);
        assert_eq!(probability(ALWAYS), 1.0);
        for p in [0.01, 0.1, 0.5] {
            assert!((probability(threshold(p)) - p).abs() < 1e-9, "{p}");
        }
    }
}
