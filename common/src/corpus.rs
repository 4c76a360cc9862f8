//! A seeded synthetic profile corpus, for tests and benchmarks.
//!
//! Third-party profiles may not be committed (Pyroscope's test data is AGPL), so tests and
//! benches generate their inputs here. A [`CorpusConfig`] describes the shape; [`Corpus::generate`]
//! makes that many unique stacks over a table of realistic function names, growing each new stack
//! from a prefix of an existing one the way real call trees branch near their leaves; a
//! [`Sampler`] then draws stacks by rank from a Zipf distribution, as real profiles concentrate on
//! a few hot paths. [`Corpus::tree`] and [`Corpus::folded`] turn a number of draws into a [`Tree`]
//! or folded text.
//!
//! Everything is deterministic for a seed: the same config gives the same stacks, samples, trees
//! and text on every run and machine (with the same `rand` and `rand_distr` versions, whose
//! `StdRng` and `Zipf` streams may change between major versions).
//!
//! ```
//! use smolder_common::{Corpus, CorpusConfig};
//!
//! let corpus = Corpus::generate(&CorpusConfig { unique_stacks: 100, ..CorpusConfig::default() });
//! let tree = corpus.tree(1_000, 0);
//! assert_eq!(tree.total(), 1_000);
//! assert_eq!(corpus.folded(1_000, 0), Corpus::generate(corpus.config()).folded(1_000, 0));
//! ```

use std::collections::HashSet;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::folded::to_folded;
use crate::tree::{FrameId, Tree};

/// Root frames of real profiles, used for the first [`CorpusConfig::roots`] functions.
const ROOT_NAMES: [&str; 6] = [
    "runtime.goexit",
    "main.main",
    "java.lang.Thread.run",
    "start_thread",
    "runtime.main",
    "_start",
];
const SERVICES: usize = 12;
const PACKAGES: [&str; 12] = [
    "http", "grpc", "db", "cache", "json", "auth", "queue", "render", "store", "metrics", "sched",
    "codec",
];
const TYPES: [&str; 12] = [
    "Handler", "Server", "Client", "Pool", "Codec", "Encoder", "Decoder", "Router", "Session",
    "Worker", "Conn", "Batch",
];
const VERBS: [&str; 14] = [
    "Serve", "Handle", "Get", "Put", "Encode", "Decode", "Read", "Write", "Flush", "Process",
    "Run", "Dispatch", "Lookup", "Marshal",
];
/// Mixed into the seed of samplers so that draws do not replay the generator's stream.
const SAMPLER_SEED: u64 = 0x5341_4d50_4c45_5253;
/// A stack grown from an earlier one keeps all but at most this many of the frames they can
/// share, so that stacks diverge near their leaves as in real profiles (Pyroscope's heap test
/// profile has about one node per six frames of its unique stacks).
const MAX_DIVERGENCE: usize = 4;
/// Consecutive duplicate stacks after which the config is taken to allow too few unique stacks.
const MAX_DUPLICATES_IN_A_ROW: usize = 10_000;

/// The shape of a synthetic corpus. Every field has a default; override with struct update
/// syntax.
#[derive(Clone, Debug, PartialEq)]
pub struct CorpusConfig {
    /// Seed of every random choice. Default 1.
    pub seed: u64,
    /// How many distinct stacks to generate. Default 10,000.
    pub unique_stacks: usize,
    /// Shortest stack, in frames, at least 1. Default 10.
    pub min_depth: usize,
    /// Longest stack, in frames, at least `min_depth`. Default 60.
    pub max_depth: usize,
    /// How many distinct function names, more than `roots`. Default 5,000.
    pub functions: usize,
    /// How many of those functions are root frames (`runtime.goexit`, `main.main`, ...): every
    /// stack starts with one. Default 4.
    pub roots: usize,
    /// Probability that a new stack grows from a prefix of an existing one rather than from a
    /// root, in 0..=1. Default 0.95.
    pub share_prefix: f64,
    /// Exponent `s` of the Zipf distribution by rank: rank `k` is drawn with weight `1 / k^s`.
    /// 0 is uniform; around 1 is typical of CPU profiles. Default 1.1.
    pub zipf_exponent: f64,
}

impl Default for CorpusConfig {
    fn default() -> Self {
        CorpusConfig {
            seed: 1,
            unique_stacks: 10_000,
            min_depth: 10,
            max_depth: 60,
            functions: 5_000,
            roots: 4,
            share_prefix: 0.95,
            zipf_exponent: 1.1,
        }
    }
}

