//! A crate's import graph between its stages, read from its source, checked against the
//! table of allowed edges that ARCHITECTURE.md lists.
//!
//! Every `crate::…` (and `super::…` leaving a stage) path in a crate's `src/` is an edge
//! between two modules. A module is a top-level module of the crate, except the *substages*
//! a [`Layout`] names (`ingest::quic`), which are kept apart from their parent so that their
//! few needs stay visible. Each crate's `tests/<crate>/layout.rs` holds its table and runs
//! the three checks: [`Layout::check_edges`], [`Layout::check_table`] and
//! [`Layout::check_architecture_md`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each module and the modules it may use, leaves first.
pub type Allowed = &'static [(&'static str, &'static [&'static str])];

/// One crate's layout: its source folder, its substages and its allowed edges.
pub struct Layout {
    /// The crate's `src/` folder.
    pub src: PathBuf,
    /// Modules kept apart from their parent in the graph (`ingest::quic`).
    pub substages: &'static [&'static str],
    /// Each module and the modules it may use, leaves first.
    pub allowed: Allowed,
    /// The heading of ARCHITECTURE.md's section whose first table lists the same edges.
    pub heading: &'static str,
}

impl Layout {
    /// Every edge between two nodes, with the files (relative to `src`) that make it.
    ///
    /// # Panics
    ///
    /// When the source folder cannot be read.
    pub fn edges(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        let mut files = Vec::new();
        modules(&self.src, &[], &mut files);
        let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for (module, path) in files {
            // The crate root and the binary declare and use modules; they are no stage.
            if module == ["main"] || module == ["lib"] {
                continue;
            }
            let Some(from) = self.node(&module) else {
                continue;
            };
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            for target in targets(&module, &text) {
                let Some(to) = self.node(&target) else {
                    continue;
                };
                if to != from {
                    let file = path.strip_prefix(&self.src).unwrap().display().to_string();
                    edges.entry((from.clone(), to)).or_default().insert(file);
                }
            }
        }
        edges
    }

    /// Fails on an edge of the source that the table does not list, and when one of `expected`
    /// (edges that exist for sure) is not found, which would mean a broken parser.
    ///
    /// # Panics
    ///
    /// Listing every edge not allowed.
    pub fn check_edges(&self, expected: &[(&str, &str)]) {
        let allowed: BTreeMap<&str, &[&str]> = self.allowed.iter().copied().collect();
        let mut problems = Vec::new();
        let edges = self.edges();
        for ((from, to), files) in &edges {
            match allowed.get(from.as_str()) {
                None => problems.push(format!(
                    "module {from} is not in ALLOWED (tests/*/layout.rs); add it with the modules it may use"
                )),
                Some(targets) if !targets.contains(&to.as_str()) => problems.push(format!(
                    "{from} uses {to} (in {}), an edge not in ALLOWED",
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                )),
                Some(_) => {}
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        for edge in expected {
            assert!(
                edges.contains_key(&(edge.0.to_owned(), edge.1.to_owned())),
                "edge {edge:?} not found; is the parser broken?"
            );
        }
    }

    /// Fails unless the table names only modules that exist, gives every module a row, and
    /// lists leaves first (each module may use only modules listed before it: no cycle).
    ///
    /// # Panics
    ///
    /// Naming the first problem.
    pub fn check_table(&self) {
        let mut files = Vec::new();
        modules(&self.src, &[], &mut files);
        let existing: BTreeSet<String> = files.iter().filter_map(|(m, _)| self.node(m)).collect();
        for (module, targets) in self.allowed {
            for name in std::iter::once(module).chain(targets.iter()) {
                assert!(
                    existing.contains(*name),
                    "ALLOWED names {name}, which does not exist"
                );
            }
        }
        for module in &existing {
            if !["lib", "main"].contains(&module.as_str()) {
                assert!(
                    self.allowed.iter().any(|(m, _)| m == module),
                    "module {module} has no row in ALLOWED"
                );
            }
        }
        let mut seen = BTreeSet::new();
        for (module, targets) in self.allowed {
            for target in *targets {
                assert!(
                    seen.contains(target),
                    "{module} may use {target}, which is not listed before it: a cycle, or the table's order is wrong"
                );
            }
            seen.insert(*module);
        }
    }

    /// Fails unless ARCHITECTURE.md (at `doc`) lists the same table under [`Layout::heading`].
    ///
    /// # Panics
    ///
    /// When the file or the section is missing, or its table differs.
    pub fn check_architecture_md(&self, doc: &Path) {
        let text =
            std::fs::read_to_string(doc).unwrap_or_else(|err| panic!("{}: {err}", doc.display()));
        let section = text
            .split_once(self.heading)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {:?}", self.heading))
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
        let expected: Vec<(String, Vec<String>)> = self
            .allowed
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
            "ARCHITECTURE.md's table under {:?} differs from ALLOWED",
            self.heading
        );
    }

    /// The node of the graph a module path belongs to.
    fn node(&self, path: &[String]) -> Option<String> {
        let first = path.first()?;
        if let Some(second) = path.get(1) {
            let sub = format!("{first}::{second}");
            if self.substages.contains(&sub.as_str()) {
                return Some(sub);
            }
        }
        Some(first.clone())
    }
}

/// Every `.rs` file under `dir`, with its module path (`store/blocks/read.rs` is
/// `store::blocks::read`, `store/mod.rs` is `store`).
fn modules(dir: &Path, prefix: &[String], out: &mut Vec<(Vec<String>, PathBuf)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("a UTF-8 file name")
            .to_owned();
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

/// The paths a `use` or an expression continues with after `crate::` or `super::`: `[x, y, Z]`
/// from `x::y::Z`, and each path of a group, nested groups and groups spread over several lines
/// included: `a::{b::C, d}` gives `[a, b, C]` and `[a, d]`.
fn paths(rest: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = rest.trim_start();
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            return group_items(group)
                .into_iter()
                .flat_map(paths)
                .map(|path| prefix.iter().cloned().chain(path).collect())
                .collect();
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            break;
        }
        rest = rest[name.len()..].trim_start();
        prefix.push(name);
        match rest.strip_prefix("::") {
            Some(next) => rest = next.trim_start(),
            None => break,
        }
    }
    vec![prefix]
}

