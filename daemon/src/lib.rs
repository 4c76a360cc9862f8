//! `smolder-daemon`: the plumbing Smolder's two daemons share, written once.
//!
//! `smolder-agent` and `smolder-aggregator` differ in their stages and agree on everything
//! around them: the command line ([`Flags`], [`Mode`]), how a config file is read and checked
//! (`config`: [`DaemonConfig`], deprecated keys), how logs are set up ([`logs`]: colour only
//! on a terminal), how a daemon runs under systemd ([`run`]: READY=1 once started, watchdog
//! pings, STOPPING=1 and a graceful stop on SIGTERM or SIGINT) and how it serves HTTP
//! ([`http`]: [`HttpConfig`], the listener, answers with a body for every refusal), and how it
//! says whether it works ([`health`]: every long-running loop beats; [`supervise`]d threads
//! restart after a panic; `/healthz`, `/readyz` and the watchdog pings follow the heartbeats;
//! [`metrics`]: the helpers every stage creates its metrics with, and `/metrics`' rendering;
//! [`fault`]: the faults tests inject, compiled in for tests only). A daemon's
//! `main.rs` is one call to [`main`] with what its modes do; its `app.rs` starts its stages
//! inside [`run`].
//!
//! Input: flags, a YAML file, the environment systemd sets (`NOTIFY_SOCKET`, `WATCHDOG_USEC`).
//! Output: a typed config, a tokio runtime running the daemon, the `listening` log lines (one
//! per listener, with its bound address: what scripts and tests read when they ask for port 0).
//! Owns the runtime, the watchdog task and the signal handlers. Depends on no Smolder crate.
//!
//! | Feature | What it does |
//! |---|---|
//! | `__fault-injection` | test-only: [`fault::fire`] reads `SMOLDER_FAULTS` |

mod config;
pub mod fault;
mod flags;
pub mod health;
pub mod http;
pub mod logs;
pub mod metrics;
mod service;

pub use config::{DaemonConfig, RenamedKey, default_yaml, load, parse};
pub use flags::{Flags, LogFormat, Mode};
pub use health::{Health, Heartbeat, LoopState, Supervised, supervise};
pub use http::{HttpConfig, HttpListener, listening};
pub use service::{Daemon, exit, main, run};
