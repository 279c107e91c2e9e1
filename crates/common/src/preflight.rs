//! Start-up preflight (I7): a worker whose KV pool cannot hold its advertised context refuses to
//! start, with a message naming both numbers, unless told to lower the advertised context to fit.

/// What the preflight compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreflightInput {
    /// The model's own context length (GGUF metadata).
    pub model_context: usize,
    /// An operator override of the advertised context (`--context-length`).
    pub context_override: Option<usize>,
    /// KV pool capacity in tokens (whole pages).
    pub pool_tokens: usize,
    /// `--lower-context-to-fit`.
    pub lower_to_fit: bool,
}

/// A worker that may start, and what it advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreflightReport {
    /// The context this worker advertises (possibly lowered).
    pub advertised_context: usize,
    /// KV pool capacity in tokens.
    pub pool_tokens: usize,
    /// The context that was asked for, when it was lowered to fit.
    pub lowered_from: Option<usize>,
}

/// Why a worker refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    /// The pool is smaller than the advertised context.
    #[error(
        "KV pool holds {pool_tokens} tokens but the advertised context is {context} tokens; \
         grow the pool (--pool-tokens / --pool-bytes) or pass --lower-context-to-fit"
    )]
    PoolTooSmall {
        /// Pool capacity in tokens.
        pool_tokens: usize,
        /// Advertised context in tokens.
        context: usize,
    },
    /// Nothing fits at all.
    #[error("KV pool holds {pool_tokens} tokens and the context is {context} tokens: nothing can be served")]
    Empty {
        /// Pool capacity in tokens.
        pool_tokens: usize,
        /// Context in tokens.
        context: usize,
    },
    /// The override asks for more than the model supports.
    #[error("--context-length {requested} exceeds the model's context of {model} tokens")]
    OverrideTooLarge {
        /// Asked for.
        requested: usize,
        /// The model's.
        model: usize,
    },
}

/// Runs the preflight.
pub fn preflight(input: PreflightInput) -> Result<PreflightReport, PreflightError> {
    let context = match input.context_override {
        Some(requested) if requested > input.model_context => {
            return Err(PreflightError::OverrideTooLarge {
                requested,
                model: input.model_context,
            })
        }
        Some(requested) => requested,
        None => input.model_context,
    };
    if context == 0 || input.pool_tokens == 0 {
        return Err(PreflightError::Empty {
            pool_tokens: input.pool_tokens,
            context,
        });
    }
    if input.pool_tokens >= context {
        return Ok(PreflightReport {
            advertised_context: context,
            pool_tokens: input.pool_tokens,
            lowered_from: None,
        });
    }
    if input.lower_to_fit {
        Ok(PreflightReport {
            advertised_context: input.pool_tokens,
            pool_tokens: input.pool_tokens,
            lowered_from: Some(context),
        })
    } else {
        Err(PreflightError::PoolTooSmall {
            pool_tokens: input.pool_tokens,
            context,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(pool_tokens: usize, lower_to_fit: bool) -> PreflightInput {
        PreflightInput {
            model_context: 2048,
            context_override: None,
            pool_tokens,
            lower_to_fit,
        }
    }

    #[test]
    fn small_pool_refuses_naming_both_numbers() {
        let err = preflight(input(1024, false)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("1024") && msg.contains("2048"), "{msg}");
    }

    #[test]
    fn small_pool_lowers_when_told() {
        let r = preflight(input(1024, true)).unwrap();
        assert_eq!(r.advertised_context, 1024);
        assert_eq!(r.lowered_from, Some(2048));
    }

    #[test]
    fn big_pool_and_override() {
        assert_eq!(
            preflight(input(4096, false)).unwrap().advertised_context,
            2048
        );
        let r = preflight(PreflightInput {
            context_override: Some(512),
            ..input(600, false)
        })
        .unwrap();
        assert_eq!(r.advertised_context, 512);
        assert!(preflight(PreflightInput {
            context_override: Some(4096),
            ..input(9000, false)
        })
        .is_err());
        assert!(preflight(input(0, true)).is_err());
    }
}
