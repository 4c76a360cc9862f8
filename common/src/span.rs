//! Span profiles: the samples taken while a traced span ran, kept per span id so that a trace
//! can open the profile of its spans.
//!
//! Input: span ids from pprof sample labels (`span_id`, 16 hex digits, as Pyroscope's SDKs and
//! `pyroscope-otel` send them) and from OTLP's link table (8 bytes). Output: a [`SpanTrees`]
//! beside a profile's tree, one [`Tree`] per [`SpanId`], holding the span's share of the
//! profile's samples. Callers: the OTLP and pprof decoders fill it; the ingest path stores it
//! beside the series' tree without making span ids series labels (they would give every
//! request its own series), and the query path merges the trees of the spans asked for.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::{Labels, Tree};

/// The pprof sample label (and `/ingest` or push series label) holding a span id, as
/// Pyroscope's SDKs and `pyroscope-otel` set it.
pub const SPAN_ID_LABEL: &str = "span_id";
/// The label `pyroscope-otel` sets beside [`SPAN_ID_LABEL`]: the root span's name.
pub const SPAN_NAME_LABEL: &str = "span_name";
/// The label `pyroscope-otel` 1.1 sets beside [`SPAN_ID_LABEL`]: the trace's id.
pub const TRACE_ID_LABEL: &str = "trace_id";

/// Whether `name` is one of the labels that identify a span or trace rather than a series:
/// [`SPAN_ID_LABEL`], [`SPAN_NAME_LABEL`] and [`TRACE_ID_LABEL`]. As series labels they would
/// give every request its own series, so ingest never keeps them as labels; the span id goes
/// to the span index.
pub fn is_span_label(name: &str) -> bool {
    matches!(name, SPAN_ID_LABEL | SPAN_NAME_LABEL | TRACE_ID_LABEL)
}

/// Removes the span labels ([`is_span_label`]) from `labels` and returns the span the
/// `span_id` label named, if it was a valid one: what ingest does with a series name such as
/// `/ingest?name=app.cpu{span_id=...}` or a push series' labels.
pub fn take_span_labels(labels: &mut Labels) -> Option<SpanId> {
    let span = labels.get(SPAN_ID_LABEL).and_then(SpanId::from_label);
    for name in [SPAN_ID_LABEL, SPAN_NAME_LABEL, TRACE_ID_LABEL] {
        labels.remove(name);
    }
    span
}

/// An OpenTelemetry span id: 8 bytes, written as 16 hex digits. All zeros is not a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId(u64);

/// A span id that is not 16 hex digits, or is all zeros.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid span id {0:?}: expected 16 hex digits, not all zero")]
pub struct BadSpanId(pub String);

impl SpanId {
    /// The span id of these 8 bytes (big-endian, so that its hex is the bytes' hex), or `None`
    /// for all zeros, which OpenTelemetry defines as no span.
    pub fn from_bytes(bytes: [u8; 8]) -> Option<SpanId> {
        let id = u64::from_be_bytes(bytes);
        (id != 0).then_some(SpanId(id))
    }

    /// The id's 8 bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }
}

impl FromStr for SpanId {
    type Err = BadSpanId;

    /// 16 hex digits, either case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = unhex(s)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .ok_or_else(|| BadSpanId(s.to_owned()))?;
        SpanId::from_bytes(bytes).ok_or_else(|| BadSpanId(s.to_owned()))
    }
}

impl fmt::Display for SpanId {
    /// 16 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl SpanId {
    /// The span id of a label value: 16 hex digits, else `None` (a malformed or all-zero id
    /// names no span; the sample still counts in its profile).
    pub fn from_label(value: &str) -> Option<SpanId> {
        value.parse().ok()
    }

    /// A comma-separated list of span ids (blanks around each ignored, empty items skipped),
    /// as `/render`'s `spanSelector` and the web UI's links carry them.
    ///
    /// # Errors
    ///
    /// [`BadSpanId`] naming the first item that is not a span id.
    pub fn parse_list(text: &str) -> Result<Vec<SpanId>, BadSpanId> {
        let mut out: Vec<SpanId> = text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// The bytes of an even run of hex digits (either case), or `None`.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// One tree per span: the samples of a profile that carried each span id.
///
/// Every sample here is also in the profile's own tree; this only says which span it ran in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanTrees {
    trees: BTreeMap<SpanId, Tree>,
}

impl SpanTrees {
    /// No spans.
    pub fn new() -> Self {
        SpanTrees::default()
    }

    /// The tree of `span`, created empty on first use.
    pub fn tree_mut(&mut self, span: SpanId) -> &mut Tree {
        self.trees.entry(span).or_default()
    }

    /// The tree of `span`, if it has samples here.
    pub fn get(&self, span: SpanId) -> Option<&Tree> {
        self.trees.get(&span)
    }

