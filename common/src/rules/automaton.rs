//! The node regexes of a rule set as one lazy DFA that a tree walk feeds frame by frame.
//!
//! Matching each stack's text from the start costs its length, so a tree of deep stacks is read
//! once per stack. Feeding the DFA one frame per node instead, and keeping its state and the
//! patterns matched so far on the walk's stack, reads each node's name once: a child resumes from
//! its parent's state. A match found before the end of a stack holds for every stack below it
//! (the bytes around it are the same); only end-of-text assertions (`$`, `\b` at the end) are
//! decided per stack, by the end-of-input transition.
//!
//! The lazy DFA builds its states in a cache. If the cache fills up and is cleared mid-walk, the
//! states kept on the walk's stack are no longer valid; the walk then gives up ([`GaveUp`]) and
//! the caller matches that profile's stacks with a `RegexSet` instead. The same happens for a
//! Unicode word boundary next to a non-ASCII byte, which a DFA cannot decide.

use std::collections::HashMap;
use std::sync::Mutex;

use regex_automata::hybrid::LazyStateID;
use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Room for the lazy DFA's states, per cache. 50 typical node regexes over a 20 000-node tree
/// use well under 1 MiB (`benches/rules_eval.rs`); 8 MiB keeps clears, which force the slow
/// path, to pathological rule sets.
const CACHE_BYTES: usize = 8 << 20;

/// Caches kept for later walks; more concurrent walks than this create caches that are dropped
/// afterwards, so that a burst of parallel evaluations does not keep its memory for good.
const POOLED_CACHES: usize = 8;

/// The walk cannot go on with the DFA; match this profile another way.
#[derive(Debug)]
pub(super) struct GaveUp;

/// The most frame outcomes a [`Scratch`] remembers before it starts over: about 100 bytes each
/// with the name, so at most some 25 MiB per pooled scratch even with long C++ names.
const REMEMBERED_FRAMES: usize = 1 << 18;

type Fold = foldhash::fast::RandomState;

/// Outcomes from one state, by frame name.
type ByName = HashMap<Box<str>, Outcome, Fold>;

/// What feeding one frame's name from one state gives: the state after it, and where the
/// patterns it matched start in [`Scratch`]'s `found` (`u32::MAX`: none).
#[derive(Clone, Copy, Debug)]
pub(super) struct Outcome {
    pub(super) state: LazyStateID,
    found: u32,
}

/// One walk's working memory: the lazy DFA's cache, and the outcome of every (state, frame
/// name) fed so far. Profiles of an app repeat their function names window after window, and
/// after a `;` the DFA is in one of few states, so in steady state a node costs a hash lookup
/// instead of a transition per byte of its name. Outcomes name cache states, so they are
/// forgotten whenever the cache is cleared.
#[derive(Debug)]
pub(super) struct Scratch {
    pub(super) cache: Cache,
    /// (state, whether the frame is a root, fed without `;`) → name → outcome.
    outcomes: HashMap<(LazyStateID, bool), ByName, Fold>,
    /// The patterns matched by each outcome that matched any, `words` per outcome.
    found: Vec<u64>,
    remembered: usize,
    /// The cache's clear count when `outcomes` was last valid.
    clears: usize,
}

/// Every node regex of a rule set in one lazy DFA, with a pool of scratches so that concurrent
/// evaluations each have one and keep what earlier profiles built.
#[derive(Debug)]
pub(super) struct Automaton {
    dfa: DFA,
    caches: Mutex<Vec<Scratch>>,
    /// 64-bit words in a set of matched patterns.
    words: usize,
}

impl Automaton {
    /// The automaton of `patterns`, or `None` when the DFA cannot be built for them.
    pub(super) fn build(patterns: &[String]) -> Option<Automaton> {
        if patterns.is_empty() {
            return None;
        }
        let config = DFA::config()
            .match_kind(MatchKind::All)
            .unicode_word_boundary(true)
            .cache_capacity(CACHE_BYTES);
        let dfa = DFA::builder().configure(config).build_many(patterns).ok()?;
        Some(Automaton {
            dfa,
            caches: Mutex::new(Vec::new()),
            words: patterns.len().div_ceil(64),
        })
    }

    /// 64-bit words in a set of matched patterns.
    pub(super) fn words(&self) -> usize {
        self.words
    }

