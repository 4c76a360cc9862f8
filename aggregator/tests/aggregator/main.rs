//! Integration tests of `smolder-aggregator` over real HTTP against a running aggregator on a
//! temporary data directory; one module per stage.

/// `/healthz` and `/readyz`: every loop named, a refused remote write degraded, a store-writer
/// panic restarted with nothing acknowledged lost.
mod health;
/// Object-storage mode against real Garage nodes: blocks in the bucket, the start's checks, acks
/// after the upload (kill -9 with the disk lost, the bucket cut off), two aggregators on one
/// bucket counting every batch once.
mod object_store;
/// The aggregator as a process: kill -9 durability (during ingest, cuts and merges), `check`,
/// the data directory lock.
mod process;
/// The multi-host test of object-storage mode: a three-node Garage cluster, three aggregators,
/// two agents and a push client in network namespaces, through kills, a cut-off bucket, a node
/// down, a lost ack and two compactors: nothing lost or counted twice, every aggregator alike.
mod scale_out;
/// Object-storage mode's shared state on real Garage nodes: recording rules made through one
/// aggregator in force on every other and outliving a lost data directory; aggregators started
/// together sharing one development CA and tokens, one agent shipping to each.
mod shared_state;
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
/// load, every config key prints and is shown or is hidden for a reason; the glossary's order.
mod docs;

/// Ingest: `/ingest` in every body format and the Connect push, good and bad input.
mod ingest;

/// Admission control with real clients: floods past the in-flight budget, the decompression
/// budget, tenants' ingest rates, the query limits.
mod admission;

/// Over a hundred hostile inputs across every API, the QUIC protocol and the config files:
/// each refused saying why, nothing stored, the next good request served.
mod hostile;

/// Authentication and authorization: every route with no, wrong, removed and out-of-scope
/// credentials; the loopback rule; credentials' tenants; agents' tokens; HTTPS; Pyroscope's
/// Python and Node.js SDKs with tokens and basic auth; no secret in the log.
mod auth;

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

/// Traces to profiles: a Python app's span profiles (pyroscope-io, pyroscope-otel and the
/// OpenTelemetry SDK) read back through Connect and `/render`; every shape a span id comes in.
mod spans;

/// Agents shipping over QUIC: delivery to `/render`, exactly once across `kill -9`, spooling
/// through an outage and a partition (a network namespace), a full spool.
mod transport;

/// A fleet on one box, short: a hundred simulated agents over QUIC and Pyroscope clients over
/// HTTP for a minute, acks keeping up, every series holding what was acknowledged.
mod fleet_to_store;

/// The aggregator killed -9 every 30 s under a fleet's load: nothing acknowledged lost or
/// stored twice, no panic, `/readyz` truthful across restarts, the fleet's counters and the
/// aggregator's metrics agreeing on what was acknowledged, duplicated and dropped.
mod soak;

/// The whole path of a CPU sample: the agent's real eBPF sampler (as root) → window → spool →
/// QUIC → store → `/render`.
mod ebpf_to_store;

/// QUIC ingest against hostile or mistaken clients: authentication, protocol versions,
/// truncated, oversized, garbage and decompression-bomb streams; the development certificate's
/// names.
mod quic;
/// Tenants: two tenants pushing the same app through every transport see only their own data
/// through every API; without multitenancy the header is ignored.
mod tenants;
/// The web UI's page and assets as served; the browser scenarios live in `aggregator/ui/e2e/`.
mod ui;
/// Upgrades: an agent of the previous release (its binary, `scripts/previous-release`) shipping
/// to this aggregator's binary.
mod upgrade;
