//! Discovery: where a job's target groups come from.
//!
//! Input: a job's `static-configs`, `file-sd-configs` and `http-sd-configs`. Output: an
//! [`Update`] per source whenever its groups may have changed, sent to the job's pool. Each
//! file and HTTP source runs as its own task, owned by the pool.
//!
//! Documents are untrusted: one larger than [`MAX_DOCUMENT_BYTES`] or listing more than
//! [`MAX_TARGETS`] targets is refused, and so is one that does not parse (unknown keys
//! included). A refused document is reported (in the update's errors, the log, `/targets` and
//! `smolder_agent_scrape_discovery_failures_total`) and its previous groups are kept, so a
//! half-written file or a failing endpoint never empties a job.
//!
//! Files are checked every second (modification time, size, inode) and reread when they
//! change, and at least every `refresh-interval`: polling needs no inotify limits, sees editors
//! that replace files by renaming, and costs one `stat` per file per second. Each group gets a
//! `__meta_filepath` label; HTTP groups get `__meta_url`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::ScrapeMetrics;
use super::config::{FileSdConfig, HttpSdConfig, TargetGroup};
use super::fetch::Fetcher;

/// The largest discovery document read, in bytes.
pub const MAX_DOCUMENT_BYTES: u64 = 8 << 20;
/// The most targets one document may list.
pub const MAX_TARGETS: usize = 10_000;
/// How often files are checked for changes.
const FILE_POLL: Duration = Duration::from_secs(1);

/// What a source found.
#[derive(Debug)]
pub struct Update {
    /// The index of the source within its job (static first, then files, then HTTP).
    pub source: usize,
    /// Every group the source holds now: the new ones, or the previous ones where a document
    /// was refused.
    pub groups: Vec<TargetGroup>,
    /// Why documents were refused, one message each; empty when all were read.
    pub errors: Vec<String>,
}

/// Why a discovery document was refused.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The document is larger than [`MAX_DOCUMENT_BYTES`].
    #[error("document is larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge,
    /// The document lists more than [`MAX_TARGETS`] targets.
    #[error("document lists {count} targets, more than the limit of {MAX_TARGETS}")]
    TooManyTargets {
        /// The number listed.
        count: usize,
    },
    /// The JSON does not parse as a list of target groups.
    #[error("invalid JSON target groups")]
    Json {
        /// serde_json's error, with line and column.
        source: serde_json::Error,
    },
    /// The YAML does not parse as a list of target groups.
    #[error("invalid YAML target groups")]
    Yaml {
        /// The YAML parser's error, with line and column.
        source: serde_norway::Error,
    },
    /// An HTTP endpoint answered with a content type other than JSON.
    #[error("content type {0:?} is not application/json")]
    ContentType(String),
}

/// The syntax of a discovery document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A JSON array of groups.
    Json,
    /// A YAML list of groups.
    Yaml,
}

impl Format {
    /// The format a file's extension says, if it says one.
    pub fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "json" => Some(Format::Json),
            "yml" | "yaml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

/// Parses a document of target groups under the limits, adding `meta` to each group's labels.
///
/// # Errors
///
/// A [`DiscoveryError`] when the document is too large, lists too many targets or does not
/// parse.
pub fn parse_groups(
    bytes: &[u8],
    format: Format,
    meta: (&str, &str),
) -> Result<Vec<TargetGroup>, DiscoveryError> {
    if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(DiscoveryError::TooLarge);
    }
    let mut groups: Vec<TargetGroup> = match format {
        Format::Json => {
            serde_json::from_slice(bytes).map_err(|source| DiscoveryError::Json { source })?
        }
        // An empty YAML file is an empty list, as Prometheus reads it.
        Format::Yaml if bytes.iter().all(u8::is_ascii_whitespace) => Vec::new(),
        Format::Yaml => {
            serde_norway::from_slice(bytes).map_err(|source| DiscoveryError::Yaml { source })?
        }
    };
    let count: usize = groups.iter().map(|g| g.targets.len()).sum();
    if count > MAX_TARGETS {
        return Err(DiscoveryError::TooManyTargets { count });
    }
    for group in &mut groups {
        group.labels.insert(meta.0.to_owned(), meta.1.to_owned());
    }
    Ok(groups)
}

