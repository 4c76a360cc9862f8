//! One simulated agent: a window every `window / load`, held until the aggregator acknowledges
//! it, shipped over its own QUIC connection with the agent's own code.
//!
//! The bookkeeping is the agent spool's sans-IO [`Queue`] (waiting, in flight, evicted past
//! the byte bound), the connection and each batch's exchange are
//! [`ship::connect`] and [`ship::send_batch`], the reconnect delays the agent's [`Backoff`].
//! What differs from a real agent: batches are held in memory as the recipe of their trees
//! (pool variants fixed by agent and sequence) and framed again at each send, so that a
//! thousand agents with minutes of backlog cost the generator little, and each batch's fate is
//! tallied per series for the check against the aggregator.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use smolder_agent::ship::backoff::Backoff;
use smolder_agent::ship::{self, Answer, ShipConfig, ShipError, ShipMetrics};
use smolder_agent::spool::queue::{DropReason, Queue};
use smolder_common::wire::{BatchMessage, FrameKind, LabelMessage, SeriesMessage, code, frame};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::host::{HostSeries, Pool, host_series, variant};
use crate::record::{Counters, Latencies, Latency, SeriesKey, Tallies, Tally};

/// What every agent task shares.
pub(crate) struct Shared {
    pub(crate) pool: Arc<Pool>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) latencies: Arc<Latencies>,
    pub(crate) ship: ShipConfig,
    pub(crate) metrics: ShipMetrics,
    pub(crate) window: Duration,
    pub(crate) spool_max_bytes: u64,
    /// Makes this run's agent ids its own: a fleet started again on the same aggregator is a
    /// new fleet, not the old one resending.
    pub(crate) run: String,
}

/// What the fleet tells its tasks while they run.
#[derive(Clone)]
pub(crate) struct Control {
    /// The load factor: windows come `load` times as often.
    pub(crate) load: watch::Receiver<f64>,
    /// Set when the fleet stops: stop producing, ship what is held until this deadline.
    pub(crate) stop: watch::Receiver<Option<Instant>>,
}

/// How often a window closes at `load`.
pub(crate) fn period(base: Duration, load: f64) -> Duration {
    base.div_f64(load.max(0.01))
}

/// A window held until acknowledged.
struct Held {
    start: SystemTime,
    end: SystemTime,
    closed: Instant,
    /// Whether it went out at least once: if so, the aggregator may hold it.
    sent: bool,
}

type Connecting = Pin<
    Box<
        dyn Future<
                Output = (
                    Option<quinn::Endpoint>,
                    Result<quinn::Connection, ShipError>,
                ),
            > + Send,
    >,
>;

/// One agent, `index` of the fleet, whose first window closes one window after `phase`.
pub(crate) struct Agent {
    shared: Arc<Shared>,
    index: usize,
    id: String,
    hostname: String,
    series: Vec<HostSeries>,
    tallies: Vec<Tally>,
    queue: Queue,
    held: HashMap<u64, Held>,
    next_sequence: u64,
}

impl Agent {
    pub(crate) fn new(shared: Arc<Shared>, index: usize) -> Agent {
        let series = host_series(index);
        Agent {
            id: format!("fleet-{}-{index:05}", shared.run),
            hostname: format!("fleet-{index:05}"),
            tallies: vec![Tally::default(); series.len()],
            series,
            queue: Queue::new(shared.spool_max_bytes, Duration::from_secs(365 * 86_400)),
            held: HashMap::new(),
            next_sequence: 1,
            shared,
            index,
        }
    }

