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
    /// The cross-vs-cold p-value below which an incident opens.
    pub threshold: f64,
}

impl Default for SideChannelSettings {
    /// 8 rounds: two disjoint samples of 8 reach p ≈ 2·10⁻⁴, well below the default threshold
    /// of 10⁻³, while identical distributions pass it in all but one audit in a thousand.
    fn default() -> Self {
        Self {
            rounds: 8,
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
