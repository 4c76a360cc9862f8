//! `smolder-aggregator`: the central daemon that stores profiles and answers queries about them.
//!
//! Data flows through one module per stage, in this order:
//!
//! - [`ingest`](crate::ingest): Pyroscope's push APIs (`POST /ingest` in folded, lines and pprof,
//!   the Go SDK's multipart form, and Connect's `/push.v1.PusherService/Push`), each body parsed
//!   into [`Profile`](smolder_common::Profile)s with `smolder-common`'s formats;
//! - `store`: profiles made durable in sled, indexed by series and label, with pre-merged
//!   rollups so that a query of any span reads a bounded number of trees;
//! - [`query`](crate::query): `/render`, `/render-diff`, label and app listings, answered with
//!   Pyroscope's flamebearer JSON, folded text or pprof.
//!
//! - `rules`: counters from every stored profile by Pyroscope's `metrics-export-rules` and the
//!   recording-rules API, served on `/exported-metrics` and optionally remote-written.
//!
//! [`app`] wires them together behind one HTTP listener (`http`), which also serves `/metrics`
//! (`metrics`) and `/healthz`; [`config`] is the configuration file, one section per stage.
//! `main.rs` only parses flags and calls [`app::run`].
//!
//! - `ui`: the web UI at `/`, embedded in the binary when `aggregator/ui` was built first; it
//!   reads everything through the query API above.

pub mod app;
pub mod config;
mod http;
mod ingest;
mod metrics;
mod query;
mod rules;
mod store;
mod ui;
