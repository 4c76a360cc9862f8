//! A debuginfod client: fetches debug files by build id (`GET <url>/buildid/<hex>/debuginfo`,
//! the protocol of elfutils' `debuginfod` and of `debuginfod.debian.net`) into a bounded disk
//! cache, on a thread of its own, so that symbolization never waits for the network.
//!
//! Input: build ids of stripped binaries with no local debug file
//! ([`Debuginfod::request`]). Output: their debug files, `<build id>.debug` in the cache
//! directory, checked to carry the build id asked for; the ids fetched
//! ([`Debuginfod::take_fetched`]). Caller: the symbolizer thread. Owns the
//! `smolder-debuginfod` thread and the cache directory `<data dir>/debuginfod/`, bounded by
//! `symbolize.debuginfod-cache-bytes` (least recently used first out).
//!
//! Servers are asked in `symbolize.debuginfod-urls` order; the first to have the file wins. A
//! build id no server has is not asked again for [`NOT_FOUND_RETRY`], one that failed (server
//! down, timeout) not for [`FAILED_RETRY`].

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use smolder_unwind::Elf;
use tracing::{debug, info, warn};

use super::debuginfo::{downloaded_name, hex};
use crate::ebpf::cache_dir::CacheDir;
use crate::ebpf::metrics::{DEBUGINFOD_QUEUE_FULL, SymbolizeMetrics};
use crate::ebpf::unwind::{FileBytes, Stamp, open_regular};
use crate::tier::{DroppedUnit, StageCounters};

/// How long a build id no server has is not asked for again.
pub(crate) const NOT_FOUND_RETRY: Duration = Duration::from_secs(3600);
/// How long a build id whose fetch failed is not asked for again.
pub(crate) const FAILED_RETRY: Duration = Duration::from_secs(300);

/// The most build ids waiting for the client thread (each fetch can take
/// `symbolize.debuginfod-timeout`); past it, requests are dropped and asked again later.
pub(crate) const MAX_QUEUED: usize = 1024;
/// The most build ids remembered in their retry wait; past it, the wait ending soonest is
/// forgotten.
pub(crate) const MAX_RETRY_WAITS: usize = 16384;

/// The outcomes of `smolder_agent_symbolize_debuginfod_fetches_total{outcome}`.
pub(crate) const FETCH_OUTCOMES: [&str; 6] = [
    "fetched",
    "not_found",
    "failed",
    "timeout",
    "too_large",
    "mismatch",
];

/// What the client needs to know.
pub(crate) struct ClientConfig {
    pub(crate) urls: Vec<String>,
    pub(crate) timeout: Duration,
    pub(crate) max_bytes: u64,
    pub(crate) dir: PathBuf,
}

/// The handle to the `smolder-debuginfod` thread; dropping it stops the thread (a fetch in
/// progress ends at its timeout).
pub(crate) struct Debuginfod {
    tx: Option<mpsc::SyncSender<Vec<u8>>>,
    tier: StageCounters,
    /// Build ids answered, and whether their file is in the cache.
    answers: mpsc::Receiver<(Vec<u8>, bool)>,
    thread: Option<JoinHandle<()>>,
    /// Build ids asked for and not answered yet: each is asked once at a time.
    pending: HashSet<Vec<u8>>,
}

impl Debuginfod {
    /// Starts the client thread.
    ///
    /// # Errors
    ///
    /// When the cache directory cannot be created or the thread cannot start.
    pub(crate) fn start(
        config: ClientConfig,
        metrics: SymbolizeMetrics,
    ) -> std::io::Result<Debuginfod> {
        std::fs::create_dir_all(&config.dir)?;
        info!(urls = %config.urls.join(" "), dir = %config.dir.display(), "debuginfod client started");
        let (tx, rx) = mpsc::sync_channel(MAX_QUEUED);
        let (done, answers) = mpsc::channel();
        let tier = metrics.tier.clone();
        let thread = std::thread::Builder::new()
            .name("smolder-debuginfod".to_owned())
            .spawn(move || {
                let _span = tracing::info_span!("debuginfod").entered();
                run(config, metrics, rx, done);
            })?;
        Ok(Debuginfod {
            tier,
            tx: Some(tx),
            answers,
            thread: Some(thread),
            pending: HashSet::new(),
        })
    }

