//! A job's pool: its discovery sources, its target set, and one scrape loop per target.
//!
//! Input: [`Update`]s from the job's discovery tasks. Output: scrape loops started for new
//! targets and aborted for vanished ones; a target whose key is unchanged keeps its loop and
//! its delta state. Owns the discovery tasks and the loops; [`run`] ends them all when told to
//! stop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use smolder_common::pprof::Limits;
use smolder_daemon::Heartbeat;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument as _, info, info_span, warn};

use super::ScrapeMetrics;
use super::config::{ScrapeConfig, TargetGroup};
use super::discovery::{self, Update};
use super::fetch::Fetcher;
use super::scraper::ScrapeLoop;
use super::status::{SharedScrape, SourceStatus, Status};
use super::target::{Builder, Target};
use crate::window::Submitter;

/// What a job's pool needs.
pub struct Job {
    /// The job's config.
    pub config: ScrapeConfig,
    /// Its target builder.
    pub builder: Builder,
    /// Its HTTP client.
    pub fetcher: Fetcher,
    /// Where profiles go.
    pub submitter: Submitter,
    /// The scraper's metrics.
    pub metrics: ScrapeMetrics,
    /// Where `/targets` reads from.
    pub status: Status,
}

struct Running {
    target: Target,
    shared: SharedScrape,
    task: JoinHandle<()>,
}

/// Runs the job until `stop` turns true, then ends its discovery tasks and scrape loops. Beats
/// `heartbeat` on every discovery update and every period.
pub async fn run(job: Job, mut stop: watch::Receiver<bool>, heartbeat: Heartbeat) {
    let name = job.config.job_name.clone();
    let (updates_tx, mut updates) = mpsc::channel::<Update>(16);
    let mut groups: Vec<Vec<TargetGroup>> = Vec::new();
    let mut sources: Vec<SourceStatus> = Vec::new();
    let mut discovery_tasks = Vec::new();

    groups.push(job.config.static_configs.clone());
    sources.push(SourceStatus {
        source: "static".to_owned(),
        at: Some(SystemTime::now()),
        groups: job.config.static_configs.len(),
        errors: Vec::new(),
    });
    for file_sd in &job.config.file_sd_configs {
        let index = groups.len();
        groups.push(Vec::new());
        sources.push(SourceStatus {
            source: format!("file:{}", file_sd.files.join(",")),
            ..SourceStatus::default()
        });
        let span = info_span!("scrape_discovery", job = %name, mechanism = "file");
        discovery_tasks.push(tokio::spawn(
            discovery::run_file(
                name.clone(),
                index,
                file_sd.clone(),
                updates_tx.clone(),
                job.metrics.clone(),
            )
            .instrument(span),
        ));
    }
    for http_sd in &job.config.http_sd_configs {
        let index = groups.len();
        groups.push(Vec::new());
        sources.push(SourceStatus {
            source: format!("http:{}", http_sd.url),
            ..SourceStatus::default()
        });
        let span = info_span!("scrape_discovery", job = %name, mechanism = "http");
        discovery_tasks.push(tokio::spawn(
            discovery::run_http(
                name.clone(),
                index,
                http_sd.clone(),
                updates_tx.clone(),
                job.metrics.clone(),
            )
            .instrument(span),
        ));
    }
    drop(updates_tx);

    let mut running: HashMap<String, Running> = HashMap::new();
    job.status.set_sources(&name, sources.clone());
    sync(&job, &groups, &mut running);
    let mut ticker = tokio::time::interval(heartbeat.period());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        heartbeat.beat();
        tokio::select! {
            _ = ticker.tick() => {}
            // Without file or HTTP sources the channel closes at once; the targets stay.
            Some(update) = updates.recv() => {
                for error in &update.errors {
                    warn!(target: "smolder_agent::scrape", job = %name, error = %error,
                        "discovery document refused");
                }
                if let Some(source) = sources.get_mut(update.source) {
                    source.at = Some(SystemTime::now());
                    source.groups = update.groups.len();
                    source.errors = update.errors;
                }
                if let Some(slot) = groups.get_mut(update.source) {
                    *slot = update.groups;
                }
                job.status.set_sources(&name, sources.clone());
                sync(&job, &groups, &mut running);
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
    }
    for task in discovery_tasks {
        task.abort();
    }
    for (_, run) in running.drain() {
        run.task.abort();
        // Wait for the loop to drop its submitter, so that the window loop can finish.
        let _ = run.task.await;
    }
}

/// Brings the running loops in line with the targets of `groups`.
fn sync(job: &Job, groups: &[Vec<TargetGroup>], running: &mut HashMap<String, Running>) {
    let name = &job.config.job_name;
    let targets = job.builder.build(groups.iter().flatten());
    let mut wanted: HashMap<String, Target> =
        targets.active.into_iter().map(|t| (t.key(), t)).collect();
    let before = running.len();
    running.retain(|key, run| match wanted.remove(key) {
        // Same key, same loop; the discovered labels may have changed.
        Some(target) => {
            run.target = target;
            true
        }
        None => {
            run.task.abort();
            false
        }
    });
    let stopped = before - running.len();
    let started = wanted.len();
    let limits = Limits {
        max_bytes: usize::try_from(job.config.decompressed_size_limit).unwrap_or(usize::MAX),
        ..Limits::default()
    };
    for (key, target) in wanted {
        let shared: SharedScrape = Arc::new(Mutex::new(Default::default()));
        let scrape = ScrapeLoop {
            target: target.clone(),
            fetcher: job.fetcher.clone(),
            submitter: job.submitter.clone(),
            metrics: job.metrics.clone(),
            shared: Arc::clone(&shared),
            limits,
        };
        let span = info_span!("scrape_target", job = %name, profile = %target.profile,
            url = %target.url);
        let task = tokio::spawn(scrape.run().instrument(span));
        running.insert(
            key,
            Running {
                target,
                shared,
                task,
            },
        );
    }
    if started > 0 || stopped > 0 {
        info!(target: "smolder_agent::scrape", job = %name, started, stopped,
            targets = running.len(), dropped = targets.dropped.len(), "targets changed");
    }
    let mut active: Vec<_> = running
        .values()
        .map(|run| (run.target.clone(), Arc::clone(&run.shared)))
        .collect();
    active.sort_by(|a, b| (a.0.url.as_str(), &a.0.profile).cmp(&(b.0.url.as_str(), &b.0.profile)));
    job.metrics
        .targets_dropped
        .with_label_values(&[name])
        .set(i64::try_from(targets.dropped.len()).unwrap_or(i64::MAX));
    job.status.set_targets(name, active, targets.dropped);
}
