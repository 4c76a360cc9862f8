//! pprof bodies: `format=pprof` and the Go SDK's multipart form.
//!
//! Input: checked [`IngestParams`] and the decoded body. Output: a [`ProfileSet`] with one profile
//! per converted sample type and distinct set of pprof string labels, named
//! `<name's app>.<suffix>{name's labels + sample labels}` (`name` is a prefix here, as in
//! Pyroscope), with the span trees of its samples that carried a `span_id` label (span labels
//! are never series labels; see [`smolder_common::span`]). The Go SDK's form (`pyroscope-go:upstream/remote/remote.go`) carries file
//! fields `profile`, `prev_profile` (the previous cumulative profile) and `sample_type_config`
//! (JSON that replaces the default sample-type table); query parameters as for any `/ingest`.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::request::Parts;
use smolder_common::pprof::{self, Limits, SampleTypeConfig};
use smolder_common::series;
use smolder_common::{
    Aggregation, Profile, ProfileMeta, ProfileSeries, SampleTypes, Series, SpanId, SpanTrees, Tree,
};

use super::body::{FormFields, RequestBody};
use super::params::IngestParams;
use super::{IngestConfig, IngestError, ProfileSet, Transport};
use crate::store::ProfileSpans;

/// The profiles of a request being converted, with the span trees of those that have any: what
/// a [`ProfileSet`] carries.
#[derive(Default)]
pub(crate) struct Converted {
    profiles: Vec<(Profile, &'static str)>,
    spans: ProfileSpans,
}

impl Converted {
    /// Adds `profile`, of distributor `type` `kind`, with its `spans` (empty for none).
    pub(crate) fn push(&mut self, profile: Profile, kind: &'static str, spans: SpanTrees) {
        if !spans.is_empty() {
            self.spans.push((self.profiles.len(), spans));
        }
        self.profiles.push((profile, kind));
    }

