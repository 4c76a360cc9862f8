//! The aggregator's stages depend downward only: every `crate::…` (and `super::…` leaving a
//! stage) path in `aggregator/src` is an edge between two modules, and every edge must be in
//! [`ALLOWED`], which ARCHITECTURE.md lists too.

use std::path::Path;

use smolder_test_support::layout::{Allowed, Layout};

/// Each module of the crate and the modules it may use, leaves first. A module is a top-level
/// module of `aggregator/src`, except `ingest::quic`, which is kept apart so that QUIC ingest
/// gets only what it needs.
const ALLOWED: Allowed = &[
    ("api_error", &[]),
    ("tenant", &["api_error"]),
    ("metrics", &[]),
    ("identity", &[]),
    ("auth", &["tenant", "api_error", "metrics", "identity"]),
    ("admission", &["api_error", "metrics", "tenant"]),
    ("store", &["metrics", "tenant"]),
    (
        "rules",
        &["store", "metrics", "api_error", "tenant", "auth"],
    ),
    (
        "ingest",
        &[
            "rules",
            "store",
            "metrics",
            "api_error",
            "tenant",
            "auth",
            "admission",
        ],
    ),
    (
        "ingest::quic",
        &[
            "ingest",
            "store",
            "metrics",
            "api_error",
            "tenant",
            "auth",
            "admission",
            "identity",
        ],
    ),
    (
        "query",
        &["store", "metrics", "api_error", "tenant", "auth"],
    ),
    (
        "admin",
        &["store", "metrics", "api_error", "tenant", "auth"],
    ),
    ("ui", &["auth"]),
    ("http", &["metrics", "api_error", "auth", "admission"]),
    (
        "config",
        &[
            "http",
            "auth",
            "admission",
            "ingest",
            "query",
            "rules",
            "store",
            "tenant",
        ],
    ),
    (
        "app",
        &[
            "config",
            "metrics",
            "identity",
            "auth",
            "admission",
            "store",
            "tenant",
            "rules",
            "ingest",
            "ingest::quic",
            "query",
            "admin",
            "ui",
            "http",
        ],
    ),
];

fn layout() -> Layout {
    Layout {
        src: Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        // Kept apart from its parent, so that QUIC ingest's few needs stay visible.
        substages: &["ingest::quic"],
        allowed: ALLOWED,
        heading: "### Allowed imports between the aggregator's modules",
    }
}

#[test]
fn stages_import_only_the_stages_below_them() {
    // The parser sees the edges it should: a few that exist for sure.
    layout().check_edges(&[
        ("ingest", "store"),
        ("ingest::quic", "ingest"),
        ("app", "http"),
    ]);
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

/// Ingest, query, rules and admin reach the store only through `store::Store`: outside the
/// store itself, only `app.rs` (which opens it) names the implementation, `BlockStore`. Test
/// modules, which open a real store to test a stage on it, may.
#[test]
fn the_stages_reach_the_store_only_through_its_interface() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.clone()];
    let mut naming = Vec::new();
    while let Some(path) = files.pop() {
        if path.is_dir() {
            if path != src.join("store") {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || path == src.join("app.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // What ships: the text before the file's test module.
        let shipped = text.split("#[cfg(test)]").next().unwrap_or_default();
        if shipped.contains("BlockStore") {
            naming.push(path.strip_prefix(&src).unwrap().display().to_string());
        }
    }
    assert!(
        naming.is_empty(),
        "{naming:?} name BlockStore; use the store::Store interface"
    );
}
