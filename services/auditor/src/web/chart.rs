//! Counts over time as inline SVG: bars per time bucket, stacked by series. Two charts use it:
//! integrity events stacked by kind, and incidents opened stacked by severity.

use maud::{html, Markup};
use std::collections::BTreeMap;

use super::axis::{self, coord};
use super::html::time;
use crate::domain::{IntegrityKind, Severity, UnixMs};
use crate::store::{IncidentPoint, SeriesPoint};

const W: f64 = 900.0;
const H: f64 = 260.0;
const PAD_L: f64 = 40.0;
const PAD_B: f64 = 24.0;

/// One stacked segment: `count` events of series `name` in the bucket starting at `bucket`.
struct Segment {
    bucket: UnixMs,
    name: &'static str,
    color: &'static str,
    count: i64,
}

/// The time axis and the legend of one chart.
struct Frame<'a> {
    id: &'a str,
    label: &'a str,
    since: UnixMs,
    now: UnixMs,
    bucket_ms: i64,
    legend: Vec<(&'static str, &'static str)>,
}

fn integrity_color(k: IntegrityKind) -> &'static str {
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

/// The color of a severity, shared by the badges and the incidents chart.
pub fn severity_color(s: Severity) -> &'static str {
    match s {
        Severity::Info => "#5d6d7e",
        Severity::Warning => "#b9770e",
        Severity::Critical => "#922b21",
    }
}

/// Integrity events (bucketed at `bucket_ms` from `since` to `now`), stacked by kind.
pub fn integrity(points: &[SeriesPoint], since: UnixMs, now: UnixMs, bucket_ms: i64) -> Markup {
    let segments: Vec<Segment> = points
        .iter()
        .map(|p| Segment {
            bucket: p.bucket,
            name: p.kind.as_str(),
            color: integrity_color(p.kind),
            count: p.count,
        })
        .collect();
    let frame = Frame {
        id: "integrity-chart",
        label: "integrity events",
        since,
        now,
        bucket_ms,
        legend: IntegrityKind::ALL
            .iter()
            .map(|k| (k.as_str(), integrity_color(*k)))
            .collect(),
    };
    stacked(&frame, &segments)
}

/// Incidents opened (bucketed at `bucket_ms` from `since` to `now`), stacked by severity.
pub fn incidents(points: &[IncidentPoint], since: UnixMs, now: UnixMs, bucket_ms: i64) -> Markup {
    let segments: Vec<Segment> = points
        .iter()
        .map(|p| Segment {
            bucket: p.bucket,
            name: p.severity.as_str(),
            color: severity_color(p.severity),
            count: p.count,
        })
        .collect();
    let frame = Frame {
        id: "incidents-chart",
        label: "incidents opened",
        since,
        now,
        bucket_ms,
        legend: Severity::ALL
            .iter()
            .map(|s| (s.as_str(), severity_color(*s)))
            .collect(),
    };
    stacked(&frame, &segments)
}

