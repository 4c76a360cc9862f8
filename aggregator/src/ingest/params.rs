//! The query string of `POST /ingest` and the choice of body format.
//!
//! Input: the request's query pairs and `Content-Type`. Output: [`IngestParams`], with every
//! default applied and every value checked, so that the body parsers never see a bad parameter.

use std::time::SystemTime;

use smolder_common::span::take_span_labels;
use smolder_common::{Aggregation, ProfileMeta, Series, SpanId, timestamp};

use super::IngestError;

/// The formats `/ingest` reads, for error messages.
pub(crate) const SUPPORTED_FORMATS: &str = "folded, lines, pprof, jfr";

/// What the body of an `/ingest` request holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyFormat {
    /// `frame;frame;leaf count` lines (Pyroscope's "groups").
    Folded,
    /// `frame;frame;leaf` lines, one sample each.
    Lines,
    /// A pprof protobuf, gzipped or not.
    Pprof,
    /// The Go SDK's multipart form: `profile`, `prev_profile`, `sample_type_config`.
    PprofForm,
    /// A Java Flight Recorder recording, gzipped or not.
    Jfr,
    /// The Java agent's multipart form: `jfr` and `labels`.
    JfrForm,
}

impl BodyFormat {
    /// The `format` label of `smolder_aggregator_ingest_profiles_total` and the `type` label of
    /// the distributor metrics for text bodies.
    pub(crate) fn label(self) -> &'static str {
        match self {
            BodyFormat::Folded => "folded",
            BodyFormat::Lines => "lines",
            BodyFormat::Pprof | BodyFormat::PprofForm => "pprof",
            BodyFormat::Jfr | BodyFormat::JfrForm => "jfr",
        }
    }

    /// Pyroscope's first-match switch (`v0.37:pkg/server/ingest.go`): the `format` parameter
    /// first, then a multipart `Content-Type`, else folded.
    ///
    /// Two departures, both so that a client mistake is an error rather than silently folded
    /// data: a `format` Smolder does not know is rejected, naming the ones it does, and
    /// `format=pprof` or `format=jfr` with a multipart body reads the form (the body could not
    /// be a bare profile).
    fn select(format: Option<&str>, content_type: &str) -> Result<BodyFormat, IngestError> {
        let multipart = content_type
            .to_ascii_lowercase()
            .contains("multipart/form-data");
        match format {
            Some("folded") => Ok(BodyFormat::Folded),
            Some("lines") => Ok(BodyFormat::Lines),
            Some("pprof") if multipart => Ok(BodyFormat::PprofForm),
            Some("pprof") => Ok(BodyFormat::Pprof),
            Some("jfr") if multipart => Ok(BodyFormat::JfrForm),
            Some("jfr") => Ok(BodyFormat::Jfr),
            Some(other @ ("trie" | "tree" | "speedscope")) => Err(IngestError::UnsupportedFormat {
                format: other.to_owned(),
            }),
            Some(other) => Err(IngestError::UnknownFormat {
                format: other.to_owned(),
            }),
            None if content_type.starts_with("binary/octet-stream+trie")
                || content_type.starts_with("binary/octet-stream+tree") =>
            {
                Err(IngestError::UnsupportedFormat {
                    format: content_type["binary/octet-stream+".len()..]
                        .chars()
                        .take(4)
                        .collect(),
                })
            }
            None if multipart => Ok(BodyFormat::PprofForm),
            None => Ok(BodyFormat::Folded),
        }
    }
}

/// The checked parameters of one `/ingest` request.
#[derive(Clone, Debug)]
pub(crate) struct IngestParams {
    /// The `name` parameter: the series for text bodies, the app prefix and labels for pprof;
    /// without its span labels (`span_id`, `span_name`, `trace_id`), which are never series
    /// labels.
    pub(crate) series: Series,
    /// The span the `name` parameter's `span_id` label names: every sample without a span of
    /// its own ran in it.
    pub(crate) span: Option<SpanId>,
    /// `from`, default now.
    pub(crate) from: SystemTime,
    /// `until`, default now; never before `from`.
    pub(crate) until: SystemTime,
    /// `spyName`, `sampleRate`, `units` and `aggregationType`.
    pub(crate) meta: ProfileMeta,
    /// From `format` and `Content-Type`.
    pub(crate) format: BodyFormat,
}

