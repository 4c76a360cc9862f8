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

/// Every node regex of a rule set in one lazy DFA, with a pool of caches so that concurrent
/// evaluations each have one and keep the states earlier profiles built.
#[derive(Debug)]
pub(super) struct Automaton {
    dfa: DFA,
    caches: Mutex<Vec<Cache>>,
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

    /// A cache for one walk, to hand back with [`Automaton::put_back`].
    pub(super) fn take_cache(&self) -> Cache {
        self.caches
            .lock()
            .expect("cache pool lock: taken only to pop or push")
            .pop()
            .unwrap_or_else(|| self.dfa.create_cache())
    }

    /// Returns a cache to the pool, unless the pool is full.
    pub(super) fn put_back(&self, cache: Cache) {
        let mut caches = self
            .caches
            .lock()
            .expect("cache pool lock: taken only to pop or push");
        if caches.len() < POOLED_CACHES {
            caches.push(cache);
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