/// The items of a group whose opening brace `group` follows: `a::B, c}` gives `a::B` and `c`.
fn group_items(group: &str) -> Vec<&str> {
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
/// from `module`, the file's own module path. The file is read whole, comments removed, so that
/// a group rustfmt spreads over several lines counts.
fn targets(module: &[String], text: &str) -> BTreeSet<Vec<String>> {
    let text: String = text.lines().map(code).collect::<Vec<_>>().join("\n");
    let mut found = BTreeSet::new();
    for pos in starts(&text, "crate::") {
        found.extend(paths(&text[pos + "crate::".len()..]));
    }
    for pos in starts(&text, "super::") {
        // `super` is the parent of `x` for `x.rs` and for `x/mod.rs` alike.
        let mut base = module.to_vec();
        let mut rest = &text[pos..];
        while let Some(next) = rest.strip_prefix("super::") {
            base.pop();
            rest = next;
        }
        for path in paths(rest) {
            found.insert(base.iter().cloned().chain(path).collect());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parser_reads_groups_nested_paths_and_supers() {
        let layout = Layout {
            src: PathBuf::new(),
            substages: &["ingest::quic"],
            allowed: &[],
            heading: "",
        };
        let text = "use crate::{api_error::ApiError, store::{Store, TimeRange}};\n\
                    use super::super::metrics::Errors; // crate::app in a comment\n\
                    let url = \"http://x\"; crate::tenant::Tenant::anonymous();\n\
                    /// [`x`](crate::app::start)\n\
                    use crate::rules::{\n    \
                        check::Rule,\n    \
                        metrics::{Counters, Gauges},\n\
                    };\n";
        let module: Vec<String> = ["ingest", "quic", "connection"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let found: BTreeSet<String> = targets(&module, text)
            .iter()
            .filter_map(|t| layout.node(t))
            .collect();
        let expected: BTreeSet<String> = ["api_error", "store", "ingest", "tenant", "rules"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        // `super::super` from `ingest::quic::connection` is `ingest`, and `ingest::metrics` is
        // part of it.
        assert_eq!(found, expected);
    }

    #[test]
    fn a_substage_named_inside_a_group_is_its_own_node() {
        let layout = Layout {
            src: PathBuf::new(),
            substages: &["ingest::quic"],
            allowed: &[],
            heading: "",
        };
        let text = "use crate::ingest::{\n    quic::Listener,\n    push,\n};\n";
        let found: BTreeSet<String> = targets(&["app".to_owned()], text)
            .iter()
            .filter_map(|t| layout.node(t))
            .collect();
        let expected: BTreeSet<String> = ["ingest::quic", "ingest"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn a_substage_is_its_own_node() {
        let layout = Layout {
            src: PathBuf::new(),
            substages: &["ingest::quic"],
            allowed: &[],
            heading: "",
        };
        let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            layout.node(&path(&["ingest", "quic", "tls"])).as_deref(),
            Some("ingest::quic")
        );
        assert_eq!(
            layout.node(&path(&["ingest", "push"])).as_deref(),
            Some("ingest")
        );
    }
}