    /// Adds every span of `other`, merging the trees of spans both have.
    pub fn merge(&mut self, other: &SpanTrees) {
        for (&span, tree) in &other.trees {
            self.tree_mut(span).merge(tree);
        }
    }

    /// The spans and their trees, in span id order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (SpanId, &Tree)> + '_ {
        self.trees.iter().map(|(&span, tree)| (span, tree))
    }

    /// The merged tree of the spans in `spans` that are here.
    pub fn select(&self, spans: &[SpanId]) -> Tree {
        let mut out = Tree::new();
        for span in spans {
            if let Some(tree) = self.trees.get(span) {
                out.merge(tree);
            }
        }
        out
    }

    /// Multiplies every value by `numerator / denominator`, as [`Tree::scale`] does.
    ///
    /// # Panics
    ///
    /// If `denominator` is zero.
    pub fn scale(&mut self, numerator: u64, denominator: u64) {
        for tree in self.trees.values_mut() {
            tree.scale(numerator, denominator);
        }
    }

    /// Adds `tree` as span `span`'s, merged with what it has.
    pub fn add(&mut self, span: SpanId, tree: &Tree) {
        match self.trees.get_mut(&span) {
            Some(mine) => mine.merge(tree),
            None => {
                self.trees.insert(span, tree.clone());
            }
        }
    }

    /// Drops the spans whose trees are empty (a scale that rounded them to nothing).
    pub fn retain_nonempty(&mut self) {
        self.trees.retain(|_, tree| tree.total() > 0);
    }

    /// The number of spans.
    pub fn len(&self) -> usize {
        self.trees.len()
    }

    /// Whether there are no spans.
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }
}

impl IntoIterator for SpanTrees {
    type Item = (SpanId, Tree);
    type IntoIter = std::collections::btree_map::IntoIter<SpanId, Tree>;

    fn into_iter(self) -> Self::IntoIter {
        self.trees.into_iter()
    }
}

impl FromIterator<(SpanId, Tree)> for SpanTrees {
    /// Span trees from pairs; a span given twice has its trees merged.
    fn from_iter<I: IntoIterator<Item = (SpanId, Tree)>>(pairs: I) -> Self {
        let mut out = SpanTrees::new();
        for (span, tree) in pairs {
            out.add(span, &tree);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_read_and_write_hex() {
        let id: SpanId = "00F067AA0BA902B7".parse().unwrap();
        assert_eq!(id.to_string(), "00f067aa0ba902b7");
        assert_eq!(
            id.to_bytes(),
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        for bad in [
            "",
            "00f067aa0ba902b",
            "00f067aa0ba902b7a0",
            "0000000000000000",
            "zzf067aa0ba902b7",
            "+0f067aa0ba902b7",
        ] {
            assert_eq!(
                bad.parse::<SpanId>(),
                Err(BadSpanId(bad.to_owned())),
                "{bad}"
            );
        }
        assert_eq!(unhex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(SpanId::from_label("00f067aa0ba902b7"), Some(id));
        assert_eq!(SpanId::from_label("not a span"), None);
        assert_eq!(
            SpanId::parse_list(" 00f067aa0ba902b7,,00F067AA0BA902B7 , 0000000000000001"),
            Ok(vec![
                SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 1]).unwrap(),
                id
            ])
        );
        assert_eq!(
            SpanId::parse_list("00f067aa0ba902b7,x"),
            Err(BadSpanId("x".to_owned()))
        );
        assert!(is_span_label("span_id") && is_span_label("trace_id"));
        assert!(!is_span_label("span"));
        let mut labels = Labels::from_pairs([
            ("env", "prod"),
            ("span_id", "00F067AA0BA902B7"),
            ("span_name", "GET /"),
            ("trace_id", "c0712b7cef35caf6bb3ee002b87fc2e4"),
        ])
        .unwrap();
        assert_eq!(take_span_labels(&mut labels), Some(id));
        assert_eq!(labels, Labels::from_pairs([("env", "prod")]).unwrap());
        let mut labels = Labels::from_pairs([("span_id", "bad")]).unwrap();
        assert_eq!(take_span_labels(&mut labels), None);
        assert!(labels.is_empty());
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }

    #[test]
    fn select_merges_only_the_spans_asked_for() {
        let a = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
        let b = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 2]).unwrap();
        let c = SpanId::from_bytes([0, 0, 0, 0, 0, 0, 0, 3]).unwrap();
        let mut spans = SpanTrees::new();
        spans.tree_mut(a).insert_names(["main", "a"], 2);
        spans.tree_mut(b).insert_names(["main", "b"], 3);
        let mut other = SpanTrees::new();
        other.tree_mut(a).insert_names(["main", "a"], 1);
        spans.merge(&other);
        let selected = spans.select(&[a, c]);
        assert_eq!(selected.total(), 3);
        assert_eq!(spans.select(&[a, b]).total(), 6);
        assert_eq!(spans.len(), 2);
    }
}