/// A generated set of unique stacks over a table of function names. See the
/// [module documentation](self).
#[derive(Clone, Debug)]
pub struct Corpus {
    config: CorpusConfig,
    functions: Vec<String>,
    /// Root first, as indices into `functions`; index 0 is rank 1, the most drawn.
    stacks: Vec<Vec<u32>>,
}

impl Corpus {
    /// Generates the corpus `config` describes.
    ///
    /// Each new stack picks a depth uniformly in `min_depth..=max_depth`. With probability
    /// `share_prefix` it starts as a prefix of a uniformly chosen earlier stack (all the frames
    /// they can share but the last zero to four), otherwise as a root function alone; it is then
    /// extended with uniformly chosen non-root functions to its depth. Duplicates are drawn
    /// again.
    ///
    /// # Panics
    ///
    /// If the config is inconsistent (`min_depth` of 0, `max_depth < min_depth`, `functions <=
    /// roots`, `roots` of 0, `share_prefix` outside 0..=1, a negative or non-finite
    /// `zipf_exponent`, or no stacks), or allows fewer unique stacks than requested.
    pub fn generate(config: &CorpusConfig) -> Corpus {
        assert!(config.min_depth >= 1, "min_depth must be at least 1");
        assert!(
            config.max_depth >= config.min_depth,
            "max_depth below min_depth"
        );
        assert!(config.roots >= 1, "roots must be at least 1");
        assert!(
            config.functions > config.roots,
            "functions must exceed roots"
        );
        assert!(
            config.functions <= u32::MAX as usize,
            "functions must fit in u32"
        );
        assert!(
            (0.0..=1.0).contains(&config.share_prefix),
            "share_prefix outside 0..=1"
        );
        assert!(
            config.zipf_exponent.is_finite() && config.zipf_exponent >= 0.0,
            "zipf_exponent must be finite and non-negative"
        );
        assert!(
            config.unique_stacks >= 1,
            "unique_stacks must be at least 1"
        );

        let mut rng = StdRng::seed_from_u64(config.seed);
        let functions = (0..config.functions)
            .map(|i| function_name(i, config.roots, &mut rng))
            .collect();

        let mut stacks: Vec<Vec<u32>> = Vec::with_capacity(config.unique_stacks);
        let mut seen: HashSet<Vec<u32>> = HashSet::with_capacity(config.unique_stacks);
        let mut duplicates = 0;
        while stacks.len() < config.unique_stacks {
            let depth = rng.random_range(config.min_depth..=config.max_depth);
            let mut stack = if !stacks.is_empty() && rng.random_bool(config.share_prefix) {
                let parent = &stacks[rng.random_range(0..stacks.len())];
                let limit = parent.len().min(depth);
                let keep = limit - rng.random_range(0..=(limit - 1).min(MAX_DIVERGENCE));
                parent[..keep].to_vec()
            } else {
                vec![rng.random_range(0..config.roots) as u32]
            };
            stack.reserve(depth - stack.len());
            while stack.len() < depth {
                stack.push(rng.random_range(config.roots..config.functions) as u32);
            }
            if seen.contains(&stack) {
                duplicates += 1;
                assert!(
                    duplicates < MAX_DUPLICATES_IN_A_ROW,
                    "config allows fewer than {} unique stacks",
                    config.unique_stacks
                );
                continue;
            }
            duplicates = 0;
            seen.insert(stack.clone());
            stacks.push(stack);
        }
        Corpus {
            config: config.clone(),
            functions,
            stacks,
        }
    }

    /// The config this corpus was generated from.
    pub fn config(&self) -> &CorpusConfig {
        &self.config
    }

    /// The function names, indexed by the values in [`Corpus::stacks`].
    pub fn functions(&self) -> &[String] {
        &self.functions
    }

    /// The unique stacks, root first, as indices into [`Corpus::functions`]. Index 0 is rank 1,
    /// the stack a [`Sampler`] draws most often.
    pub fn stacks(&self) -> &[Vec<u32>] {
        &self.stacks
    }

