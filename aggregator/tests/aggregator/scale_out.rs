//! The multi-host test of object-storage mode: a three-node Garage cluster (replication factor
//! 3, a zone per node), three aggregator processes on its one bucket, two agent processes
//! (each scraping a pprof target of its own) and a push client process
//! (`tests/clients/push_client.py`), every aggregator and Garage node in a network namespace of
//! its own. Each aggregator has two links, one
//! to the agents and the push client (a veth pair to this namespace, [`Netns`]) and one to the
//! bucket (a port on the storage [`Bridge`] the Garage nodes are on), so that it can be cut off
//! from the bucket while its clients still reach it.
//!
//! While the agents scrape their targets and ship a window every two seconds, and the client
//! pushes ten profiles a second,
//! one test goes through the faults in turn and says what each did:
//!
//! 1. `kill -9` of the aggregator an agent ships to, its data directory deleted: the agents on
//!    it move to another within 30 s, and it comes back empty (a new machine in its place);
//! 2. an aggregator cut off from the bucket: it refuses (503, retryable rejects) rather than
//!    acknowledge what it cannot upload, agents move on at once, and it catches up once the
//!    link is back;
//! 3. one Garage node killed: ingest and queries go on (its replicas answer for it), and the
//!    push latency before and during is printed;
//! 4. a batch stored by one aggregator whose ack was lost, sent again to another: counted once;
//! 5. two aggregators configured to compact the same range (both compact whatever the election
//!    says): totals exact through every aggregator at every check.
//!
//! At the end every series totals what was sent (agents' profiles exactly, pushes between what
//! was acknowledged and that plus what got no answer), and flame graphs and `SelectSeries`
//! totals are identical through each aggregator. Needs root, `ip` and Garage, as the
//! object-storage tests do.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use smolder_common::querier::{SelectSeriesRequest, SelectSeriesResponse};
use smolder_test_support::garage::Cluster;
use smolder_test_support::netns::{Bridge, Netns, Port};
use smolder_test_support::previous::{PprofTarget, cpu_pprof};
use smolder_test_support::process::{Process, daemon};
use smolder_test_support::prometheus::Metrics;
use smolder_test_support::wait::eventually;

use crate::object_store::{TOKEN, aggregator_in, push_all, send_batch_to, total};
use crate::transport::ticks;
use crate::util::AggregatorProcess;

/// The samples of each profile the agents' targets serve: series `a` 3, `b` 4.
const PER_SCRAPE: u64 = 7;

/// Aggregators on the storage bridge are hosts `.21` to `.23`, Garage nodes `.11` to `.13`.
const FIRST_AGGREGATOR: u8 = 21;
const FIRST_GARAGE: u8 = 11;

/// One aggregator host: the process, its link to its clients, its port on the bucket's network.
struct Host {
    agg: AggregatorProcess,
    storage: Port,
    /// Its namespace and the link to it, held for as long as the host lives.
    _front: Netns,
}

impl Host {
    /// `kill -9`.
    fn kill(&mut self) {
        self.agg.kill();
    }
}

/// An agent process of this host, shipping to all three aggregators what it scrapes from a
/// pprof target of its own.
struct Agent {
    process: Process,
    http: SocketAddr,
    target: PprofTarget,
}

impl Agent {
    /// Agent `k`, application `agent<k>`, with its state under `state`, trusting `ca`.
    fn start(
        k: usize,
        aggregators: &[SocketAddr],
        ca: &std::path::Path,
        state: &std::path::Path,
    ) -> Agent {
        let target = PprofTarget::serve(cpu_pprof("variant", &[("a", 3), ("b", 4)]), usize::MAX);
        let list: Vec<String> = aggregators.iter().map(|a| format!("'{a}'")).collect();
        let config = format!(
            "hostname: agent-{k}\nhttp:\n  listen: 127.0.0.1:0\nebpf:\n  enabled: false\n\
             window:\n  length: 1s\n  settle: 0s\n\
             ship:\n  aggregators: [{list}]\n  ca: {ca}\n  token: {TOKEN}\n  \
             backoff-min: 1s\n  backoff-max: 2s\n  ack-timeout: 10s\n\
             scrape-configs:\n  - job-name: agent{k}\n    scrape-interval: 2s\n    scrape-timeout: 1500ms\n    \
             enabled-profiles: [cpu]\n    profiles: {{cpu: {{params: {{seconds: 1}}}}}}\n    \
             static-configs: [{{application: agent{k}, targets: ['{target}']}}]\n",
            list = list.join(", "),
            ca = ca.display(),
            target = target.addr(),
        );
        std::fs::create_dir_all(state).unwrap();
        let path = state.join("agent.yaml");
        std::fs::write(&path, config).unwrap();
        let mut command = daemon(&agent_binary(), "info");
        command
            .arg("--data-dir")
            .arg(state.join("data"))
            .arg("--config")
            .arg(&path);
        let process = Process::spawn(command);
        let http = process.listening("http");
        Agent {
            process,
            http,
            target,
        }
    }

