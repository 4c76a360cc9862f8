//! The unwinder's maps in the kernel: a table goes in as an exactly sized array, filled through
//! a memory mapping of its file descriptor and then inserted into `unwind_tables`; mappings go
//! in and out of the `unwind_mappings` LPM trie.
//!
//! Input: a table's entries, LPM keys and values. Output: the kernel memory a table takes, read
//! from its map's `fdinfo`. Caller: the unwinder's worker thread. Owns the two maps, taken from
//! the loaded object ([`UnwindMaps`]).

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, IterableMap as _, MapData, MapError};
use smolder_agent_ebpf::unwind::{Mapping, MappingKey, TABLE_MAP_FLAGS};

use crate::ebpf::loader::UnwindMaps;

/// Why a table or mapping could not go into the kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Creating, mapping or inserting a table's array failed.
    #[error("loading an unwind table of {entries} entries into the kernel failed: {action}")]
    Table {
        /// The table's entries.
        entries: usize,
        /// What failed.
        action: &'static str,
        /// The system's or aya's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Inserting or deleting an LPM entry failed.
    #[error("{action} an unwind mapping failed")]
    Mapping {
        /// `inserting` or `deleting`.
        action: &'static str,
        /// aya's error.
        source: Box<MapError>,
    },
}

/// The two maps.
pub(crate) struct Kernel {
    maps: UnwindMaps,
}

/// A read-write shared mapping of a BPF array map, unmapped on drop.
struct MapMemory {
    ptr: *mut libc::c_void,
    len: usize,
}

impl MapMemory {
    /// Maps the first `len` bytes of the map behind `fd`.
    fn new(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<MapMemory> {
        // SAFETY: a fresh mapping (null hint) of a BPF_F_MMAPABLE array's own file descriptor;
        // the kernel checks `len` against the map's size and the flags against the map's.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MapMemory { ptr, len })
    }

    /// Copies `entries` to the start of the mapping.
    fn write(&mut self, entries: &[u64]) {
        let bytes = std::mem::size_of_val(entries);
        assert!(bytes <= self.len, "the mapping holds the table");
        // SAFETY: `ptr` is a live, writable mapping of `len >= bytes` bytes that nothing else in
        // this process aliases; a page-aligned mapping is aligned for u64; the source is a
        // distinct Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(entries.as_ptr(), self.ptr.cast::<u64>(), entries.len());
        }
    }
}

impl Drop for MapMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and nothing borrows the mapping.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// The kernel memory a map charges, from `/proc/self/fdinfo/<fd>` (`memlock:`).
fn memlock(map: &MapData) -> Option<u64> {
    let info = std::fs::read_to_string(format!(
        "/proc/self/fdinfo/{}",
        map.fd().as_fd().as_raw_fd()
    ))
    .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("memlock:"))?
        .trim()
        .parse()
        .ok()
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

impl Kernel {
    pub(crate) fn new(maps: UnwindMaps) -> Kernel {
        Kernel { maps }
    }

    /// The kernel memory a table of `entries` entries will take, for the budget before it is
    /// created: the array's pages and the map's own page.
    pub(crate) fn estimate(entries: usize) -> u64 {
        let page = page_size() as u64;
        (entries as u64 * 8).div_ceil(page) * page + page
    }

    /// Puts a table into the kernel under `key`; returns the kernel memory it takes. The
    /// insert waits for an RCU grace period (the kernel's `maybe_wait_bpf_programs` for
    /// map-in-map updates): milliseconds, which is why this runs on the worker thread.
    pub(crate) fn load_table(&mut self, key: u64, entries: &[u64]) -> Result<u64, KernelError> {
        let error = |action: &'static str| {
            move |source: Box<dyn std::error::Error + Send + Sync>| KernelError::Table {
                entries: entries.len(),
                action,
                source,
            }
        };
        let count =
            u32::try_from(entries.len()).map_err(|err| error("sizing the array")(Box::new(err)))?;
        let inner = Array::<MapData, u64>::create(count, TABLE_MAP_FLAGS)
            .map_err(|err| error("creating the array")(Box::new(err)))?;
        let map_data = inner.map();
        let len = std::mem::size_of_val(entries).div_ceil(page_size()) * page_size();
        {
            let mut memory = MapMemory::new(map_data.fd().as_fd(), len)
                .map_err(|err| error("mapping the array")(Box::new(err)))?;
            memory.write(entries);
        }
        let bytes = memlock(map_data).unwrap_or_else(|| Kernel::estimate(entries.len()));
        self.maps
            .tables
            .insert(key, &inner, 0)
            .map_err(|err| error("inserting it into unwind_tables")(Box::new(err)))?;
        Ok(bytes)
    }

    /// Takes the table under `key` out of the kernel; the walks that still find it finish with
    /// it, later ones step with frame pointers over its code.
    pub(crate) fn evict_table(&mut self, key: u64) -> Result<(), KernelError> {
        match self.maps.tables.remove(&key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(KernelError::Table {
                entries: 0,
                action: "removing it from unwind_tables",
                source: Box::new(source),
            }),
        }
    }

    /// Inserts (or updates) one LPM entry.
    pub(crate) fn insert_mapping(
        &mut self,
        prefix: u32,
        key: MappingKey,
        value: Mapping,
    ) -> Result<(), KernelError> {
        self.maps
            .mappings
            .insert(&Key::new(prefix, key), value, 0)
            .map_err(|source| KernelError::Mapping {
                action: "inserting",
                source: Box::new(source),
            })
    }

    /// Deletes one LPM entry; a missing one is not an error.
    pub(crate) fn delete_mapping(
        &mut self,
        prefix: u32,
        key: MappingKey,
    ) -> Result<(), KernelError> {
        match self.maps.mappings.remove(&Key::new(prefix, key)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(KernelError::Mapping {
                action: "deleting",
                source: Box::new(source),
            }),
        }
    }
}