    /// Asks for the debug file of `build_id`, unless it is being asked for already. The thread
    /// skips build ids in their retry wait, so asking again is cheap.
    /// Past [`MAX_QUEUED`] waiting, the request is dropped and counted
    /// (`smolder_agent_dropped_requests_total{stage="symbolize",reason="debuginfod_queue_full"}`);
    /// the binary asks again at a later poll.
    pub(crate) fn request(&mut self, build_id: &[u8]) {
        if self.pending.contains(build_id) {
            return;
        }
        let Some(tx) = &self.tx else { return };
        match tx.try_send(build_id.to_vec()) {
            Ok(()) => {
                self.pending.insert(build_id.to_vec());
            }
            Err(mpsc::TrySendError::Full(_)) => {
                self.tier
                    .dropped(DroppedUnit::Requests, DEBUGINFOD_QUEUE_FULL, 1);
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {}
        }
    }

    /// The build ids whose debug files arrived since the last call.
    pub(crate) fn take_fetched(&mut self) -> Vec<Vec<u8>> {
        let mut fetched = Vec::new();
        for (id, arrived) in self.answers.try_iter() {
            self.pending.remove(&id);
            if arrived {
                fetched.push(id);
            }
        }
        fetched
    }
}

impl Drop for Debuginfod {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Why one fetch did not bring a file.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("no server has it")]
    NotFound,
    #[error("the request timed out")]
    Timeout,
    #[error("larger than the cache ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("the file does not carry the build id asked for")]
    Mismatch,
    /// The request failed on the way (connection, TLS, a body cut short).
    #[error("requesting {url} failed")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with a status other than 200 or 404.
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    /// Writing the downloaded file failed.
    #[error("writing {path} failed")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl FetchError {
    fn outcome(&self) -> &'static str {
        match self {
            FetchError::NotFound => "not_found",
            FetchError::Timeout => "timeout",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Mismatch => "mismatch",
            FetchError::Request { .. } | FetchError::Status { .. } | FetchError::Write { .. } => {
                "failed"
            }
        }
    }
}

fn run(
    config: ClientConfig,
    metrics: SymbolizeMetrics,
    rx: mpsc::Receiver<Vec<u8>>,
    done: mpsc::Sender<(Vec<u8>, bool)>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            warn!(error = %err, "the debuginfod client cannot start its runtime; debug files will not be fetched");
            return;
        }
    };
    let client = match reqwest::Client::builder()
        .connect_timeout(config.timeout.min(Duration::from_secs(10)))
        .timeout(config.timeout)
        .user_agent(concat!("smolder-agent/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(err) => {
            warn!(error = %err, "the debuginfod client cannot be built; debug files will not be fetched");
            return;
        }
    };
    let mut cache = open_cache(&config.dir, config.max_bytes);
    metrics
        .debuginfod_cache_bytes
        .set(i64::try_from(cache.used_bytes()).unwrap_or(i64::MAX));
    let mut retry_after: HashMap<Vec<u8>, Instant> = HashMap::new();
    while let Ok(id) = rx.recv() {
        let name = downloaded_name(&id);
        if cache.touch(&name) {
            let _ = done.send((id, true));
            continue;
        }
        let now = Instant::now();
        if retry_after.get(&id).is_some_and(|at| now < *at) {
            let _ = done.send((id, false));
            continue;
        }
        let started = Instant::now();
        let result = runtime.block_on(fetch(&client, &config, &id, &name));
        metrics
            .debuginfod_duration
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(bytes) => {
                metrics
                    .debuginfod_fetches
                    .with_label_values(&["fetched"])
                    .inc();
                metrics.debuginfod_bytes.inc_by(bytes);
                cache.added(&name, bytes);
                retry_after.remove(&id);
                debug!(build_id = %hex(&id), bytes, "debug file fetched");
                let _ = done.send((id, true));
            }
            Err(err) => {
                metrics
                    .debuginfod_fetches
                    .with_label_values(&[err.outcome()])
                    .inc();
                let wait = match err {
                    FetchError::NotFound | FetchError::TooLarge { .. } | FetchError::Mismatch => {
                        NOT_FOUND_RETRY
                    }
                    FetchError::Timeout
                    | FetchError::Request { .. }
                    | FetchError::Status { .. }
                    | FetchError::Write { .. } => FAILED_RETRY,
                };
                debug!(
                    build_id = %hex(&id),
                    error = %err,
                    cause = std::error::Error::source(&err).map(ToString::to_string),
                    "no debug file from debuginfod"
                );
                if retry_after.len() >= MAX_RETRY_WAITS {
                    forget_a_retry_wait(&mut retry_after, now);
                }
                retry_after.insert(id.clone(), now + wait);
                let _ = done.send((id, false));
            }
        }
        metrics
            .debuginfod_cache_bytes
            .set(i64::try_from(cache.used_bytes()).unwrap_or(i64::MAX));
    }
}