    /// Its `/metrics`.
    async fn metrics(&self) -> Metrics {
        Metrics::scrape(&format!("http://{}/metrics", self.http)).await
    }

    /// The aggregator it ships to now.
    async fn aggregator(&self) -> Option<SocketAddr> {
        aggregator_in(&self.metrics().await)
    }

    /// Stops scraping; the samples its target served, once the last answer is out.
    async fn stop_scraping(&self) -> u64 {
        self.target.stop();
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.target.served() as u64 * PER_SCRAPE
    }

    /// SIGTERM, and a clean exit.
    fn stop(mut self) {
        self.process.terminate();
        assert!(self.process.wait().success(), "{}", self.process.log());
    }
}

/// This build's `smolder-agent`, beside this test binary's directory: `cargo test --workspace`
/// (the README's test command) builds it with the agent's tests.
fn agent_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let binary = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/deps")
        .join("smolder-agent");
    assert!(
        binary.exists(),
        "{} is missing: build it (cargo build -p smolder-agent), or run the workspace's tests",
        binary.display()
    );
    binary
}

/// The time since the epoch in seconds.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// An HTTP client presenting [`TOKEN`]: seen from an aggregator's namespace, the test is not
/// on its host.
fn client() -> reqwest::Client {
    let bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .default_headers(reqwest::header::HeaderMap::from_iter([(
            reqwest::header::AUTHORIZATION,
            bearer,
        )]))
        .build()
        .unwrap()
}

/// What the push client sent and heard.
#[derive(Default)]
struct Pushes {
    /// Samples of pushes answered 200.
    acked: u64,
    /// Samples of pushes that got no answer (a kill mid-request): stored at most once.
    unanswered: u64,
    /// Pushes refused with a status (503 while cut off), or never sent: not stored.
    refused: u64,
    /// The latency of each acknowledged push, with the phase it was sent in.
    latencies: Vec<(String, Duration)>,
    /// Each acknowledged push (its stack is `main;push;p<number>`): number, value, where it
    /// went and in which phase, to name what is missing if anything is.
    log: Vec<(u64, u64, String, String)>,
}

/// One line of the push client's output: one push.
#[derive(serde::Deserialize)]
struct Push {
    i: u64,
    value: u64,
    addr: String,
    phase: String,
    seconds: f64,
    outcome: String,
}

/// The push client, a process of its own (`tests/clients/push_client.py`, Python's own HTTP
/// client): `pushed.cpu` ten times a second, each push to the next aggregator in turn.
struct PushClient {
    child: std::process::Child,
    phases: Option<std::process::ChildStdin>,
    /// Its output's lines, read as they come so that it never waits on a full pipe.
    lines: std::thread::JoinHandle<Vec<String>>,
}

impl PushClient {
    /// Starts it against `addrs`.
    fn start(addrs: &[SocketAddr]) -> PushClient {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/push_client.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .arg(TOKEN)
            .args(addrs.iter().map(ToString::to_string))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the push client");
        let phases = child.stdin.take();
        let stdout = child.stdout.take().expect("its output");
        let lines = std::thread::spawn(move || {
            use std::io::BufRead;
            std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .collect()
        });
        PushClient {
            child,
            phases,
            lines,
        }
    }

    /// Tags the pushes sent from now on with `phase`.
    fn phase(&mut self, phase: &str) {
        use std::io::Write;
        let phases = self.phases.as_mut().expect("running");
        writeln!(phases, "{phase}").expect("the push client reads its phases");
        phases.flush().expect("the push client reads its phases");
    }

