//! Reads the per-CPU `unwind_counters` the programs keep: samples and process events lost to a
//! full ring buffer.

use smolder_agent_ebpf::unwind::{Counter, MAP_COUNTERS};

use super::{EbpfError, Sampler};

/// How often each kernel-side loss happened since the previous read, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LostCounts {
    /// Samples lost because the samples ring buffer was full.
    pub samples: u64,
    /// Process events lost because the events ring buffer was full.
    pub events: u64,
}

impl Sampler {
    /// The losses since the previous call.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the counters cannot be read.
    pub fn read_lost(&mut self) -> Result<LostCounts, EbpfError> {
        let mut delta = [0u64; Counter::ALL.len()];
        for counter in Counter::ALL {
            let i = counter as usize;
            let per_cpu =
                self.counters
                    .get(&(counter as u32), 0)
                    .map_err(|source| EbpfError::Map {
                        map: MAP_COUNTERS,
                        action: "reading the loss counters",
                        source: Some(Box::new(source)),
                    })?;
            let total: u64 = per_cpu.iter().sum();
            delta[i] = total.saturating_sub(self.counters_seen[i]);
            self.counters_seen[i] = total;
        }
        Ok(LostCounts {
            samples: delta[Counter::SamplesLost as usize],
            events: delta[Counter::EventsLost as usize],
        })
    }
}
