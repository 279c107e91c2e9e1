//! First-token latency against prompt length as inline SVG, for probe steps (colored by
//! outcome) and for sampled requests of every tenant (colored by how they ended): each is a dot
//! at (prompt tokens, TTFT); one with no first token (refused, or no answer) is a dot on the
//! strip under the axis. The context limit is a dashed line.
//! Prompt length is on a log₂ scale: a full sweep doubles its length each step, and a light
//! sweep's short prompt would otherwise sit on the axis next to a context of thousands.

use maud::{html, Markup};

use super::axis::{self, coord};
use crate::domain::{ProbeOutcome, SampleStatus};
use crate::store::{ProbeResult, SamplePoint};

const W: f64 = 900.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PLOT_TOP: f64 = 12.0;
const PLOT_H: f64 = 240.0;
/// The "no first token" strip under the x axis.
const STRIP: f64 = 26.0;

/// The color of an outcome, shared by the dots and the legend.
pub fn outcome_color(o: ProbeOutcome) -> &'static str {
    match o {
        ProbeOutcome::Accepted => "#1e8449",
        ProbeOutcome::RejectedClean => "#2e86c1",
        ProbeOutcome::BadStatus => "#d68910",
        ProbeOutcome::TokenMismatch => "#8e44ad",
        ProbeOutcome::LatencyImplausible => "#a04000",
        ProbeOutcome::OverlengthAccepted => "#c0392b",
        ProbeOutcome::Leak => "#641e16",
        ProbeOutcome::TransportError => "#17202a",
    }
}

/// The prompt length a step is plotted at: the tokenizer's count, else the router's
/// `usage.prompt_tokens`, else the filler word count (a lower bound).
fn prompt_len(r: &ProbeResult) -> i64 {
    r.expected_tokens
        .or(r.prompt_tokens)
        .unwrap_or(r.prompt_words)
}

/// The color of a sampled request's ending.
fn sample_color(s: SampleStatus) -> &'static str {
    match s {
        SampleStatus::Ok => "#1e8449",
        SampleStatus::Rejected => "#2e86c1",
        SampleStatus::Error => "#c0392b",
        SampleStatus::Cancelled => "#7f8c8d",
    }
}

/// One dot: where, what color, its CSS class and hover text.
struct Dot {
    len: i64,
    ttft_ms: Option<i64>,
    color: &'static str,
    class: String,
    title: String,
}

/// What a chart is and what its colors mean.
struct Chart<'a> {
    id: &'a str,
    aria: &'a str,
    legend: Vec<(&'static str, &'static str)>,
}

/// Probe steps (`results`), with the context `limit` (when known) marked.
pub fn probes(results: &[ProbeResult], limit: Option<i64>) -> Markup {
    let dots: Vec<Dot> = results
        .iter()
        .map(|r| {
            let len = prompt_len(r);
            let what = match (r.ttft_ms, r.http_status) {
                (Some(t), _) => format!("TTFT {t} ms"),
                (None, Some(s)) => format!("HTTP {s}"),
                (None, None) => "no answer".to_string(),
            };
            Dot {
                len,
                ttft_ms: r.ttft_ms,
                color: outcome_color(r.outcome),
                class: format!("step outcome-{}", r.outcome),
                title: format!(
                    "{} step {}: {len} tokens, {what}, {}",
                    r.tenant, r.step, r.outcome
                ),
            }
        })
        .collect();
    let chart = Chart {
        id: "probe-chart",
        aria: "probe outcome and first-token latency against prompt length",
        legend: ProbeOutcome::ALL
            .iter()
            .map(|o| (o.as_str(), outcome_color(*o)))
            .collect(),
    };
    render(&chart, &dots, limit)
}

/// Sampled requests of every tenant, as the router reported them.
pub fn samples(points: &[SamplePoint], limit: Option<i64>) -> Markup {
    let dots: Vec<Dot> = points
        .iter()
        .map(|p| Dot {
            len: p.prompt_tokens,
            ttft_ms: p.ttft_ms,
            color: sample_color(p.status),
            class: format!("sample status-{}", p.status),
            title: format!(
                "{}: {} prompt tokens, {}, {}",
                p.tenant,
                p.prompt_tokens,
                p.ttft_ms
                    .map(|t| format!("TTFT {t} ms"))
                    .unwrap_or_else(|| "no first token".into()),
                p.status
            ),
        })
        .collect();
    let chart = Chart {
        id: "traffic-chart",
        aria: "sampled requests: first-token latency against prompt length",
        legend: SampleStatus::ALL
            .iter()
            .map(|s| (s.as_str(), sample_color(*s)))
            .collect(),
    };
    render(&chart, &dots, limit)
}