/// The cache directory: `<build id>.debug` files, least recently used deleted past the bound;
/// empty (files fetched from now on are counted) when it cannot be listed.
fn open_cache(dir: &Path, max_bytes: u64) -> CacheDir {
    CacheDir::open(dir, max_bytes, |_| true).unwrap_or_else(|err| {
        warn!(dir = %dir.display(), error = %err, "the debuginfod cache cannot be listed; starting it empty");
        CacheDir::empty(dir, max_bytes)
    })
}

/// Makes room in the retry waits: those over, else the one ending soonest (that build id may
/// be asked again a little early).
fn forget_a_retry_wait(retry_after: &mut HashMap<Vec<u8>, Instant>, now: Instant) {
    retry_after.retain(|_, at| now < *at);
    if retry_after.len() >= MAX_RETRY_WAITS
        && let Some(soonest) = retry_after
            .iter()
            .min_by_key(|(_, at)| **at)
            .map(|(id, _)| id.clone())
    {
        retry_after.remove(&soonest);
    }
}

/// Asks every server in turn; writes the first answer to `<dir>/<name>` and returns its size.
async fn fetch(
    client: &reqwest::Client,
    config: &ClientConfig,
    id: &[u8],
    name: &str,
) -> Result<u64, FetchError> {
    let mut last = FetchError::NotFound;
    for url in &config.urls {
        let url = format!(
            "{}/buildid/{}/debuginfo",
            url.trim_end_matches('/'),
            hex(id)
        );
        match fetch_one(client, &url, config, id, name).await {
            Ok(bytes) => return Ok(bytes),
            Err(FetchError::NotFound) => {}
            Err(err) => last = err,
        }
    }
    Err(last)
}

async fn fetch_one(
    client: &reqwest::Client,
    url: &str,
    config: &ClientConfig,
    id: &[u8],
    name: &str,
) -> Result<u64, FetchError> {
    let failed = |source: reqwest::Error| {
        if source.is_timeout() {
            FetchError::Timeout
        } else {
            FetchError::Request {
                url: url.to_owned(),
                source,
            }
        }
    };
    let mut response = client.get(url).send().await.map_err(failed)?;
    match response.status() {
        reqwest::StatusCode::OK => {}
        reqwest::StatusCode::NOT_FOUND => return Err(FetchError::NotFound),
        status => {
            return Err(FetchError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
            });
        }
    }
    let limit = config.max_bytes;
    if response.content_length().is_some_and(|len| len > limit) {
        return Err(FetchError::TooLarge { limit });
    }
    let tmp = config.dir.join(format!(".{name}.tmp"));
    let mut file = std::fs::File::create(&tmp).map_err(|source| FetchError::Write {
        path: tmp.clone(),
        source,
    })?;
    let mut written = 0u64;
    let result = async {
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            written += chunk.len() as u64;
            if written > limit {
                return Err(FetchError::TooLarge { limit });
            }
            file.write_all(&chunk).map_err(|source| FetchError::Write {
                path: tmp.clone(),
                source,
            })?;
        }
        drop(file);
        if !carries(&tmp, id) {
            return Err(FetchError::Mismatch);
        }
        std::fs::rename(&tmp, config.dir.join(name)).map_err(|source| FetchError::Write {
            path: tmp.clone(),
            source,
        })
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|()| written)
}