impl IngestParams {
    /// Reads the query pairs against `now`. Of a repeated parameter the first wins, as Go's
    /// `url.Values.Get` does; an empty value is the same as an absent one.
    ///
    /// # Errors
    ///
    /// An [`IngestError`] naming the parameter for a missing `name`, any malformed value, `until`
    /// before `from`, or a format Smolder does not read.
    pub(crate) fn parse(
        pairs: &[(String, String)],
        content_type: &str,
        now: SystemTime,
    ) -> Result<IngestParams, IngestError> {
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
        };
        let format = BodyFormat::select(get("format"), content_type)?;
        let name = get("name").ok_or(IngestError::MissingName)?;
        let mut series = Series::parse(name).map_err(|source| IngestError::BadName {
            name: name.to_owned(),
            source,
        })?;
        let span = take_span_labels(series.labels_mut());
        let time = |param: &'static str| match get(param) {
            None => Ok(now),
            Some(value) => timestamp::parse(value, now).map_err(|source| IngestError::BadTime {
                param,
                value: value.to_owned(),
                source,
            }),
        };
        let from = time("from")?;
        let until = time("until")?;
        if until < from {
            return Err(IngestError::UntilBeforeFrom {
                from: get("from").unwrap_or("now").to_owned(),
                until: get("until").unwrap_or("now").to_owned(),
            });
        }
        let defaults = ProfileMeta::default();
        let sample_rate = match get("sampleRate") {
            None => defaults.sample_rate,
            Some(value) => value
                .parse::<u32>()
                .ok()
                .filter(|&rate| rate > 0)
                .ok_or_else(|| IngestError::BadSampleRate {
                    value: value.to_owned(),
                })?,
        };
        let aggregation = match get("aggregationType") {
            None => Aggregation::Sum,
            Some(value) => {
                value
                    .parse::<Aggregation>()
                    .map_err(|_| IngestError::BadAggregation {
                        value: value.to_owned(),
                    })?
            }
        };
        let meta = ProfileMeta {
            spy_name: get("spyName").map_or(defaults.spy_name, str::to_owned),
            sample_rate,
            units: get("units").map_or(defaults.units, str::to_owned),
            aggregation,
        };
        Ok(IngestParams {
            series,
            span,
            from,
            until,
            meta,
            format,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(query: &[(&str, &str)], content_type: &str) -> Result<IngestParams, IngestError> {
        let pairs: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        IngestParams::parse(&pairs, content_type, now)
    }

    #[test]
    fn defaults_are_pyroscopes() {
        let params = parse(&[("name", "app.cpu")], "").expect("valid");
        assert_eq!(params.format, BodyFormat::Folded);
        assert_eq!(params.meta, ProfileMeta::default());
        assert_eq!(params.from, params.until);
    }

    #[test]
    fn format_switch_is_first_match() {
        let form = "multipart/form-data; boundary=x";
        let format = |f: Option<&str>, ct: &str| {
            let mut query = vec![("name", "app")];
            if let Some(f) = f {
                query.push(("format", f));
            }
            parse(&query, ct).map(|p| p.format)
        };
        assert_eq!(format(None, form).ok(), Some(BodyFormat::PprofForm));
        assert_eq!(format(Some("lines"), form).ok(), Some(BodyFormat::Lines));
        assert_eq!(format(Some("pprof"), "").ok(), Some(BodyFormat::Pprof));
        assert_eq!(
            format(Some("pprof"), form).ok(),
            Some(BodyFormat::PprofForm)
        );
        assert_eq!(format(Some(""), "").ok(), Some(BodyFormat::Folded));
        assert_eq!(format(Some("jfr"), "").ok(), Some(BodyFormat::Jfr));
        assert_eq!(format(Some("jfr"), form).ok(), Some(BodyFormat::JfrForm));
        assert!(matches!(
            format(None, "binary/octet-stream+trie"),
            Err(IngestError::UnsupportedFormat { .. })
        ));
        assert!(matches!(
            format(Some("groups"), ""),
            Err(IngestError::UnknownFormat { .. })
        ));
    }

    #[test]
    fn first_of_a_repeated_parameter_wins() {
        let params = parse(&[("name", "a.cpu"), ("name", "b.cpu")], "").expect("valid");
        assert_eq!(params.series.app(), "a.cpu");
    }

    #[test]
    fn bad_values_name_the_parameter() {
        let cases: &[&[(&str, &str)]] = &[
            &[],
            &[("name", "a b{")],
            &[("name", "a"), ("from", "yesterday")],
            &[("name", "a"), ("from", "now"), ("until", "now-1h")],
            &[("name", "a"), ("sampleRate", "0")],
            &[("name", "a"), ("sampleRate", "-5")],
            &[("name", "a"), ("aggregationType", "max")],
        ];
        for case in cases {
            assert!(parse(case, "").is_err(), "{case:?} should be rejected");
        }
    }
}
