//! Reads the per-CPU `unwind_counters` the programs keep: samples and process events lost to a
//! full ring buffer, and where the user-stack walks found their frames' rows (the row cache or
//! a search of the table).

use smolder_agent_ebpf::unwind::{Counter, MAP_COUNTERS};

use super::{EbpfError, Sampler};

/// What the kernel counted since the previous read, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounts {
    /// Samples lost because the samples ring buffer was full.
    pub lost_samples: u64,
    /// Process events lost because the events ring buffer was full.
    pub lost_events: u64,
    /// Frames whose unwind row came from the walk's row cache.
    pub rows_cached: u64,
    /// Frames whose unwind row was searched for in a table.
    pub rows_searched: u64,
}

impl Sampler {
    /// The counts since the previous call.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the counters cannot be read.
    pub fn read_counters(&mut self) -> Result<KernelCounts, EbpfError> {
        let mut delta = [0u64; Counter::ALL.len()];
        for counter in Counter::ALL {
            let i = counter as usize;
            let per_cpu =
                self.counters
                    .get(&(counter as u32), 0)
                    .map_err(|source| EbpfError::Map {
                        map: MAP_COUNTERS,
                        action: "reading the kernel's counters",
                        source: Some(Box::new(source)),
                    })?;
            let total: u64 = per_cpu.iter().sum();
            delta[i] = total.saturating_sub(self.counters_seen[i]);
            self.counters_seen[i] = total;
        }
        Ok(KernelCounts {
            lost_samples: delta[Counter::SamplesLost as usize],
            lost_events: delta[Counter::EventsLost as usize],
            rows_cached: delta[Counter::RowsCached as usize],
            rows_searched: delta[Counter::RowsSearched as usize],
        })
    }
}
