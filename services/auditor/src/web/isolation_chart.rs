//! The side-channel audit's p-values over time as inline SVG: one series per worker and
//! channel (circles: first-token timing; squares: scheduling order), on a log scale with p = 1
//! at the top and the threshold a dashed line. A leak is drawn filled red; an inconclusive
//! timing audit (its positive control saw no cache hit) hollow.

use maud::{html, Markup};
use std::collections::BTreeMap;

use super::axis::coord;
use super::html::time;
use crate::domain::IsolationChannel;
use crate::store::IsolationAudit;

const W: f64 = 900.0;
const PAD_L: f64 = 64.0;
const PAD_R: f64 = 16.0;
const PLOT_TOP: f64 = 12.0;
const PLOT_H: f64 = 220.0;

/// Colors of the workers' series, in the order their names sort.
const PALETTE: [&str; 6] = [
    "#1f618d", "#117a65", "#7d3c98", "#b9770e", "#2e4053", "#a04000",
];

/// The chart of `audits` (oldest first).
pub fn isolation(audits: &[IsolationAudit]) -> Markup {
    let neg_log = |p: f64| -p.max(1e-300).log10();
    let threshold = audits.last().map_or(1e-3, |a| a.audit.threshold);
    // Down to two decades below the threshold or the smallest p, in whole decades.
    let deepest = audits
        .iter()
        .map(|a| neg_log(a.audit.p))
        .fold(neg_log(threshold) + 2.0, f64::max)
        .ceil();
    let (t0, t1) = match (audits.first(), audits.last()) {
        (Some(a), Some(b)) => (a.audit.at.0, b.audit.at.0.max(a.audit.at.0 + 1)),
        _ => (0, 1),
    };
    let plot_w = W - PAD_L - PAD_R;
    let axis_y = PLOT_TOP + PLOT_H;
    let x_of = |t: i64| PAD_L + 8.0 + (t - t0) as f64 / (t1 - t0) as f64 * (plot_w - 16.0);
    let y_of = |p: f64| PLOT_TOP + neg_log(p) / deepest * PLOT_H;
    let mut series: BTreeMap<(String, IsolationChannel), Vec<&IsolationAudit>> = BTreeMap::new();
    for a in audits {
        series
            .entry((a.audit.worker.clone(), a.audit.channel))
            .or_default()
            .push(a);
    }
    let workers: Vec<&String> = {
        let mut w: Vec<&String> = series.keys().map(|(w, _)| w).collect();
        w.dedup();
        w
    };
    let color_of = |worker: &str| {
        let i = workers.iter().position(|w| *w == worker).unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    };
    let total_h = axis_y + 30.0 + (series.len().div_ceil(3) as f64) * 16.0;
    // A tick every decade (every other one past ten).
    let step = if deepest > 10.0 { 2 } else { 1 };
    let ty = y_of(threshold);
    html! {
        svg xmlns="http://www.w3.org/2000/svg" id="isolation-chart" width=(W) height=(total_h)
            viewBox={ "0 0 " (W) " " (total_h) } role="img"
            aria-label="Side-channel audit p-values over time, per worker" {
            line x1=(PAD_L) y1=(axis_y) x2=(W - PAD_R) y2=(axis_y) stroke="#566573" {}
            line x1=(PAD_L) y1=(PLOT_TOP) x2=(PAD_L) y2=(axis_y) stroke="#566573" {}
            @for d in (0..=deepest as i64).step_by(step) {
                @let y = PLOT_TOP + d as f64 / deepest * PLOT_H;
                text class="tick" x=(PAD_L - 4.0) y=(coord(y + 3.0)) font-size="10"
                    text-anchor="end" {
                    @if d == 0 { "p = 1" } @else { "1e-" (d) }
                }
            }
            line class="threshold" x1=(PAD_L) y1=(coord(ty)) x2=(W - PAD_R) y2=(coord(ty))
                stroke="#922b21" stroke-dasharray="4 3" {}
            text x=(W - PAD_R) y=(coord(ty - 3.0)) font-size="11" fill="#922b21"
                text-anchor="end" { "threshold " (format!("{threshold:.0e}")) }
            @if let (Some(a), Some(b)) = (audits.first(), audits.last()) {
                text x=(PAD_L) y=(axis_y + 14.0) font-size="11" { (time(a.audit.at)) }
                text x=(W - PAD_R) y=(axis_y + 14.0) font-size="11" text-anchor="end" {
                    (time(b.audit.at))
                }
            }
            @for ((worker, channel), points) in &series {
                @let color = color_of(worker);
                @let line: Vec<String> = points
                    .iter()
                    .map(|a| format!("{},{}", coord(x_of(a.audit.at.0)), coord(y_of(a.audit.p))))
                    .collect();
                polyline fill="none" stroke=(color) stroke-opacity="0.5" points=(line.join(" ")) {}
                @for a in points {
                    (point(a, worker, *channel, color, (x_of(a.audit.at.0), y_of(a.audit.p))))
                }
            }
            @for (i, (worker, channel)) in series.keys().enumerate() {
                @let x = PAD_L + (i % 3) as f64 * 280.0;
                @let y = axis_y + 24.0 + (i / 3) as f64 * 16.0;
                @let color = color_of(worker);
                @match channel {
                    IsolationChannel::Timing => {
                        circle cx=(x + 5.0) cy=(y + 5.0) r="5" fill=(color) {}
                    }
                    IsolationChannel::Order => {
                        rect x=(x + 0.5) y=(y + 0.5) width="9" height="9" fill=(color) {}
                    }
                }
                text x=(x + 14.0) y=(y + 9.0) font-size="11" { (worker) " · " (channel) }
            }
        }
    }
}

