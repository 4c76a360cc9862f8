//! The agent's stages depend downward only: every `crate::…` (and `super::…` leaving a stage)
//! path in `agent/src` is an edge between two modules, and every edge must be in [`ALLOWED`],
//! which ARCHITECTURE.md lists too.

use std::path::Path;

use smolder_test_support::layout::{Allowed, Layout};

/// Each module of the crate and the modules it may use, leaves first: the sources, then the
/// window loop they feed and its sinks, then what gathers them (the metrics catalogue, the
/// HTTP port, the config file) and the wiring.
const ALLOWED: Allowed = &[
    ("tier", &[]),
    ("relabel", &[]),
    ("window", &["tier"]),
    ("ebpf", &["window", "relabel", "tier"]),
    ("scrape", &["window", "relabel", "tier"]),
    ("rules", &["window", "tier"]),
    ("spool", &["window", "tier"]),
    ("ship", &["spool", "tier"]),
    (
        "metrics",
        &["ebpf", "scrape", "window", "rules", "spool", "ship", "tier"],
    ),
    ("http", &["metrics", "scrape", "rules"]),
    (
        "config",
        &["ebpf", "scrape", "window", "rules", "spool", "ship"],
    ),
    (
        "app",
        &[
            "config", "metrics", "ebpf", "scrape", "window", "rules", "spool", "ship", "http",
        ],
    ),
];

fn layout() -> Layout {
    Layout {
        src: Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        substages: &[],
        allowed: ALLOWED,
        heading: "### Allowed imports between the agent's modules",
    }
}

#[test]
fn stages_import_only_the_stages_below_them() {
    // The parser sees the edges it should: a few that exist for sure.
    layout().check_edges(&[("ebpf", "window"), ("ship", "spool"), ("app", "http")]);
}

#[test]
fn the_allowed_table_is_acyclic_and_names_modules_that_exist() {
    layout().check_table();
}

#[test]
fn architecture_md_lists_the_same_edges() {
    layout()
        .check_architecture_md(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"));
}