    /// Stops it after the push under way; what it sent and heard.
    fn finish(mut self) -> Pushes {
        drop(self.phases.take());
        let status = self.child.wait().expect("the push client ends");
        assert!(status.success(), "the push client failed: {status}");
        let mut pushes = Pushes::default();
        for line in self.lines.join().expect("its output read") {
            let push: Push = serde_json::from_str(&line).expect("a push's line");
            match push.outcome.as_str() {
                "acked" => {
                    pushes.acked += push.value;
                    pushes
                        .latencies
                        .push((push.phase.clone(), Duration::from_secs_f64(push.seconds)));
                    pushes.log.push((push.i, push.value, push.addr, push.phase));
                }
                "unanswered" => pushes.unanswered += push.value,
                _ => pushes.refused += 1,
            }
        }
        pushes
    }
}

/// The p50 and p99 of the latencies of `phase`, and how many there were.
fn percentiles(pushes: &Pushes, phase: &str) -> (Duration, Duration, usize) {
    let mut of: Vec<Duration> = pushes
        .latencies
        .iter()
        .filter(|(p, _)| p == phase)
        .map(|(_, d)| *d)
        .collect();
    of.sort_unstable();
    if of.is_empty() {
        return (Duration::ZERO, Duration::ZERO, 0);
    }
    let at = |q: f64| of[((of.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), of.len())
}

/// `name` summed over every sample of `/metrics` at `addr`.
async fn sum(addr: SocketAddr, name: &str) -> f64 {
    Metrics::scrape(&format!("http://{addr}/metrics"))
        .await
        .samples_of(name)
        .map(|s| s.value)
        .sum()
}

/// `SelectSeries` of `service`'s CPU over the last hour, one point per minute: the sum of its
/// points (nanoseconds).
async fn select_series_total(http: &reqwest::Client, addr: SocketAddr, service: &str) -> f64 {
    let end = i64::try_from(now() + 60).unwrap() * 1000;
    let request = SelectSeriesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".to_owned(),
        label_selector: format!("{{service_name=\"{service}\"}}"),
        start: end - 3_660_000,
        end,
        step: 60.0,
        ..SelectSeriesRequest::default()
    };
    let body = http
        .post(format!(
            "http://{addr}/querier.v1.QuerierService/SelectSeries"
        ))
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("SelectSeries")
        .bytes()
        .await
        .expect("its body");
    SelectSeriesResponse::decode(body)
        .expect("a SelectSeries answer")
        .series
        .iter()
        .flat_map(|s| &s.points)
        .map(|p| p.value)
        .sum()
}

/// `query`'s flame graph through `addr` as sorted folded lines.
async fn collapsed(http: &reqwest::Client, addr: SocketAddr, query: &str) -> String {
    let text = http
        .get(format!("http://{addr}/render"))
        .query(&[
            ("query", query),
            ("from", "now-1h"),
            ("until", "now+1m"),
            ("format", "collapsed"),
        ])
        .send()
        .await
        .expect("GET /render")
        .text()
        .await
        .expect("its body");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines.join("\n")
}

/// The batches `agent` has had acknowledged.
async fn acked_batches(agent: &Agent) -> f64 {
    agent
        .metrics()
        .await
        .value("smolder_agent_ship_batches_acked_total", &[])
}

/// The agents shipping to `addr` now, each with its count of acknowledged batches.
async fn shipping_to(agents: &[Agent], addr: SocketAddr) -> Vec<(usize, f64)> {
    let mut on = Vec::new();
    for (k, agent) in agents.iter().enumerate() {
        if agent.aggregator().await == Some(addr) {
            on.push((k, acked_batches(agent).await));
        }
    }
    on
}

