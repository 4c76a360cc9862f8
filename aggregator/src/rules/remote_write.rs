//! Prometheus remote write: every rule's counters pushed to a receiver on an interval.
//!
//! Input: the counters of [`Rules`], copied each `rules.remote-write-interval`. Output: one
//! snappy-compressed protobuf `WriteRequest` (remote-write 1.0) per interval, `POST`ed to
//! `rules.remote-write-url`, each series labelled with `__name__`, its `group_by` labels and
//! `rules.remote-write-labels`, stamped with the push time. The values are the cumulative
//! counters that `/exported-metrics` serves, so `rate()` reads them the same way on either path.
//! Owns: the task started by `app` when a URL is set; a failed push is counted and logged, and
//! the next interval sends the counters again (they are cumulative, so nothing is lost but a
//! point).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use prost::Message;
use smolder_daemon::Heartbeat;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{CounterValue, Rules, RulesConfig, RulesError, RulesMetrics};

/// `prometheus.WriteRequest`.
#[derive(Clone, PartialEq, Message)]
struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(double, tag = "1")]
    value: f64,
    #[prost(int64, tag = "2")]
    timestamp: i64,
}

/// Checks the remote-write settings.
///
/// # Errors
///
/// [`RulesError::RemoteWriteUrl`] for a URL that is not plain `http://`,
/// [`RulesError::RemoteWriteLabel`] for an invalid label name.
pub(crate) fn check(config: &RulesConfig) -> Result<(), RulesError> {
    let url = &config.remote_write_url;
    if url.is_empty() {
        return Ok(());
    }
    let bad = |reason| RulesError::RemoteWriteUrl {
        url: url.clone(),
        reason,
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    match parsed.scheme() {
        "http" => {}
        "https" => {
            return Err(bad(
                "https is not supported; push to a local Prometheus agent or a TLS proxy over http",
            ));
        }
        _ => return Err(bad("expected an http:// URL")),
    }
    if parsed.host_str().is_none() {
        return Err(bad("no host"));
    }
    if config.remote_write_interval.is_zero() {
        return Err(bad("rules.remote-write-interval must be more than zero"));
    }
    for name in config.remote_write_labels.keys() {
        if !smolder_common::prometheus::is_user_label_name(name) {
            return Err(RulesError::RemoteWriteLabel { name: name.clone() });
        }
    }
    Ok(())
}

/// Builds the request body for `samples` at `timestamp_ms`: protobuf, then snappy (block
/// format, as the protocol requires).
fn encode(samples: Vec<CounterValue>, external: &[(String, String)], timestamp_ms: i64) -> Vec<u8> {
    let timeseries = samples
        .into_iter()
        .map(
            |CounterValue {
                 name,
                 labels,
                 value,
             }| {
                let mut labels: Vec<Label> = std::iter::once(("__name__".to_owned(), name))
                    .chain(labels)
                    .chain(external.iter().cloned())
                    .map(|(name, value)| Label { name, value })
                    .collect();
                // The protocol requires labels sorted by name; a group_by label wins over an
                // external one of the same name, as Prometheus' external labels do.
                labels.sort_by(|a, b| a.name.cmp(&b.name));
                labels.dedup_by(|later, earlier| later.name == earlier.name);
                TimeSeries {
                    labels,
                    samples: vec![Sample {
                        value,
                        timestamp: timestamp_ms,
                    }],
                }
            },
        )
        .collect();
    let proto = WriteRequest { timeseries }.encode_to_vec();
    snap::raw::Encoder::new()
        .compress_vec(&proto)
        .expect("snappy compresses any input under 4 GiB")
}

/// Pushes the counters of `rules` every interval, for as long as the aggregator runs, beating
/// `beat` at each (degraded while the receiver fails: the loop works, its peer does not).
pub(crate) async fn run(
    rules: Arc<Rules>,
    config: RulesConfig,
    metrics: RulesMetrics,
    beat: Heartbeat,
) {
    let url = config.remote_write_url.clone();
    let span = info_span!("remote_write", %url);
    async move {
        let client = match reqwest::Client::builder()
            .timeout(config.remote_write_timeout)
            .build()
        {
            Ok(client) => client,
            Err(err) => {
                warn!(error = %err, "cannot build the HTTP client; remote write is off");
                beat.degraded(format_args!("remote write is off: {err}"));
                return;
            }
        };
        let external: Vec<(String, String)> = config
            .remote_write_labels
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let mut ticker = tokio::time::interval(config.remote_write_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            beat.beating(ticker.tick()).await;
            let samples = rules.snapshot();
            if samples.is_empty() {
                beat.alive();
                continue;
            }
            let count = samples.len();
            let now_ms = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let body = encode(samples, &external, now_ms);
            let started = Instant::now();
            let sent = client
                .post(&url)
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", "snappy")
                .header("x-prometheus-remote-write-version", "0.1.0")
                .body(body)
                .send()
                .await;
            metrics
                .remote_write_duration
                .observe(started.elapsed().as_secs_f64());
            let outcome = match sent {
                Ok(response) if response.status().is_success() => Ok(()),
                Ok(response) => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    Err(format!("{status}: {}", text.trim()))
                }
                Err(err) => Err(err.to_string()),
            };
            match outcome {
                Ok(()) => {
                    metrics
                        .remote_write_requests
                        .with_label_values(&["success"])
                        .inc();
                    metrics.remote_write_samples.inc_by(count as u64);
                    beat.beat();
                    if failing {
                        info!(samples = count, "remote write recovered");
                        failing = false;
                    }
                    debug!(samples = count, "pushed");
                }
                Err(error) => {
                    metrics
                        .remote_write_requests
                        .with_label_values(&["error"])
                        .inc();
                    beat.degraded(format_args!("the receiver {url} fails: {error}"));
                    if failing {
                        debug!(%error, "remote write still failing");
                    } else {
                        warn!(%error, "remote write failed; retrying every interval");
                        failing = true;
                    }
                }
            }
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_back_with_sorted_labels() {
        let body = encode(
            vec![CounterValue {
                name: "app_total".to_owned(),
                labels: vec![("env".to_owned(), "prod".to_owned())],
                value: 2.5,
            }],
            &[
                ("aggregator".to_owned(), "eu".to_owned()),
                ("env".to_owned(), "x".to_owned()),
            ],
            1_700_000_000_000,
        );
        let proto = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let request = WriteRequest::decode(proto.as_slice()).unwrap();
        let series = &request.timeseries[0];
        let labels: Vec<(&str, &str)> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("__name__", "app_total"),
                ("aggregator", "eu"),
                ("env", "prod")
            ]
        );
        assert_eq!(
            series.samples,
            [Sample {
                value: 2.5,
                timestamp: 1_700_000_000_000
            }]
        );
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        let with = |url: &str| RulesConfig {
            remote_write_url: url.to_owned(),
            ..RulesConfig::default()
        };
        assert!(check(&with("")).is_ok());
        assert!(check(&with("http://127.0.0.1:9090/api/v1/write")).is_ok());
        assert!(
            check(&with("https://x/api/v1/write"))
                .unwrap_err()
                .to_string()
                .contains("https is not supported")
        );
        assert!(check(&with("nope")).is_err());
    }
}
