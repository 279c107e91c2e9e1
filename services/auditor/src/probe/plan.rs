//! What a probe run sends and how each answer is judged. Pure functions, no I/O.
//!
//! Prompts are `<marker> w w w ... w <marker>` with filler words that are one token each in
//! byte-level BPE vocabularies, so a prompt of `n` words has at least `n` tokens. A full sweep's
//! lengths start at one page and double up to the context limit, then cross it; a light sweep
//! sends one page and one page past the limit.

use crate::domain::{ProbeOutcome, SweepKind};

/// Filler words: common, short, and one token each (with their leading space).
const FILLER: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "as",
];

/// Tokens the two markers and BOS may add on top of the filler, at most (a marker is ~10).
const MARKER_TOKEN_ALLOWANCE: u32 = 48;

/// Filler word counts one run of `sweep` sends per tenant.
pub fn steps_of(sweep: SweepKind, limit: u32, page: u32, max_tokens: u32) -> Vec<u32> {
    match sweep {
        SweepKind::Light => light_steps(limit, page),
        SweepKind::Full => steps(limit, page, max_tokens),
    }
}

/// A light sweep: one short prompt (one page, when that fits under `limit`) and the step just
/// past the limit, which the router must refuse before any page is allocated.
pub fn light_steps(limit: u32, page: u32) -> Vec<u32> {
    let page = page.max(1);
    let mut out = Vec::with_capacity(2);
    if page < limit {
        out.push(page);
    }
    out.push(limit.saturating_add(page));
    out
}

/// Filler word counts for one full run: `page`, doubling while under `limit`, then one step
/// just under the limit and two past it.
pub fn steps(limit: u32, page: u32, max_tokens: u32) -> Vec<u32> {
    let page = page.max(1);
    let mut out = Vec::new();
    let mut n = page;
    while n < limit {
        out.push(n);
        n = n.saturating_mul(2);
    }
    let near = limit.saturating_sub(max_tokens + MARKER_TOKEN_ALLOWANCE);
    if near > 0 && !out.contains(&near) {
        out.push(near);
    }
    out.push(limit.saturating_add(page));
    out.push(limit.saturating_mul(2));
    out.sort_unstable();
    out
}

/// The prompt for a step: the two markers around `words` filler words.
pub fn prompt(start_marker: &str, end_marker: &str, words: u32) -> String {
    let mut s = String::with_capacity(words as usize * 4 + 64);
    s.push_str(start_marker);
    for i in 0..words as usize {
        s.push(' ');
        s.push_str(FILLER[i % FILLER.len()]);
    }
    s.push(' ');
    s.push_str(end_marker);
    s
}

/// What the prober knows about a step before sending it.
#[derive(Clone, Copy, Debug)]
pub struct StepSpec {
    /// Filler words.
    pub words: u32,
    /// Tokenizer count of the prompt, when a tokenizer is configured.
    pub expected_tokens: Option<u32>,
    /// `max_tokens` requested.
    pub max_tokens: u32,
    /// The advertised context limit.
    pub limit: u32,
}

impl StepSpec {
    /// Whether the prompt certainly does not fit (every filler word is at least one token).
    pub fn certainly_over(&self) -> bool {
        let lower = self.expected_tokens.unwrap_or(self.words);
        lower.saturating_add(self.max_tokens) > self.limit
    }

    /// Whether the prompt certainly fits.
    pub fn certainly_fits(&self) -> bool {
        let upper = match self.expected_tokens {
            Some(t) => t,
            None => self.words.saturating_mul(2) + MARKER_TOKEN_ALLOWANCE,
        };
        upper.saturating_add(self.max_tokens) <= self.limit
    }
}

/// What came back for a step.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A 200 with its completion.
    Completed {
        /// The generated text.
        text: String,
        /// `usage.prompt_tokens`, if present.
        prompt_tokens: Option<u32>,
        /// Milliseconds to the first generated text (whole response when not streamed).
        ttft_ms: u64,
        /// `usage.prompt_tokens_details.cached_tokens`: prompt tokens served from the tenant's
        /// prefix cache, if reported.
        cached_tokens: Option<u32>,
    },
    /// A non-200 status.
    Refused {
        /// HTTP status.
        status: u16,
        /// `error.code` (or `error.type`) when the body was OpenAI's error shape.
        code: Option<String>,
    },
}

