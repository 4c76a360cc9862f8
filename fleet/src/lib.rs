//! `smolder-fleet`: a fleet on one box, the load generator of the fleet benchmark
//! (`aggregator/benches/fleet_to_store.rs`) and of the soak tests; a dev-dependency only.
//!
//! A [`Fleet`] is, in one process, [`FleetConfig::agents`] simulated agents, each its own QUIC
//! connection speaking Smolder's wire protocol with the agent's own code
//! (`smolder_agent::ship::connect` and `send_batch`, the spool's sans-IO queue, the reconnect
//! backoff), each closing a window every [`FleetConfig::window`] (20 series of realistic trees
//! from the seeded Zipf corpus, about as large as a busy host's: `host.rs`) under its own agent
//! id and sequence; and Pyroscope clients pushing [`FleetConfig::pushes_per_second`] CPU
//! profiles over HTTP, a third each as pprof and folded `/ingest` and as Connect `push.v1`
//! (`push.rs`). [`Fleet::set_load`] makes every window and push come that many times as
//! often, to find where the aggregator stops keeping up.
//!
//! Every agent holds its windows until they are acknowledged and records, per series, what was
//! acknowledged, refused, sent without an answer, or never sent ([`Tally`]); every push
//! likewise. [`Fleet::snapshot`] reads the counters and the latencies of the interval since the
//! last snapshot (ack latency from a batch's stream opening to its ack; the window's age at its
//! ack, spool time included; a push's answer time), [`Fleet::stop`] drains and returns the
//! [`Record`], and [`verify`] checks it series by series against the aggregator's query API.
//! [`process`] reads a process's RSS and CPU time from `/proc`.
//!
//! ```no_run
//! # async fn example(quic: std::net::SocketAddr, http: std::net::SocketAddr) {
//! use std::time::Duration;
//! use smolder_fleet::{Fleet, FleetConfig};
//!
//! let mut config = FleetConfig::new(quic, http, "data/tls/ca.pem".into(), "token".into());
//! config.agents = 100;
//! let fleet = Fleet::start(config).await;
//! tokio::time::sleep(Duration::from_secs(60)).await;
//! println!("{:?}", fleet.snapshot());
//! let record = fleet.stop(Duration::from_secs(30)).await;
//! let check = smolder_fleet::verify(
//!     &reqwest::Client::new(),
//!     &format!("http://{http}"),
//!     &record.tallies,
//!     record.started,
//!     record.stopped,
//! )
//! .await
//! .unwrap();
//! assert!(check.passed(), "{check}");
//! # }
//! ```

mod agent;
mod host;
pub mod process;
pub mod push;
mod record;
mod verify;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolder_agent::metrics::Metrics as AgentMetrics;
use smolder_agent::ship::ShipConfig;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use record::{Quantiles, SeriesKey, Tallies, Tally, Totals};
pub use verify::{Mismatch, Verification, VerifyError, verify};

use crate::agent::{Agent, Control};
use crate::host::{Pool, host_series, variant};
use crate::push::Format;
use crate::record::{Counters, Latencies};

/// The fleet's shape and rates.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Simulated agents, one QUIC connection each. Default 1,000.
    pub agents: usize,
    /// How often each agent closes a window (and each SDK client pushes) at load 1. Default
    /// `10s`, the agent's and the SDKs' default.
    pub window: Duration,
    /// Pushes per second over HTTP at load 1, a third per format. Default 200.
    pub pushes_per_second: f64,
    /// How agents ship: the aggregator's QUIC address, its CA, the token, batches in flight,
    /// backoff, ack timeout, exactly as an agent's `ship:` section.
    pub ship: ShipConfig,
    /// The aggregator's HTTP address, for pushes.
    pub http: SocketAddr,
    /// Bytes of batches an agent holds unacknowledged (trees as encoded, before lz4) before
    /// it drops its oldest, as `spool.max-bytes`. Held batches cost the generator about 100
    /// bytes each, whatever this says. Default 256 MiB, the agent's default.
    pub spool_max_bytes: u64,
    /// Pushes in flight at most; past it a push is skipped and counted. Default 1,024.
    pub max_pushes_in_flight: usize,
    /// How long a push may take. Default `10s`.
    pub push_timeout: Duration,
    /// Seed of the corpus and trees. Default 7.
    pub seed: u64,
}

impl FleetConfig {
    /// The defaults, shipping to `quic` with `ca` and `token` and pushing to `http`.
    pub fn new(quic: SocketAddr, http: SocketAddr, ca: PathBuf, token: String) -> FleetConfig {
        let ship = ShipConfig {
            aggregator: quic.to_string(),
            ca,
            token,
            ..ShipConfig::default()
        };
        FleetConfig {
            agents: 1_000,
            window: Duration::from_secs(10),
            pushes_per_second: 200.0,
            ship,
            http,
            spool_max_bytes: 256 << 20,
            max_pushes_in_flight: 1_024,
            push_timeout: Duration::from_secs(10),
            seed: 7,
        }
    }
}

/// What one host's window holds, on average over the pool's variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Series per window.
    pub series: usize,
    /// Tree nodes per window.
    pub nodes: f64,
    /// Bytes of encoded trees per window (before lz4).
    pub bytes: f64,
    /// Values of `.cpu` series per window: samples.
    pub cpu_samples: f64,
}

/// The fleet's counters and the latencies of the interval since the last snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot {
    /// Since the fleet started.
    pub elapsed: Duration,
    /// The load factor now.
    pub load: f64,
    /// Cumulative counters.
    pub totals: Totals,
    /// Batch ack latency over the interval: stream opened to ack.
    pub ack: Quantiles,
    /// Window age at its ack over the interval: window closed to ack, spool time included.
    pub age: Quantiles,
    /// Push answer time over the interval.
    pub push: Quantiles,
}

