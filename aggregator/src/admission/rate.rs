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

/// The buckets of every tenant that sent recently.
#[derive(Debug)]
pub(crate) struct TenantRates {
    /// Bytes per second.
    rate: f64,
    /// The most a bucket holds.
    burst: f64,
    buckets: HashMap<Tenant, Bucket>,
}

impl TenantRates {
    /// Buckets refilling at `rate` bytes per second up to `burst` bytes.
    pub(crate) fn new(rate: u64, burst: u64) -> TenantRates {
        TenantRates {
            rate: rate as f64,
            burst: burst.max(1) as f64,
            buckets: HashMap::new(),
        }
    }

    fn bucket(&mut self, tenant: &Tenant, now: Instant) -> &mut Bucket {
        if self.buckets.len() >= SWEEP_AT && !self.buckets.contains_key(tenant) {
            let (rate, burst) = (self.rate, self.burst);
            self.buckets.retain(|_, b| {
                b.tokens + rate * now.saturating_duration_since(b.at).as_secs_f64() < burst
            });
        }
        let (rate, burst) = (self.rate, self.burst);
        let bucket = self.buckets.entry(tenant.clone()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + rate * elapsed).min(burst);
        bucket.at = now;
        bucket
    }

    /// Whether `tenant` may send now; else how long until it may.
    pub(crate) fn admit(&mut self, tenant: &Tenant, now: Instant) -> Result<(), Duration> {
        let rate = self.rate;
        let bucket = self.bucket(tenant, now);
        if bucket.tokens > 0.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((-bucket.tokens + 1.0) / rate))
        }
    }

    /// Charges `tenant` for `bytes` it sent.
    pub(crate) fn charge(&mut self, tenant: &Tenant, bytes: u64, now: Instant) {
        self.bucket(tenant, now).tokens -= bytes as f64;
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

    #[test]
    fn a_tenant_pays_back_what_it_sent_over_its_rate() {
        let mut rates = TenantRates::new(1000, 2000);
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
        let mut rates = TenantRates::new(1000, 1000);
        let t0 = Instant::now();
        for i in 0..SWEEP_AT {
            rates.charge(&Tenant::new(&format!("t{i}")).unwrap(), 10, t0);
        }
        assert_eq!(rates.len(), SWEEP_AT);
        rates.charge(&Tenant::anonymous(), 10, t0 + Duration::from_secs(1));
        assert_eq!(rates.len(), 1, "the refilled buckets went");
    }
}