/// Latency bounds a first token must fall in.
#[derive(Clone, Copy, Debug)]
pub struct LatencyBounds {
    /// The least upper bound on TTFT: a step answered within it is never too slow.
    pub floor_ttft_ms: u64,
    /// Lower bound per prompt token in microseconds (0: none). Prefill cannot be free: a long
    /// prompt answered instantly was not prefilled for this request.
    pub min_prefill_us_per_token: u64,
    /// The suite's measured prefill pace in tokens per second (`pace::Pace`), when known.
    pub pace_tokens_per_s: Option<f64>,
}

/// How many times its expected time (at the measured pace) a step may take. A step is judged at
/// the pace of the shorter steps before it, and prefill's rate falls as the context grows
/// (attention): on a 2-core AMD EPYC with SmolLM2 (debug-built services beside a compiler),
/// 161 tokens/s at 1,065 tokens and 132 at 2,038, a fifth less for twice the prompt; a busy
/// neighbour taking one of the two cores can halve it again. 4 leaves room for both with a
/// margin, while a worker frozen for several times a step's normal time is still caught.
pub const PACE_FACTOR: f64 = 4.0;

impl LatencyBounds {
    /// The first-token limit for a prompt of `prompt_tokens`: the floor, or [`PACE_FACTOR`]
    /// times its time at the measured pace when that is longer.
    pub fn limit_ms(&self, prompt_tokens: u32) -> u64 {
        let paced = self
            .pace_tokens_per_s
            .filter(|r| *r > 0.0)
            .map_or(0, |rate| {
                (PACE_FACTOR * f64::from(prompt_tokens) * 1000.0 / rate).ceil() as u64
            });
        self.floor_ttft_ms.max(paced)
    }
}

