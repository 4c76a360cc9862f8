//! The limits each series of a request or agent batch is checked against, one by one: series per
//! request, labels and their length, time (not from the future, not older than the retention),
//! and the tenant's active series ([`ActiveSeries`], `active.rs`). Input: a request's profiles;
//! output: those that pass, and a [`Refused`] for each of the others. Sans IO: the time is the
//! caller's. Caller: the [`Ingester`](super::Ingester), which stores the ones that pass.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use smolder_common::Profile;
use smolder_common::wire::{BatchLimits, Refusal, RefusalReason};

use super::IngestConfig;
use super::active::ActiveSeries;
use super::ingester::Refused;
use crate::store::unix;
use crate::tenant::{Tenant, TenantLimits};

/// How far past the aggregator's clock a profile may end: agents' clocks drift, but a profile
/// from the future would sit in a bucket no query reaches and that retention never deletes.
pub(crate) const MAX_CLOCK_SKEW: Duration = Duration::from_secs(600);

/// The limits of `ingest:` and the store's retention, with the tenants' active series.
pub(crate) struct Limits {
    max_batch_bytes: u32,
    max_series_per_request: usize,
    max_labels_per_series: usize,
    max_label_bytes: usize,
    /// Profiles that ended longer ago than this are refused: the store's retention
    /// (`store.retention`), which would delete them at once.
    retention: Duration,
    active: ActiveSeries,
}

impl Limits {
    /// The limits of `config` and of the `tenants` with limits of their own, with the store's
    /// `retention`.
    pub(crate) fn new(
        config: &IngestConfig,
        tenants: &HashMap<Tenant, TenantLimits>,
        retention: Duration,
    ) -> Limits {
        let own = tenants
            .iter()
            .filter_map(|(tenant, limits)| Some((tenant.clone(), limits.max_active_series?)))
            .collect();
        Limits {
            max_batch_bytes: config.quic.max_batch_bytes,
            max_series_per_request: config.max_series_per_request,
            max_labels_per_series: config.max_labels_per_series,
            max_label_bytes: config.max_label_bytes,
            retention,
            active: ActiveSeries::new(config.max_active_series_per_tenant, own),
        }
    }

    /// The limits a batch must keep, as the QUIC welcome announces them.
    pub(crate) fn batch(&self) -> BatchLimits {
        let cap = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        BatchLimits {
            max_batch_bytes: u64::from(self.max_batch_bytes),
            max_series: cap(self.max_series_per_request),
            max_labels: cap(self.max_labels_per_series),
            max_label_bytes: cap(self.max_label_bytes),
        }
    }

    /// The profiles that pass every check, in order; the others go to `refused` under their
    /// index among the request's series (which, for an agent batch, skips those `refused` holds
    /// already).
    pub(crate) fn check(
        &self,
        tenant: &Tenant,
        profiles: Vec<(Profile, &'static str)>,
        refused: &mut Vec<Refused>,
        now: SystemTime,
    ) -> Vec<(Profile, &'static str)> {
        let limits = self.batch();
        let mut taken: Vec<usize> = refused.iter().map(|r| r.index).collect();
        taken.sort_unstable();
        let mut indices = (0..).filter(|i| taken.binary_search(i).is_err());
        let total = profiles.len() + refused.len();
        let mut passed = Vec::with_capacity(profiles.len());
        for (profile, kind) in profiles {
            let index = indices.next().expect("an unbounded range");
            let outcome = if index >= self.max_series_per_request {
                Err(Refusal {
                    reason: RefusalReason::TooManySeries,
                    message: format!(
                        "the request makes {total} series, more than ingest.max-series-per-request ({}); series {} ({}) is past it",
                        self.max_series_per_request,
                        index,
                        profile.series.app()
                    ),
                })
            } else {
                limits
                    .check_labels(profile.series.app(), profile.series.labels().iter())
                    .and_then(|()| check_time(&profile, now, self.retention))
            };
            match outcome {
                Ok(()) => passed.push((index, profile, kind)),
                Err(refusal) => refused.push(Refused { index, refusal }),
            }
        }
        // The tenant's limit is taken last, so that series refused for another reason do not
        // count against it.
        let admitted = self.active.admit(
            tenant,
            passed.iter().map(|(_, profile, _)| &profile.series),
            unix(now),
        );
        passed
            .into_iter()
            .zip(admitted)
            .filter_map(|((index, profile, kind), admitted)| {
                if admitted {
                    return Some((profile, kind));
                }
                refused.push(Refused {
                    index,
                    refusal: Refusal {
                        reason: RefusalReason::TenantSeriesLimit,
                        message: format!(
                            "series {} is new and tenant {tenant} has {} active series, its limit ({})",
                            profile.series,
                            self.active.limit(tenant),
                            self.active.setting(tenant)
                        ),
                    },
                });
                None
            })
            .collect()
    }
}

/// Refuses a profile stamped beyond [`MAX_CLOCK_SKEW`] or older than `retention`.
fn check_time(profile: &Profile, now: SystemTime, retention: Duration) -> Result<(), Refusal> {
    if profile.until > now + MAX_CLOCK_SKEW {
        return Err(Refusal {
            reason: RefusalReason::ClockSkew,
            message: format!(
                "until {} is more than {} s after the aggregator's clock ({})",
                unix(profile.until),
                MAX_CLOCK_SKEW.as_secs(),
                unix(now)
            ),
        });
    }
    if profile.until + retention < now {
        return Err(Refusal {
            reason: RefusalReason::TooOld,
            message: format!(
                "until {} is older than the retention (store.retention, {} s); it would be deleted at once",
                unix(profile.until),
                retention.as_secs()
            ),
        });
    }
    Ok(())
}
