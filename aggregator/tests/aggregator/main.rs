//! Integration tests of `smolder-aggregator` over real HTTP against a running aggregator on a
//! temporary data directory; one module per stage.

/// The aggregator as a process: kill -9 durability, the data directory lock.
mod process;
/// Fixtures: a running aggregator, an HTTP client, helpers to ingest and render.
mod util;

/// Ingest: `/ingest` in every body format and the Connect push, good and bad input.
mod ingest;

/// `/render`, `/render-diff`, label and app listings: exact Pyroscope answers over HTTP.
mod query;

/// A real Prometheus scraping `/exported-metrics` of both tiers and receiving remote write.
mod prometheus;

/// Rules: `/exported-metrics` for Pyroscope's documented example over every ingest format, the
/// recording-rules API, persistence and invalid input.
mod rules;

/// Every Pyroscope SDK's exact upload request, accepted or rejected with a useful message.
mod sdk;
