//! The check after a run: per series, what the aggregator holds against what the fleet was told
//! it holds, through the query API Grafana uses (`querier.v1.SelectSeries`, grouped by the label
//! that tells the fleet's series apart, one point per series over the whole run).
//!
//! A series passes when the aggregator holds at least everything acknowledged and at most that
//! plus what was sent without an answer: nothing acknowledged lost, nothing counted twice.
//! Values come back in the profile type's units (CPU samples as nanoseconds, rounded down per
//! point); the comparison allows that rounding and no more.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use smolder_common::ProfileMeta;
use smolder_common::ProfileTypeId;
use smolder_common::ValueScale;
use smolder_common::querier::{SelectSeriesRequest, SelectSeriesResponse};

use crate::record::{SeriesKey, Tallies, Tally};

/// How one series compared.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The series.
    pub series: SeriesKey,
    /// What the fleet recorded for it.
    pub tally: Tally,
    /// What the aggregator holds, in the query API's units.
    pub stored: f64,
    /// The acknowledged values in those units.
    pub acked: f64,
}

/// The outcome of [`verify`].
#[derive(Clone, Debug, Default)]
pub struct Verification {
    /// Series checked.
    pub series: usize,
    /// Series holding exactly what was acknowledged.
    pub exact: usize,
    /// Series holding more than was acknowledged, within what was sent without an answer.
    pub within_unanswered: usize,
    /// Series holding less than was acknowledged: acknowledged data lost.
    pub lost: Vec<Mismatch>,
    /// Series holding more than was sent: counted twice, or data the fleet never sent.
    pub extra: Vec<Mismatch>,
    /// Series the aggregator returned for the fleet's apps that the fleet has no record of.
    pub unknown: Vec<String>,
}

impl Verification {
    /// Whether every series passed.
    pub fn passed(&self) -> bool {
        self.lost.is_empty() && self.extra.is_empty() && self.unknown.is_empty()
    }
}

impl std::fmt::Display for Verification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} series: {} exact, {} within what had no answer, {} lost acknowledged data, {} more than sent, {} unknown",
            self.series,
            self.exact,
            self.within_unanswered,
            self.lost.len(),
            self.extra.len(),
            self.unknown.len()
        )?;
        for m in self.lost.iter().chain(&self.extra).take(10) {
            write!(
                f,
                "\n  {}{{{}={}}}: stored {}, acknowledged {} ({:?})",
                m.series.app, m.series.label, m.series.value, m.stored, m.acked, m.tally
            )?;
        }
        Ok(())
    }
}

/// Why the check could not be made.
#[derive(Debug)]
pub struct VerifyError(String);

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for VerifyError {}

/// Compares every series of `tallies` with what the aggregator at `http_base`
/// (`http://host:port`) holds over `[from, until]`.
///
/// # Errors
///
/// When a query fails or its answer does not decode.
pub async fn verify(
    http: &reqwest::Client,
    http_base: &str,
    tallies: &Tallies,
    from: SystemTime,
    until: SystemTime,
) -> Result<Verification, VerifyError> {
    // One query per app and label.
    let mut groups: BTreeMap<(&str, &str), Vec<(&SeriesKey, &Tally)>> = BTreeMap::new();
    for (key, tally) in tallies {
        groups
            .entry((key.app.as_str(), key.label))
            .or_default()
            .push((key, tally));
    }
    let ms = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let (start, end) = (
        ms(from - Duration::from_secs(60)),
        ms(until + Duration::from_secs(60)),
    );
    let step = ((end - start) / 1_000 + 10) as f64;
    let mut out = Verification::default();
    for ((app, label), series) in groups {
        let (service, suffix) = app.rsplit_once('.').unwrap_or((app, ""));
        let units = series[0].0.units;
        let request = SelectSeriesRequest {
            profile_type_id: ProfileTypeId::for_series(suffix, units).to_string(),
            label_selector: format!("{{service_name=\"{service}\"}}"),
            start,
            end,
            group_by: vec![label.to_owned()],
            step,
            ..SelectSeriesRequest::default()
        };
        let response = http
            .post(format!(
                "{http_base}/querier.v1.QuerierService/SelectSeries"
            ))
            .header("content-type", "application/proto")
            .header("connect-protocol-version", "1")
            .body(request.encode_to_vec())
            .send()
            .await
            .map_err(|err| VerifyError(format!("SelectSeries of {app}: {err}")))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|err| VerifyError(format!("SelectSeries of {app}: {err}")))?;
        if !status.is_success() {
            return Err(VerifyError(format!(
                "SelectSeries of {app}: {status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let answer = SelectSeriesResponse::decode(body)
            .map_err(|err| VerifyError(format!("SelectSeries of {app}: {err}")))?;
        let mut stored: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        for s in answer.series {
            let value = s
                .labels
                .iter()
                .find(|l| l.name == label)
                .map(|l| l.value.clone())
                .unwrap_or_default();
            let total = s.points.iter().map(|p| p.value).sum::<f64>();
            stored.insert(value, (total, s.points.len()));
        }
        for (key, tally) in series {
            out.series += 1;
            let (held, points) = stored.remove(&key.value).unwrap_or((0.0, 0));
            let scale = ValueScale::of(&ProfileMeta {
                units: key.units.to_owned(),
                sample_rate: key.sample_rate,
                ..ProfileMeta::default()
            });
            let acked = scale.apply(tally.acked) as f64;
            let most = scale.apply(tally.acked + tally.unanswered) as f64;
            // Each point was rounded down once.
            let slack = points as f64 + 0.5;
            let mismatch = || Mismatch {
                series: key.clone(),
                tally: *tally,
                stored: held,
                acked,
            };
            if held + slack < acked {
                out.lost.push(mismatch());
            } else if held > most + slack {
                out.extra.push(mismatch());
            } else if (held - acked).abs() <= slack {
                out.exact += 1;
            } else {
                out.within_unanswered += 1;
            }
        }
        out.unknown.extend(
            stored
                .into_keys()
                .map(|value| format!("{app}{{{label}={value}}}")),
        );
    }
    Ok(out)
}
