//! Pyroscope clients: profiles pushed over HTTP the three ways SDKs push them, a third each:
//! gzipped pprof to `POST /ingest?format=pprof` (Go, Java, .NET, Node), folded text to
//! `POST /ingest?format=folded` (Python, Ruby, eBPF), and Connect's `push.v1` (Alloy, the v1
//! SDKs).
//!
//! Each format has its clients (instances), each pushing a 10 s CPU profile every `window /
//! load` as an SDK does, one request at a time per format at an even rate. A push is
//! acknowledged by a 2xx answer; 429 and 503 are the aggregator shedding load (with
//! `Retry-After`, counted apart); any other status is a refusal; a connection refused means
//! it was never sent, and no answer (a timeout, a connection reset) leaves it unknown whether
//! it was stored. Clients do not retry,
//! as Pyroscope's SDKs do not, so that a push is stored at most once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::agent::{Control, period};
use crate::host::{PUSH_HZ, Pool};
use crate::record::{Counters, Latencies, Latency, SeriesKey, Tallies};

/// Apps per format: each client belongs to one.
const APPS: usize = 10;

/// How a client pushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Pprof,
    Folded,
    Connect,
}

impl Format {
    pub(crate) const ALL: [Format; 3] = [Format::Pprof, Format::Folded, Format::Connect];

    fn name(self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Folded => "folded",
            Format::Connect => "connect",
        }
    }

    /// The units the aggregator stores this format's CPU profiles in.
    fn stored(self) -> (&'static str, u32) {
        ("samples", PUSH_HZ)
    }
}

/// What every pusher shares.
pub(crate) struct Shared {
    pub(crate) pool: Arc<Pool>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) latencies: Arc<Latencies>,
    pub(crate) http: reqwest::Client,
    pub(crate) addr: SocketAddr,
    /// Pushes per second over all formats at load 1.
    pub(crate) rate: f64,
    pub(crate) window: Duration,
    pub(crate) in_flight: Arc<Semaphore>,
}

/// One format's clients, until stopped; returns what became of each series' samples.
pub(crate) async fn run(shared: Arc<Shared>, format: Format, mut control: Control) -> Tallies {
    let rate = shared.rate / Format::ALL.len() as f64;
    if rate <= 0.0 {
        return Tallies::new();
    }
    // Each client pushes once a window at load 1.
    let clients = ((rate * shared.window.as_secs_f64()).round() as usize).max(1);
    let base = Duration::from_secs_f64(1.0 / rate);
    let mut tallies = Tallies::new();
    let mut requests: JoinSet<(SeriesKey, u64, Result<(), Answer>)> = JoinSet::new();
    let mut next = Instant::now() + base.mul_f64(format as u32 as f64 / 3.0);
    let mut count = 0usize;
    let mut stopping = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next), if !stopping => {
                next += period(base, *control.load.borrow());
                let client = count % clients;
                count += 1;
                let Ok(permit) = Arc::clone(&shared.in_flight).try_acquire_owned() else {
                    Counters::inc(&shared.counters.pushes_skipped);
                    continue;
                };
                let shared = Arc::clone(&shared);
                requests.spawn(async move {
                    let outcome = push(&shared, format, client, count).await;
                    drop(permit);
                    outcome
                });
            }
            Some(done) = requests.join_next() => {
                if let Ok((key, total, outcome)) = done {
                    let tally = tallies.entry(key).or_default();
                    match outcome {
                        Ok(()) => tally.acked += total,
                        Err(Answer::Refused) => tally.refused += total,
                        Err(Answer::Unknown) => tally.unanswered += total,
                        Err(Answer::Unsent) => tally.dropped += total,
                    }
                }
            }
            changed = control.stop.changed(), if !stopping => {
                let _ = changed;
                stopping = true;
            }
            else => break,
        }
        if stopping && requests.is_empty() {
            break;
        }
    }
    tallies
}

/// Why a push is not acknowledged.
enum Answer {
    /// The aggregator answered and did not store it.
    Refused,
    /// No answer: stored or not.
    Unknown,
    /// Not sent: the connection could not be made.
    Unsent,
}