/// What a stopped fleet sent and what became of it.
#[derive(Clone, Debug)]
pub struct Record {
    /// Per series.
    pub tallies: Tallies,
    /// Final counters.
    pub totals: Totals,
    /// Ack latency over the whole run.
    pub ack: Quantiles,
    /// Window age at ack over the whole run.
    pub age: Quantiles,
    /// Push answer time over the whole run.
    pub push: Quantiles,
    /// When the fleet started and stopped, for the check's time range.
    pub started: SystemTime,
    /// See `started`.
    pub stopped: SystemTime,
}

/// A running fleet.
pub struct Fleet {
    counters: Arc<Counters>,
    latencies: Arc<Latencies>,
    load: watch::Sender<f64>,
    stop: watch::Sender<Option<Instant>>,
    agents: Vec<JoinHandle<Tallies>>,
    pushers: Vec<JoinHandle<Tallies>>,
    started: SystemTime,
    epoch: Instant,
    shape: Shape,
}

impl Fleet {
    /// Generates the trees and starts every agent and pusher at load 1. Agents connect and
    /// close their windows spread evenly over the first window, as a fleet whose hosts
    /// started at different times.
    ///
    /// # Panics
    ///
    /// When the HTTP client cannot be built.
    pub async fn start(config: FleetConfig) -> Fleet {
        let seed = config.seed;
        let pool = Arc::new(
            tokio::task::spawn_blocking(move || Pool::generate(seed))
                .await
                .expect("generating the trees"),
        );
        let shape = shape(&pool);
        let counters = Arc::new(Counters::default());
        let latencies = Arc::new(Latencies::default());
        let (load, load_rx) = watch::channel(1.0);
        let (stop, stop_rx) = watch::channel(None);
        let control = Control {
            load: load_rx,
            stop: stop_rx,
        };
        let started = SystemTime::now();
        let run = started
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis()
            .to_string();
        let shared = Arc::new(agent::Shared {
            pool: Arc::clone(&pool),
            counters: Arc::clone(&counters),
            latencies: Arc::clone(&latencies),
            ship: config.ship.clone(),
            metrics: AgentMetrics::new().ship.clone(),
            window: config.window,
            spool_max_bytes: config.spool_max_bytes,
            run,
        });
        let agents = (0..config.agents)
            .map(|index| {
                let phase = config.window.mul_f64(index as f64 / config.agents as f64);
                let agent = Agent::new(Arc::clone(&shared), index);
                tokio::spawn(agent.run(phase, control.clone()))
            })
            .collect();
        let http = reqwest::Client::builder()
            .timeout(config.push_timeout)
            .pool_max_idle_per_host(config.max_pushes_in_flight)
            .build()
            .expect("an HTTP client");
        let pushing = Arc::new(push::Shared {
            pool,
            counters: Arc::clone(&counters),
            latencies: Arc::clone(&latencies),
            http,
            addr: config.http,
            rate: config.pushes_per_second,
            window: config.window,
            in_flight: Arc::new(Semaphore::new(config.max_pushes_in_flight)),
        });
        let pushers = Format::ALL
            .iter()
            .map(|&format| tokio::spawn(push::run(Arc::clone(&pushing), format, control.clone())))
            .collect();
        Fleet {
            counters,
            latencies,
            load,
            stop,
            agents,
            pushers,
            started,
            epoch: Instant::now(),
            shape,
        }
    }

    /// What one host's window holds.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Windows and pushes come `load` times as often from now on (at least 0.01).
    pub fn set_load(&self, load: f64) {
        self.load.send_replace(load.max(0.01));
    }

    /// The counters, and the latencies since the last snapshot.
    pub fn snapshot(&self) -> Snapshot {
        let [ack, age, push] = self.latencies.interval();
        Snapshot {
            elapsed: self.epoch.elapsed(),
            load: *self.load.borrow(),
            totals: self.counters.read(),
            ack,
            age,
            push,
        }
    }

    /// Stops closing windows and pushing; agents go on shipping what they hold for up to
    /// `drain`, then close their connections. Returns the record of the run.
    pub async fn stop(self, drain: Duration) -> Record {
        let stopped = SystemTime::now();
        self.stop.send_replace(Some(Instant::now() + drain));
        let mut tallies = Tallies::new();
        for handle in self.agents.into_iter().chain(self.pushers) {
            let part = handle.await.expect("a fleet task panicked");
            for (key, tally) in part {
                tallies.entry(key).or_default().add(&tally);
            }
        }
        let [ack, age, push] = self.latencies.whole();
        Record {
            tallies,
            totals: self.counters.read(),
            ack,
            age,
            push,
            started: self.started,
            stopped,
        }
    }
}

/// The average window of host 0 over the variants.
fn shape(pool: &Pool) -> Shape {
    let series = host_series(0);
    let (mut nodes, mut bytes, mut cpu) = (0usize, 0usize, 0u64);
    let windows = 64u64;
    for sequence in 0..windows {
        for (i, s) in series.iter().enumerate() {
            let tree = pool.tree(s.kind, s.size, variant(0, sequence, i));
            nodes += tree.nodes;
            bytes += tree.encoded.len();
            if s.kind == host::Kind::Cpu {
                cpu += tree.total;
            }
        }
    }
    let n = windows as f64;
    Shape {
        series: series.len(),
        nodes: nodes as f64 / n,
        bytes: bytes as f64 / n,
        cpu_samples: cpu as f64 / n,
    }
}
