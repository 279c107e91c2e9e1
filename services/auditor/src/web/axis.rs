//! Value axes of the UI's charts: round ticks (1, 2 or 5 times a power of ten, at most five
//! intervals) from 0 up to the first tick at or above the largest value, so the top of an axis
//! is a labelled round number and the largest mark sits at or under it; and the labels a
//! latency axis writes (`500 ms`, `1.5 s`, `80 s`); and coordinates as the charts write them.

/// The ticks of an axis from 0 to `max` (at least 1): every multiple of the step up to the
/// first at or above `max`, which is the axis' top.
pub fn ticks(max: i64) -> Vec<i64> {
    let max = max.max(1);
    // Steps of `s` to reach `v` (both above 0), rounded up.
    let steps = |v: i64, s: i64| v / s + i64::from(v % s != 0);
    let mut step: i64 = 1;
    'find: loop {
        for m in [1, 2, 5] {
            let s = step.saturating_mul(m);
            if steps(max, s) <= 5 {
                step = s;
                break 'find;
            }
        }
        step = step.saturating_mul(10);
    }
    (0..=steps(max, step)).map(|i| i * step).collect()
}

/// A duration in milliseconds as an axis label: `0`, `250 ms`, `1 s`, `1.5 s`, `80 s`.
pub fn ms_label(ms: i64) -> String {
    match ms {
        0 => "0".to_string(),
        ms if ms < 1000 => format!("{ms} ms"),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{} s", (ms as f64 / 1000.0 * 10.0).round() / 10.0),
    }
}

/// A chart coordinate as the SVG writes it: one decimal.
pub fn coord(v: f64) -> String {
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_the_top_covers_the_largest_value() {
        assert_eq!(ticks(0), vec![0, 1]);
        assert_eq!(ticks(4), vec![0, 1, 2, 3, 4]);
        assert_eq!(ticks(7), vec![0, 2, 4, 6, 8]);
        assert_eq!(ticks(100), vec![0, 20, 40, 60, 80, 100]);
        assert_eq!(
            ticks(80_870),
            vec![0, 20_000, 40_000, 60_000, 80_000, 100_000]
        );
        for max in [1, 3, 9, 11, 99, 101, 1234, 99_999, 123_456_789] {
            let t = ticks(max);
            assert!(t.len() <= 6 && t.len() >= 2, "{max}: {t:?}");
            assert!(*t.last().unwrap() >= max, "{max}: {t:?}");
            // The step before the top would not have covered it: no empty interval on top.
            assert!(t[t.len() - 2] < max, "{max}: {t:?}");
        }
    }

    #[test]
    fn latency_labels_read_in_ms_then_seconds() {
        assert_eq!(ms_label(0), "0");
        assert_eq!(ms_label(250), "250 ms");
        assert_eq!(ms_label(1000), "1 s");
        assert_eq!(ms_label(1500), "1.5 s");
        assert_eq!(ms_label(80_000), "80 s");
    }
}
