//! Per-tenant ingest rates: a token bucket of bytes per tenant, sans IO (times come in as
//! arguments). A tenant is admitted while its bucket is not empty and pays for what it sent,
//! which may take the bucket below zero: a request larger than the burst still gets through
//! once, and the tenant then waits until the rate has paid it back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::tenant::Tenant;

/// Past this many tenants, full buckets (tenants idle long enough) are forgotten.
const SWEEP_AT: usize = 10_000;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Bytes that may be sent now; negative while a large request is paid back.
    tokens: f64,
    at: Instant,
}

/// A tenant's rate: bytes per second, 0 for none, and the most its bucket holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rate {
    /// Bytes per second; 0 means no limit.
    pub(crate) per_second: u64,
    /// The burst, in bytes.
    pub(crate) burst: u64,
}

impl Rate {
    fn refilled(self, bucket: Bucket, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        (bucket.tokens + self.per_second as f64 * elapsed).min(self.burst.max(1) as f64)
    }
}

/// The buckets of every tenant that sent recently.
#[derive(Debug)]
pub(crate) struct TenantRates {
    /// Every tenant's rate but those in `own`.
    default: Rate,
    /// Tenants' own rates (`tenant.limits`).
    own: HashMap<Tenant, Rate>,
    buckets: HashMap<Tenant, Bucket>,
}

impl TenantRates {
    /// Buckets refilling at `default`'s rate, or a tenant's `own`.
    pub(crate) fn new(default: Rate, own: HashMap<Tenant, Rate>) -> TenantRates {
        TenantRates {
            default,
            own,
            buckets: HashMap::new(),
        }
    }

    /// `tenant`'s rate.
    pub(crate) fn rate(&self, tenant: &Tenant) -> Rate {
        self.own.get(tenant).copied().unwrap_or(self.default)
    }

    /// The setting that gives `tenant` its rate, as a refusal names it.
    pub(crate) fn setting(&self, tenant: &Tenant) -> String {
        if self.own.contains_key(tenant) {
            format!("tenant.limits.{tenant}.ingest-bytes-per-second")
        } else {
            "admission.tenant-ingest-bytes-per-second".to_owned()
        }
    }

    /// Whether any tenant has a limit.
    pub(crate) fn any(&self) -> bool {
        self.default.per_second > 0 || self.own.values().any(|rate| rate.per_second > 0)
    }

    fn bucket(&mut self, tenant: &Tenant, now: Instant) -> &mut Bucket {
        if self.buckets.len() >= SWEEP_AT && !self.buckets.contains_key(tenant) {
            let (default, own) = (self.default, &self.own);
            self.buckets.retain(|tenant, bucket| {
                let rate = own.get(tenant).copied().unwrap_or(default);
                rate.refilled(*bucket, now) < rate.burst as f64
            });
        }
        let rate = self.rate(tenant);
        let bucket = self.buckets.entry(tenant.clone()).or_insert(Bucket {
            tokens: rate.burst.max(1) as f64,
            at: now,
        });
        bucket.tokens = rate.refilled(*bucket, now);
        bucket.at = now;
        bucket
    }

    /// Whether `tenant` may send now; else how long until it may.
    pub(crate) fn admit(&mut self, tenant: &Tenant, now: Instant) -> Result<(), Duration> {
        let rate = self.rate(tenant);
        if rate.per_second == 0 {
            return Ok(());
        }
        let bucket = self.bucket(tenant, now);
        if bucket.tokens > 0.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (-bucket.tokens + 1.0) / rate.per_second as f64,
            ))
        }
    }

    /// Charges `tenant` for `bytes` it sent.
    pub(crate) fn charge(&mut self, tenant: &Tenant, bytes: u64, now: Instant) {
        if self.rate(tenant).per_second > 0 {
            self.bucket(tenant, now).tokens -= bytes as f64;
        }
    }

    /// How many tenants have a bucket.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: u64, burst: u64) -> Rate {
        Rate { per_second, burst }
    }

    #[test]
    fn a_tenants_own_rate_replaces_the_default() {
        let (a, b, c) = (
            Tenant::new("team-a").unwrap(),
            Tenant::new("team-b").unwrap(),
            Tenant::new("team-c").unwrap(),
        );
        let own = HashMap::from([(a.clone(), rate(0, 0)), (b.clone(), rate(10, 100))]);
        let mut rates = TenantRates::new(rate(1000, 1000), own);
        assert!(rates.any());
        let t0 = Instant::now();
        for tenant in [&a, &b, &c] {
            rates.charge(tenant, 500, t0);
        }
        assert!(rates.admit(&a, t0).is_ok(), "no limit of its own");
        assert_eq!(
            rates.admit(&b, t0),
            Err(Duration::from_secs_f64(40.1)),
            "paid back at its own rate"
        );
        assert!(rates.admit(&c, t0).is_ok(), "the default's burst");
        assert_eq!(
            rates.setting(&b),
            "tenant.limits.team-b.ingest-bytes-per-second"
        );
        assert_eq!(
            rates.setting(&c),
            "admission.tenant-ingest-bytes-per-second"
        );
        assert!(!TenantRates::new(rate(0, 1), HashMap::from([(a, rate(0, 5))])).any());
    }

    #[test]
    fn a_tenant_pays_back_what_it_sent_over_its_rate() {
        let mut rates = TenantRates::new(rate(1000, 2000), HashMap::new());
        let (a, b) = (Tenant::anonymous(), Tenant::new("team-b").unwrap());
        let t0 = Instant::now();
        assert!(rates.admit(&a, t0).is_ok());
        rates.charge(&a, 5000, t0);
        let wait = rates.admit(&a, t0).unwrap_err();
        assert!(
            wait >= Duration::from_secs(3) && wait <= Duration::from_millis(3002),
            "{wait:?}"
        );
        assert!(rates.admit(&b, t0).is_ok(), "another tenant has its own");
        assert!(rates.admit(&a, t0 + Duration::from_millis(2999)).is_err());
        assert!(rates.admit(&a, t0 + Duration::from_millis(3002)).is_ok());
        // Idle long: full again, no more than the burst.
        let later = t0 + Duration::from_secs(100);
        rates.charge(&a, 2000, later);
        assert!(
            rates.admit(&a, later).is_err(),
            "the burst is the most saved"
        );
    }

    #[test]
    fn idle_tenants_are_forgotten_past_many() {
        let mut rates = TenantRates::new(rate(1000, 1000), HashMap::new());
        let t0 = Instant::now();
        for i in 0..SWEEP_AT {
            rates.charge(&Tenant::new(&format!("t{i}")).unwrap(), 10, t0);
        }
        assert_eq!(rates.len(), SWEEP_AT);
        rates.charge(&Tenant::anonymous(), 10, t0 + Duration::from_secs(1));
        assert_eq!(rates.len(), 1, "the refilled buckets went");
    }
}
