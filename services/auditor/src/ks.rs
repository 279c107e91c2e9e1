//! The two-sample Kolmogorov–Smirnov test: how the side-channel audit (and `pagewarden bench
//! prefix`) tell whether two sets of timings come from one distribution.

/// The two-sample Kolmogorov–Smirnov statistic of sorted samples `x` and `y`, and its
/// asymptotic p-value (the Kolmogorov distribution with Stephens' small-sample correction).
pub fn ks_two_sample(x: &[f64], y: &[f64]) -> (f64, f64) {
    let (n, m) = (x.len(), y.len());
    if n == 0 || m == 0 {
        return (f64::NAN, f64::NAN);
    }
    let (mut i, mut j, mut d) = (0, 0, 0f64);
    while i < n && j < m {
        let v = x[i].min(y[j]);
        while i < n && x[i] <= v {
            i += 1;
        }
        while j < m && y[j] <= v {
            j += 1;
        }
        d = d.max((i as f64 / n as f64 - j as f64 / m as f64).abs());
    }
    let en = ((n * m) as f64 / (n + m) as f64).sqrt();
    let lambda = (en + 0.12 + 0.11 / en) * d;
    (d, kolmogorov_q(lambda))
}

/// `Q_KS(λ) = 2 Σ_{k≥1} (-1)^{k-1} e^{-2k²λ²}`, the probability that the scaled statistic
/// exceeds `λ` under the null hypothesis.
fn kolmogorov_q(lambda: f64) -> f64 {
    if lambda < 1e-3 {
        return 1.0;
    }
    let mut sum = 0.0;
    for k in 1..=100 {
        let k = k as f64;
        let term = (-2.0 * k * k * lambda * lambda).exp();
        sum += if k as u64 % 2 == 1 { term } else { -term };
        if term < 1e-12 {
            break;
        }
    }
    (2.0 * sum).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ks_matches_the_tables() {
        // Identical samples: D = 0, p = 1.
        let a: Vec<f64> = (0..30).map(f64::from).collect();
        let (d, p) = ks_two_sample(&a, &a);
        assert_eq!(d, 0.0);
        assert!((p - 1.0).abs() < 1e-9);
        // Disjoint samples: D = 1, p tiny.
        let b: Vec<f64> = (100..130).map(f64::from).collect();
        let (d, p) = ks_two_sample(&a, &b);
        assert_eq!(d, 1.0);
        assert!(p < 1e-6, "{p}");
        // Q_KS(1.36) ≈ 0.049 and Q_KS(1.63) ≈ 0.010: the 5% and 1% critical values.
        assert!((kolmogorov_q(1.36) - 0.049).abs() < 0.002);
        assert!((kolmogorov_q(1.63) - 0.010).abs() < 0.001);
        // Shifted by a third of the range: D = 1/3 for 30 and 30.
        let c: Vec<f64> = (10..40).map(f64::from).collect();
        assert!((ks_two_sample(&a, &c).0 - 1.0 / 3.0).abs() < 1e-9);
    }
}
