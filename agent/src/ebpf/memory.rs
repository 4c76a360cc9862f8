//! Memory-growth profiles: where processes first touch memory, which is where their resident
//! memory grows.
//!
//! Input: the `ebpf.memory` config section, and the kernel's page-fault samples (one every
//! `period` minor faults per CPU, with the faulting address and whether the fault mapped a
//! transparent huge page). Output: bytes per stack, `period × page size` per sample (the huge
//! page's 2 MiB where the fault mapped one), added to the window's stacks
//! ([`super::samples::WindowSamples`]). Caller: the samples reader and the loader.
//!
//! What is counted: every minor fault that maps a page, anonymous or file-backed (a first
//! touch of `malloc`ed or `mmap`ed memory, a copy-on-write after `fork`, a file page mapped
//! from the page cache). A read of never-written anonymous memory maps the shared zero page
//! and still counts as a base page; memory given back (`free`, `munmap`) is never subtracted:
//! this is growth, not what is in use. Huge pages count 2 MiB only for anonymous private
//! mappings; file-backed and shared-memory huge pages and multi-size (mTHP) folios count as
//! base pages.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Memory-growth sampling (`ebpf.memory:`). Only with `ebpf.enabled: true`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct MemoryConfig {
    /// Whether the agent samples page faults (`<service>.memory_growth`). Default `false`.
    pub enabled: bool,
    /// Minor page faults per sample, on each CPU; each sample counts `period` pages. Default
    /// `1024` (4 MiB of base pages per sample).
    pub period: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            enabled: false,
            period: 1024,
        }
    }
}

/// Where the kernel says how it uses transparent huge pages.
pub(crate) const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Whether `enabled` (the text of [`THP_ENABLED`], the mode in use in brackets) maps huge
/// pages in every mapping that does not refuse them, not only in `MADV_HUGEPAGE` ones.
pub(crate) fn thp_always(enabled: &str) -> bool {
    enabled.contains("[always]")
}

/// [`thp_always`] of this host; false when the file cannot be read (no THP support).
pub(crate) fn host_thp_always() -> bool {
    std::fs::read_to_string(Path::new(THP_ENABLED)).is_ok_and(|text| thp_always(&text))
}

/// The size of a base page on this host.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The bytes a memory sample stands for: `faults` pages of `page_size`, or of a huge page.
pub(crate) fn bytes(faults: u64, huge: bool, page_size: u64) -> u64 {
    let page = if huge {
        1 << smolder_agent_ebpf::offcpu::HUGE_PAGE_SHIFT
    } else {
        page_size
    };
    faults.saturating_mul(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thp_mode_and_sample_sizes() {
        assert!(thp_always("[always] madvise never\n"));
        assert!(!thp_always("always [madvise] never\n"));
        assert_eq!(bytes(1024, false, 4096), 4 << 20);
        assert_eq!(bytes(3, true, 4096), 6 << 20);
        assert_eq!(bytes(u64::MAX, false, 4096), u64::MAX);
        assert!(page_size() >= 4096);
    }
}
