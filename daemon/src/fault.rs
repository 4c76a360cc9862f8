//! Faults a test can inject into a real daemon process: with the `__fault-injection` feature,
//! which only the test crates' dev-dependencies enable, [`fire`] reads `SMOLDER_FAULTS` (names
//! separated by commas, each `name` or `name@N`) and says once per process that a named fault
//! is due: at the first call for `name`, at the N-th for `name@N`. Without the feature (every
//! build that ships) it is a constant `false` and the variable is never read.
//!
//! A cargo feature rather than `cfg(debug_assertions)`: the hook is absent from a release
//! build and from a debug build alike unless a test asks for it, so no environment variable
//! can make a deployed daemon panic. The test crates enable it through their dev-dependency on
//! this crate, so `cargo test` builds the daemon binaries with it.
//!
//! Faults: `symbolize-panic` (the agent's symbolizer panics on a window) and
//! `store-writer-panic` (the aggregator's store writer panics on a write).

/// Whether the fault `name` is asked for and due now: once per process, at the first call (or
/// the N-th, for `name@N`).
#[cfg(feature = "__fault-injection")]
pub fn fire(name: &str) -> bool {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    // Calls per fault name so far.
    static CALLS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let asked = std::env::var("SMOLDER_FAULTS").unwrap_or_default();
    let Some(at) = asked.split(',').find_map(|fault| {
        let (fault, at) = fault.trim().split_once('@').unwrap_or((fault.trim(), "1"));
        (fault == name).then(|| at.parse::<u64>().unwrap_or(1))
    }) else {
        return false;
    };
    let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    let count = calls.entry(name.to_owned()).or_default();
    *count += 1;
    *count == at
}

/// Whether the fault `name` is due: never, in a build without `__fault-injection`.
#[cfg(not(feature = "__fault-injection"))]
#[inline]
pub fn fire(_name: &str) -> bool {
    false
}
