//! Smolder's per-host daemon.
//!
//! The agent turns what the processes of one host do into stack trees, one per series and
//! window, and hands each closed window on. Its modules follow the data's path:
//!
//! - [`window`]: sources submit [`Profile`](smolder_common::Profile)s; the window loop merges
//!   them per series into wall-clock-aligned windows (10 s by default) and hands each closed
//!   [`Window`](window::Window) to its sinks.
//! - [`rules`]: a window sink that turns every closed window into the counters of the config's
//!   `metrics-export-rules`, served on `/exported-metrics`.
//! - [`http`]: the agent's own port (`127.0.0.1:4042`): `/metrics` and `/healthz`.
//! - [`metrics`]: every metric the agent exports, in one catalogue.
//! - [`config`]: the YAML file, one section per stage.
//! - [`app`]: wires the stages together; [`app::start`] is what the binary and the tests run.

pub mod app;
pub mod config;
pub mod http;
pub mod metrics;
pub mod rules;
pub mod window;