/// Waits until `agent` is connected to an aggregator other than `from` and has acked a batch
/// there (more than `acked` in all); how long that took since `since`.
async fn moved_on(agent: &Agent, from: SocketAddr, acked: f64, since: Instant) -> Duration {
    eventually(
        Duration::from_secs(45),
        &format!("the agent off {from}"),
        || async {
            let metrics = agent.metrics().await;
            let on = aggregator_in(&metrics);
            on.is_some()
                && on != Some(from)
                && metrics.value("smolder_agent_ship_connected", &[]) == 1.0
                && metrics.value("smolder_agent_ship_batches_acked_total", &[]) > acked
        },
    )
    .await;
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_aggregators_on_a_garage_cluster_lose_nothing_through_kills_cuts_and_a_node_down() {
    let started = Instant::now();
    let storage = Bridge::create();
    let mut garage =
        tokio::task::block_in_place(|| Cluster::start(&storage, FIRST_GARAGE, 3, "smolder"));
    eprintln!("garage cluster of 3 up in {:?}", started.elapsed());
    let root = tempfile::tempdir().unwrap();
    let http = client();

    // Every aggregator goes through node 0 (a gateway, as a load balancer would be); node 2 is
    // the one stopped. Aggregators 0 and 1 are configured to compact whatever the others do.
    let extra = |compactor: &str| {
        let store = garage.store_yaml(
            0,
            &format!(
                "    poll-interval: 500ms\n    orphan-after: 5s\n    request-timeout: 2s\n    compaction-grace: 20s\n    compactor: {compactor}\n  compaction-interval: 1s\n"
            ),
        );
        format!(
            "auth:\n  credentials:\n    - name: scale-out\n      token: {TOKEN}\n      scopes: [ingest, read, admin]\nstore:\n{store}"
        )
    };
    let mut hosts: Vec<Host> = Vec::new();
    for k in 0..3u8 {
        let front = Netns::create();
        let port = storage.attach(&front, FIRST_AGGREGATOR + k);
        let mut agg = AggregatorProcess::new(root.path().join(format!("agg{k}")));
        agg.http = SocketAddr::from((front.inside, 0));
        agg.quic = SocketAddr::from((front.inside, 0));
        agg.wrapper = front.exec();
        agg.extra = extra(if k < 2 { "always" } else { "true" });
        agg.start(false);
        agg.wait_ready(&http).await;
        hosts.push(Host {
            agg,
            storage: port,
            _front: front,
        });
    }
    let http_addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.agg.http).collect();
    let quic_addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.agg.quic).collect();
    // One CA for all three: the development CA they share through the bucket.
    let ca = root.path().join("ca.pem");
    std::fs::copy(hosts[0].agg.data.join("tls/ca.pem"), &ca).unwrap();

    // Two agent processes, each configured with all three aggregators.
    let agents: Vec<Agent> = (0..2)
        .map(|k| Agent::start(k, &quic_addrs, &ca, &root.path().join(format!("agent{k}"))))
        .collect();
    let mut pusher = PushClient::start(&http_addrs);
    let acked = |k: usize| acked_batches(&agents[k]);
    eventually(Duration::from_secs(30), "both agents shipping", || async {
        acked(0).await >= 4.0 && acked(1).await >= 4.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    // 1. kill -9 the aggregator agent 0 ships to, and delete its data directory.
    let victim_addr = agents[0].aggregator().await.expect("agent 0 ships");
    let victim = quic_addrs
        .iter()
        .position(|a| *a == victim_addr)
        .expect("one of the three");
    let on_victim = shipping_to(&agents, victim_addr).await;
    pusher.phase("aggregator killed");
    eprintln!("{:?}: 1. kill -9 of aggregator {victim}", started.elapsed());
    hosts[victim].kill();
    let killed = Instant::now();
    std::fs::remove_dir_all(&hosts[victim].agg.data).unwrap();
    for (k, before) in &on_victim {
        let took = moved_on(&agents[*k], victim_addr, *before, killed).await;
        eprintln!("agent {k} failed over from the killed aggregator {victim} in {took:?}");
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
    // A new machine in its place: an empty data directory; the fleet's development CA and
    // tokens come from the bucket.
    hosts[victim].agg.start(false);
    hosts[victim].agg.wait_ready(&http).await;
    pusher.phase("steady");

    // 2. Cut the aggregator agent 1 ships to off from the bucket.
    let cut_addr = agents[1].aggregator().await.expect("agent 1 ships");
    let cut = quic_addrs
        .iter()
        .position(|a| *a == cut_addr)
        .expect("one of the three");
    let before = shipping_to(&agents, cut_addr).await;
    pusher.phase("aggregator cut off");
    eprintln!(
        "{:?}: 2. aggregator {cut} cut off from the bucket",
        started.elapsed()
    );
    hosts[cut].storage.cut();
    let cut_at = Instant::now();
    for (k, acked_before) in &before {
        let took = moved_on(&agents[*k], cut_addr, *acked_before, cut_at).await;
        eprintln!("agent {k} moved on from the aggregator cut off from the bucket in {took:?}");
        let metrics = agents[*k].metrics().await;
        assert!(
            metrics.value(
                "smolder_agent_ship_failovers_total",
                &[("reason", "unavailable")]
            ) >= 1.0,
            "moved on because the aggregator refused: {metrics:?}"
        );
    }
    // Nothing it could not upload is acknowledged: a push is refused as retryable, and its
    // count of acknowledged batches stands still while the link is down.
    let refused = http
        .post(format!("http://{}/ingest", http_addrs[cut]))
        .query(&[
            ("name", "refused.cpu".to_owned()),
            ("from", (now() - 10).to_string()),
            ("until", now().to_string()),
        ])
        .body("main;refused 5\n")
        .send()
        .await
        .expect("the cut-off aggregator answers");
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key(reqwest::header::RETRY_AFTER));
    let stored_batches = |addr| async move {
        sum(addr, "smolder_aggregator_ingest_quic_batches_acked_total").await
            - sum(
                addr,
                "smolder_aggregator_ingest_quic_batches_duplicate_total",
            )
            .await
    };
    let acked_at_cut = stored_batches(http_addrs[cut]).await;
    let ready =
        smolder_test_support::health::probe(&format!("http://{}", http_addrs[cut]), "/readyz")
            .await;
    assert!(ready.is("store_writer", "degraded"), "{}", ready.body);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        stored_batches(http_addrs[cut]).await,
        acked_at_cut,
        "the cut-off aggregator acknowledged a batch"
    );
    hosts[cut].storage.heal();
    let healed = Instant::now();
    let base = format!("http://{}", http_addrs[cut]);
    smolder_test_support::health::until(&base, "/readyz", "writing again", |answer| {
        answer.is("store_writer", "running")
    })
    .await;
    eprintln!(
        "the aggregator cut off for {:?} writes again {:?} after the link came back",
        healed - cut_at,
        healed.elapsed()
    );
    pusher.phase("steady");
    tokio::time::sleep(Duration::from_secs(5)).await;

    // 3. One Garage node down: its replicas answer for it.
    let acked_before: f64 = acked(0).await + acked(1).await;
    pusher.phase("garage node down");
    eprintln!("{:?}: 3. garage node 2 down", started.elapsed());
    tokio::task::block_in_place(|| garage.kill(2));
    let node_down = Instant::now();
    // Each agent ships a window every 2 s: 20 batches in 20 s, half of them at the least.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let acked_during = acked(0).await + acked(1).await - acked_before;
    assert!(
        acked_during >= 10.0,
        "agents' batches acknowledged with a node down: {acked_during}"
    );
    for addr in &http_addrs {
        assert!(
            ticks(&http, &format!("http://{addr}"), "agent0.cpu").await > 0,
            "queries through {addr} with a node down"
        );
    }
    tokio::task::block_in_place(|| garage.restart(2));
    eprintln!(
        "garage node 2 down for {:?}: {acked_during} agent batches acknowledged meanwhile",
        node_down.elapsed()
    );
    pusher.phase("steady");

    // 4. A batch one aggregator stored and whose ack was lost, sent again to another.
    eprintln!(
        "{:?}: 4. a batch sent again to another aggregator",
        started.elapsed()
    );
    let end = SystemTime::now();
    let first = send_batch_to(quic_addrs[0], &ca, 1, end, 13).await;
    assert!(!first.duplicate);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = send_batch_to(quic_addrs[1], &ca, 1, end, 13).await;
    assert!(
        again.duplicate,
        "the resent batch is a duplicate: {again:?}"
    );

    // 5. Aggregators 0 and 1 both compact: waves of pushes into a closed range through both,
    // totals exact through all three at every check.
    let range = (now() - 5 * 3_600) / 10_000 * 10_000;
    let mut compacted_pushes = 0;
    eprintln!(
        "{:?}: 5. waves of pushes while two compact",
        started.elapsed()
    );
    for wave in 0..3u64 {
        let head = range + 2 * wave * 1_000;
        let (a, b) = tokio::join!(
            push_all(&http, http_addrs[0], "both.cpu", head, 6),
            push_all(&http, http_addrs[1], "both.cpu", head + 1_000, 5),
        );
        compacted_pushes += a + b;
        let until = Instant::now() + Duration::from_secs(6);
        // Once every aggregator has seen the wave's writes, exact from then on.
        for addr in &http_addrs {
            eventually(
                Duration::from_secs(20),
                "the wave through every aggregator",
                || async {
                    total(&http, *addr, "both.cpu", range, range + 10_000).await == compacted_pushes
                },
            )
            .await;
        }
        while Instant::now() < until {
            for addr in &http_addrs {
                assert_eq!(
                    total(&http, *addr, "both.cpu", range, range + 10_000).await,
                    compacted_pushes,
                    "through {addr} while two compact"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    eventually(
        Duration::from_secs(60),
        "both compactors merged",
        || async {
            let mut each = Vec::new();
            for addr in &http_addrs[..2] {
                each.push(
                    sum(*addr, "smolder_aggregator_store_compactions_total").await
                        + sum(*addr, "smolder_aggregator_store_merges_abandoned_total").await,
                );
            }
            each.iter().all(|tried| *tried >= 1.0)
        },
    )
    .await;
    for addr in &http_addrs {
        assert_eq!(
            total(&http, *addr, "both.cpu", range, range + 10_000).await,
            compacted_pushes,
            "through {addr} after both compacted"
        );
    }

    // The end: everything sent, once, through every aggregator.
    eprintln!(
        "{:?}: the end: totals through every aggregator",
        started.elapsed()
    );
    let produced = [
        agents[0].stop_scraping().await,
        agents[1].stop_scraping().await,
    ];
    let pushes = tokio::task::block_in_place(|| pusher.finish());
    eventually(Duration::from_secs(60), "both spools drained", || async {
        let mut empty = true;
        for agent in &agents {
            empty &= agent
                .metrics()
                .await
                .value("smolder_agent_spool_batches", &[])
                == 0.0;
        }
        empty
    })
    .await;
    let (acked_pushes, unanswered) = (pushes.acked, pushes.unanswered);
    for addr in &http_addrs {
        let base = format!("http://{addr}");
        eventually(
            Duration::from_secs(60),
            &format!("every agent profile through {addr}"),
            || async {
                ticks(&http, &base, "agent0.cpu").await == produced[0]
                    && ticks(&http, &base, "agent1.cpu").await == produced[1]
            },
        )
        .await;
        let stored = async || ticks(&http, &base, "pushed.cpu").await;
        let within = |pushed| (acked_pushes..=acked_pushes + unanswered).contains(&pushed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !within(stored().await) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let pushed = stored().await;
        if !within(pushed) {
            let graph = collapsed(&http, *addr, "pushed.cpu").await;
            let missing: Vec<_> = pushes
                .log
                .iter()
                .filter(|(i, value, _, _)| {
                    !graph
                        .lines()
                        .any(|line| line == format!("main;push;p{i} {value}"))
                })
                .collect();
            panic!(
                "pushes through {addr}: {pushed}, acknowledged {acked_pushes}, unanswered \
                 {unanswered}; acknowledged pushes missing (number, value, sent to, phase): \
                 {missing:?}"
            );
        }
        assert_eq!(ticks(&http, &base, "raw.cpu").await, 13, "through {addr}");
        assert_eq!(
            ticks(&http, &base, "refused.cpu").await,
            0,
            "through {addr}"
        );
    }
    let mut graphs: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for addr in &http_addrs {
        for app in ["agent0.cpu", "agent1.cpu", "pushed.cpu", "raw.cpu"] {
            graphs
                .entry(app)
                .or_default()
                .push(collapsed(&http, *addr, app).await);
        }
        for service in ["agent0", "agent1", "pushed", "raw"] {
            series
                .entry(service)
                .or_default()
                .push(select_series_total(&http, *addr, service).await);
        }
    }
    for (app, each) in &graphs {
        assert!(
            each.iter().all(|graph| graph == &each[0]),
            "{app}'s flame graph differs between aggregators: {each:?}"
        );
    }
    for (service, each) in &series {
        assert!(each[0] > 0.0, "{service}: {each:?}");
        assert!(
            each.iter().all(|total| total == &each[0]),
            "{service}'s SelectSeries totals differ between aggregators: {each:?}"
        );
    }
    {
        for phase in [
            "steady",
            "aggregator killed",
            "aggregator cut off",
            "garage node down",
        ] {
            let (p50, p99, n) = percentiles(&pushes, phase);
            eprintln!("push latency, {phase}: p50 {p50:?}, p99 {p99:?} ({n} pushes)");
        }
        eprintln!(
            "pushes: {acked_pushes} samples acknowledged, {unanswered} unanswered, {} refused; \
             agents: {produced:?} samples; the whole test {:?}",
            pushes.refused,
            started.elapsed()
        );
    }
    for agent in agents {
        let metrics = agent.metrics().await;
        assert_eq!(
            metrics.value("smolder_agent_dropped_batches_total", &[]),
            0.0
        );
        agent.stop();
    }
    drop(hosts);
}