    /// The names of stack `index`, root first.
    ///
    /// # Panics
    ///
    /// If `index` is not below `self.stacks().len()`.
    pub fn stack_names(&self, index: usize) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.stacks[index]
            .iter()
            .map(|&f| self.functions[f as usize].as_str())
    }

    /// Interns every function into `tree` and returns each unique stack as frame ids of that
    /// tree, ready for [`Tree::insert`] (benchmarks measure insertion without interning).
    pub fn intern(&self, tree: &mut Tree) -> Vec<Vec<FrameId>> {
        let ids: Vec<FrameId> = self.functions.iter().map(|f| tree.intern(f)).collect();
        self.stacks
            .iter()
            .map(|stack| stack.iter().map(|&f| ids[f as usize]).collect())
            .collect()
    }

    /// A Zipf sampler over this corpus' stacks. Different `stream`s give independent draws;
    /// the same stream always gives the same draws.
    pub fn sampler(&self, stream: u64) -> Sampler {
        let seed = self.config.seed ^ SAMPLER_SEED ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Sampler {
            rng: StdRng::seed_from_u64(seed),
            zipf: Zipf::new(self.stacks.len() as f64, self.config.zipf_exponent)
                .expect("config checked: n >= 1 and a finite exponent >= 0"),
            len: self.stacks.len(),
        }
    }

    /// How often each unique stack is drawn in `samples` draws from `sampler(stream)`.
    pub fn counts(&self, samples: usize, stream: u64) -> Vec<u64> {
        let mut counts = vec![0u64; self.stacks.len()];
        for index in self.sampler(stream).take(samples) {
            counts[index] += 1;
        }
        counts
    }

    /// A tree of `samples` draws from `sampler(stream)`, each with a value of 1.
    pub fn tree(&self, samples: usize, stream: u64) -> Tree {
        let mut tree = Tree::new();
        let stacks = self.intern(&mut tree);
        for (stack, count) in stacks.iter().zip(self.counts(samples, stream)) {
            tree.insert(stack, count);
        }
        tree
    }

    /// A tree holding every unique stack once, with a value of 1: the largest tree this corpus
    /// makes.
    pub fn full_tree(&self) -> Tree {
        let mut tree = Tree::new();
        for stack in self.intern(&mut tree) {
            tree.insert(&stack, 1);
        }
        tree
    }

    /// [`Corpus::tree`] as folded text.
    pub fn folded(&self, samples: usize, stream: u64) -> String {
        to_folded(&self.tree(samples, stream))
    }
}

/// Draws stack indices from a [`Corpus`], Zipf-distributed by rank: index 0 is the most likely.
/// An endless iterator; made by [`Corpus::sampler`].
#[derive(Debug)]
pub struct Sampler {
    rng: StdRng,
    zipf: Zipf<f64>,
    len: usize,
}

impl Iterator for Sampler {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        // Zipf yields a whole number in 1..=len as a float.
        let rank = self.zipf.sample(&mut self.rng) as usize;
        Some(rank.clamp(1, self.len) - 1)
    }
}