/// One verdict of `worker`'s `channel` series at `(x, y)`: filled red when it leaks, hollow
/// when inconclusive, else in the series' `color`; its hover text says what it found.
fn point(
    a: &IsolationAudit,
    worker: &str,
    channel: IsolationChannel,
    color: &str,
    (x, y): (f64, f64),
) -> Markup {
    let fill = match (a.audit.leak, a.audit.conclusive) {
        (true, _) => "#c0392b",
        (false, true) => color,
        (false, false) => "none",
    };
    let title = html! {
        title {
            "worker " (worker) ", " (channel) ": p = " (format!("{:.2e}", a.audit.p)) " over "
            (a.audit.rounds) " rounds"
            @match (a.audit.leak, a.audit.conclusive) {
                (true, _) => ", LEAK",
                (false, false) => ", inconclusive",
                (false, true) => "",
            }
            " (run " (a.audit.run_id.0) ", " (time(a.audit.at)) ")"
        }
    };
    let class = format!(
        "audit {} {}",
        channel,
        if a.audit.leak { "leak" } else { "ok" }
    );
    match channel {
        IsolationChannel::Timing => html! {
            circle cx=(coord(x)) cy=(coord(y)) r="4" class=(class) fill=(fill) stroke=(color) {
                (title)
            }
        },
        IsolationChannel::Order => html! {
            rect x=(coord(x - 4.0)) y=(coord(y - 4.0)) width="8" height="8" class=(class)
                fill=(fill) stroke=(color) {
                (title)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ProbeRunId, UnixMs};
    use crate::store::NewIsolationAudit;

    fn audit(worker: &str, channel: IsolationChannel, p: f64, at: i64) -> IsolationAudit {
        IsolationAudit {
            id: at,
            audit: NewIsolationAudit {
                run_id: ProbeRunId(at),
                worker: worker.into(),
                channel,
                rounds: 8,
                p,
                control_p: None,
                threshold: 1e-3,
                conclusive: true,
                leak: p < 1e-3,
                at: UnixMs(at),
            },
        }
    }

    #[test]
    fn each_worker_and_channel_is_a_series_and_a_leak_is_red_below_the_threshold() {
        let svg = isolation(&[
            audit("prefill-a", IsolationChannel::Timing, 0.4, 1_000),
            audit("prefill-a", IsolationChannel::Order, 0.7, 1_000),
            audit("prefill-b<", IsolationChannel::Timing, 2e-5, 2_000),
            audit("prefill-a", IsolationChannel::Timing, 0.2, 3_000),
        ])
        .into_string();
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("class=\"audit timing ok\"").count(), 2);
        assert_eq!(svg.matches("class=\"audit order ok\"").count(), 1);
        assert_eq!(svg.matches("class=\"audit timing leak\"").count(), 1);
        assert!(svg.contains("worker prefill-b&lt;, timing: p = 2.00e-5 over 8 rounds, LEAK"));
        assert!(svg.contains("threshold 1e-3"));
        // p = 1 at the top; the leak (p = 2e-5, axis down to 1e-5) below the threshold line.
        let y = |needle: &str| -> f64 {
            let at = svg.find(needle).unwrap();
            let key = if needle.contains("threshold") {
                "y1=\""
            } else {
                "cy=\""
            };
            let rest = &svg[at..];
            let v = &rest[rest.find(key).unwrap() + key.len()..];
            v[..v.find('"').unwrap()].parse().unwrap()
        };
        let leak_y = {
            let at = svg.find("class=\"audit timing leak\"").unwrap();
            let before = &svg[..at];
            let cy = &before[before.rfind("cy=\"").unwrap() + 4..];
            cy[..cy.find('"').unwrap()].parse::<f64>().unwrap()
        };
        assert!(leak_y > y("class=\"threshold\""), "{svg}");
        assert!(
            (leak_y - (PLOT_TOP + PLOT_H * 4.69897 / 5.0)).abs() < 0.2,
            "{leak_y}"
        );
    }

    #[test]
    fn no_audits_still_render() {
        let svg = isolation(&[]).into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(!svg.contains("class=\"audit"));
    }

    #[test]
    fn a_worker_name_is_escaped_in_titles_and_the_legend() {
        let svg = isolation(&[audit("<script>w</script>", IsolationChannel::Order, 0.5, 1)])
            .into_string();
        assert!(!svg.contains("<script>"), "{svg}");
        assert!(svg.contains("<title>worker &lt;script&gt;w&lt;/script&gt;, order: p = 5.00e-1"));
        assert!(svg.contains(">&lt;script&gt;w&lt;/script&gt; · order</text>"));
    }
}