    /// The set of an HTTP request of body `format` and `sent_bytes` as sent.
    pub(crate) fn into_set(self, format: &'static str, sent_bytes: usize) -> ProfileSet {
        ProfileSet {
            transport: Transport::Http,
            format,
            sent_bytes,
            profiles: self.profiles,
            spans: self.spans,
        }
    }
}

/// The pprof limits for `config`: a profile may be as large as a decompressed body.
pub(crate) fn limits(config: &IngestConfig) -> Limits {
    Limits {
        max_bytes: config.max_decompressed_bytes,
        ..Limits::default()
    }
}

/// Parses a bare pprof body (`format=pprof`), gzipped or not, with the default sample types.
///
/// # Errors
///
/// [`IngestError::Pprof`] for a profile that does not decode or is over `limits`, and
/// [`IngestError::BadLabel`] or [`IngestError::BadProfileName`] for a label or sample-type name
/// that cannot name a series.
pub(crate) fn parse_body(
    params: &IngestParams,
    body: &RequestBody,
    limits: &Limits,
) -> Result<ProfileSet, IngestError> {
    let bytes = body.inflate.gunzip_part(&body.bytes, "pprof body")?;
    let mut series =
        pprof::parse(&bytes, &sdk_sample_types(), limits).map_err(|source| IngestError::Pprof {
            part: "pprof body".to_owned(),
            source,
        })?;
    normalize_sdk_series(&mut series, params.meta.sample_rate);
    let mut out = Converted::default();
    to_profiles(params, series, &mut out)?;
    Ok(out.into_set("pprof", body.sent_bytes))
}

/// The fields of the Go SDK's form that Smolder reads; others are ignored.
pub(crate) struct Form {
    profile: Bytes,
    prev_profile: Option<Bytes>,
    sample_type_config: Option<Bytes>,
}

/// Reads the multipart form in `body` (already read under the caps and gunzipped), with the
/// request's headers for its boundary. Of a repeated field the first wins.
///
/// # Errors
///
/// [`IngestError::Multipart`] for a malformed form (no boundary, broken parts) and
/// [`IngestError::MissingProfileField`] when no field is named `profile`.
pub(crate) async fn read_form(parts: Parts, body: Bytes) -> Result<Form, IngestError> {
    let mut form = FormFields::read(parts, body).await?;
    let Some(profile) = form.take("profile") else {
        return Err(IngestError::MissingProfileField {
            fields: form.sent(),
        });
    };
    Ok(Form {
        profile,
        prev_profile: form.take("prev_profile"),
        sample_type_config: form.take("sample_type_config"),
    })
}

/// Converts the form: `sample_type_config` (if sent) replaces the default sample types, and
/// cumulative sample types are stored as `profile − prev_profile` per stack when
/// `prev_profile` is sent (as they are otherwise: the SDK sends none on its first upload).
///
/// # Errors
///
/// As [`parse_body`], naming the field at fault.
pub(crate) fn parse_form(
    params: &IngestParams,
    form: Form,
    body: &RequestBody,
    limits: &Limits,
) -> Result<ProfileSet, IngestError> {
    let sample_types = match &form.sample_type_config {
        None => sdk_sample_types(),
        Some(json) => SampleTypes::from_json(json).map_err(|source| IngestError::Pprof {
            part: "sample_type_config field".to_owned(),
            source,
        })?,
    };
    let parse = |bytes: &[u8], field: &str| {
        let part = format!("{field} field");
        let bytes = body.inflate.gunzip_part(bytes, &part)?;
        pprof::parse(&bytes, &sample_types, limits)
            .map_err(|source| IngestError::Pprof { part, source })
    };
    let mut series = parse(&form.profile, "profile")?;
    if form.sample_type_config.is_none() {
        normalize_sdk_series(&mut series, params.meta.sample_rate);
    }
    if let Some(prev) = &form.prev_profile {
        let earlier: HashMap<(String, Vec<(String, String)>), ProfileSeries> =
            parse(prev, "prev_profile")?
                .into_iter()
                .filter(|s| s.cumulative)
                .map(|s| ((s.sample_type.clone(), s.labels.clone()), s))
                .collect();
        for current in series.iter_mut().filter(|s| s.cumulative) {
            let key = (current.sample_type.clone(), current.labels.clone());
            if let Some(earlier) = earlier.get(&key) {
                current.tree = current.tree.subtract(&earlier.tree);
            }
        }
    }
    let mut out = Converted::default();
    to_profiles(params, series, &mut out)?;
    Ok(out.into_set("pprof", body.sent_bytes))
}

/// The sample types read from pprof bodies sent without a `sample_type_config`: Pyroscope's
/// defaults, plus the types of the v1-era SDKs, which a v0 table would silently drop.
/// pyroscope-rs (and so the Python and Ruby SDKs) sends only `cpu` in `nanoseconds`
/// (`pyroscope-rs:src/encode/pprof.rs`), and the .NET profiler `cpu`, `wall`, `alloc_samples`,
/// `alloc_size`, `lock_count`, `lock_time` and `exception`. `cpu` and `wall` are stored as
/// sample counts under the same suffix as a folded `.cpu` upload, by
/// [`normalize_sdk_series`]; the others under their own names, summed, as deltas (those SDKs
/// send deltas).
pub(crate) fn sdk_sample_types() -> SampleTypes {
    let mut types = SampleTypes::default();
    for (name, suffix) in [("cpu", "cpu"), ("wall", "wall")] {
        types.insert(
            name,
            SampleTypeConfig {
                // Empty: keep the pprof unit, so that `normalize_sdk_series` knows what to
                // divide by.
                units: String::new(),
                display_name: suffix.to_owned(),
                aggregation: Aggregation::Sum,
                cumulative: false,
                sampled: true,
            },
        );
    }
    for name in [
        "alloc_samples",
        "alloc_size",
        "lock_count",
        "lock_time",
        "exception",
    ] {
        if types.get(name).is_none() {
            types.insert(
                name,
                SampleTypeConfig {
                    aggregation: Aggregation::Sum,
                    ..SampleTypeConfig::default()
                },
            );
        }
    }
    types
}

/// Completes a conversion with [`sdk_sample_types`]:
/// - a profile that has Go's `samples` type also has `cpu` (Go's CPU profiles carry both) and
///   Node's a `wall` type beside `samples`: the `samples` series already holds those stacks,
///   so the time-valued ones are dropped rather than stored twice;
/// - `cpu` and `wall` values in a time unit become sample counts (value × rate / units per
///   second), with units `samples`, so that they sum with folded `.cpu` uploads. The rate is
///   the profile's (from its period), else `fallback_rate` (`sampleRate`, default 100).
pub(crate) fn normalize_sdk_series(series: &mut Vec<ProfileSeries>, fallback_rate: u32) {
    let timed = |s: &ProfileSeries| s.sample_type == "cpu" || s.sample_type == "wall";
    if series.iter().any(|s| s.sample_type == "samples") {
        series.retain(|s| !timed(s));
    }
    for s in series.iter_mut().filter(|s| timed(s)) {
        let per_second: u64 = match s.units.as_str() {
            "nanoseconds" => 1_000_000_000,
            "microseconds" => 1_000_000,
            "milliseconds" => 1_000,
            "seconds" => 1,
            // Already a count of samples.
            _ => {
                s.units = "samples".to_owned();
                continue;
            }
        };
        let rate = s.sample_rate.unwrap_or(fallback_rate).max(1);
        s.tree.scale(u64::from(rate), per_second);
        s.spans.scale(u64::from(rate), per_second);
        s.spans.retain_nonempty();
        s.sample_rate = Some(rate);
        s.units = "samples".to_owned();
    }
}

/// Converts `series` under the `name` parameter of `params` ([`to_profiles_under`]).
pub(crate) fn to_profiles(
    params: &IngestParams,
    series: Vec<ProfileSeries>,
    out: &mut Converted,
) -> Result<(), IngestError> {
    let prefix = Prefix {
        series: &params.series,
        span: params.span,
        meta: &params.meta,
        range: (params.from, params.until),
    };
    to_profiles_under(&prefix, series, out)
}

/// What converted pprof series are named and stamped with.
pub(crate) struct Prefix<'p> {
    /// App and labels every series gets.
    pub(crate) series: &'p Series,
    /// The span every sample without a span of its own ran in: a span id given with the
    /// prefix (the `name` parameter's, a push series' labels).
    pub(crate) span: Option<SpanId>,
    /// Spy name and the sample rate of types without a period.
    pub(crate) meta: &'p ProfileMeta,
    /// The time the profiles cover.
    pub(crate) range: (std::time::SystemTime, std::time::SystemTime),
}

