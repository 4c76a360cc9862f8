//! `smolder-test-support`: what Smolder's test crates and benchmarks share, a dev-dependency
//! only.
//!
//! - [`prometheus`]: Prometheus' text format parsed into samples, with lookups that fail
//!   loudly when nothing matches, so that a renamed metric fails its test instead of reading
//!   as 0.
//! - [`process`]: a daemon binary as a child process on port 0: it binds what it is given,
//!   logs the address it got, and the fixture reads it from the `listening` line; its log is
//!   kept for assertions and failures.
//! - [`config_keys`]: every key a configuration type reads, from its `Deserialize`
//!   implementation, for the check that each one prints or is hidden for a reason.
//! - [`health`]: `/healthz` and `/readyz` read into rows by loop name, and polled until a
//!   state holds.
//! - [`systemd`]: the check both daemons pass under a service manager (READY=1, watchdog pings,
//!   STOPPING=1).
//! - [`layout`]: a crate's import graph between its stages, checked against the allowed
//!   edges ARCHITECTURE.md lists (each crate's `tests/*/layout.rs`).
//! - [`garage`]: a real Garage node (S3-compatible store) with a bucket and a key, for the
//!   object-storage tests, and a cluster of nodes in network namespaces for the multi-host test.
//! - [`moto`]: moto's S3 server, an S3 API that honours conditional writes, for the
//!   compaction lease that Garage cannot exercise.
//! - [`net`] and [`wait`]: port-0 addresses, a socket that never answers, polling until a
//!   condition holds; [`rules`]: Pyroscope's documented rules, which both tiers evaluate.
//! - [`netns`]: a network namespace behind a veth pair whose link a test cuts and heals (a
//!   partition), for processes run inside it; a bridge joining namespaces as hosts on one
//!   network, each host's port cut and healed on its own.
//! - [`previous`]: the previous release's binaries (`v0.1.0`) for the upgrade tests,
//!   and a pprof target that agents of either release scrape alike.
//!
//! Every listener a test makes binds port 0, so that the suite runs beside a real Smolder on
//! the default ports.

pub mod config_keys;
pub mod garage;
pub mod health;
pub mod layout;
pub mod moto;
pub mod net;
pub mod netns;
pub mod previous;
pub mod process;
pub mod prometheus;
pub mod rules;
pub mod systemd;
pub mod wait;

/// The environment variable `name` parsed, or `default` when unset or unparsable: how the short
/// versions of the long runs and benchmarks are lengthened.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
