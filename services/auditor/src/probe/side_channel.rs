//! The side-channel audit: whether the prefix cache's timing is visible across tenants, as a
//! paired timing test in the style of Gu et al., "Auditing Prompt Caching in Language Model
//! APIs" (ICML 2025).
//!
//! Each round, the owner tenant sends a fresh marked prompt twice (the first computes it and
//! caches it, the second is the **warm** sample), then the other tenant sends that very prompt
//! (the **cross** sample) and a fresh prompt of the same length (the **cold** sample), in an
//! order that alternates between rounds. Time to first token of each is the measure.
//!
//! - Positive control: warm must differ from cold (two-sample Kolmogorov–Smirnov p below
//!   [`CONTROL_ALPHA`], warm faster). Otherwise the audit cannot see a cache hit at all (cache
//!   off, or the prompt too short for this machine to tell) and is inconclusive.
//! - The test: cross against cold. Under isolation (I10) the other tenant's request computes
//!   the whole prompt like any cold one, so the two are one distribution; a p-value below the
//!   threshold with cross faster means another tenant's cache served it: a `side_channel`
//!   incident. The p-value is exported per worker as `pagewarden_auditor_isolation_ks_p`.
//!
//! The scheduling-order channel (PromptPeek, Wu et al., NDSS 2025): a scheduler that serves
//! requests with a cached prefix first (longest-prefix-match ordering) lets a tenant learn
//! another tenant's prompt from the order its own requests come back in. Each order round, the
//! owner caches two fresh prompts, then the other tenant sends a batch of four: two on the
//! owner's prompts (**cross**) and two fresh ones (**cold**), in positions drawn at random and
//! sent a few milliseconds apart. Under isolation the order cannot depend on which positions
//! hold the cross requests, so the number of (cross, cold) pairs in which the cross request got
//! its first token first is, summed over rounds, a sum of independent Mann–Whitney U(2, 2)
//! counts; the exact one-sided p-value of the observed sum is [`order_p`].
//!
//! Per worker: when the deployment signs isolation receipts, every audit request asks for one,
//! and a round counts for a prefill worker only when the receipts say that worker computed all
//! of its requests (the owner's and the other tenant's: a cache is one worker's, so rounds
//! split across workers test no cache and are left out). Without receipts the audit cannot
//! tell the workers apart and reports one series, `all`.

use std::collections::BTreeMap;

use crate::ks::ks_two_sample;

/// Significance the positive control must reach for the audit to count.
pub const CONTROL_ALPHA: f64 = 0.05;

/// Pages of filler in each audit prompt: long enough that a cached prefix saves a visible
/// share of its first-token time on any machine the suite runs on.
pub const PROMPT_PAGES: u32 = 32;

/// How the audit runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SideChannelSettings {
    /// Rounds per audit (4 requests each); 0 turns the audit off.
    pub rounds: u32,
    /// Rounds of the scheduling-order audit (6 requests each); 0 turns it off.
    pub order_rounds: u32,
    /// The p-value (cross against cold, and of the order) below which an incident opens.
    pub threshold: f64,
}

impl Default for SideChannelSettings {
    /// 8 rounds: two disjoint samples of 8 reach p ≈ 2·10⁻⁴, well below the default threshold
    /// of 10⁻³, while identical distributions pass it in all but one audit in a thousand.
    fn default() -> Self {
        Self {
            rounds: 8,
            order_rounds: ORDER_ROUNDS,
            threshold: 1e-3,
        }
    }
}

/// First-token times of one audit, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// The owner's repeat of its own prompt (positive control).
    pub warm: Vec<f64>,
    /// The other tenant on the owner's prompt.
    pub cross: Vec<f64>,
    /// The other tenant on a fresh prompt (negative control).
    pub cold: Vec<f64>,
}

/// What an audit found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// Kolmogorov–Smirnov D and p of cross against cold.
    pub cross_d: f64,
    /// Its p-value.
    pub cross_p: f64,
    /// p-value of warm against cold (the positive control).
    pub control_p: f64,
    /// The positive control passed: the audit could see a cache hit.
    pub conclusive: bool,
    /// Another tenant's cache served the cross requests: the p-value is below the threshold,
    /// cross faster than cold, and the control passed.
    pub leak: bool,
}

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `v` (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    let s = sorted(v);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The worker a round is reported under when the deployment signs no receipts.
pub const ALL_WORKERS: &str = "all";

/// Where a round's requests were computed, as far as the receipts tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every request on this prefill worker (`all`: no receipts, so not known).
    On(String),
    /// Its requests went to different workers: the round tested no one worker's cache.
    Split,
}

