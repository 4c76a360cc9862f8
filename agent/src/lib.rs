//! Smolder's per-host daemon.
//!
//! The agent turns what the processes of one host do into stack trees, one per series and
//! window, and hands each closed window on. Its modules follow the data's path:
//!
//! - [`window`]: sources submit [`Profile`](smolder_common::Profile)s; the window loop merges
//!   them per series into wall-clock-aligned windows (10 s by default) and hands each closed
//!   [`Window`](window::Window) to its sinks.
//! - [`cpu`]: the eBPF CPU source. [`ebpf`] loads the kernel sampler and drains plain samples,
//!   [`process`] names each process's series (systemd unit, container, relabel rules),
//!   [`symbolize`] turns addresses into function names on its own thread; `cpu` submits one
//!   `<service_name>.cpu` profile per series and window.
//! - [`spool`]: every closed window becomes a batch in an on-disk sled queue, bounded by bytes
//!   and age, until the aggregator acknowledges it.
//! - [`ship`]: drains the spool to the aggregator over QUIC, oldest first, reconnecting with
//!   backoff; a batch leaves the spool only on its ack.
//! - [`scrape`]: pull mode: pprof scraped from HTTP targets (Pyroscope's `scrape-configs`),
//!   submitted to the windows like any source.
//! - [`http`]: the agent's own port (`127.0.0.1:4042`): `/metrics` and `/healthz`.
//! - [`relabel`]: Prometheus-style relabelling of label sets, shared by the sources that
//!   choose and name what they profile.
//! - [`metrics`]: every metric the agent exports, in one catalogue.
//! - [`config`]: the YAML file, one section per stage.
//! - [`app`]: wires the stages together; [`app::start`] is what the binary and the tests run.

pub mod app;
pub mod config;
pub mod cpu;
pub mod ebpf;
pub mod http;
pub mod metrics;
pub mod process;
pub mod relabel;
pub mod scrape;
pub mod ship;
pub mod spool;
pub mod symbolize;
pub mod window;
