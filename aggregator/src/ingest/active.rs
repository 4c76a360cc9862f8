//! Active series per tenant, sans IO: which series each tenant has written recently, so that
//! `ingest.max-active-series-per-tenant` can refuse the new series of a tenant at its limit.
//!
//! Input: the series of every request that passed the other checks, with the request's time.
//! Output: whether each may be stored. A series is active for [`ACTIVE_WINDOW`] after its last
//! write; a tenant at its limit has the series idle longer than that forgotten (at most once a
//! [`SWEEP_INTERVAL`]) before a new one is refused. The count starts from zero when the
//! aggregator starts: after a restart, a tenant may add up to the limit again before the
//! series it had are counted (OPERATIONS.md, "Limits").

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use smolder_common::Series;

use crate::tenant::Tenant;

/// How long a series counts as active after its last write: the head's span, beyond which its
/// writes are in blocks.
pub(crate) const ACTIVE_WINDOW: Duration = Duration::from_secs(3_600);
/// How often a tenant at its limit has its idle series forgotten: a sweep reads every series of
/// the tenant.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The active series of every tenant, each under its limit.
pub(crate) struct ActiveSeries {
    /// Every tenant's limit but those in `own`; 0 for none.
    limit: usize,
    /// Tenants' own limits (`tenant.limits`).
    own: HashMap<Tenant, usize>,
    /// Held for one request's lookups and inserts, never across I/O.
    tenants: Mutex<HashMap<Tenant, TenantSeries>>,
}

#[derive(Default)]
struct TenantSeries {
    /// Each active series with the Unix second of its last write.
    last_write: HashMap<Series, u64>,
    /// When idle series were last forgotten, Unix seconds.
    swept: u64,
}

impl TenantSeries {
    fn sweep(&mut self, now: u64) {
        if now.saturating_sub(self.swept) < SWEEP_INTERVAL.as_secs() {
            return;
        }
        self.swept = now;
        let cutoff = now.saturating_sub(ACTIVE_WINDOW.as_secs());
        self.last_write.retain(|_, last| *last >= cutoff);
    }
}

impl ActiveSeries {
    /// No active series yet; `limit` series per tenant, or a tenant's `own`, 0 for no limit.
    pub(crate) fn new(limit: usize, own: HashMap<Tenant, usize>) -> ActiveSeries {
        ActiveSeries {
            limit,
            own,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// Whether each of `series` may be written for `tenant` at `now` (Unix seconds): a series
    /// active already may, a new one while the tenant is under its limit; those that may are
    /// active from now on.
    pub(crate) fn admit<'s>(
        &self,
        tenant: &Tenant,
        series: impl IntoIterator<Item = &'s Series>,
        now: u64,
    ) -> Vec<bool> {
        let limit = self.limit(tenant);
        if limit == 0 {
            return series.into_iter().map(|_| true).collect();
        }
        let mut tenants = self
            .tenants
            .lock()
            .expect("active series lock: held for lookups only");
        let active = tenants.entry(tenant.clone()).or_default();
        series
            .into_iter()
            .map(|series| {
                if let Some(last) = active.last_write.get_mut(series) {
                    *last = now;
                    return true;
                }
                if active.last_write.len() >= limit {
                    active.sweep(now);
                }
                if active.last_write.len() >= limit {
                    return false;
                }
                active.last_write.insert(series.clone(), now);
                true
            })
            .collect()
    }

    /// `tenant`'s limit.
    pub(crate) fn limit(&self, tenant: &Tenant) -> usize {
        self.own.get(tenant).copied().unwrap_or(self.limit)
    }

    /// The setting that gives `tenant` its limit, as the refusal names it.
    pub(crate) fn setting(&self, tenant: &Tenant) -> String {
        if self.own.contains_key(tenant) {
            format!("tenant.limits.{tenant}.max-active-series")
        } else {
            "ingest.max-active-series-per-tenant".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str) -> Series {
        name.parse().unwrap()
    }

    #[test]
    fn a_tenant_at_its_limit_keeps_its_series_and_gets_no_new_one() {
        let active = ActiveSeries::new(2, HashMap::new());
        let (a, b) = (Tenant::anonymous(), Tenant::new("team-b").unwrap());
        let [x, y, z] = [series("x.cpu"), series("y.cpu"), series("z.cpu")];
        assert_eq!(active.admit(&a, [&x, &y, &z], 1_000), [true, true, false]);
        assert_eq!(active.admit(&a, [&z, &x], 1_010), [false, true]);
        // Another tenant has its own count.
        assert_eq!(active.admit(&b, [&z], 1_010), [true]);
        // Once y has been idle past the window, a new series takes its place.
        let later = 1_010 + ACTIVE_WINDOW.as_secs() - 5;
        assert_eq!(active.admit(&a, [&x], later), [true]);
        let after = 1_000 + ACTIVE_WINDOW.as_secs() + 1;
        assert_eq!(active.admit(&a, [&z], after + 100), [true]);
        assert_eq!(active.admit(&a, [&y], after + 100), [false]);
    }

    #[test]
    fn a_tenants_own_limit_replaces_the_default() {
        let (a, b) = (
            Tenant::new("team-a").unwrap(),
            Tenant::new("team-b").unwrap(),
        );
        let active = ActiveSeries::new(1, HashMap::from([(a.clone(), 3), (b.clone(), 0)]));
        let all: Vec<Series> = (0..5).map(|i| series(&format!("s{i}.cpu"))).collect();
        assert_eq!(active.admit(&a, &all, 1), [true, true, true, false, false]);
        assert!(active.admit(&b, &all, 1).into_iter().all(|ok| ok), "none");
        let c = Tenant::anonymous();
        assert_eq!(active.admit(&c, &all[..2], 1), [true, false], "the default");
        assert_eq!(
            (active.limit(&a), active.limit(&b), active.limit(&c)),
            (3, 0, 1)
        );
        assert_eq!(active.setting(&a), "tenant.limits.team-a.max-active-series");
        assert_eq!(active.setting(&c), "ingest.max-active-series-per-tenant");
    }

    #[test]
    fn zero_means_no_limit() {
        let active = ActiveSeries::new(0, HashMap::new());
        let all: Vec<Series> = (0..100).map(|i| series(&format!("s{i}.cpu"))).collect();
        assert!(
            active
                .admit(&Tenant::anonymous(), &all, 1)
                .into_iter()
                .all(|ok| ok)
        );
    }
}