fn stacked(f: &Frame<'_>, segments: &[Segment]) -> Markup {
    let bucket_ms = f.bucket_ms.max(1);
    let first = f.since.0.div_euclid(bucket_ms);
    let last = f.now.0.div_euclid(bucket_ms);
    let n = (last - first + 1).max(1) as f64;
    let mut stacks: BTreeMap<i64, Vec<&Segment>> = BTreeMap::new();
    for s in segments {
        stacks
            .entry(s.bucket.0.div_euclid(bucket_ms))
            .or_default()
            .push(s);
    }
    let y_ticks = axis::ticks(
        stacks
            .values()
            .map(|v| v.iter().map(|s| s.count).sum::<i64>())
            .max()
            .unwrap_or(0),
    );
    let max = *y_ticks.last().unwrap_or(&1) as f64;
    let plot_w = W - PAD_L;
    let plot_h = H - PAD_B;
    let bar_w = (plot_w / n).max(1.0);
    let legend_rows = f.legend.len().div_ceil(5) as f64;
    let total_h = H + 8.0 + legend_rows * 16.0;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" id=(f.id) width=(W) height=(total_h)
            viewBox={ "0 0 " (W) " " (total_h) } role="img" aria-label=(f.label) {
            line x1=(PAD_L) y1=(plot_h) x2=(W) y2=(plot_h) stroke="#566573" {}
            // Counts: a labelled gridline at every round tick.
            @for &t in &y_ticks {
                @let y = plot_h - t as f64 / max * (plot_h - 16.0);
                line x1=(PAD_L) y1=(coord(y)) x2=(W) y2=(coord(y)) stroke="#eaecee" {}
                text class="ytick" x=(PAD_L - 4.0) y=(coord(y + 4.0)) font-size="11"
                    text-anchor="end" { (t) }
            }
            @for (bucket, segs) in &stacks {
                @let x = PAD_L + (bucket - first) as f64 * bar_w;
                @for (s, (y, h)) in segs.iter().zip(stacked_heights(segs, max, plot_h)) {
                    rect x=(coord(x)) y=(coord(y)) width=(coord((bar_w - 1.0).max(1.0)))
                        height=(coord(h)) fill=(s.color) {
                        title { (time(UnixMs(bucket * bucket_ms))) " " (s.name) ": " (s.count) }
                    }
                }
            }
            text x=(PAD_L) y=(plot_h + 14.0) font-size="11" { (time(f.since)) }
            text x=(W) y=(plot_h + 14.0) font-size="11" text-anchor="end" { (time(f.now)) }
            @for (i, (name, color)) in f.legend.iter().enumerate() {
                @let x = PAD_L + (i % 5) as f64 * 170.0;
                @let y = H + 6.0 + (i / 5) as f64 * 16.0;
                rect x=(x) y=(y) width="10" height="10" fill=(color) {}
                text x=(x + 14.0) y=(y + 9.0) font-size="11" { (name) }
            }
        }
    }
}

/// The top and height of each segment of one bar, stacked upwards from the axis at `plot_h`.
fn stacked_heights(segs: &[&Segment], max: f64, plot_h: f64) -> Vec<(f64, f64)> {
    let mut y = plot_h;
    segs.iter()
        .map(|s| {
            let h = s.count as f64 / max * (plot_h - 16.0);
            y -= h;
            (y, h)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_stack_per_bucket_and_name_their_series() {
        let p = |bucket, severity, count| IncidentPoint {
            bucket: UnixMs(bucket),
            severity,
            count,
        };
        let svg = incidents(
            &[
                p(0, Severity::Critical, 2),
                p(0, Severity::Warning, 1),
                p(60_000, Severity::Info, 4),
            ],
            UnixMs(0),
            UnixMs(120_000),
            60_000,
        )
        .into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("id=\"incidents-chart\""));
        assert!(svg.contains("critical: 2") && svg.contains("warning: 1"));
        assert!(svg.contains("info: 4"));
        // The tallest stack (4) sets the scale: labelled 0 to 4.
        let labels: Vec<&str> = svg
            .split("class=\"ytick\"")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        assert_eq!(labels, ["0", "1", "2", "3", "4"]);
    }

    #[test]
    fn labels_and_names_are_escaped() {
        let frame = Frame {
            id: "x\"><script>",
            label: "a <b> & \"c\"",
            since: UnixMs(0),
            now: UnixMs(60_000),
            bucket_ms: 60_000,
            legend: vec![("<i>kind</i>", "#000")],
        };
        let segments = [Segment {
            bucket: UnixMs(0),
            name: "</title><script>",
            color: "#000",
            count: 1,
        }];
        let svg = stacked(&frame, &segments).into_string();
        for raw in ["<script>", "<b>", "<i>", "</title><script>"] {
            assert!(!svg.contains(raw), "{raw} unescaped in {svg}");
        }
        assert!(svg.contains("id=\"x&quot;&gt;&lt;script&gt;\""));
        assert!(svg.contains("aria-label=\"a &lt;b&gt; &amp; &quot;c&quot;\""));
        assert!(svg.contains("<title>1970-01-01 00:00:00 &lt;/title&gt;&lt;script&gt;: 1</title>"));
        assert!(svg.contains(">&lt;i&gt;kind&lt;/i&gt;</text>"));
    }
}
