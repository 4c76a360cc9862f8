//! `smolder-test-support`: what Smolder's test crates and benchmarks share, a dev-dependency
//! only.
//!
//! - [`prometheus`]: Prometheus' text format parsed into samples, with lookups that fail
//!   loudly when nothing matches, so that a renamed metric fails its test instead of reading
//!   as 0.
//! - [`process`]: a daemon binary as a child process on port 0: it binds what it is given,
//!   logs the address it got, and the fixture reads it from the `listening` line; its log is
//!   kept for assertions and failures.
//! - [`health`]: `/healthz` and `/readyz` read into rows by loop name, and polled until a
//!   state holds.
//! - [`systemd`]: the check both daemons pass under a service manager (READY=1, watchdog pings,
//!   STOPPING=1).
//! - [`net`] and [`wait`]: port-0 addresses, a socket that never answers, polling until a
//!   condition holds; [`rules`]: Pyroscope's documented rules, which both tiers evaluate.
//!
//! Every listener a test makes binds port 0, so that the suite runs beside a real Smolder on
//! the default ports.

pub mod health;
pub mod net;
pub mod process;
pub mod prometheus;
pub mod rules;
pub mod systemd;
pub mod wait;
