//! Folded and `lines` bodies: one series, named by the `name` parameter, one tree.
//!
//! Input: checked [`IngestParams`] and the decoded body. Output: a [`ProfileSet`] of at most one
//! profile (none for a body without stacks); when the `name` parameter carries a `span_id`
//! label, the whole profile is that span's. The parser is `smolder-common`'s, which rejects
//! the whole body at the first bad line, naming it, where Pyroscope silently dropped the rest
//! of the body at a long line and wrapped negative counts.

use smolder_common::{FoldedFormat, FoldedLimits, Profile, SpanTrees, parse_folded};

use super::body::RequestBody;
use super::params::{BodyFormat, IngestParams};
use super::pprof::Converted;
use super::{IngestError, ProfileSet};

/// Parses a folded or lines body into a profile set for `params.series`.
///
/// # Errors
///
/// [`IngestError::Folded`] naming the first bad line.
pub(crate) fn parse(params: &IngestParams, body: &RequestBody) -> Result<ProfileSet, IngestError> {
    let (format, label) = match params.format {
        BodyFormat::Lines => (FoldedFormat::Lines, "lines"),
        _ => (FoldedFormat::Folded, "folded"),
    };
    let tree = parse_folded(&body.bytes, format, &FoldedLimits::default()).map_err(|source| {
        IngestError::Folded {
            format: label,
            source,
        }
    })?;
    let mut out = Converted::default();
    if !tree.is_empty() {
        let mut spans = SpanTrees::new();
        if let Some(span) = params.span {
            spans.add(span, &tree);
        }
        out.push(
            Profile {
                series: params.series.clone(),
                meta: params.meta.clone(),
                from: params.from,
                until: params.until,
                tree,
            },
            label,
            spans,
        );
    }
    Ok(out.into_set(params.format.label(), body.sent_bytes))
}
