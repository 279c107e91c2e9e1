//! Probe steps against prompt length as inline SVG: each answered step is a dot at (prompt
//! tokens, first-token latency), colored by outcome; a step with no first token (refused, or
//! no answer) is a dot on the strip under the axis. The context limit is a dashed line.
//! Prompt length is on a log₂ scale: a full sweep doubles its length each step, and a light
//! sweep's short prompt would otherwise sit on the axis next to a context of thousands.

use std::fmt::Write;

use super::html::esc;
use crate::domain::ProbeOutcome;
use crate::store::ProbeResult;

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

/// Renders `results` with the context `limit` (when known) marked.
pub fn probes(results: &[ProbeResult], limit: Option<i64>) -> String {
    let max_x = results
        .iter()
        .map(prompt_len)
        .chain(limit)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let max_y = results
        .iter()
        .filter_map(|r| r.ttft_ms)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_w = W - PAD_L - PAD_R;
    let axis_y = PLOT_TOP + PLOT_H;
    // From half the shortest prompt, so the shortest does not sit on the y axis.
    let min_x = results
        .iter()
        .map(prompt_len)
        .chain(limit)
        .min()
        .unwrap_or(1)
        .max(2) as f64
        / 2.0;
    let (log_lo, log_hi) = (min_x.log2(), max_x.max(min_x * 2.0).log2());
    let x_of = |v: i64| {
        let v = (v as f64).max(min_x);
        PAD_L + (v.log2() - log_lo) / (log_hi - log_lo) * plot_w
    };
    let y_of = |v: i64| axis_y - v as f64 / max_y * PLOT_H;
    let legend_rows = ProbeOutcome::ALL.len().div_ceil(4) as f64;
    let total_h = axis_y + STRIP + 30.0 + legend_rows * 16.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"probe-chart\" width=\"{W}\" \
         height=\"{total_h}\" viewBox=\"0 0 {W} {total_h}\" role=\"img\" \
         aria-label=\"probe outcome and first-token latency against prompt length\">\
         <line x1=\"{PAD_L}\" y1=\"{axis_y}\" x2=\"{}\" y2=\"{axis_y}\" stroke=\"#566573\"/>\
         <line x1=\"{PAD_L}\" y1=\"{PLOT_TOP}\" x2=\"{PAD_L}\" y2=\"{axis_y}\" stroke=\"#566573\"/>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">{max_y} ms</text>\
         <text x=\"{}\" y=\"{axis_y}\" font-size=\"11\" text-anchor=\"end\">0</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">no TTFT</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">prompt tokens (log scale)\
         </text>",
        W - PAD_R,
        PAD_L - 4.0,
        PLOT_TOP + 10.0,
        PAD_L - 4.0,
        PAD_L - 4.0,
        axis_y + STRIP / 2.0 + 4.0,
        W - PAD_R,
        axis_y + STRIP + 14.0,
    );
    // Ticks at the powers of 4 between the ends of the axis.
    let mut tick: i64 = 1;
    while (tick as f64) < min_x {
        tick = tick.saturating_mul(4);
    }
    while tick as f64 <= max_x {
        let x = x_of(tick);
        let _ = write!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{axis_y}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#566573\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{}\" font-size=\"10\" \
             text-anchor=\"middle\">{tick}</text>",
            axis_y + 4.0,
            axis_y + STRIP + 2.0,
        );
        tick = tick.saturating_mul(4);
    }
    if let Some(l) = limit {
        let x = x_of(l);
        // The label sits on whichever side of the line has room.
        let (tx, anchor) = if x > PAD_L + plot_w / 2.0 {
            (x - 3.0, "end")
        } else {
            (x + 3.0, "start")
        };
        let _ = write!(
            svg,
            "<line id=\"context-limit\" x1=\"{x:.1}\" y1=\"{PLOT_TOP}\" x2=\"{x:.1}\" \
             y2=\"{}\" stroke=\"#922b21\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{tx:.1}\" y=\"{}\" font-size=\"11\" fill=\"#922b21\" \
             text-anchor=\"{anchor}\">context limit {l}</text>",
            axis_y + STRIP,
            PLOT_TOP + 10.0,
        );
    }
    for r in results {
        let len = prompt_len(r);
        let (cy, what) = match r.ttft_ms {
            Some(t) => (y_of(t), format!("TTFT {t} ms")),
            None => (
                axis_y + STRIP / 2.0,
                match r.http_status {
                    Some(s) => format!("HTTP {s}"),
                    None => "no answer".to_string(),
                },
            ),
        };
        let _ = write!(
            svg,
            "<circle class=\"step outcome-{o}\" cx=\"{:.1}\" cy=\"{cy:.1}\" r=\"4\" fill=\"{}\" \
             fill-opacity=\"0.8\"><title>{} step {}: {len} tokens, {what}, {o}</title></circle>",
            x_of(len),
            outcome_color(r.outcome),
            esc(&r.tenant),
            r.step,
            o = r.outcome,
        );
    }
    for (i, o) in ProbeOutcome::ALL.iter().enumerate() {
        let x = PAD_L + (i % 4) as f64 * 200.0;
        let y = axis_y + STRIP + 24.0 + (i / 4) as f64 * 16.0;
        let _ = write!(
            svg,
            "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"11\">{o}</text>",
            x + 5.0,
            y + 5.0,
            outcome_color(*o),
            x + 14.0,
            y + 9.0
        );
    }
    svg.push_str("</svg>");
    svg
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
        );
        assert_eq!(svg.matches("class=\"step ").count(), 3);
        assert!(svg.contains("20 tokens, TTFT 50 ms, accepted"));
        assert!(svg.contains("300 tokens, HTTP 400, rejected_clean"));
        assert!(svg.contains("id=\"context-limit\"") && svg.contains("context limit 256"));
        // Log scale from half the shortest prompt (20 tokens) to the longest (300), ticked at
        // powers of 4.
        let ticks: Vec<&str> = svg
            .split("class=\"tick\"")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        assert_eq!(ticks, vec!["16", "64", "256"]);
        // The slowest answer is at the top of the plot.
        assert!(svg.contains(&format!("cy=\"{PLOT_TOP:.1}\"")));
        assert!(svg.contains(">100 ms</text>"));
    }

    #[test]
    fn an_empty_chart_still_renders() {
        let svg = probes(&[], None);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(!svg.contains("class=\"step "));
    }
}
