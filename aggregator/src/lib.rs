//! `smolder-aggregator`: the central daemon that stores profiles and answers queries about them.
//!
//! Data flows through one module per stage, in this order. A stage imports only what lies
//! beneath it (the leaves, the store, the rules), never a module that uses it:
//! `tests/aggregator/layout.rs` enforces the edges and ARCHITECTURE.md lists them.
//!
//! - `ingest`: Pyroscope's push APIs (`POST /ingest` in folded, lines, pprof and JFR, the Go
//!   SDK's multipart form, and Connect's `/push.v1.PusherService/Push`) and agents' batches
//!   over QUIC (`ingest::quic`), each parsed into a `ProfileSet` that the `Ingester` checks,
//!   evaluates against the rules and writes to the store;
//! - `rules`: counters from every stored profile by Pyroscope's `metrics-export-rules` and the
//!   recording-rules API, served on `/exported-metrics` and optionally remote-written;
//! - `store`: the one interface (`store::Store`) ingest, query, rules and admin reach the data
//!   through, taking a tenant; its planning as pure code; the block store behind it: a head
//!   for recent writes, immutable blocks with pre-merged rollups (so that a query of any span
//!   reads a bounded number of trees), compaction, retention and downsampling;
//! - `query`: `/render`, `/render-diff`, label and app listings, answered with Pyroscope's
//!   flamebearer JSON, folded text or pprof;
//! - `admin`: `DELETE /api/apps`;
//! - `ui`: the web UI at `/`, embedded in the binary when `aggregator/ui` was built first; it
//!   reads everything through the query API above.
//!
//! In front of them all:
//!
//! - `auth`: who a request is (bearer tokens and basic auth from `auth.credentials` and
//!   credential files, the web UI's sessions, the loopback rule without credentials) and what
//!   its credential's scope lets it call; each stage's routes name their access
//!   (`auth::Routes`), and agents' tokens are checked against the same credentials;
//! - `admission`: how much work is taken on at once (one in-flight budget of bytes for HTTP and
//!   QUIC, tenants' ingest rates), answering overload with 503/429 and `Retry-After`.
//!
//! Shared leaves: `api_error` (how a handler or a layer says no), `tenant` (whose data),
//! `metrics` (the registry and the tier's errors, dropped and refused counters), `identity`
//! (the development CA, server certificate and tokens under `<data-dir>/tls/`, shared by the
//! aggregators of one bucket). `http` mounts
//! the stages' routes behind one listener, with `/metrics` and `/healthz`, under the auth and
//! admission layers; [`app`] wires everything together in data-path order; [`config`] is the
//! configuration file, one section per stage. `main.rs` only parses flags and calls
//! [`app::run`].

mod admin;
mod admission;
mod api_error;
pub mod app;
mod auth;
pub mod config;
#[cfg(fuzzing)]
#[doc(hidden)]
pub use auth::fuzzing;
mod http;
mod identity;
mod ingest;
mod metrics;
mod query;
mod rules;
mod store;
mod tenant;
mod ui;
