//! What the simulated hosts send: a pool of realistic trees from the seeded Zipf corpus, encoded
//! once, and the shape of one host's window (which services, which profile types, how large).
//!
//! A host runs [`SERVICES_PER_HOST`] of [`SERVICES`] services, the way a fleet runs replicas of a
//! few dozen services: each has a `.cpu` and an `.off_cpu` series and every other one a
//! `.memory_growth` series, 20 series a window. Sizes fall with the service's rank on the
//! host, as CPU time concentrates on a few processes: the busiest service draws 800 CPU
//! samples a window (most of a core at 99 Hz for 10 s), the least busy 10; 1,420 CPU samples
//! and about 6,000 tree nodes a window in all. Each series of a window
//! takes one of [`VARIANTS`] trees of its size, chosen from the agent and the sequence number,
//! so that a resent batch is the same batch.

use smolder_common::pprof::{self, EncodeOptions};
use smolder_common::{Corpus, CorpusConfig, Tree};

/// Distinct services over the fleet.
pub(crate) const SERVICES: usize = 40;
/// Services one host runs.
pub(crate) const SERVICES_PER_HOST: usize = 8;
/// Trees per size class and kind, so that windows differ.
pub(crate) const VARIANTS: usize = 8;
/// Draws per window of each size class.
const SIZES: [usize; 7] = [10, 20, 40, 80, 150, 300, 800];
/// The size class of the `.cpu`, `.off_cpu` and `.memory_growth` series (`None`: not this
/// kind) of the service of each rank on a host.
const SHAPE: [[Option<usize>; 3]; SERVICES_PER_HOST] = [
    [Some(6), Some(4), Some(3)],
    [Some(5), Some(3), None],
    [Some(4), Some(2), Some(2)],
    [Some(3), Some(2), None],
    [Some(2), Some(1), Some(1)],
    [Some(1), Some(1), None],
    [Some(1), Some(0), Some(0)],
    [Some(0), Some(0), None],
];
/// The eBPF sampler's default frequency: `.cpu` values are samples at this rate.
pub(crate) const CPU_HZ: u32 = 99;
/// What one off-CPU draw stands for, in nanoseconds blocked.
const OFF_CPU_NS_PER_DRAW: u64 = 1_000_000;
/// What one memory-growth draw stands for, in bytes (a page).
const BYTES_PER_PAGE: u64 = 4_096;
/// Sizes of the SDK profiles pushed over HTTP: draws of a 10 s CPU profile at 100 Hz.
const PUSH_SIZES: [usize; 4] = [100, 200, 500, 1_000];
/// The SDKs' CPU sampling rate.
pub(crate) const PUSH_HZ: u32 = 100;

/// A kind of series an agent ships, as its eBPF sources make them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    Cpu,
    OffCpu,
    MemoryGrowth,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Cpu, Kind::OffCpu, Kind::MemoryGrowth];

    /// The app name's suffix.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::OffCpu => "off_cpu",
            Kind::MemoryGrowth => "memory_growth",
        }
    }

    /// The series' units, as the agent's eBPF sources write them.
    pub(crate) fn units(self) -> &'static str {
        match self {
            Kind::Cpu => "samples",
            Kind::OffCpu => "nanoseconds",
            Kind::MemoryGrowth => "bytes",
        }
    }

    /// Samples per second, for `.cpu`; 0 otherwise.
    pub(crate) fn sample_rate(self) -> u32 {
        match self {
            Kind::Cpu => CPU_HZ,
            Kind::OffCpu | Kind::MemoryGrowth => 0,
        }
    }

    fn weight(self) -> u64 {
        match self {
            Kind::Cpu => 1,
            Kind::OffCpu => OFF_CPU_NS_PER_DRAW,
            Kind::MemoryGrowth => BYTES_PER_PAGE,
        }
    }
}

/// One tree of the pool, encoded once.
pub(crate) struct PoolTree {
    /// In Smolder's tree encoding, as a batch carries it.
    pub(crate) encoded: Vec<u8>,
    /// The sum of its values.
    pub(crate) total: u64,
    /// Its nodes.
    pub(crate) nodes: usize,
}

/// One SDK profile of the pool, in each body format a push uses.
pub(crate) struct PushBody {
    /// Gzipped pprof, CPU samples at [`PUSH_HZ`].
    pub(crate) pprof: Vec<u8>,
    /// Folded text.
    pub(crate) folded: String,
    /// Its samples.
    pub(crate) total: u64,
}