fn render(chart: &Chart<'_>, dots: &[Dot], limit: Option<i64>) -> Markup {
    let lens = || dots.iter().map(|d| d.len).chain(limit);
    let max_x = lens().max().unwrap_or(0).max(1) as f64;
    let y_ticks = axis::ticks(dots.iter().filter_map(|d| d.ttft_ms).max().unwrap_or(0));
    let max_y = *y_ticks.last().unwrap_or(&1) as f64;
    let plot_w = W - PAD_L - PAD_R;
    let axis_y = PLOT_TOP + PLOT_H;
    // From half the shortest prompt, so the shortest does not sit on the y axis.
    let min_x = lens().min().unwrap_or(1).max(2) as f64 / 2.0;
    let (log_lo, log_hi) = (min_x.log2(), max_x.max(min_x * 2.0).log2());
    let x_of = |v: i64| {
        let v = (v as f64).max(min_x);
        PAD_L + (v.log2() - log_lo) / (log_hi - log_lo) * plot_w
    };
    let y_of = |v: i64| axis_y - v as f64 / max_y * PLOT_H;
    let legend_rows = chart.legend.len().div_ceil(4) as f64;
    let total_h = axis_y + STRIP + 30.0 + legend_rows * 16.0;
    // Ticks at the powers of 4 between the ends of the axis.
    let mut x_ticks = Vec::new();
    let mut tick: i64 = 1;
    while (tick as f64) < min_x {
        tick = tick.saturating_mul(4);
    }
    while tick as f64 <= max_x {
        x_ticks.push(tick);
        tick = tick.saturating_mul(4);
    }
    html! {
        svg xmlns="http://www.w3.org/2000/svg" id=(chart.id) width=(W) height=(total_h)
            viewBox={ "0 0 " (W) " " (total_h) } role="img" aria-label=(chart.aria) {
            line x1=(PAD_L) y1=(axis_y) x2=(W - PAD_R) y2=(axis_y) stroke="#566573" {}
            line x1=(PAD_L) y1=(PLOT_TOP) x2=(PAD_L) y2=(axis_y) stroke="#566573" {}
            text x=(PAD_L - 4.0) y=(axis_y + STRIP / 2.0 + 4.0) font-size="11"
                text-anchor="end" { "no TTFT" }
            text x=(W - PAD_R) y=(axis_y + STRIP + 14.0) font-size="11" text-anchor="end" {
                "prompt tokens (log scale)"
            }
            // First-token time: a labelled gridline at every round tick.
            @for &t in &y_ticks {
                @let y = y_of(t);
                line x1=(PAD_L) y1=(coord(y)) x2=(W - PAD_R) y2=(coord(y)) stroke="#d5d8dc" {}
                text class="ytick" x=(PAD_L - 4.0) y=(coord(y + 3.5)) font-size="10"
                    text-anchor="end" { (axis::ms_label(t)) }
            }
            @for &tick in &x_ticks {
                @let x = coord(x_of(tick));
                line x1=(x) y1=(axis_y) x2=(x) y2=(axis_y + 4.0) stroke="#566573" {}
                text class="tick" x=(x) y=(axis_y + STRIP + 2.0) font-size="10"
                    text-anchor="middle" { (tick) }
            }
            @if let Some(l) = limit {
                @let x = x_of(l);
                // The label sits on whichever side of the line has room.
                @let (tx, anchor) = if x > PAD_L + plot_w / 2.0 {
                    (x - 3.0, "end")
                } else {
                    (x + 3.0, "start")
                };
                line class="context-limit" x1=(coord(x)) y1=(PLOT_TOP) x2=(coord(x))
                    y2=(axis_y + STRIP) stroke="#922b21" stroke-dasharray="4 3" {}
                text x=(coord(tx)) y=(PLOT_TOP + 10.0) font-size="11" fill="#922b21"
                    text-anchor=(anchor) { "context limit " (l) }
            }
            @for d in dots {
                @let cy = match d.ttft_ms {
                    Some(t) => y_of(t),
                    None => axis_y + STRIP / 2.0,
                };
                circle class=(d.class) cx=(coord(x_of(d.len))) cy=(coord(cy)) r="4" fill=(d.color)
                    fill-opacity="0.8" {
                    title { (d.title) }
                }
            }
            @for (i, (name, color)) in chart.legend.iter().enumerate() {
                @let x = PAD_L + (i % 4) as f64 * 200.0;
                @let y = axis_y + STRIP + 24.0 + (i / 4) as f64 * 16.0;
                circle cx=(x + 5.0) cy=(y + 5.0) r="5" fill=(color) {}
                text x=(x + 14.0) y=(y + 9.0) font-size="11" { (name) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::UnixMs;

    fn step(expected: i64, ttft: Option<i64>, outcome: ProbeOutcome) -> ProbeResult {
        ProbeResult {
            tenant: "probe-a".into(),
            step: 0,
            prompt_words: expected - 2,
            expected_tokens: Some(expected),
            outcome,
            http_status: Some(if ttft.is_some() { 200 } else { 400 }),
            prompt_tokens: ttft.map(|_| expected),
            ttft_ms: ttft,
            detail: String::new(),
            at: UnixMs(0),
        }
    }

    #[test]
    fn answered_steps_sit_by_latency_and_refused_ones_on_the_strip() {
        let svg = probes(
            &[
                step(20, Some(50), ProbeOutcome::Accepted),
                step(200, Some(100), ProbeOutcome::Accepted),
                step(300, None, ProbeOutcome::RejectedClean),
            ],
            Some(256),
        )
        .into_string();
        assert_eq!(svg.matches("class=\"step ").count(), 3);
        assert!(svg.contains("20 tokens, TTFT 50 ms, accepted"));
        assert!(svg.contains("300 tokens, HTTP 400, rejected_clean"));
        assert!(svg.contains("class=\"context-limit\"") && svg.contains("context limit 256"));
        // Log scale from half the shortest prompt (20 tokens) to the longest (300), ticked at
        // powers of 4.
        let ticks: Vec<&str> = svg
            .split("class=\"tick\"")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        assert_eq!(ticks, vec!["16", "64", "256"]);
        // The slowest answer is at the top of the plot, on its round tick; the axis is labelled
        // every 20 ms.
        assert!(svg.contains(&format!("cy=\"{PLOT_TOP:.1}\"")));
        let labels: Vec<&str> = svg
            .split("class=\"ytick\"")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        assert_eq!(labels, ["0", "20 ms", "40 ms", "60 ms", "80 ms", "100 ms"]);
    }

    #[test]
    fn sampled_requests_are_dots_by_status() {
        let p = |tenant: &str, tokens, ttft, status| SamplePoint {
            tenant: tenant.into(),
            prompt_tokens: tokens,
            ttft_ms: ttft,
            status,
            at: UnixMs(0),
        };
        let svg = samples(
            &[
                p("alice", 40, Some(30), SampleStatus::Ok),
                p("bob<", 9000, None, SampleStatus::Rejected),
            ],
            None,
        )
        .into_string();
        assert!(svg.contains("id=\"traffic-chart\""));
        assert_eq!(svg.matches("class=\"sample status-").count(), 2);
        assert!(svg.contains("alice: 40 prompt tokens, TTFT 30 ms, ok"));
        assert!(svg.contains("bob&lt;: 9000 prompt tokens, no first token, rejected"));
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let svg = probes(&[], None).into_string();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(!svg.contains("class=\"step "));
    }

    #[test]
    fn a_tenant_name_cannot_close_the_title() {
        let point = SamplePoint {
            tenant: "</title></circle><script>x</script>".into(),
            prompt_tokens: 10,
            ttft_ms: Some(5),
            status: SampleStatus::Ok,
            at: UnixMs(0),
        };
        let svg = samples(&[point], None).into_string();
        assert!(
            !svg.contains("<script>") && !svg.contains("</title></circle><script>"),
            "{svg}"
        );
        assert!(svg.contains(
            "<title>&lt;/title&gt;&lt;/circle&gt;&lt;script&gt;x&lt;/script&gt;: 10 prompt tokens"
        ));
        assert_eq!(svg.matches("</title>").count(), 1);
    }
}
