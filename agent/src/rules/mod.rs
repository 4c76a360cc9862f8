//! Rules: Prometheus counters from every closed window, served on the agent's own port, so that
//! alerts on profiles work even while the aggregator is unreachable.
//!
//! Input: each closed [`Window`], as a sink of the window loop (registered in `app` before the
//! shipper). Output: [`Exported`], the counters of the config file's `metrics-export-rules`
//! (Pyroscope's format, evaluated by [`smolder_common::rules`], the same evaluator as the
//! aggregator's), which `GET /exported-metrics` renders. Owns: the task [`run`] and the
//! counters; they start at zero with the process, like any Prometheus counter.

mod metrics;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smolder_common::rules::{Counters, RuleError, RuleSet, RuleSpec};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info_span, warn};

pub use self::metrics::RulesMetrics;
use self::metrics::SERIES_LIMIT;
use crate::tier::DroppedUnit;
use crate::window::Window;

/// Windows queued for the rules, past which the window loop drops the newest for them rather
/// than wait: evaluation is much cheaper than a window is long, so this only ever holds a burst
/// of windows closing at once (a source catching up on old data), as the spool's queue does.
const QUEUE: usize = 16;

/// The counters the agent's rules have made.
pub struct Exported {
    counters: Mutex<Counters>,
}

impl Exported {
    /// The counters in Prometheus' text format, as `/exported-metrics` serves them.
    pub fn render(&self) -> String {
        self.counters
            .lock()
            .expect("counters lock: taken to add or render, never across an await")
            .render()
    }
}

/// Compiles the config file's `metrics-export-rules`.
///
/// # Errors
///
/// The first invalid rule, named, with what is wrong with it.
pub fn compile(specs: &BTreeMap<String, RuleSpec>) -> Result<RuleSet, RuleError> {
    RuleSet::from_specs(specs)
}

/// The rules stage of a starting agent: the sink to register with the window loop, the
/// counters for the HTTP port, and the receiving end that [`run`] consumes.
pub fn channel(
    rules: &RuleSet,
) -> (
    mpsc::Sender<Arc<Window>>,
    Arc<Exported>,
    mpsc::Receiver<Arc<Window>>,
) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let exported = Arc::new(Exported {
        counters: Mutex::new(Counters::new(rules)),
    });
    (tx, exported, rx)
}

/// Evaluates `rules` on every window until the window loop stops.
pub async fn run(
    rules: RuleSet,
    mut windows: mpsc::Receiver<Arc<Window>>,
    exported: Arc<Exported>,
    metrics: RulesMetrics,
) {
    metrics.rules.set(rules.len() as i64);
    let rules = Arc::new(rules);
    async move {
        while let Some(window) = windows.recv().await {
            if rules.is_empty() {
                continue;
            }
            let started = Instant::now();
            let set = Arc::clone(&rules);
            // Windows hold every series of a host; their trees are too large for a runtime
            // worker.
            let evaluated = tokio::task::spawn_blocking(move || {
                let mut increments = smolder_common::rules::Increments::default();
                for profile in &window.profiles {
                    set.evaluate_into(profile, &mut increments);
                }
                (increments, window.profiles.len())
            })
            .await;
            let (increments, profiles) = match evaluated {
                Ok(done) => done,
                Err(err) => {
                    metrics.tier.error("panic");
                    warn!(error = %err, "evaluating a window panicked; its counts are lost");
                    continue;
                }
            };
            let mut counters = exported
                .counters
                .lock()
                .expect("counters lock: taken to add or render, never across an await");
            let applied = counters.apply(increments);
            metrics.series.set(counters.series() as i64);
            drop(counters);
            if applied.over_limit > 0 {
                metrics.tier.dropped(
                    DroppedUnit::Increments,
                    SERIES_LIMIT,
                    applied.over_limit as u64,
                );
                warn!(
                    dropped = applied.over_limit,
                    limit = smolder_common::rules::MAX_SERIES_PER_RULE,
                    "a rule's group_by has more label combinations than the limit; new ones are not counted"
                );
            }
            metrics.windows_evaluated.inc();
            metrics
                .evaluation_duration
                .observe(started.elapsed().as_secs_f64());
            debug!(profiles, added = applied.added, "window evaluated");
        }
    }
    .instrument(info_span!("rules"))
    .await
}
