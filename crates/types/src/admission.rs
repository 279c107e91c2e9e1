//! Worker admission (I3): a request whose prompt plus `max_tokens` exceeds the effective context
//! is rejected with a typed reason before any page is allocated. Rejection is terminal.
//!
//! The effective context is the smaller of the advertised context and the KV pool's capacity.

use crate::reject_reason::RejectReason;

/// Why a request was refused at admission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// No prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_tokens` was zero.
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// Prompt plus completion does not fit.
    #[error(
        "this model's maximum context length is {context} tokens, but {prompt_tokens} prompt tokens \
         plus {max_tokens} max_tokens were requested"
    )]
    ContextLengthExceeded {
        /// Prompt length.
        prompt_tokens: usize,
        /// Requested completion length.
        max_tokens: usize,
        /// Effective context.
        context: usize,
    },
}

impl Rejection {
    /// The reason a refusing status carries and metrics count.
    pub fn reason(&self) -> RejectReason {
        match self {
            Rejection::EmptyPrompt => RejectReason::EmptyPrompt,
            Rejection::ZeroMaxTokens => RejectReason::ZeroMaxTokens,
            Rejection::ContextLengthExceeded { .. } => RejectReason::ContextLengthExceeded,
        }
    }
}

/// A request that passed admission; only this value lets a worker allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Completion budget.
    pub max_tokens: usize,
}

impl Admitted {
    /// Tokens the request may occupy at most.
    pub fn total_tokens(&self) -> usize {
        self.prompt_tokens + self.max_tokens
    }
}

/// The admission rule of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    advertised_context: usize,
    pool_tokens: usize,
}

impl Admission {
    /// From the preflight's advertised context and the pool's capacity.
    pub fn new(advertised_context: usize, pool_tokens: usize) -> Self {
        Self {
            advertised_context,
            pool_tokens,
        }
    }

    /// min(advertised context, pool capacity).
    pub fn effective_context(&self) -> usize {
        self.advertised_context.min(self.pool_tokens)
    }

    /// The advertised context.
    pub fn advertised_context(&self) -> usize {
        self.advertised_context
    }

    /// Checks a request; sums saturate so a huge `max_tokens` cannot wrap around.
    pub fn check(&self, prompt_tokens: usize, max_tokens: usize) -> Result<Admitted, Rejection> {
        if prompt_tokens == 0 {
            return Err(Rejection::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(Rejection::ZeroMaxTokens);
        }
        let context = self.effective_context();
        if prompt_tokens.saturating_add(max_tokens) > context {
            return Err(Rejection::ContextLengthExceeded {
                prompt_tokens,
                max_tokens,
                context,
            });
        }
        Ok(Admitted {
            prompt_tokens,
            max_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_sweep() {
        let a = Admission::new(128, 1000);
        assert!(a.check(127, 1).is_ok());
        assert!(a.check(128, 1).is_err());
        assert!(a.check(1, 127).is_ok());
        for over in 1..=16 * 16 {
            let err = a.check(64 + over, 64).unwrap_err();
            assert_eq!(err.reason(), RejectReason::ContextLengthExceeded);
        }
        assert!(a.check(1, usize::MAX).is_err());
    }

    #[test]
    fn pool_smaller_than_context_bounds_admission() {
        let a = Admission::new(2048, 100);
        assert_eq!(a.effective_context(), 100);
        assert!(a.check(50, 50).is_ok());
        assert!(a.check(50, 51).is_err());
    }

    #[test]
    fn empty_and_zero() {
        let a = Admission::new(10, 10);
        assert_eq!(a.check(0, 1), Err(Rejection::EmptyPrompt));
        assert_eq!(a.check(1, 0), Err(Rejection::ZeroMaxTokens));
    }
}