/// The placement of a round whose requests were computed on `workers` (`None`: receipts are
/// off, so no request can say).
pub fn placement<'a>(workers: impl IntoIterator<Item = Option<&'a str>>) -> Placement {
    let mut seen: Option<&str> = None;
    for w in workers {
        let w = w.unwrap_or(ALL_WORKERS);
        match seen {
            None => seen = Some(w),
            Some(s) if s == w => {}
            Some(_) => return Placement::Split,
        }
    }
    Placement::On(seen.unwrap_or(ALL_WORKERS).to_string())
}

/// One timing round: where it ran and its first-token times.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// The prefill worker all of its requests were computed on.
    pub worker: String,
    /// The owner's repeat.
    pub warm: f64,
    /// The other tenant on the owner's prompt.
    pub cross: f64,
    /// The other tenant on a fresh prompt.
    pub cold: f64,
}

/// The rounds grouped by worker: one audit per worker.
pub fn by_worker(rounds: &[Round]) -> BTreeMap<String, Timings> {
    let mut out: BTreeMap<String, Timings> = BTreeMap::new();
    for r in rounds {
        let t = out.entry(r.worker.clone()).or_default();
        t.warm.push(r.warm);
        t.cross.push(r.cross);
        t.cold.push(r.cold);
    }
    out
}

/// Rounds of the order audit (a batch of 4 each); 6 reach p = 6⁻⁶ ≈ 2·10⁻⁵ when every cross
/// request comes back first, below the default threshold.
pub const ORDER_ROUNDS: u32 = 6;

/// Cross and cold requests in each order round's batch.
pub const ORDER_PAIRS: usize = 2;

/// The number of (cross, cold) pairs of one order round in which the cross request got its
/// first token strictly before the cold one (ties count for cold: the test stays exact or
/// conservative).
pub fn cross_first(cross: &[f64], cold: &[f64]) -> u32 {
    cross
        .iter()
        .map(|x| cold.iter().filter(|c| x < c).count() as u32)
        .sum()
}

/// How often each U of one round of `m` cross and `n` cold requests occurs among the
/// C(m + n, m) equally likely placements of the cross requests in the finishing order
/// (Mann–Whitney's null distribution), by the recurrence on who finishes last.
fn u_counts(m: usize, n: usize) -> Vec<f64> {
    if m == 0 || n == 0 {
        return vec![1.0];
    }
    // The last to finish is a cross request (first before no cold one: the rest's U) or a
    // cold one (every cross request is first before it: the rest's U plus m).
    let last_cross = u_counts(m - 1, n);
    let last_cold = u_counts(m, n - 1);
    let mut out = vec![0.0; m * n + 1];
    for (u, c) in last_cross.iter().enumerate() {
        out[u] += c;
    }
    for (u, c) in last_cold.iter().enumerate() {
        out[u + m] += c;
    }
    out
}

/// The exact one-sided p-value of the order audit: the probability, were the order independent
/// of which positions hold the cross requests, that `rounds` rounds of `m` cross and `n` cold
/// requests would show `observed` or more (cross, cold) pairs with the cross request first.
/// 1 when there are no rounds.
pub fn order_p(m: usize, n: usize, rounds: usize, observed: u32) -> f64 {
    let one = u_counts(m, n);
    let total: f64 = one.iter().sum();
    let one: Vec<f64> = one.iter().map(|c| c / total).collect();
    let mut dist = vec![1.0];
    for _ in 0..rounds {
        let mut next = vec![0.0; dist.len() + one.len() - 1];
        for (a, pa) in dist.iter().enumerate() {
            for (b, pb) in one.iter().enumerate() {
                next[a + b] += pa * pb;
            }
        }
        dist = next;
    }
    dist.iter().skip(observed as usize).sum::<f64>().min(1.0)
}