    /// Runs until stopped and drained (or the drain deadline); returns what became of every
    /// series' values.
    pub(crate) async fn run(mut self, phase: Duration, mut control: Control) -> Tallies {
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        let max_in_flight = shared.ship.max_batches_in_flight.max(1) as usize;
        let mut backoff = Backoff::new(shared.ship.backoff_min, shared.ship.backoff_max);
        let started = Instant::now();
        let mut next_window = started + phase + period(shared.window, *control.load.borrow());
        let mut retry_at = Some(started + phase);
        let mut endpoint: Option<quinn::Endpoint> = None;
        let mut connecting: Option<Connecting> = None;
        let mut conn: Option<quinn::Connection> = None;
        let mut paused_until: Option<Instant> = None;
        let mut in_flight: JoinSet<(u64, Instant, Result<Answer, ShipError>)> = JoinSet::new();
        let mut deadline: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if deadline.is_some() && self.held.is_empty() {
                break;
            }
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            if conn.is_none() && connecting.is_none() && retry_at.is_none_or(|t| now >= t) {
                retry_at = None;
                connecting = Some(Box::pin(attempt(
                    shared.ship.clone(),
                    endpoint.take(),
                    self.id.clone(),
                    self.hostname.clone(),
                    shared.metrics.clone(),
                )));
            }
            if let Some(c) = &conn
                && paused_until.is_none()
            {
                while in_flight.len() < max_in_flight {
                    let Some(sequence) = self.queue.take_next() else {
                        break;
                    };
                    let frame = self.frame(sequence);
                    counters
                        .batch_bytes
                        .fetch_add(frame.len() as u64, Ordering::Relaxed);
                    if let Some(held) = self.held.get_mut(&sequence) {
                        held.sent = true;
                    }
                    let (c, metrics, timeout) =
                        (c.clone(), shared.metrics.clone(), shared.ship.ack_timeout);
                    in_flight.spawn(async move {
                        let sent = Instant::now();
                        let (sequence, answer) =
                            ship::send_batch(c, sequence, frame, timeout, metrics).await;
                        (sequence, sent, answer)
                    });
                }
            }
            let connected = conn.clone();
            tokio::select! {
                () = tokio::time::sleep_until(next_window), if deadline.is_none() => {
                    let length = period(shared.window, *control.load.borrow());
                    // Now, not the loop's `now`: the select may have waited a whole window.
                    self.close_window(Instant::now(), length);
                    next_window += length;
                }
                Some(joined) = in_flight.join_next() => {
                    if let Ok((sequence, sent, answer)) = joined {
                        match self.answered(sequence, sent, answer, &mut backoff) {
                            Outcome::Fine => {}
                            Outcome::Pause(delay) => paused_until = Some(Instant::now() + delay),
                            Outcome::Broken => {
                                self.lose(&mut conn, &mut in_flight, &mut backoff).await;
                                retry_at = Some(Instant::now() + backoff.next(rand::random()));
                            }
                        }
                    }
                }
                (back, result) = async { connecting.as_mut().expect("checked").await }, if connecting.is_some() => {
                    connecting = None;
                    endpoint = back;
                    match result {
                        Ok(c) => {
                            conn = Some(c);
                            backoff.reset();
                            Counters::inc(&counters.connects);
                            counters.connected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            Counters::inc(&counters.connect_errors);
                            retry_at = Some(Instant::now() + backoff.next(rand::random()));
                        }
                    }
                }
                () = async { tokio::time::sleep_until(retry_at.expect("checked")).await }, if retry_at.is_some() => {}
                _ = async { connected.as_ref().expect("checked").closed().await }, if connected.is_some() => {
                    self.lose(&mut conn, &mut in_flight, &mut backoff).await;
                    retry_at = Some(Instant::now() + backoff.next(rand::random()));
                }
                () = async { tokio::time::sleep_until(paused_until.expect("checked")).await }, if paused_until.is_some() => {
                    paused_until = None;
                }
                changed = control.stop.changed(), if deadline.is_none() => {
                    let stop = if changed.is_ok() { *control.stop.borrow() } else { Some(Instant::now()) };
                    deadline = stop;
                }
            }
        }
        // What is still in flight was sent and has no answer.
        in_flight.abort_all();
        while let Some(joined) = in_flight.join_next().await {
            if let Ok((sequence, sent, answer)) = joined {
                self.answered(sequence, sent, answer, &mut backoff);
            }
        }
        if let Some(c) = conn.take() {
            c.close(code::AGENT_SHUTDOWN.into(), b"fleet stopping");
            counters.connected.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(endpoint) = endpoint {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
        let left: Vec<u64> = self.held.keys().copied().collect();
        for sequence in left {
            self.settle(sequence, Fate::Left);
        }
        self.series
            .iter()
            .zip(&self.tallies)
            .map(|(series, tally)| {
                (
                    SeriesKey {
                        app: series.app(),
                        label: "hostname",
                        value: self.hostname.clone(),
                        units: series.kind.units(),
                        sample_rate: series.kind.sample_rate(),
                    },
                    *tally,
                )
            })
            .collect()
    }

    /// A window of `length` closes: it becomes the next batch, held until acknowledged; a spool
    /// over its bound drops its oldest batches.
    fn close_window(&mut self, now: Instant, length: Duration) {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let end = SystemTime::now();
        let start = end - length;
        let bytes: u64 = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let tree = self
                    .shared
                    .pool
                    .tree(s.kind, s.size, variant(self.index, sequence, i));
                tree.encoded.len() as u64
            })
            .sum();
        self.held.insert(
            sequence,
            Held {
                start,
                end,
                closed: now,
                sent: false,
            },
        );
        Counters::inc(&self.shared.counters.windows);
        for dropped in self.queue.push(sequence, bytes, end) {
            Counters::inc(&self.shared.counters.dropped_full);
            self.settle(dropped.sequence, Fate::Dropped);
        }
    }

    /// The batch frame of `sequence`, the same bytes at every send.
    fn frame(&self, sequence: u64) -> Vec<u8> {
        let held = &self.held[&sequence];
        let nanos = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        };
        let series = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let tree = self
                    .shared
                    .pool
                    .tree(s.kind, s.size, variant(self.index, sequence, i));
                SeriesMessage {
                    app: s.app(),
                    profile_type: s.kind.suffix().to_owned(),
                    labels: vec![LabelMessage {
                        name: "hostname".to_owned(),
                        value: self.hostname.clone(),
                    }],
                    units: s.kind.units().to_owned(),
                    sample_rate: s.kind.sample_rate(),
                    spy_name: "ebpfspy".to_owned(),
                    aggregation: "sum".to_owned(),
                    tree: tree.encoded.clone(),
                }
            })
            .collect();
        let message = BatchMessage {
            agent_id: self.id.clone(),
            sequence,
            start_unix_nanos: nanos(held.start),
            end_unix_nanos: nanos(held.end),
            series,
        };
        frame::encode(FrameKind::Batch, &message)
    }

    /// Books an answer; says what the connection loop must do.
    fn answered(
        &mut self,
        sequence: u64,
        sent: Instant,
        answer: Result<Answer, ShipError>,
        backoff: &mut Backoff,
    ) -> Outcome {
        let counters = &self.shared.counters;
        match answer {
            Ok(Answer::Ack(ack)) => {
                let latencies = &self.shared.latencies;
                latencies.observe(Latency::Ack, sent.elapsed());
                if let Some(held) = self.held.get(&sequence) {
                    latencies.observe(Latency::Age, held.closed.elapsed());
                }
                if ack.duplicate {
                    Counters::inc(&counters.duplicates);
                }
                self.queue.acked(sequence);
                if self.held.contains_key(&sequence) {
                    Counters::inc(&counters.acked);
                    self.settle(sequence, Fate::Acked);
                }
                backoff.reset();
                Outcome::Fine
            }
            Ok(Answer::Reject(reject)) if reject.retryable => {
                Counters::inc(&counters.rejected_retryable);
                self.queue.retry(sequence);
                Outcome::Pause(backoff.next(rand::random()))
            }
            Ok(Answer::Reject(_)) => {
                Counters::inc(&counters.rejected);
                self.queue.remove(sequence, DropReason::Rejected);
                self.settle(sequence, Fate::Refused);
                Outcome::Fine
            }
            Err(_) => {
                Counters::inc(&counters.failed);
                self.queue.retry(sequence);
                Outcome::Broken
            }
        }
    }

    /// The connection is gone or taken as broken: close it, book what was in flight, and send
    /// everything again on the next one.
    async fn lose(
        &mut self,
        conn: &mut Option<quinn::Connection>,
        in_flight: &mut JoinSet<(u64, Instant, Result<Answer, ShipError>)>,
        backoff: &mut Backoff,
    ) {
        if let Some(c) = conn.take() {
            c.close(code::AGENT_SHUTDOWN.into(), b"connection taken as broken");
            self.shared
                .counters
                .connected
                .fetch_sub(1, Ordering::Relaxed);
        }
        // Answers that came in before the close still count; the rest are sent again.
        in_flight.abort_all();
        while let Some(joined) = in_flight.join_next().await {
            if let Ok((sequence, sent, answer)) = joined {
                self.answered(sequence, sent, answer, backoff);
            }
        }
        self.queue.retry_all();
    }

    /// Books batch `sequence`'s values per series and forgets it.
    fn settle(&mut self, sequence: u64, fate: Fate) {
        let Some(held) = self.held.remove(&sequence) else {
            return;
        };
        for (i, s) in self.series.iter().enumerate() {
            let total = self
                .shared
                .pool
                .tree(s.kind, s.size, variant(self.index, sequence, i))
                .total;
            let tally = &mut self.tallies[i];
            match fate {
                Fate::Acked => tally.acked += total,
                Fate::Refused => tally.refused += total,
                Fate::Dropped | Fate::Left if held.sent => tally.unanswered += total,
                Fate::Dropped | Fate::Left => tally.dropped += total,
            }
        }
    }
}

/// What happens to the connection after an answer.
enum Outcome {
    Fine,
    /// A retryable reject: send nothing for this long.
    Pause(Duration),
    /// No answer: the connection is taken as broken, as the agent does.
    Broken,
}

/// How a held batch left.
#[derive(Clone, Copy)]
enum Fate {
    Acked,
    Refused,
    /// Evicted from a full spool.
    Dropped,
    /// Still held when the run ended.
    Left,
}

/// One connection attempt, giving the endpoint back for the next.
async fn attempt(
    config: ShipConfig,
    mut endpoint: Option<quinn::Endpoint>,
    agent_id: String,
    hostname: String,
    metrics: ShipMetrics,
) -> (
    Option<quinn::Endpoint>,
    Result<quinn::Connection, ShipError>,
) {
    // The generator's batches are far inside any aggregator's limits: it does not split them.
    let result = ship::connect(&config, &mut endpoint, &agent_id, &hostname, &metrics)
        .await
        .map(|(conn, _limits)| conn);
    (endpoint, result)
}