/// One push of client `client`; `count` picks its profile.
async fn push(
    shared: &Shared,
    format: Format,
    client: usize,
    count: usize,
) -> (SeriesKey, u64, Result<(), Answer>) {
    let body = &shared.pool.pushes[count % shared.pool.pushes.len()];
    let service = format!("sdk-{}-{:02}", format.name(), client % APPS);
    let instance = format!("{}-{client:04}", format.name());
    let (units, sample_rate) = format.stored();
    let key = SeriesKey {
        app: format!("{service}.cpu"),
        label: "instance",
        value: instance.clone(),
        units,
        sample_rate,
    };
    let until = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs();
    let from = until - 10;
    let addr = shared.addr;
    let request = match format {
        Format::Pprof => shared
            .http
            .post(format!("http://{addr}/ingest"))
            .query(&[
                ("name", format!("{service}{{instance={instance}}}")),
                ("from", from.to_string()),
                ("until", until.to_string()),
                ("format", "pprof".to_owned()),
                ("spyName", "gospy".to_owned()),
            ])
            .body(body.pprof.clone()),
        Format::Folded => shared
            .http
            .post(format!("http://{addr}/ingest"))
            .query(&[
                ("name", format!("{service}.cpu{{instance={instance}}}")),
                ("from", from.to_string()),
                ("until", until.to_string()),
                ("format", "folded".to_owned()),
                ("sampleRate", PUSH_HZ.to_string()),
                ("spyName", "pyspy".to_owned()),
            ])
            .body(body.folded.clone()),
        Format::Connect => {
            let request = wire::push_request(
                &[
                    ("__name__", "process_cpu"),
                    ("service_name", &service),
                    ("instance", &instance),
                ],
                body.pprof.clone(),
            );
            shared
                .http
                .post(format!("http://{addr}/push.v1.PusherService/Push"))
                .header("content-type", "application/proto")
                .body(request.encode_to_vec())
        }
    };
    let counters = &shared.counters;
    Counters::inc(&counters.pushes);
    let started = Instant::now();
    let outcome = match request.send().await {
        Ok(response) if response.status().is_success() => {
            // Read to the end, so that the connection goes back to the pool.
            let _ = response.bytes().await;
            Counters::inc(&counters.pushes_ok);
            Ok(())
        }
        Ok(response) => {
            let status = response.status().as_u16();
            if matches!(status, 429 | 503) {
                Counters::inc(&counters.pushes_refused);
                if response.headers().contains_key("retry-after") {
                    Counters::inc(&counters.pushes_retry_after);
                }
            } else {
                Counters::inc(&counters.pushes_failed);
            }
            let _ = response.bytes().await;
            Err(Answer::Refused)
        }
        // Nothing reached the aggregator: a connection refused (it is down).
        Err(err) if err.is_connect() => {
            Counters::inc(&counters.pushes_unreachable);
            Err(Answer::Unsent)
        }
        Err(_) => {
            Counters::inc(&counters.pushes_unanswered);
            Err(Answer::Unknown)
        }
    };
    if matches!(outcome, Ok(()) | Err(Answer::Refused)) {
        shared.latencies.observe(Latency::Push, started.elapsed());
    }
    (key, body.total, outcome)
}

/// `push.v1` messages, written from `grafana/pyroscope:api/push/v1/push.proto` so that clients
/// speak the wire format independently of the aggregator's definitions.
pub mod wire {
    /// A push of one series with `labels` and one pprof `profile`.
    pub fn push_request(labels: &[(&str, &str)], profile: Vec<u8>) -> PushRequest {
        PushRequest {
            series: vec![RawProfileSeries {
                labels: labels
                    .iter()
                    .map(|(name, value)| LabelPair {
                        name: (*name).to_owned(),
                        value: (*value).to_owned(),
                    })
                    .collect(),
                samples: vec![RawSample {
                    raw_profile: profile,
                    id: "5f0c7c4e-4a3b-4f0e-9d1a-2b8c6d7e8f90".to_owned(),
                }],
            }],
        }
    }

    /// `push.v1.PushRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        /// The profiles, by label set.
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }

    /// `push.v1.RawProfileSeries`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        /// The series' labels.
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        /// Its profiles.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }

    /// `types.v1.LabelPair`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LabelPair {
        /// The name.
        #[prost(string, tag = "1")]
        pub name: String,
        /// The value.
        #[prost(string, tag = "2")]
        pub value: String,
    }

    /// `push.v1.RawSample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawSample {
        /// A pprof profile, gzipped or not.
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        /// The profile's id.
        #[prost(string, tag = "2")]
        pub id: String,
    }
}