/// Turns converted pprof series into profiles under `prefix`: app `<prefix app>.<suffix>`,
/// labels `prefix`'s plus the sample's (the sample's win on a clash). Units and aggregation
/// come from the sample type, the sample rate from the profile's period for sampled types and
/// from `meta` otherwise; the spy name from `meta`. Series whose tree is empty are skipped.
/// Each profile keeps the span trees of its samples, and those without a span go to the
/// prefix's span when it has one; cumulative sample types keep none (their trees are not the
/// samples of one span but counts since the process started).
///
/// # Errors
///
/// [`IngestError::BadLabel`] for a pprof label named `__name__` (other names are made valid by
/// [`label_name`]),
/// [`IngestError::BadProfileName`] for a suffix that makes an invalid app name.
pub(crate) fn to_profiles_under(
    prefix: &Prefix<'_>,
    series: Vec<ProfileSeries>,
    out: &mut Converted,
) -> Result<(), IngestError> {
    let (from, until) = prefix.range;
    let meta = prefix.meta;
    for s in series {
        if s.tree.is_empty() {
            continue;
        }
        let mut spans = if s.cumulative {
            SpanTrees::new()
        } else {
            s.spans
        };
        if let Some(span) = prefix.span.filter(|_| !s.cumulative) {
            let mut spanned = Tree::new();
            for (_, tree) in spans.iter() {
                spanned.merge(tree);
            }
            let rest = s.tree.subtract(&spanned);
            if rest.total() > 0 {
                spans.add(span, &rest);
            }
        }
        let prefix = prefix.series;
        let mut labels = prefix.labels().clone();
        for (name, value) in &s.labels {
            labels
                .insert(label_name(name), value)
                .map_err(|source| IngestError::BadLabel {
                    name: name.clone(),
                    source,
                })?;
        }
        let app = format!("{}.{}", prefix.app(), s.name_suffix);
        let name = Series::new(app.clone(), labels)
            .map_err(|source| IngestError::BadProfileName { name: app, source })?;
        let kind = type_label(&s.name_suffix);
        out.push(
            Profile {
                series: name,
                meta: ProfileMeta {
                    spy_name: meta.spy_name.clone(),
                    sample_rate: s.sample_rate.unwrap_or(meta.sample_rate),
                    units: s.units,
                    aggregation: s.aggregation,
                },
                from,
                until,
                tree: s.tree,
            },
            kind,
            spans,
        );
    }
    Ok(())
}

/// A pprof label name as a series label name ([`series::sanitize_label_name`]). Go programs
/// label samples freely (`http-route`); rejecting the whole profile for that would lose it, and
/// Pyroscope sanitizes the same way.
pub(super) fn label_name(name: &str) -> String {
    series::sanitize_label_name(name)
}