    /// Working memory for one walk, to hand back with [`Automaton::put_back`].
    pub(super) fn take(&self) -> Scratch {
        let pooled = self
            .caches
            .lock()
            .expect("cache pool lock: taken only to pop or push")
            .pop();
        let mut scratch = pooled.unwrap_or_else(|| Scratch {
            cache: self.dfa.create_cache(),
            outcomes: HashMap::default(),
            found: Vec::new(),
            remembered: 0,
            clears: 0,
        });
        if scratch.clears != scratch.cache.clear_count() || scratch.remembered > REMEMBERED_FRAMES {
            scratch.outcomes.clear();
            scratch.found.clear();
            scratch.remembered = 0;
            scratch.clears = scratch.cache.clear_count();
        }
        scratch
    }

    /// The outcome of feeding frame `name` from state `sid` (after its `;`, unless it is a
    /// root frame), remembered across walks.
    pub(super) fn frame(
        &self,
        scratch: &mut Scratch,
        sid: LazyStateID,
        root: bool,
        name: &str,
    ) -> Result<Outcome, GaveUp> {
        if let Some(outcome) = scratch
            .outcomes
            .get(&(sid, root))
            .and_then(|names| names.get(name))
        {
            return Ok(*outcome);
        }
        let mut found = vec![0u64; self.words];
        let state = self.feed(&mut scratch.cache, sid, name.as_bytes(), &mut found)?;
        let at = if found.iter().any(|&w| w != 0) {
            let at = u32::try_from(scratch.found.len()).map_err(|_| GaveUp)?;
            scratch.found.extend_from_slice(&found);
            at
        } else {
            u32::MAX
        };
        let outcome = Outcome { state, found: at };
        scratch
            .outcomes
            .entry((sid, root))
            .or_default()
            .insert(name.into(), outcome);
        scratch.remembered += 1;
        Ok(outcome)
    }

    /// The patterns `outcome` matched, if any.
    pub(super) fn found<'s>(&self, scratch: &'s Scratch, outcome: Outcome) -> Option<&'s [u64]> {
        (outcome.found != u32::MAX).then(|| {
            let at = outcome.found as usize;
            &scratch.found[at..at + self.words]
        })
    }

    /// Returns working memory to the pool, unless the pool is full.
    pub(super) fn put_back(&self, scratch: Scratch) {
        let mut caches = self
            .caches
            .lock()
            .expect("cache pool lock: taken only to pop or push");
        if caches.len() < POOLED_CACHES {
            caches.push(scratch);
        }
    }

    /// The state before any byte of a stack.
    pub(super) fn start(&self, cache: &mut Cache) -> Result<LazyStateID, GaveUp> {
        let config = start::Config::new().anchored(Anchored::No);
        self.dfa.start_state(cache, &config).map_err(|_| GaveUp)
    }

    /// Feeds `bytes` from state `sid`, setting the bit of every pattern that matches on the way
    /// in `hits`, and returns the state after them.
    pub(super) fn feed(
        &self,
        cache: &mut Cache,
        mut sid: LazyStateID,
        bytes: &[u8],
        hits: &mut [u64],
    ) -> Result<LazyStateID, GaveUp> {
        let clears = cache.clear_count();
        for &byte in bytes {
            sid = self.dfa.next_state(cache, sid, byte).map_err(|_| GaveUp)?;
            if cache.clear_count() != clears || sid.is_quit() {
                return Err(GaveUp);
            }
            if sid.is_match() {
                self.mark(cache, sid, hits);
            }
        }
        Ok(sid)
    }

    /// Sets the bits of the patterns that match at the end of a stack in state `sid`.
    pub(super) fn finish(
        &self,
        cache: &mut Cache,
        sid: LazyStateID,
        hits: &mut [u64],
    ) -> Result<(), GaveUp> {
        let clears = cache.clear_count();
        let eoi = self.dfa.next_eoi_state(cache, sid).map_err(|_| GaveUp)?;
        if cache.clear_count() != clears || eoi.is_quit() {
            return Err(GaveUp);
        }
        if eoi.is_match() {
            self.mark(cache, eoi, hits);
        }
        Ok(())
    }

    fn mark(&self, cache: &Cache, sid: LazyStateID, hits: &mut [u64]) {
        for i in 0..self.dfa.match_len(cache, sid) {
            let pattern = self.dfa.match_pattern(cache, sid, i).as_usize();
            hits[pattern / 64] |= 1 << (pattern % 64);
        }
    }
}
