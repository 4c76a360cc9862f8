//! Scraped bodies → window profiles: decode under limits, map sample types, subtract the
//! previous scrape of cumulative types, name the series.
//!
//! Input: a response body and the [`Target`] it came from. Output: [`Scraped`], the
//! [`Profile`]s to submit. Caller: the target's scrape loop, on the blocking pool. Pure apart
//! from the [`Deltas`] it is handed.
//!
//! Series are named as Pyroscope names pull-mode series: `<app>.<suffix>{labels}`, where the
//! suffix comes from the profile's sample-type table (`cpu`, `alloc_space`, `block_count`...)
//! and the labels are the target's (`job`, `instance`, discovery and relabel results) plus the
//! pprof sample labels. A sample label whose name a target label already has is kept as
//! `exported_<name>`, as Prometheus does; names are sanitized to `[A-Za-z0-9_.]`.

use std::borrow::Cow;
use std::time::SystemTime;

use smolder_common::pprof::{self, Limits, PprofError, SampleTypeConfig};
use smolder_common::{Labels, Profile, ProfileMeta, Series};

use super::delta::{Delta, Deltas};
use super::target::Target;

/// When the scraped profile was taken.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Start of the span a snapshot or a duration profile covers.
    pub from: SystemTime,
    /// Its end.
    pub until: SystemTime,
    /// Start of the span a cumulative delta covers: the previous successful scrape.
    pub delta_from: SystemTime,
}

/// What one scrape gave.
#[derive(Debug, Default)]
pub struct Scraped {
    /// The profiles to submit, one per series; empty trees are left out.
    pub profiles: Vec<Profile>,
    /// The number of pprof samples in the body.
    pub samples: usize,
    /// Cumulative series whose counters went down since the previous scrape.
    pub resets: u64,
}

/// Why a body could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// The body is not a usable pprof profile (or is one past `decompressed-size-limit`).
    #[error("response is not a usable pprof profile (content-type {content_type:?})")]
    Pprof {
        /// The response's content type, which often explains (`text/html`).
        content_type: String,
        /// The decoder's error.
        source: PprofError,
    },
    /// A series name could not be built from the target and the sample labels.
    #[error("cannot name series {app}.{suffix}")]
    Series {
        /// The application name.
        app: String,
        /// The sample type suffix.
        suffix: String,
        /// Why.
        source: smolder_common::SeriesError,
    },
}

/// Converts one scraped body of `target`.
///
/// `gzip` says the transport was gzip-encoded (`Content-Encoding: gzip`); a gzipped pprof
/// body, which is what Go serves, is recognised by its magic bytes either way.
///
/// # Errors
///
/// A [`ConvertError`] when the body is not a pprof profile within `limits`.
pub fn convert(
    body: &[u8],
    gzip: bool,
    content_type: &str,
    target: &Target,
    span: Span,
    deltas: &mut Deltas,
    limits: &Limits,
) -> Result<Scraped, ConvertError> {
    let pprof_error = |source| ConvertError::Pprof {
        content_type: content_type.to_owned(),
        source,
    };
    let body: Cow<'_, [u8]> = if gzip {
        pprof::decompress(body, limits).map_err(pprof_error)?
    } else {
        Cow::Borrowed(body)
    };
    let profile = pprof::decode(&body, limits).map_err(pprof_error)?;
    let mut sample_types = target.sample_types.clone();
    if target.all_sample_types {
        for value_type in &profile.sample_type {
            let name = usize::try_from(value_type.r#type)
                .ok()
                .and_then(|i| profile.string_table.get(i))
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .unwrap_or_default();
            if !name.is_empty() && sample_types.get(&name).is_none() {
                sample_types.insert(name, SampleTypeConfig::default());
            }
        }
    }
    let series = pprof::to_series(&profile, &sample_types, limits).map_err(pprof_error)?;
    let mut out = Scraped {
        samples: profile.sample.len(),
        ..Scraped::default()
    };
    for s in series {
        let (tree, from) = if s.cumulative {
            match deltas.handle((s.sample_type.clone(), s.labels.clone()), s.tree) {
                Delta::Primed => continue,
                Delta::Reset => {
                    out.resets += 1;
                    continue;
                }
                Delta::Ready(tree) => (tree, span.delta_from),
            }
        } else {
            (s.tree, span.from)
        };
        if tree.total() == 0 {
            continue;
        }
        let app = format!("{}.{}", target.app, s.name_suffix);
        let labels = series_labels(&target.labels, &s.labels);
        let series = Series::new(app, labels).map_err(|source| ConvertError::Series {
            app: target.app.clone(),
            suffix: s.name_suffix.clone(),
            source,
        })?;
        out.profiles.push(Profile {
            series,
            meta: ProfileMeta {
                spy_name: target.spy_name.clone(),
                sample_rate: s.sample_rate.unwrap_or(0),
                units: s.units,
                aggregation: s.aggregation,
            },
            from,
            until: span.until,
            tree,
        });
    }
    deltas.end_scrape();
    Ok(out)
}

/// The target's labels plus the sample's, sanitized; the target's win.
fn series_labels(target: &Labels, sample: &[(String, String)]) -> Labels {
    let mut labels = target.clone();
    for (name, value) in sample {
        let mut name = smolder_common::series::sanitize_label_name(name);
        if target.contains(&name) || name.starts_with("__") {
            name = format!("exported_{name}");
        }
        // Names are sanitized and never `__name__`, so insert cannot fail; a label that still
        // could not be set is left out rather than losing the profile.
        let _ = labels.insert(name, value.clone());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_labels_never_override_target_labels() {
        let target = Labels::from_pairs([("job", "j"), ("instance", "h:1")]).unwrap();
        let labels = series_labels(
            &target,
            &[
                ("instance".to_owned(), "x".to_owned()),
                ("http-route".to_owned(), "/a".to_owned()),
                ("__name__".to_owned(), "n".to_owned()),
            ],
        );
        assert_eq!(
            labels.to_string(),
            "{exported___name__=n,exported_instance=x,http_route=/a,instance=h:1,job=j}"
        );
    }
}