/// The `type` label of the distributor metrics for a profile type. Suffixes come from the
/// client's `sample_type_config`, so anything outside the known profile types counts as
/// `other`, keeping the label bounded.
pub(super) fn type_label(suffix: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "cpu",
        "itimer",
        "wall",
        "inuse_objects",
        "inuse_space",
        "alloc_objects",
        "alloc_space",
        "goroutines",
        "mutex_count",
        "mutex_duration",
        "block_count",
        "block_duration",
        "exceptions",
        "alloc_in_new_tlab_objects",
        "alloc_in_new_tlab_bytes",
        "alloc_outside_tlab_objects",
        "alloc_outside_tlab_bytes",
        "lock_count",
        "lock_duration",
    ];
    KNOWN
        .iter()
        .find(|&&known| known == suffix)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use smolder_common::Tree;
    use smolder_common::pprof::EncodeOptions;

    use super::*;

    #[test]
    fn series_are_named_under_the_prefix() {
        let mut tree = Tree::new();
        tree.insert_names(["main", "work"], 30);
        let body = pprof::encode(&tree, &EncodeOptions::cpu_samples(250)).to_bytes(true);
        let series = pprof::parse(&body, &SampleTypes::default(), &Limits::default())
            .expect("valid profile");
        let prefix = Series::parse("shop{env=prod}").expect("valid name");
        let meta = ProfileMeta::default();
        let now = std::time::SystemTime::now();
        let mut out = Converted::default();
        let prefix = Prefix {
            series: &prefix,
            span: None,
            meta: &meta,
            range: (now, now),
        };
        to_profiles_under(&prefix, series, &mut out).expect("valid series");
        let profiles = out.profiles;
        assert_eq!(profiles.len(), 1);
        assert!(out.spans.is_empty());
        let (profile, kind) = &profiles[0];
        assert_eq!(profile.series.to_string(), "shop.cpu{env=prod}");
        assert_eq!(profile.meta.sample_rate, 250);
        assert_eq!(*kind, "cpu");
        assert_eq!(profile.tree, tree);
    }

    /// A prefix's span (`name=app.cpu{span_id=...}`, a push series' `span_id`) takes the
    /// samples that carry no span of their own; cumulative types keep no spans.
    #[test]
    fn samples_without_a_span_go_to_the_prefix_span() {
        let own: SpanId = "00f067aa0ba902b7".parse().expect("span id");
        let prefix_span: SpanId = "5a561accaab40cf2".parse().expect("span id");
        let mut tree = Tree::new();
        tree.insert_names(["main", "own"], 4);
        tree.insert_names(["main", "rest"], 6);
        let mut spans = SpanTrees::new();
        spans.tree_mut(own).insert_names(["main", "own"], 4);
        let series = |cumulative| ProfileSeries {
            sample_type: "samples".to_owned(),
            name_suffix: "cpu".to_owned(),
            units: "samples".to_owned(),
            aggregation: Aggregation::Sum,
            cumulative,
            sample_rate: Some(100),
            labels: Vec::new(),
            tree: tree.clone(),
            spans: spans.clone(),
        };
        let app = Series::parse("shop").expect("valid name");
        let meta = ProfileMeta::default();
        let now = std::time::SystemTime::now();
        let prefix = Prefix {
            series: &app,
            span: Some(prefix_span),
            meta: &meta,
            range: (now, now),
        };
        let mut out = Converted::default();
        to_profiles_under(&prefix, vec![series(false), series(true)], &mut out)
            .expect("valid series");
        assert_eq!(out.profiles.len(), 2);
        assert_eq!(out.spans.len(), 1, "none for the cumulative series");
        let (index, spans) = &out.spans[0];
        assert_eq!(*index, 0);
        let folded = |span| smolder_common::to_folded(spans.get(span).expect("a span"));
        assert_eq!(folded(own), "main;own 4\n");
        assert_eq!(folded(prefix_span), "main;rest 6\n");
    }

    #[test]
    fn unknown_types_count_as_other() {
        assert_eq!(type_label("alloc_space"), "alloc_space");
        assert_eq!(type_label("my_custom_type"), "other");
        assert_eq!(label_name("http-route"), "http_route");
        assert_eq!(label_name("process.runtime.name"), "process.runtime.name");
    }
}