/// A plausible, distinct function name for index `i`: root names first, then Go methods and
/// functions, Java methods and runtime internals. The index ends every name, which keeps them
/// distinct.
fn function_name(i: usize, roots: usize, rng: &mut StdRng) -> String {
    if i < roots {
        return match ROOT_NAMES.get(i) {
            Some(name) => (*name).to_string(),
            None => format!("thread_start{i}"),
        };
    }
    let service = rng.random_range(0..SERVICES);
    let package = PACKAGES[rng.random_range(0..PACKAGES.len())];
    let ty = TYPES[rng.random_range(0..TYPES.len())];
    let verb = VERBS[rng.random_range(0..VERBS.len())];
    match rng.random_range(0..10) {
        0..=4 => format!("github.com/acme/svc{service}/{package}.(*{ty}).{verb}{i}"),
        5..=6 => format!("github.com/acme/svc{service}/{package}.{verb}{ty}{i}"),
        7..=8 => format!(
            "com.acme.svc{service}.{package}.{ty}.{}{i}",
            verb.to_ascii_lowercase()
        ),
        _ => format!("runtime.{}{i}", verb.to_ascii_lowercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::folded::{FoldedFormat, FoldedLimits, parse_folded};

    fn small() -> CorpusConfig {
        CorpusConfig {
            unique_stacks: 2_000,
            functions: 500,
            ..CorpusConfig::default()
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_corpus() {
        let a = Corpus::generate(&small());
        let b = Corpus::generate(&small());
        assert_eq!(a.functions(), b.functions());
        assert_eq!(a.stacks(), b.stacks());
        assert_eq!(a.folded(10_000, 3), b.folded(10_000, 3));
        let other = Corpus::generate(&CorpusConfig { seed: 2, ..small() });
        assert_ne!(a.stacks(), other.stacks());
        assert_ne!(a.counts(10_000, 0), a.counts(10_000, 1));
    }

    #[test]
    fn a_known_seed_gives_known_output() {
        // Pins the generator (and the `rand` streams behind it): a change here changes every
        // benchmark input, so it must be deliberate.
        let corpus = Corpus::generate(&CorpusConfig {
            unique_stacks: 3,
            min_depth: 2,
            max_depth: 3,
            functions: 8,
            ..CorpusConfig::default()
        });
        let stacks: Vec<Vec<&str>> = (0..3).map(|i| corpus.stack_names(i).collect()).collect();
        let run = "github.com/acme/svc5/db.(*Client).Run5";
        let process = "github.com/acme/svc9/codec.(*Worker).Process4";
        assert_eq!(
            stacks,
            [
                vec!["runtime.goexit", run, process],
                vec!["runtime.goexit", run],
                vec!["runtime.goexit", process, process],
            ]
        );
    }

    #[test]
    fn stacks_are_unique_within_depth_bounds_and_share_prefixes() {
        let config = CorpusConfig {
            min_depth: 5,
            max_depth: 12,
            ..small()
        };
        let corpus = Corpus::generate(&config);
        assert_eq!(corpus.stacks().len(), 2_000);
        let distinct: HashSet<&Vec<u32>> = corpus.stacks().iter().collect();
        assert_eq!(distinct.len(), 2_000);
        for stack in corpus.stacks() {
            assert!((5..=12).contains(&stack.len()), "depth {}", stack.len());
            assert!((stack[0] as usize) < config.roots);
            assert!(stack[1..].iter().all(|&f| f as usize >= config.roots));
        }
        // Prefix sharing: far fewer nodes than frames.
        let tree = corpus.full_tree();
        let frames: usize = corpus.stacks().iter().map(Vec::len).sum();
        assert!(
            tree.len() * 2 < frames,
            "{} nodes for {frames} frames",
            tree.len()
        );
        assert!(tree.root().children().count() <= config.roots);
    }

    #[test]
    fn function_names_are_distinct_and_look_real() {
        let corpus = Corpus::generate(&small());
        let distinct: HashSet<&String> = corpus.functions().iter().collect();
        assert_eq!(distinct.len(), corpus.functions().len());
        assert_eq!(corpus.functions()[0], "runtime.goexit");
        assert!(
            corpus
                .functions()
                .iter()
                .any(|f| f.starts_with("github.com/acme/svc") && f.contains(".(*"))
        );
        assert!(corpus.functions().iter().all(|f| !f.contains([';', ' '])));
    }

    #[test]
    fn draws_are_zipf_skewed() {
        let corpus = Corpus::generate(&small());
        let counts = corpus.counts(200_000, 0);
        assert_eq!(counts.iter().sum::<u64>(), 200_000);
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2].max(1);
        assert!(
            counts[0] > 100 * median,
            "top {} median {median}",
            counts[0]
        );
        assert!(counts[0] >= counts[1] && counts[1] >= counts[10]);
    }

    #[test]
    fn a_zero_exponent_is_uniform() {
        let corpus = Corpus::generate(&CorpusConfig {
            zipf_exponent: 0.0,
            unique_stacks: 10,
            ..small()
        });
        let counts = corpus.counts(100_000, 0);
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn trees_and_folded_text_agree() {
        let corpus = Corpus::generate(&small());
        let tree = corpus.tree(5_000, 0);
        assert_eq!(tree.total(), 5_000);
        let text = corpus.folded(5_000, 0);
        let parsed = parse_folded(
            text.as_bytes(),
            FoldedFormat::Folded,
            &FoldedLimits::default(),
        )
        .unwrap();
        assert_eq!(parsed, tree);
    }

    #[test]
    #[should_panic(expected = "fewer than 100 unique stacks")]
    fn impossible_configs_panic_instead_of_spinning() {
        Corpus::generate(&CorpusConfig {
            unique_stacks: 100,
            min_depth: 1,
            max_depth: 2,
            functions: 3,
            roots: 1,
            ..CorpusConfig::default()
        });
    }
}
