//! Memory-growth profiles: where processes first touch memory, which is where their resident
//! memory grows.
//!
//! Input: the `ebpf.memory` config section, and the kernel's page-fault samples (one every
//! `period` minor faults per CPU, with the faulting address and whether the fault mapped a
//! transparent huge page). Output: bytes per stack, `period × page size` per sample (the huge
//! page's 2 MiB where the fault mapped one), added to the window's stacks
//! ([`super::samples::WindowSamples`]). Caller: the samples reader and the loader.
//!
//! What is counted: every minor fault, one base page each (a first touch of `malloc`ed or
//! `mmap`ed memory, a copy-on-write after `fork`, a file page mapped from the page cache, but
//! also the rarer faults that map no new memory: a write to a page shared since `fork` that
//! is reused, a NUMA-balancing hint). A read of never-written anonymous memory maps the shared
//! zero page and still counts as a base page; memory given back (`free`, `munmap`) is never
//! subtracted: this is growth, not what is in use. A fault that mapped a new anonymous
//! transparent huge page counts 2 MiB (the kernel records such faults as they happen, so a
//! fault that fell back to base pages counts its base page, whatever the block looks like
//! afterwards); file-backed, shared-memory and hugetlbfs huge pages and multi-size (mTHP)
//! folios count as base pages.

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

/// What the page-fault program needs to find the kernel's direct map and read page tables
/// through it (`pagetable.bpf.h`): the CPU's physical address bits, and the highest physical
/// address of RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PhysicalLayout {
    /// The physical address bits of a page-table entry: 52 (the architecture's most) unless
    /// `/proc/cpuinfo` says fewer (a memory-encryption bit above them is not an address).
    pub address_bits: u32,
    /// The end of the highest `System RAM` range of `/proc/iomem`; `None` when it cannot be
    /// read (addresses show as zeros without `CAP_SYS_ADMIN`).
    pub ram_end: Option<u64>,
}

/// Where the CPU's address sizes are.
const CPUINFO: &str = "/proc/cpuinfo";
/// Where the physical memory map is.
const IOMEM: &str = "/proc/iomem";
/// The direct-map bases tried when the highest RAM address is unknown: 64 TiB of RAM.
const MAX_DIRECT_MAP_CANDIDATES: u32 = 1 << 16;

impl PhysicalLayout {
    /// This host's.
    pub(crate) fn of_host() -> PhysicalLayout {
        PhysicalLayout {
            address_bits: std::fs::read_to_string(CPUINFO)
                .ok()
                .and_then(|text| physical_address_bits(&text))
                .unwrap_or(52),
            ram_end: std::fs::read_to_string(IOMEM)
                .ok()
                .and_then(|text| ram_end(&text)),
        }
    }

    /// The 1 GiB bases the program tries: one per GiB of physical address space RAM reaches.
    pub(crate) fn direct_map_candidates(&self) -> u32 {
        self.ram_end
            .map_or(MAX_DIRECT_MAP_CANDIDATES, |end| {
                u32::try_from((end >> 30) + 1).unwrap_or(u32::MAX)
            })
            .min(MAX_DIRECT_MAP_CANDIDATES)
    }
}

/// The "N bits physical" of `/proc/cpuinfo`'s first "address sizes" line.
fn physical_address_bits(cpuinfo: &str) -> Option<u32> {
    let line = cpuinfo.lines().find(|l| l.starts_with("address sizes"))?;
    let (_, sizes) = line.split_once(':')?;
    let bits: u32 = sizes.split_whitespace().next()?.parse().ok()?;
    (32..=52).contains(&bits).then_some(bits)
}

/// The end (exclusive) of the highest top-level `System RAM` range of `/proc/iomem`; `None`
/// when there is none, or addresses are hidden (all zero).
fn ram_end(iomem: &str) -> Option<u64> {
    iomem
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| {
            let (range, name) = l.split_once(" : ")?;
            (name.trim() == "System RAM").then_some(range)
        })
        .filter_map(|range| {
            let (_, end) = range.split_once('-')?;
            u64::from_str_radix(end.trim(), 16).ok()
        })
        .max()
        .filter(|&end| end > 0)
        .map(|end| end.saturating_add(1))
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
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn any_cpuinfo_or_iomem_text_gives_a_bounded_layout(text in "(address sizes|System RAM|[0-9a-f]{1,20}|[ :\n-]){0,40}") {
            if let Some(bits) = physical_address_bits(&text) {
                prop_assert!((32..=52).contains(&bits));
            }
            let layout = PhysicalLayout { address_bits: 52, ram_end: ram_end(&text) };
            prop_assert!(layout.direct_map_candidates() <= MAX_DIRECT_MAP_CANDIDATES);
        }
    }

    #[test]
    fn sample_sizes() {
        assert_eq!(bytes(1024, false, 4096), 4 << 20);
        assert_eq!(bytes(3, true, 4096), 6 << 20);
        assert_eq!(bytes(u64::MAX, false, 4096), u64::MAX);
        assert!(page_size() >= 4096);
    }

    #[test]
    fn the_physical_layout_reads_cpuinfo_and_iomem() {
        let cpuinfo = "processor\t: 0\naddress sizes\t: 46 bits physical, 57 bits virtual\n";
        assert_eq!(physical_address_bits(cpuinfo), Some(46));
        assert_eq!(physical_address_bits("address sizes : many\n"), None);
        assert_eq!(
            physical_address_bits("address sizes : 64 bits physical\n"),
            None
        );
        let iomem = "00001000-0009fbff : System RAM\n\
                     00100000-bfffffff : System RAM\n  \
                     01000000-01ffffff : Kernel code\n\
                     fe000000-fe0fffff : PCI Bus 0000:00\n\
                     100000000-63fffffff : System RAM\n";
        assert_eq!(ram_end(iomem), Some(0x6_4000_0000));
        let hidden = "00000000-00000000 : System RAM\n";
        assert_eq!(ram_end(hidden), None);
        let layout = PhysicalLayout {
            address_bits: 46,
            ram_end: Some(0x6_4000_0000),
        };
        assert_eq!(layout.direct_map_candidates(), 26);
        let unknown = PhysicalLayout {
            ram_end: None,
            ..layout
        };
        assert_eq!(unknown.direct_map_candidates(), 1 << 16);
    }
}