/// Whether the file at `path` is an ELF file with build id `id`.
fn carries(path: &Path, id: &[u8]) -> bool {
    let Ok(file) = open_regular(path, false) else {
        return false;
    };
    let Ok(stamp) = Stamp::of(&file) else {
        return false;
    };
    let Ok(mapped) = FileBytes::new(&file, &stamp) else {
        return false;
    };
    Elf::parse(mapped.bytes()).is_ok_and(|elf| elf.build_id() == Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_waits_stay_within_their_bound() {
        let now = Instant::now();
        let mut waits: HashMap<Vec<u8>, Instant> = (0..MAX_RETRY_WAITS as u32)
            .map(|i| {
                (
                    i.to_le_bytes().to_vec(),
                    now + Duration::from_secs(u64::from(i) + 1),
                )
            })
            .collect();
        forget_a_retry_wait(&mut waits, now);
        assert_eq!(waits.len(), MAX_RETRY_WAITS - 1);
        assert!(
            !waits.contains_key(0u32.to_le_bytes().as_slice()),
            "the soonest goes"
        );
        // Those over go first, all of them.
        forget_a_retry_wait(&mut waits, now + Duration::from_secs(101));
        assert_eq!(waits.len(), MAX_RETRY_WAITS - 101);
    }

    #[test]
    fn requests_past_the_queue_are_dropped_and_counted() {
        // A server that accepts and never answers holds the thread in its first fetch.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (registry, metrics) = crate::ebpf::SourceMetrics::standalone();
        let mut client = Debuginfod::start(
            ClientConfig {
                urls: vec![format!("http://{}", listener.local_addr().unwrap())],
                timeout: Duration::from_secs(30),
                max_bytes: 1 << 20,
                dir: dir.path().to_path_buf(),
            },
            metrics.symbolize.clone(),
        )
        .unwrap();
        let extra = 50;
        for i in 0..(MAX_QUEUED + 1 + extra) as u32 {
            client.request(&i.to_le_bytes());
        }
        // The thread took one or none off the queue.
        let text = smolder_daemon::metrics::render(&registry).unwrap();
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("smolder_agent_dropped_requests_total")
                    && l.contains("debuginfod_queue_full")
            })
            .unwrap();
        let dropped: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((extra..=extra + 1).contains(&dropped), "{line}");
        assert!(client.pending.len() <= MAX_QUEUED + 1);
        // Asking again for one in the queue sends nothing.
        client.request(&0u32.to_le_bytes());
        drop(listener);
    }

    #[test]
    fn the_cache_directory_keeps_the_most_recently_used_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("aa.debug"), [0u8; 100]).unwrap();
        std::fs::write(dir.path().join(".bb.debug.tmp"), [0u8; 10]).unwrap();
        let mut cache = open_cache(dir.path(), 250);
        assert_eq!(cache.used_bytes(), 100);
        assert!(!dir.path().join(".bb.debug.tmp").exists(), "leftovers go");
        std::fs::write(dir.path().join("cc.debug"), [0u8; 100]).unwrap();
        cache.added("cc.debug", 100);
        assert!(cache.touch("aa.debug"));
        std::fs::write(dir.path().join("dd.debug"), [0u8; 100]).unwrap();
        cache.added("dd.debug", 100);
        // 300 > 250: cc, the least recently used, goes.
        assert!(!dir.path().join("cc.debug").exists());
        assert!(cache.touch("aa.debug") && cache.touch("dd.debug") && !cache.touch("cc.debug"));
        assert_eq!(cache.used_bytes(), 200);
    }

    #[test]
    fn only_an_elf_file_with_the_build_id_is_kept() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let bytes = std::fs::read(libc).unwrap();
        let id = Elf::parse(&bytes).unwrap().build_id().unwrap().to_vec();
        assert!(carries(libc, &id));
        assert!(!carries(libc, &[1, 2, 3]));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("junk"), b"not an elf").unwrap();
        assert!(!carries(&dir.path().join("junk"), &id));
    }
}
