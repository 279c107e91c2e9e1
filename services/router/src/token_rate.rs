//! Per-tenant tokens per minute (the tenants file's `tokens_per_minute`): a token bucket per
//! tenant holding up to a minute's tokens and refilled continuously. A request is admitted
//! when the bucket holds its prompt's tokens (or is full, for a prompt larger than a minute's
//! worth), and the prompt is taken at once; completion tokens are taken as they are relayed,
//! so a long generation may drive the bucket below zero and the tenant's next request waits
//! for it to refill. A refusal is a 429 with `Retry-After` saying when the bucket will hold
//! enough.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pagewarden_common::TenantId;

use crate::error::RouterError;

/// One tenant's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens available (negative: owed by completions already relayed).
    level: f64,
    /// When `level` was last brought up to date.
    at: Instant,
}

/// Every tenant's bucket.
#[derive(Debug, Default)]
pub struct TokenRates {
    buckets: Mutex<HashMap<TenantId, Bucket>>,
}

impl TokenRates {
    /// Admits a request of `prompt` tokens for `tenant` under `per_minute` (`None`: no limit),
    /// taking its prompt's tokens; else the 429 with how long to wait.
    pub fn admit(
        &self,
        tenant: &TenantId,
        per_minute: Option<u64>,
        prompt: usize,
        now: Instant,
    ) -> Result<(), RouterError> {
        let Some(limit) = per_minute else {
            return Ok(());
        };
        let mut buckets = self.lock();
        let b = refill(&mut buckets, tenant, limit, now);
        let need = (prompt as f64).min(limit as f64);
        if b.level >= need {
            b.level -= prompt as f64;
            return Ok(());
        }
        let wait = (need - b.level) / per_second(limit);
        Err(RouterError::TokenRateExceeded {
            tenant: tenant.to_string(),
            per_minute: limit,
            retry_after: Duration::from_secs_f64(wait),
        })
    }

    /// Takes `tokens` (completion tokens relayed) from `tenant`'s bucket.
    pub fn charge(&self, tenant: &TenantId, per_minute: Option<u64>, tokens: u64, now: Instant) {
        let Some(limit) = per_minute else {
            return;
        };
        let mut buckets = self.lock();
        refill(&mut buckets, tenant, limit, now).level -= tokens as f64;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, Bucket>> {
        // A poisoned lock still holds whole buckets: each update is one assignment.
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn per_second(limit: u64) -> f64 {
    limit as f64 / 60.0
}

/// The tenant's bucket brought up to `now` (a new one is full).
fn refill<'a>(
    buckets: &'a mut HashMap<TenantId, Bucket>,
    tenant: &TenantId,
    limit: u64,
    now: Instant,
) -> &'a mut Bucket {
    let b = buckets.entry(tenant.clone()).or_insert(Bucket {
        level: limit as f64,
        at: now,
    });
    let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
    b.level = (b.level + elapsed * per_second(limit)).min(limit as f64);
    b.at = now;
    b
}

/// Charges one request's relayed completion tokens to its tenant's bucket.
#[derive(Debug, Clone)]
pub struct TokenMeter {
    rates: Arc<TokenRates>,
    tenant: TenantId,
    per_minute: Option<u64>,
}

impl TokenMeter {
    /// A meter for `tenant` under `per_minute` (`None`: charges nothing).
    pub fn new(rates: Arc<TokenRates>, tenant: TenantId, per_minute: Option<u64>) -> Self {
        Self {
            rates,
            tenant,
            per_minute,
        }
    }

    /// Takes `tokens` from the tenant's bucket.
    pub fn charge(&self, tokens: u64) {
        self.rates
            .charge(&self.tenant, self.per_minute, tokens, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(e: RouterError) -> f64 {
        match e {
            RouterError::TokenRateExceeded { retry_after, .. } => retry_after.as_secs_f64(),
            other => panic!("not a token-rate refusal: {other}"),
        }
    }

    #[test]
    fn a_minute_of_tokens_then_a_wait_as_long_as_the_refill() {
        let r = TokenRates::default();
        let a = TenantId::new("a");
        let t0 = Instant::now();
        // 600 a minute: 10 a second.
        assert!(r.admit(&a, Some(600), 400, t0).is_ok());
        assert!(r.admit(&a, Some(600), 200, t0).is_ok());
        let wait = secs(r.admit(&a, Some(600), 100, t0).unwrap_err());
        assert!((wait - 10.0).abs() < 1e-6, "{wait}");
        assert!(r
            .admit(&a, Some(600), 100, t0 + Duration::from_secs(10))
            .is_ok());
        // Completions relayed drive it below zero: the next prompt waits for them too.
        r.charge(&a, Some(600), 300, t0 + Duration::from_secs(10));
        let wait = secs(
            r.admit(&a, Some(600), 10, t0 + Duration::from_secs(10))
                .unwrap_err(),
        );
        assert!((wait - 31.0).abs() < 1e-6, "{wait}");
        // Another tenant, and a tenant without a limit, are not touched.
        assert!(r.admit(&TenantId::new("b"), Some(600), 600, t0).is_ok());
        assert!(r.admit(&a, None, 1_000_000, t0).is_ok());
    }

    #[test]
    fn a_prompt_larger_than_a_minute_passes_on_a_full_bucket() {
        let r = TokenRates::default();
        let a = TenantId::new("a");
        let t0 = Instant::now();
        assert!(r.admit(&a, Some(60), 500, t0).is_ok());
        let wait = secs(r.admit(&a, Some(60), 500, t0).unwrap_err());
        // 440 owed plus a full minute (60) at 1 a second.
        assert!((wait - 500.0).abs() < 1e-6, "{wait}");
    }
}