/// Every tree the fleet sends.
pub(crate) struct Pool {
    /// By kind, size class, variant: `[kind][size][variant]`.
    trees: Vec<Vec<Vec<PoolTree>>>,
    /// SDK profiles, by size and variant, flattened.
    pub(crate) pushes: Vec<PushBody>,
}

impl Pool {
    /// Generates the corpus of `seed` and every tree. Takes a second or two; blocking.
    pub(crate) fn generate(seed: u64) -> Pool {
        let corpus = Corpus::generate(&CorpusConfig {
            seed,
            unique_stacks: 12_000,
            min_depth: 6,
            max_depth: 24,
            functions: 4_000,
            // A little more concentrated than the corpus' default 1.1: a host's 10 s window
            // repeats its hot stacks more than a day's profile of one service does.
            zipf_exponent: 1.3,
            ..CorpusConfig::default()
        });
        let mut stream = 0u64;
        let mut draw = |samples: usize| {
            stream += 1;
            corpus.tree(samples, stream)
        };
        let trees = Kind::ALL
            .iter()
            .map(|kind| {
                SIZES
                    .iter()
                    .map(|&size| {
                        (0..VARIANTS)
                            .map(|_| {
                                let mut tree = draw(size);
                                tree.scale(kind.weight(), 1);
                                PoolTree {
                                    encoded: tree.encode(),
                                    total: tree.total(),
                                    nodes: tree.len(),
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let pushes = PUSH_SIZES
            .iter()
            .flat_map(|&size| (0..VARIANTS).map(move |_| size))
            .map(|size| {
                let tree: Tree = draw(size);
                PushBody {
                    pprof: pprof::encode(&tree, &EncodeOptions::cpu_samples(PUSH_HZ))
                        .to_bytes(true),
                    folded: smolder_common::folded::to_folded(&tree),
                    total: tree.total(),
                }
            })
            .collect();
        Pool { trees, pushes }
    }

    /// The tree of `kind` in size class `size`, variant `variant`.
    pub(crate) fn tree(&self, kind: Kind, size: usize, variant: usize) -> &PoolTree {
        &self.trees[kind as usize][size][variant]
    }
}

/// One series a host ships.
#[derive(Clone, Debug)]
pub(crate) struct HostSeries {
    /// The service, the app name without its suffix: `svc-07`.
    pub(crate) service: String,
    /// Its kind.
    pub(crate) kind: Kind,
    /// Its size class.
    pub(crate) size: usize,
}

impl HostSeries {
    /// The app name, `svc-07.cpu`.
    pub(crate) fn app(&self) -> String {
        format!("{}.{}", self.service, self.kind.suffix())
    }
}

/// The series of host `index`: its [`SERVICES_PER_HOST`] services, spread over the fleet's
/// [`SERVICES`] so that each service runs on as many hosts.
pub(crate) fn host_series(index: usize) -> Vec<HostSeries> {
    let mut out = Vec::new();
    for (rank, sizes) in SHAPE.iter().enumerate() {
        // 5 × 8 = 40: the eight services of a host are distinct.
        let service = format!("svc-{:02}", (index + rank * 5) % SERVICES);
        for (kind, size) in Kind::ALL.iter().zip(sizes) {
            if let Some(size) = size {
                out.push(HostSeries {
                    service: service.clone(),
                    kind: *kind,
                    size: *size,
                });
            }
        }
    }
    out
}

/// Which variant series `series` of agent `agent` sends in batch `sequence`: fixed by the three,
/// so that a resent batch is byte for byte the batch first sent.
pub(crate) fn variant(agent: usize, sequence: u64, series: usize) -> usize {
    let mut x = (agent as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(sequence.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(series as u64);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 29;
    (x % VARIANTS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_has_twenty_series_of_eight_distinct_services() {
        for index in [0, 1, 39, 40, 999] {
            let series = host_series(index);
            assert_eq!(series.len(), 20);
            let mut services: Vec<&str> = series.iter().map(|s| s.service.as_str()).collect();
            services.dedup();
            assert_eq!(services.len(), SERVICES_PER_HOST);
            services.sort_unstable();
            services.dedup();
            assert_eq!(services.len(), SERVICES_PER_HOST, "{index}");
        }
    }

    #[test]
    fn variants_are_fixed_and_spread() {
        assert_eq!(variant(3, 17, 2), variant(3, 17, 2));
        let mut seen = [0usize; VARIANTS];
        for sequence in 0..8_000 {
            seen[variant(5, sequence, 1)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }
}