/// Judges one audit's timings against `threshold`.
pub fn judge(t: &Timings, threshold: f64) -> Verdict {
    let (warm, cross, cold) = (sorted(&t.warm), sorted(&t.cross), sorted(&t.cold));
    let (cross_d, cross_p) = ks_two_sample(&cross, &cold);
    let (_, control_p) = ks_two_sample(&warm, &cold);
    let conclusive = control_p < CONTROL_ALPHA && median(&warm) < median(&cold);
    let leak = conclusive && cross_p < threshold && median(&cross) < median(&cold);
    Verdict {
        cross_d,
        cross_p,
        control_p,
        conclusive,
        leak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(warm: &[f64], cross: &[f64], cold: &[f64]) -> Timings {
        Timings {
            warm: warm.to_vec(),
            cross: cross.to_vec(),
            cold: cold.to_vec(),
        }
    }

    const COLD: [f64; 8] = [150.0, 160.0, 148.0, 171.0, 155.0, 149.0, 158.0, 162.0];
    const WARM: [f64; 8] = [31.0, 29.0, 35.0, 30.0, 33.0, 28.0, 36.0, 32.0];
    const COLD_TOO: [f64; 8] = [152.0, 157.0, 151.0, 168.0, 150.0, 163.0, 147.0, 159.0];

    #[test]
    fn a_cross_tenant_hit_is_a_leak_and_isolation_is_not() {
        let leaky = judge(&timings(&WARM, &WARM, &COLD), 1e-3);
        assert!(leaky.conclusive && leaky.leak, "{leaky:?}");
        assert!(leaky.cross_p < 1e-3 && leaky.cross_d == 1.0, "{leaky:?}");
        let isolated = judge(&timings(&WARM, &COLD_TOO, &COLD), 1e-3);
        assert!(isolated.conclusive && !isolated.leak, "{isolated:?}");
        assert!(isolated.cross_p > 0.05, "{isolated:?}");
    }

    #[test]
    fn rounds_count_per_worker_and_split_rounds_for_none() {
        assert_eq!(
            placement([Some("p0"), Some("p0"), Some("p0")]),
            Placement::On("p0".into())
        );
        assert_eq!(placement([Some("p0"), Some("p1")]), Placement::Split);
        assert_eq!(placement([None, None]), Placement::On(ALL_WORKERS.into()));
        let round = |worker: &str, cross: f64| Round {
            worker: worker.into(),
            warm: 30.0,
            cross,
            cold: 150.0,
        };
        let g = by_worker(&[round("p0", 31.0), round("p1", 152.0), round("p0", 29.0)]);
        assert_eq!(g.len(), 2);
        assert_eq!(g["p0"].cross, vec![31.0, 29.0]);
        assert_eq!(g["p1"].cold, vec![150.0]);
    }

    #[test]
    fn the_order_test_is_mann_whitney_exact() {
        // U(2, 2): 6 placements, U = 0, 1, 2, 2, 3, 4.
        assert_eq!(u_counts(2, 2), vec![1.0, 1.0, 2.0, 1.0, 1.0]);
        assert_eq!(u_counts(1, 3), vec![1.0, 1.0, 1.0, 1.0]);
        assert!((order_p(2, 2, 1, 4) - 1.0 / 6.0).abs() < 1e-12);
        assert!((order_p(2, 2, 1, 3) - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(order_p(2, 2, 3, 0), 1.0);
        assert_eq!(order_p(2, 2, 0, 0), 1.0);
        // Every cross request first in 6 rounds: 6^-6.
        let all_first = order_p(2, 2, ORDER_ROUNDS as usize, 4 * ORDER_ROUNDS);
        assert!((all_first - 6f64.powi(-6)).abs() < 1e-15, "{all_first}");
        assert!(all_first < SideChannelSettings::default().threshold);
        // Half the pairs, as chance gives: nowhere near.
        assert!(order_p(2, 2, 6, 12) > 0.5);
        assert_eq!(cross_first(&[10.0, 40.0], &[20.0, 30.0]), 2);
        assert_eq!(cross_first(&[10.0, 20.0], &[10.0, 30.0]), 2);
    }

    #[test]
    fn without_a_visible_cache_hit_the_audit_is_inconclusive_and_files_nothing() {
        // Cache off: warm is as slow as cold, and so is cross.
        let off = judge(&timings(&COLD_TOO, &COLD_TOO, &COLD), 1e-3);
        assert!(!off.conclusive && !off.leak, "{off:?}");
        // Cross slower than cold (a busy machine) is no leak, however different.
        let slow: Vec<f64> = COLD.iter().map(|c| c * 3.0).collect();
        let v = judge(&timings(&WARM, &slow, &COLD), 1e-3);
        assert!(v.cross_p < 1e-3 && !v.leak, "{v:?}");
    }
}
