//! Integration tests of `smolder-aggregator` over real HTTP against a running aggregator on a
//! temporary data directory; one module per stage.

/// `/healthz` and `/readyz`: every loop named, a refused remote write degraded, a store-writer
/// panic restarted with nothing acknowledged lost.
mod health;
/// The aggregator as a process: kill -9 durability (during ingest, cuts and merges), `check`,
/// the data directory lock.
mod process;
/// The binary under systemd: READY=1, watchdog pings, STOPPING=1 over `NOTIFY_SOCKET`.
mod systemd;
/// Fixtures: a running aggregator, an HTTP client, helpers to ingest and render.
mod util;

/// The HTTP surface's own refusals (malformed request lines, unknown routes, wrong methods),
/// each with a body.
mod http;

/// The crate's layout: stages import only the stages below them (the edges ARCHITECTURE.md
/// lists).
mod layout;

/// README.md and OPERATIONS.md against the binaries: their shell examples run, their configs
/// load, every config key is shown.
mod docs;

/// Ingest: `/ingest` in every body format and the Connect push, good and bad input.
mod ingest;

/// OTLP profiles from PyPI's opentelemetry-proto over HTTP: every table, protobuf, JSON and
/// gzip; twenty malformed requests refused with nothing stored.
mod otlp;

/// `/render`, `/render-diff`, label and app listings: exact Pyroscope answers over HTTP.
mod query;

/// The query API Grafana speaks: Connect `querier.v1` in binary and JSON, values exact against
/// `/render`, Connect's error shape.
mod grafana;

/// A real Prometheus scraping `/exported-metrics` of both tiers and receiving remote write.
mod prometheus;

/// Rules: `/exported-metrics` for Pyroscope's documented example over every ingest format, the
/// recording-rules API, persistence and invalid input.
mod rules;

/// Every Pyroscope SDK's exact upload request, accepted or rejected with a useful message.
mod sdk;

/// Agents shipping over QUIC: delivery to `/render`, exactly once across `kill -9`, spooling
/// through an outage, a full spool.
mod transport;

/// The whole path of a CPU sample: the agent's real eBPF sampler (as root) → window → spool →
/// QUIC → store → `/render`.
mod ebpf_to_store;

/// QUIC ingest against hostile or mistaken clients: authentication, protocol versions,
/// truncated, oversized, garbage and decompression-bomb streams.
mod quic;
/// Tenants: two tenants pushing the same app through every transport see only their own data
/// through every API; without multitenancy the header is ignored.
mod tenants;
/// The web UI's page and assets as served; the browser scenarios live in `aggregator/ui/e2e/`.
mod ui;