/// The verdict for a step, with a detail line for a failure (or the code of a clean 4xx).
pub fn judge(spec: &StepSpec, answer: &Answer, latency: LatencyBounds) -> (ProbeOutcome, String) {
    match answer {
        Answer::Refused { status, code } => {
            if !(400..500).contains(status) {
                return (ProbeOutcome::BadStatus, format!("HTTP {status}"));
            }
            let Some(code) = code else {
                return (
                    ProbeOutcome::BadStatus,
                    format!("HTTP {status} without an error body"),
                );
            };
            if spec.certainly_over() && code != "context_length_exceeded" {
                return (
                    ProbeOutcome::BadStatus,
                    format!(
                        "over-length prompt refused with {code:?}, not context_length_exceeded"
                    ),
                );
            }
            if spec.certainly_fits() {
                return (
                    ProbeOutcome::BadStatus,
                    format!("prompt that fits refused: HTTP {status} {code}"),
                );
            }
            (ProbeOutcome::RejectedClean, code.clone())
        }
        Answer::Completed {
            prompt_tokens,
            ttft_ms,
            ..
        } => {
            if spec.certainly_over() {
                return (
                    ProbeOutcome::OverlengthAccepted,
                    format!(
                        "{} filler words past a limit of {} answered 200",
                        spec.words, spec.limit
                    ),
                );
            }
            let Some(pt) = *prompt_tokens else {
                return (
                    ProbeOutcome::BadStatus,
                    "200 without usage.prompt_tokens".into(),
                );
            };
            if pt.saturating_add(spec.max_tokens) > spec.limit {
                return (
                    ProbeOutcome::OverlengthAccepted,
                    format!(
                        "prompt_tokens {pt} + max_tokens {} > limit {}",
                        spec.max_tokens, spec.limit
                    ),
                );
            }
            if let Some(expected) = spec.expected_tokens {
                if pt != expected {
                    return (
                        ProbeOutcome::TokenMismatch,
                        format!("usage.prompt_tokens {pt} != tokenizer count {expected}"),
                    );
                }
            }
            let floor_ms = u64::from(pt) * latency.min_prefill_us_per_token / 1000;
            let limit_ms = latency.limit_ms(pt);
            if *ttft_ms > limit_ms || *ttft_ms < floor_ms {
                let pace = match latency.pace_tokens_per_s {
                    Some(r) => format!("; the suite's measured pace {r:.0} tokens/s"),
                    None => String::new(),
                };
                return (
                    ProbeOutcome::LatencyImplausible,
                    format!("ttft {ttft_ms} ms for {pt} tokens outside [{floor_ms}, {limit_ms}] ms{pace}"),
                );
            }
            (ProbeOutcome::Accepted, String::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: LatencyBounds = LatencyBounds {
        floor_ttft_ms: 1000,
        min_prefill_us_per_token: 0,
        pace_tokens_per_s: None,
    };

    #[test]
    fn a_step_s_limit_follows_the_measured_pace_above_the_floor() {
        let at = |pace| LatencyBounds {
            pace_tokens_per_s: pace,
            ..LAT
        };
        assert_eq!(at(None).limit_ms(8000), 1000);
        // 8,000 tokens at 100 tokens/s: 80 s expected, 320 s allowed.
        assert_eq!(at(Some(100.0)).limit_ms(8000), 320_000);
        // A fast suite keeps the floor.
        assert_eq!(at(Some(1e6)).limit_ms(8000), 1000);
        let spec = StepSpec {
            words: 8000,
            expected_tokens: None,
            max_tokens: 4,
            limit: 8192,
        };
        let done = |ttft_ms| Answer::Completed {
            text: String::new(),
            prompt_tokens: Some(8000),
            ttft_ms,
            cached_tokens: None,
        };
        assert_eq!(
            judge(&spec, &done(81_000), at(Some(100.0))).0,
            ProbeOutcome::Accepted
        );
        assert_eq!(
            judge(&spec, &done(81_000), at(None)).0,
            ProbeOutcome::LatencyImplausible
        );
        let (outcome, detail) = judge(&spec, &done(400_000), at(Some(100.0)));
        assert_eq!(outcome, ProbeOutcome::LatencyImplausible);
        assert!(detail.contains("pace 100 tokens/s"), "{detail}");
    }

    #[test]
    fn steps_start_at_a_page_and_cross_the_limit() {
        let s = steps(256, 16, 4);
        assert_eq!(s, vec![16, 32, 64, 128, 204, 272, 512]);
        assert!(s.iter().any(|&w| w > 256));
    }

    #[test]
    fn a_light_sweep_is_one_page_and_one_page_past_the_limit() {
        assert_eq!(light_steps(256, 16), vec![16, 272]);
        assert_eq!(steps_of(SweepKind::Light, 256, 16, 4), vec![16, 272]);
        assert_eq!(steps_of(SweepKind::Full, 256, 16, 4), steps(256, 16, 4));
        // A page that does not fit is not sent as the "short" prompt.
        assert_eq!(light_steps(8, 16), vec![24]);
    }

    #[test]
    fn prompt_carries_both_markers() {
        let p = prompt("PWCANARY-a", "PWCANARY-b", 3);
        assert_eq!(p, "PWCANARY-a the of and PWCANARY-b");
    }

    #[test]
    fn verdicts() {
        let fits = StepSpec {
            words: 16,
            expected_tokens: Some(40),
            max_tokens: 4,
            limit: 256,
        };
        let over = StepSpec {
            words: 300,
            expected_tokens: None,
            max_tokens: 4,
            limit: 256,
        };
        let ok = |pt| Answer::Completed {
            text: String::new(),
            prompt_tokens: Some(pt),
            ttft_ms: 5,
            cached_tokens: None,
        };
        let refused = |code: &str| Answer::Refused {
            status: 400,
            code: Some(code.into()),
        };
        assert_eq!(judge(&fits, &ok(40), LAT).0, ProbeOutcome::Accepted);
        assert_eq!(judge(&fits, &ok(39), LAT).0, ProbeOutcome::TokenMismatch);
        assert_eq!(
            judge(&over, &ok(300), LAT).0,
            ProbeOutcome::OverlengthAccepted
        );
        assert_eq!(
            judge(&over, &refused("context_length_exceeded"), LAT).0,
            ProbeOutcome::RejectedClean
        );
        assert_eq!(
            judge(&over, &refused("invalid_request"), LAT).0,
            ProbeOutcome::BadStatus
        );
        assert_eq!(
            judge(&fits, &refused("context_length_exceeded"), LAT).0,
            ProbeOutcome::BadStatus
        );
        let five_hundred = Answer::Refused {
            status: 500,
            code: None,
        };
        assert_eq!(judge(&over, &five_hundred, LAT).0, ProbeOutcome::BadStatus);
        let slow = Answer::Completed {
            text: String::new(),
            prompt_tokens: Some(40),
            cached_tokens: None,
            ttft_ms: 5000,
        };
        assert_eq!(judge(&fits, &slow, LAT).0, ProbeOutcome::LatencyImplausible);
    }
}
