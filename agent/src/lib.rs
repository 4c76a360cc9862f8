//! Smolder's per-host daemon.
//!
//! The agent turns what the processes of one host do into stack trees, one per series and
//! window, and hands each closed window on. Its modules follow the data's path: one folder per
//! source, then the window loop and its sinks.
//!
//! - [`ebpf`]: the eBPF source, everything of it: the kernel sampler's loader and map readers,
//!   the table of processes and their labels ([`ebpf::process`]), the symbolizer
//!   ([`ebpf::symbolize`]) on its own thread, and the `smolder-ebpf` thread that submits one
//!   `<service_name>.cpu` profile per series and window.
//! - [`scrape`]: the pull source: pprof scraped from HTTP targets (Pyroscope's
//!   `scrape-configs`), submitted to the windows like any source.
//! - [`relabel`]: Prometheus-style relabelling of label sets, shared by the sources that
//!   choose and name what they profile.
//! - [`window`]: sources submit [`Profile`](smolder_common::Profile)s; the window loop merges
//!   them per series into wall-clock-aligned windows (10 s by default) and hands each closed
//!   [`Window`](window::Window) to its sinks.
//! - [`rules`]: a window sink that turns every closed window into the counters of the config's
//!   `metrics-export-rules`, served on `/exported-metrics`.
//! - [`spool`]: a window sink: every closed window becomes batches within the aggregator's
//!   limits, one file each on disk, bounded by bytes and age, until the aggregator acknowledges
//!   them.
//! - [`ship`]: drains the spool to the aggregator over QUIC, oldest first, reconnecting with
//!   backoff; a batch leaves the spool only on its ack.
//! - [`http`]: the agent's own port (`127.0.0.1:4042`): `/metrics`, `/exported-metrics`,
//!   `/targets` and `/healthz`.
//! - [`tier`]: the tier's two counters with the stage as a label, errors and dropped data,
//!   which every stage counts in (a leaf).
//! - [`metrics`]: the catalogue: every stage's metrics, created in one registry that
//!   `/metrics` renders.
//! - [`config`]: the YAML file, one section per stage.
//! - [`app`]: wires the stages together; [`app::start`] is what the binary and the tests run.

pub mod app;
pub mod config;
pub mod ebpf;
pub mod http;
pub mod metrics;
pub mod relabel;
pub mod rules;
pub mod scrape;
pub mod ship;
pub mod spool;
pub mod tier;
pub mod window;
