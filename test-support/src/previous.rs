//! The previous release, for the upgrade tests: its binaries, and a pprof target that agents of
//! either release scrape alike.
//!
//! [`release`] finds `smolder-agent` and `smolder-aggregator` of release [`TAG`] under
//! `<target>/previous-release/<tag>/`, where `scripts/previous-release` builds them (`scripts/test`
//! runs it before `cargo test`); when they are missing, it runs the script itself, into a target
//! directory of its own so that the binaries other tests are running are never replaced.
//! [`PprofTarget`] serves a fixed CPU profile a given number of times, so that a test knows to
//! the sample what an agent scraped; [`cpu_pprof`] makes one with a series per label value;
//! [`agent_yaml`] is an agent's config that both releases read, scraping such a target;
//! [`ticks`] reads back what an aggregator of either release stored.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prost::Message;
use smolder_common::pprof::proto::{Function, Label, Line, Location, Profile, Sample, ValueType};

/// The previous release, as `scripts/previous-release` names it (its tag; the script records
/// its commit).
pub const TAG: &str = "v0.1.0";

/// The previous release's binaries.
#[derive(Clone, Debug)]
pub struct Release {
    /// Its `smolder-agent`.
    pub agent: PathBuf,
    /// Its `smolder-aggregator`.
    pub aggregator: PathBuf,
}

/// The previous release's binaries, for a test crate whose `CARGO_TARGET_TMPDIR` is
/// `target_tmpdir` (`<target>/tmp`); built first when missing.
///
/// # Panics
///
/// When they are missing and cannot be built (the release's commit is not in the repository).
pub fn release(target_tmpdir: &Path) -> Release {
    let target = target_tmpdir
        .parent()
        .expect("CARGO_TARGET_TMPDIR is <target>/tmp");
    let dir = target.join("previous-release").join(TAG);
    let release = Release {
        agent: dir.join("smolder-agent"),
        aggregator: dir.join("smolder-aggregator"),
    };
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    if release.agent.exists() && release.aggregator.exists() {
        return release;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/previous-release");
    eprintln!(
        "the binaries of {TAG} are not built (scripts/test builds them first); building them into \
         a target directory of their own, which takes minutes the first time"
    );
    let status = Command::new(&script)
        .arg(target.join("previous-release").join("target"))
        .env("CARGO_TARGET_DIR", target)
        .status()
        .unwrap_or_else(|err| panic!("running {}: {err}", script.display()));
    assert!(status.success(), "{} failed: {status}", script.display());
    release
}

/// An agent's config file, in keys both releases read: no eBPF, 1 s windows, shipping to the
/// aggregator at `quic` with the development CA and token of its data directory `data`, and
/// scraping `target`'s CPU profile (1 s) every 2 s as job and application `job`.
pub fn agent_yaml(job: &str, quic: &str, data: &Path, target: SocketAddr) -> String {
    format!(
        "hostname: upgrade\nhttp:\n  listen: 127.0.0.1:0\nebpf:\n  enabled: false\n\
         window:\n  length: 1s\n  settle: 0s\n\
         ship:\n  aggregator: {quic}\n  ca: {ca}\n  token-file: {token}\n  backoff-min: 1s\n  backoff-max: 2s\n\
         scrape-configs:\n  - job-name: {job}\n    scrape-interval: 2s\n    scrape-timeout: 1500ms\n    \
         enabled-profiles: [cpu]\n    profiles: {{cpu: {{params: {{seconds: 1}}}}}}\n    \
         static-configs: [{{application: {job}, targets: ['{target}']}}]\n",
        ca = data.join("tls/ca.pem").display(),
        token = data.join("tls/agent-token").display(),
    )
}

/// Total samples of `query` an aggregator of either release at `base` (`http://host:port`)
/// stored from an hour ago to a minute ahead, as `/render` says; 0 while it does not answer.
pub async fn ticks(base: &str, query: &str) -> u64 {
    let Ok(response) = reqwest::Client::new()
        .get(format!("{base}/render"))
        .query(&[("query", query), ("from", "now-1h"), ("until", "now+1m")])
        .send()
        .await
    else {
        return 0;
    };
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    json["flamebearer"]["numTicks"].as_u64().unwrap_or(0)
}

/// A CPU profile as Go's `/debug/pprof/profile` serves it (`samples`/`count` and
/// `cpu`/`nanoseconds` at 100 Hz), with one stack `main;work<i>` of `samples` per entry of
/// `series`, labelled `label=<value>`, so that an agent makes a series of each.
pub fn cpu_pprof(label: &str, series: &[(&str, u64)]) -> Vec<u8> {
    let mut strings: Vec<Vec<u8>> = Vec::new();
    let mut string = |s: &str| {
        let at = strings.len() as i64;
        strings.push(s.as_bytes().to_vec());
        at
    };
    string("");
    let samples = ValueType {
        r#type: string("samples"),
        unit: string("count"),
    };
    let cpu = ValueType {
        r#type: string("cpu"),
        unit: string("nanoseconds"),
    };
    let key = string(label);
    let function = |id: u64, name: i64| Function {
        id,
        name,
        system_name: name,
        ..Function::default()
    };
    let location = |id: u64| Location {
        id,
        line: vec![Line {
            function_id: id,
            ..Line::default()
        }],
        ..Location::default()
    };
    let mut functions = vec![function(1, string("main"))];
    let mut locations = vec![location(1)];
    let mut sample = Vec::new();
    const PERIOD: i64 = 10_000_000;
    for (i, (value, count)) in series.iter().enumerate() {
        let id = i as u64 + 2;
        functions.push(function(id, string(&format!("work{i}"))));
        locations.push(location(id));
        let count = i64::try_from(*count).expect("a count that fits pprof");
        sample.push(Sample {
            location_id: vec![id, 1],
            value: vec![count, count * PERIOD],
            label: vec![Label {
                key,
                str: string(value),
                ..Label::default()
            }],
        });
    }
    Profile {
        sample_type: vec![samples, cpu],
        sample,
        location: locations,
        function: functions,
        string_table: strings,
        period_type: Some(cpu),
        period: PERIOD,
        ..Profile::default()
    }
    .encode_to_vec()
}

/// An HTTP server on loopback that answers `GET /debug/pprof/profile` with one body a given
/// number of times, then 404; anything else is a 404. Stops when dropped.
pub struct PprofTarget {
    addr: SocketAddr,
    served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl PprofTarget {
    /// Serves `body` `times` times.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub fn serve(body: Vec<u8>, times: usize) -> PprofTarget {
        let listener = TcpListener::bind(crate::net::LOOPBACK_ANY_PORT).expect("binding");
        let addr = listener.local_addr().expect("a bound address");
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopping) = (Arc::clone(&served), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                // One request per connection: the answer closes it.
                let _ = answer(stream, &body, times, &count);
            }
        });
        PprofTarget { addr, served, stop }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many profiles it has served.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }

    /// Stops serving: later connections are refused; a request accepted before may still be
    /// answered (and counted) within its read of the request.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop to see the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

impl Drop for PprofTarget {
    fn drop(&mut self) {
        self.stop();
    }
}

fn answer(
    mut stream: TcpStream,
    body: &[u8],
    times: usize,
    served: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let wanted = request.starts_with("GET /debug/pprof/profile");
    let take = wanted
        && served
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < times).then_some(n + 1)
            })
            .is_ok();
    if take {
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )?;
        stream.write_all(body)?;
    } else {
        stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
    }
    stream.flush()
}
