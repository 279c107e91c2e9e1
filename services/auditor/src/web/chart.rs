//! The integrity-counters chart: events per time bucket, stacked by kind, as inline SVG.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::html::{esc, time};
use crate::domain::{IntegrityKind, UnixMs};
use crate::store::SeriesPoint;

const W: f64 = 900.0;
const H: f64 = 260.0;
const PAD_L: f64 = 40.0;
const PAD_B: f64 = 24.0;

fn color(k: IntegrityKind) -> &'static str {
    match k {
        IntegrityKind::GenerationMismatch => "#c0392b",
        IntegrityKind::ChecksumMismatch => "#8e44ad",
        IntegrityKind::CountMismatch => "#2471a3",
        IntegrityKind::GuardWordCorrupt => "#d35400",
        IntegrityKind::WriteRejected => "#17a589",
        IntegrityKind::Quarantine => "#b7950b",
        IntegrityKind::DeferredReleaseDrained => "#7f8c8d",
        IntegrityKind::DeferredReleaseTimedOut => "#a04000",
        IntegrityKind::PreflightFailed => "#1b2631",
        IntegrityKind::PageNotWritten => "#1f618d",
        IntegrityKind::ManifestMismatch => "#6c3483",
        IntegrityKind::StaleMessage => "#a6acaf",
    }
}

/// Renders `points` (bucketed at `bucket_ms` from `since` to `now`) as an SVG element.
pub fn render(points: &[SeriesPoint], since: UnixMs, now: UnixMs, bucket_ms: i64) -> String {
    let first = since.0.div_euclid(bucket_ms);
    let last = now.0.div_euclid(bucket_ms);
    let n = (last - first + 1).max(1) as f64;
    let mut stacks: BTreeMap<i64, Vec<(IntegrityKind, i64)>> = BTreeMap::new();
    for p in points {
        stacks
            .entry(p.bucket.0.div_euclid(bucket_ms))
            .or_default()
            .push((p.kind, p.count));
    }
    let max = stacks
        .values()
        .map(|v| v.iter().map(|(_, c)| c).sum::<i64>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_w = W - PAD_L;
    let plot_h = H - PAD_B;
    let bar_w = (plot_w / n).max(1.0);
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"integrity-chart\" width=\"{W}\" \
         height=\"{}\" viewBox=\"0 0 {W} {}\" role=\"img\" aria-label=\"integrity events\">",
        H + 56.0,
        H + 56.0
    );
    let _ = write!(
        svg,
        "<line x1=\"{PAD_L}\" y1=\"{plot_h}\" x2=\"{W}\" y2=\"{plot_h}\" stroke=\"#566573\"/>\
         <text x=\"2\" y=\"12\" font-size=\"11\">{max}</text>\
         <text x=\"2\" y=\"{plot_h}\" font-size=\"11\">0</text>"
    );
    for (bucket, kinds) in &stacks {
        let x = PAD_L + (bucket - first) as f64 * bar_w;
        let mut y = plot_h;
        for (kind, count) in kinds {
            let h = *count as f64 / max * (plot_h - 16.0);
            y -= h;
            let _ = write!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\">\
                 <title>{} {}: {count}</title></rect>",
                (bar_w - 1.0).max(1.0),
                color(*kind),
                esc(&time(UnixMs(bucket * bucket_ms))),
                kind
            );
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{PAD_L}\" y=\"{}\" font-size=\"11\">{}</text>\
         <text x=\"{W}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
        plot_h + 14.0,
        esc(&time(since)),
        plot_h + 14.0,
        esc(&time(now))
    );
    for (i, k) in IntegrityKind::ALL.iter().enumerate() {
        let x = PAD_L + (i % 5) as f64 * 170.0;
        let y = H + 6.0 + (i / 5) as f64 * 16.0;
        let _ = write!(
            svg,
            "<rect x=\"{x}\" y=\"{y}\" width=\"10\" height=\"10\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"11\">{k}</text>",
            color(*k),
            x + 14.0,
            y + 9.0
        );
    }
    svg.push_str("</svg>");
    svg
}