/// The files matching `pattern`, whose last component may hold `*` and `?`, sorted.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.contains(['*', '?']) {
        return if path.is_file() {
            vec![path.to_owned()]
        } else {
            Vec::new()
        };
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter(|e| e.file_name().to_str().is_some_and(|n| wildcard(name, n)))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` one.
fn wildcard(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// What identifies a file's content without reading it.
type Signature = (Option<SystemTime>, u64, u64);

fn signature(path: &Path) -> Option<Signature> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok(), meta.len(), meta.ino()))
}

/// One file's last good groups.
struct FileState {
    signature: Option<Signature>,
    groups: Vec<TargetGroup>,
    error: Option<String>,
}

/// Reads one discovery file under the limits.
fn read_file(path: &Path) -> Result<Vec<TargetGroup>, String> {
    use std::io::Read as _;
    let format = Format::of(path).ok_or_else(|| "not .json, .yml or .yaml".to_owned())?;
    let file = std::fs::File::open(path).map_err(|err| format!("opening: {err}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("reading: {err}"))?;
    let display = path.display().to_string();
    parse_groups(&bytes, format, ("__meta_filepath", &display)).map_err(|err| error_chain(&err))
}

/// An error and its causes, joined: `invalid JSON target groups: expected value at line 1`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Rereads the files of `patterns` that changed (all of them when `full`); returns whether the
/// set of groups or errors changed.
fn scan(
    files: &mut BTreeMap<PathBuf, FileState>,
    patterns: &[String],
    full: bool,
    job: &str,
    metrics: &ScrapeMetrics,
) -> bool {
    let mut present: Vec<PathBuf> = patterns.iter().flat_map(|p| expand(p)).collect();
    present.sort();
    present.dedup();
    let mut changed = files.keys().ne(present.iter());
    files.retain(|path, _| present.contains(path));
    for path in present {
        let now = signature(&path);
        let state = files.entry(path.clone()).or_insert(FileState {
            signature: None,
            groups: Vec::new(),
            error: None,
        });
        if !full && state.signature.is_some() && state.signature == now {
            continue;
        }
        metrics.discovery_refresh(job, "file");
        match read_file(&path) {
            Ok(groups) => {
                changed |= state.groups != groups || state.error.is_some();
                state.groups = groups;
                state.error = None;
            }
            Err(err) => {
                metrics.discovery_failure(job, "file");
                let message = format!("{}: {err}", path.display());
                warn!(target: "smolder_agent::scrape", job, error = %message,
                    "discovery file refused; keeping its previous targets");
                changed |= state.error.as_ref() != Some(&message);
                state.error = Some(message);
            }
        }
        state.signature = now;
    }
    changed
}

/// Runs one `file-sd-configs` entry until the pool stops listening.
pub async fn run_file(
    job: String,
    source: usize,
    config: FileSdConfig,
    updates: mpsc::Sender<Update>,
    metrics: ScrapeMetrics,
) {
    let mut files: BTreeMap<PathBuf, FileState> = BTreeMap::new();
    let mut last_full = Instant::now();
    let mut first = true;
    loop {
        let full = first || last_full.elapsed() >= config.refresh_interval;
        if full {
            last_full = Instant::now();
        }
        let (patterns, name, handles) = (config.files.clone(), job.clone(), metrics.clone());
        // Globbing, stat and reading files block; keep them off the async workers.
        let scanned = tokio::task::spawn_blocking(move || {
            let changed = scan(&mut files, &patterns, full, &name, &handles);
            (files, changed)
        })
        .await;
        let Ok((scanned_files, changed)) = scanned else {
            return;
        };
        files = scanned_files;
        if changed || first {
            let update = Update {
                source,
                groups: files.values().flat_map(|f| f.groups.clone()).collect(),
                errors: files.values().filter_map(|f| f.error.clone()).collect(),
            };
            debug!(target: "smolder_agent::scrape", job, groups = update.groups.len(),
                "file discovery update");
            if updates.send(update).await.is_err() {
                return;
            }
        }
        first = false;
        tokio::time::sleep(FILE_POLL).await;
    }
}

/// Runs one `http-sd-configs` entry until the pool stops listening.
pub async fn run_http(
    job: String,
    source: usize,
    config: HttpSdConfig,
    updates: mpsc::Sender<Update>,
    metrics: ScrapeMetrics,
) {
    let fetcher = match Fetcher::new(&config.client_settings()) {
        Ok(fetcher) => fetcher,
        Err(err) => {
            let message = error_chain(&err);
            warn!(target: "smolder_agent::scrape", job, error = %message, "http discovery cannot start");
            let update = Update {
                source,
                groups: Vec::new(),
                errors: vec![message],
            };
            let _ = updates.send(update).await;
            return;
        }
    };
    let Ok(url) = reqwest::Url::parse(&config.url) else {
        // validate() checked the URL when the config loaded.
        return;
    };
    let mut groups = Vec::new();
    loop {
        metrics.discovery_refresh(&job, "http");
        let fetched = fetcher
            .get(&url, "application/json", config.refresh_interval)
            .await
            .map_err(|err| error_chain(&err))
            .and_then(|body| {
                let content_type = body.content_type.trim().to_ascii_lowercase();
                if !(content_type == "application/json"
                    || content_type.starts_with("application/json;"))
                {
                    return Err(error_chain(&DiscoveryError::ContentType(body.content_type)));
                }
                parse_groups(&body.bytes, Format::Json, ("__meta_url", url.as_str()))
                    .map_err(|err| error_chain(&err))
            });
        let errors = match fetched {
            Ok(new) => {
                groups = new;
                Vec::new()
            }
            Err(err) => {
                metrics.discovery_failure(&job, "http");
                warn!(target: "smolder_agent::scrape", job, url = %url, error = %err,
                    "http discovery failed; keeping the previous targets");
                vec![format!("{url}: {err}")]
            }
        };
        let update = Update {
            source,
            groups: groups.clone(),
            errors,
        };
        if updates.send(update).await.is_err() {
            return;
        }
        tokio::time::sleep(config.refresh_interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_and_pyroscope_documents_parse() {
        let json = br#"[{"targets": ["a:1", "b:2"], "labels": {"env": "dev"}},
            {"application": "api", "spy-name": "gospy", "targets": ["c:3"]}]"#;
        let groups = parse_groups(json, Format::Json, ("__meta_url", "u")).unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].labels["env"], "dev");
        assert_eq!(groups[1].application, "api");
        assert_eq!(groups[1].spy_name, "gospy");
        assert_eq!(groups[1].labels["__meta_url"], "u");
        let yaml = b"- targets: [a:1]\n  labels: {team: core}\n";
        let groups = parse_groups(yaml, Format::Yaml, ("__meta_filepath", "f")).unwrap();
        assert_eq!(groups[0].targets, vec!["a:1".to_owned()]);
        assert!(
            parse_groups(b"\n", Format::Yaml, ("m", "v"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_documents_are_refused_in_words() {
        let cases: [(&[u8], Format, &str); 4] = [
            (
                b"[{\"targets\": [\"a:1\"]",
                Format::Json,
                "invalid JSON target groups",
            ),
            (b"[{\"target\": [\"a:1\"]}]", Format::Json, "unknown field"),
            (
                b"- targets: a\n",
                Format::Yaml,
                "invalid YAML target groups",
            ),
            (b"{\"targets\": []}", Format::Json, "invalid JSON"),
        ];
        for (doc, format, expected) in cases {
            let err = error_chain(&parse_groups(doc, format, ("m", "v")).unwrap_err());
            assert!(err.contains(expected), "{err}");
        }
        let many: Vec<String> = (0..=MAX_TARGETS).map(|i| format!("\"h:{i}\"")).collect();
        let doc = format!("[{{\"targets\": [{}]}}]", many.join(","));
        let err = parse_groups(doc.as_bytes(), Format::Json, ("m", "v")).unwrap_err();
        assert!(matches!(err, DiscoveryError::TooManyTargets { .. }));
    }

    #[test]
    fn wildcards_match_file_names() {
        assert!(wildcard("*.json", "a.json"));
        assert!(wildcard("t-?.yml", "t-1.yml"));
        assert!(!wildcard("*.json", "a.yaml"));
        assert!(wildcard("a*b*c", "aXXbYYc"));
        assert!(!wildcard("a*b", "aXXbY"));
    }
}
