//! The aggregator's stages depend downward only: every `crate::…` (and `super::…` leaving a
//! stage) path in `aggregator/src` is an edge between two modules, and every edge must be in
//! [`ALLOWED`], which ARCHITECTURE.md lists too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module of the crate and the modules it may use, leaves first. A module is a top-level
/// module of `aggregator/src`, except `ingest::quic`, which is kept apart so that QUIC ingest
/// gets only what it needs.
const ALLOWED: &[(&str, &[&str])] = &[
    ("api_error", &[]),
    ("tenant", &[]),
    ("metrics", &[]),
    ("store", &["metrics", "tenant"]),
    ("rules", &["store", "metrics", "api_error", "tenant"]),
    (
        "ingest",
        &["rules", "store", "metrics", "api_error", "tenant"],
    ),
    (
        "ingest::quic",
        &["ingest", "store", "metrics", "api_error", "tenant"],
    ),
    ("query", &["store", "metrics", "api_error", "tenant"]),
    ("admin", &["store", "metrics", "api_error", "tenant"]),
    ("ui", &[]),
    ("http", &["metrics", "api_error"]),
    (
        "config",
        &["http", "ingest", "query", "rules", "store", "tenant"],
    ),
    (
        "app",
        &[
            "config",
            "metrics",
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

/// Modules that are kept apart from their parent in the graph.
const SUBSTAGES: &[&str] = &["ingest::quic"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, with its module path (`store/sled/read.rs` is
/// `store::sled::read`, `store/mod.rs` is `store`).
fn modules(dir: &Path, prefix: &[String], out: &mut Vec<(Vec<String>, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.is_dir() {
            let mut inner = prefix.to_vec();
            inner.push(name);
            modules(&path, &inner, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let mut module = prefix.to_vec();
            if name != "mod" {
                module.push(name);
            }
            out.push((module, path));
        }
    }
}

/// The node of the graph a module path belongs to.
fn node(path: &[String]) -> Option<String> {
    let first = path.first()?;
    if let Some(second) = path.get(1) {
        let sub = format!("{first}::{second}");
        if SUBSTAGES.contains(&sub.as_str()) {
            return Some(sub);
        }
    }
    Some(first.clone())
}

/// `line` without its comment, if it has one outside a string literal.
fn code(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with("//") {
        return "";
    }
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

/// The paths a `use` or an expression continues with after `crate::` or `super::`: `x::y`
/// from `x::y::Z`, and each item of a group `{a::B, c}`.
fn items(rest: &str) -> Vec<&str> {
    let rest = rest.trim_start();
    let Some(group) = rest.strip_prefix('{') else {
        return vec![rest];
    };
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items
        .into_iter()
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .collect()
}

/// Where each occurrence of `keyword` (`crate::` or `super::`) starts in `line`, when it begins
/// a path rather than continuing one (`a::super::` is not a path from here).
fn starts<'l>(line: &'l str, keyword: &'l str) -> impl Iterator<Item = usize> + 'l {
    line.match_indices(keyword)
        .map(|(pos, _)| pos)
        .filter(move |&pos| {
            !line[..pos]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$')
        })
}

/// The module paths one file's code reaches through `crate::` and `super::` paths, resolved
/// from `module`, the file's own module path.
fn targets(module: &[String], text: &str) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    for line in text.lines().map(code) {
        for pos in starts(line, "crate::") {
            for item in items(&line[pos + "crate::".len()..]) {
                found.insert(segments(item));
            }
        }
        for pos in starts(line, "super::") {
            // `super` is the parent of `x` for `x.rs` and for `x/mod.rs` alike.
            let mut base = module.to_vec();
            let mut rest = &line[pos..];
            while let Some(next) = rest.strip_prefix("super::") {
                base.pop();
                rest = next;
            }
            for item in items(rest) {
                let mut path = base.clone();
                path.extend(segments(item));
                found.insert(path);
            }
        }
    }
    found
}

/// `a::b::{…}` as `[a, b]`; `a` as `[a]`.
fn segments(item: &str) -> Vec<String> {
    item.split("::")
        .map(|s| {
            s.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .take_while(|s| !s.is_empty())
        .collect()
}

/// Every edge between two nodes, with the files that make it.
fn edges() -> BTreeMap<(String, String), BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    modules(&root, &[], &mut files);
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (module, path) in files {
        // The crate root and the binary declare and use modules; they are no stage.
        let Some(from) = node(&module) else {
            continue;
        };
        if module == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for target in targets(&module, &text) {
            let Some(to) = node(&target) else {
                continue;
            };
            if to != from {
                let file = path.strip_prefix(&root).unwrap().display().to_string();
                edges.entry((from.clone(), to)).or_default().insert(file);
            }
        }
    }
    edges
}

#[test]
fn stages_import_only_the_stages_below_them() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut problems = Vec::new();
    let edges = edges();
    for ((from, to), files) in &edges {
        match allowed.get(from.as_str()) {
            None => problems.push(format!(
                "module {from} is not in ALLOWED (tests/aggregator/layout.rs); add it with the modules it may use"
            )),
            Some(targets) if !targets.contains(&to.as_str()) => problems.push(format!(
                "{from} uses {to} (in {}), an edge not in ALLOWED",
                files.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The parser sees the edges it should: a few that exist for sure.
    for edge in [
        ("ingest", "store"),
        ("ingest::quic", "ingest"),
        ("app", "http"),
    ] {
        assert!(
            edges.contains_key(&(edge.0.to_owned(), edge.1.to_owned())),
            "edge {edge:?} not found; is the parser broken?"
        );
    }
}

#[test]
fn the_allowed_table_is_acyclic_and_names_modules_that_exist() {
    let mut files = Vec::new();
    modules(&src(), &[], &mut files);
    let existing: BTreeSet<String> = files.iter().filter_map(|(m, _)| node(m)).collect();
    for (module, targets) in ALLOWED {
        assert!(
            existing.contains(*module),
            "ALLOWED names {module}, which does not exist"
        );
        for target in *targets {
            assert!(
                existing.contains(*target),
                "ALLOWED names {target}, which does not exist"
            );
        }
    }
    for module in &existing {
        if !["lib", "main"].contains(&module.as_str()) {
            assert!(
                ALLOWED.iter().any(|(m, _)| m == module),
                "module {module} has no row in ALLOWED"
            );
        }
    }
    // Listed leaves first: each module may use only modules listed before it.
    let mut seen = BTreeSet::new();
    for (module, targets) in ALLOWED {
        for target in *targets {
            assert!(
                seen.contains(target),
                "{module} may use {target}, which is not listed before it: a cycle, or the table's order is wrong"
            );
        }
        seen.insert(*module);
    }
}

#[test]
fn architecture_md_lists_the_same_edges() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
            .unwrap();
    let heading = "### Allowed imports between the aggregator's modules";
    let section = doc
        .split_once(heading)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {heading:?}"))
        .1;
    let mut listed: Vec<(String, Vec<String>)> = Vec::new();
    for line in section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|name| name.trim().trim_matches('`').to_owned())
                .filter(|name| !name.is_empty() && name != "—")
                .collect()
        };
        listed.push((cells[0].trim_matches('`').to_owned(), names(cells[1])));
    }
    let expected: Vec<(String, Vec<String>)> = ALLOWED
        .iter()
        .map(|(module, targets)| {
            (
                (*module).to_owned(),
                targets.iter().map(|t| (*t).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(
        listed, expected,
        "ARCHITECTURE.md's table differs from ALLOWED"
    );
}

#[test]
fn the_parser_reads_groups_nested_paths_and_supers() {
    let text = "use crate::{api_error::ApiError, store::{Store, TimeRange}};\n\
                use super::super::metrics::Errors; // crate::app in a comment\n\
                let url = \"http://x\"; crate::tenant::Tenant::anonymous();\n\
                /// [`x`](crate::app::start)\n";
    let module: Vec<String> = ["ingest", "quic", "connection"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let found: Vec<Option<String>> = targets(&module, text).iter().map(|t| node(t)).collect();
    let found: BTreeSet<String> = found.into_iter().flatten().collect();
    let expected: BTreeSet<String> = ["api_error", "store", "ingest", "tenant"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    // `super::super` from `ingest::quic::connection` is `ingest`, and `ingest::metrics` is
    // part of it.
    assert_eq!(found, expected);
}
