//! Integration tests of `smolder-aggregator` over real HTTP against a running aggregator on a
//! temporary data directory; one module per stage.

/// The aggregator as a process: kill -9 durability, the data directory lock.
mod process;
/// Fixtures: a running aggregator, an HTTP client, helpers to ingest and render.
mod util;
