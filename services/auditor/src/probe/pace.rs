//! The pace the suite has shown the prober: prefill tokens per second over its recent accepted
//! steps. A step's first-token limit follows it (`LatencyBounds::limit_ms`), so a slow machine
//! (on a 2-core CPU an 8,183-token prompt was seen to take 81 s, over a fixed 60 s limit) is not
//! taken for a stalled one, while a stall (a worker frozen for longer than the limit) still is.
//!
//! The pace is the slowest rate among the last [`WINDOW`] accepted steps of at least
//! [`MIN_TOKENS`] prompt tokens. A short prompt's time is mostly the request's overhead, so its
//! rate is lower than prefill's: it makes limits larger, never smaller. A sweep's steps
//! lengthen (each about twice the last), so every step after the first is judged at the pace
//! of the shorter ones before it. Only accepted steps feed it: a stalled step never raises the
//! limits of the steps after it.

use std::collections::VecDeque;

/// Accepted steps remembered.
pub const WINDOW: usize = 16;
/// The shortest prompt whose first-token time is taken as a pace (a sweep's first step, one
/// page of filler words between two markers, is longer).
pub const MIN_TOKENS: u32 = 32;

/// Recent accepted steps' (prompt tokens, first-token ms).
#[derive(Debug, Default)]
pub struct Pace {
    seen: VecDeque<(u32, u64)>,
}

impl Pace {
    /// Remembers an accepted step (ignored when it is too short to time prefill).
    pub fn observe(&mut self, prompt_tokens: u32, ttft_ms: u64) {
        if prompt_tokens < MIN_TOKENS {
            return;
        }
        if self.seen.len() == WINDOW {
            self.seen.pop_front();
        }
        self.seen.push_back((prompt_tokens, ttft_ms.max(1)));
    }

    /// The slowest recent rate, in prompt tokens per second; `None` before any long step.
    pub fn tokens_per_s(&self) -> Option<f64> {
        self.seen
            .iter()
            .map(|&(tokens, ms)| f64::from(tokens) * 1000.0 / ms as f64)
            .min_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_is_the_slowest_recent_long_step() {
        let mut p = Pace::default();
        assert_eq!(p.tokens_per_s(), None);
        p.observe(10, 1); // too short to time prefill
        assert_eq!(p.tokens_per_s(), None);
        p.observe(1000, 2000);
        p.observe(4000, 4000);
        assert_eq!(p.tokens_per_s(), Some(500.0));
        for _ in 0..WINDOW {
            p.observe(4000, 4000);
        }
        assert_eq!(
            p.tokens_per_s(),
            Some(1000.0),
            "the slow step left the window"
        );
    }
}
