//! `StopMatcher`: finds stop sequences in streamed text, holding back any tail that could
//! still grow into one so a client never sees part of a stop sequence.

/// What the caller may emit after pushing text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// No stop sequence yet; emit this text (possibly empty: a tail is held back).
    Continue(String),
    /// A stop sequence appeared; emit this text (everything before it) and stop.
    Stop(String),
}

/// Matches stop sequences across pushes.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        StopMatcher {
            stops: stops
                .iter()
                .map(|s| s.as_ref().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            held: String::new(),
        }
    }

    /// Adds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            return StopOutcome::Stop(out);
        }
        let keep = self.longest_partial_tail();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome::Continue(out)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop sequence.
    fn longest_partial_tail(&self) -> usize {
        let h = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let s = s.as_bytes();
            for k in (best + 1..s.len().min(h.len() + 1)).rev() {
                if h.ends_with(&s[..k]) && self.held.is_char_boundary(h.len() - k) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// Text held back; when generation ends for another reason, emit it.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
