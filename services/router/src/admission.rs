//! Admission (I3): a tokenized request is admitted only when prompt + max_tokens fits the
//! effective context, by the same rule the workers apply (`pagewarden_types::admission`). A
//! rejection here is terminal: nothing reaches any worker.

use pagewarden_common::admission::{Admission, Rejection};

use crate::error::{RouterError, ValidationError};

/// A prompt that fits: its tokens, its completion budget (the workers' `Admitted` rule, with
/// the budget chosen here when the client named none), and the context it was checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmittedPrompt {
    /// The prompt's token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Completion budget; `prompt.len() + max_tokens <= context`.
    pub max_tokens: u32,
    /// The effective context at admission.
    pub context: u32,
}

/// Checks `prompt + max_tokens <= context`. `requested = None` picks the rest of the context
/// (`context - prompt`, as vLLM: decode allocates a completion's pages as it is generated, so
/// a large budget holds no pages up front); a prompt that leaves no room for one token is
/// rejected either way. `prompt_param` is the field to blame (`prompt` or `messages`).
pub fn admit(
    prompt: Vec<u32>,
    requested: Option<u32>,
    context: u32,
    prompt_param: &'static str,
) -> Result<AdmittedPrompt, RouterError> {
    #[cfg(feature = "unsafe-test-switches")]
    if let Some(unchecked) = switched_off(&prompt, requested, context) {
        return Ok(AdmittedPrompt {
            prompt,
            max_tokens: unchecked,
            context,
        });
    }
    let p = prompt.len() as u64;
    let ctx = u64::from(context);
    let room = ctx.saturating_sub(p);
    // The workers' rule (pagewarden_types::admission), with the router's own messages: a
    // client reads which field to change and by how much.
    let rule = Admission::new(context as usize, context as usize);
    let max_tokens = requested.unwrap_or(room.max(1) as u32);
    match rule.check(prompt.len(), max_tokens as usize) {
        Ok(_) => Ok(AdmittedPrompt {
            prompt,
            max_tokens,
            context,
        }),
        Err(Rejection::EmptyPrompt) => {
            Err(ValidationError::new(prompt_param, format!("`{prompt_param}` must not be empty")).into())
        }
        Err(Rejection::ZeroMaxTokens) => {
            Err(ValidationError::new("max_tokens", "`max_tokens` must be at least 1").into())
        }
        Err(Rejection::ContextLengthExceeded { .. }) if room == 0 => {
            Err(RouterError::ContextLengthExceeded {
                param: prompt_param,
                message: format!(
                    "This model's maximum context length is {context} tokens. However, your prompt \
                     has {p} tokens, which leaves no room for a completion. Please shorten the prompt."
                ),
            })
        }
        Err(Rejection::ContextLengthExceeded { .. }) => Err(RouterError::ContextLengthExceeded {
            param: "max_tokens",
            message: format!(
                "This model's maximum context length is {context} tokens. However, you \
                 requested {} tokens ({p} in the prompt, {max_tokens} for the completion). Please \
                 reduce the prompt or max_tokens (at most {room} here).",
                u64::from(max_tokens) + p
            ),
        }),
    }
}

/// TEST-ONLY: with router rejection switched off (as the incident's router, which never read
/// the pool's size), every request passes with the `max_tokens` it asked for (the rest of the
/// context, at least 1, when it asked for none). `None`: the check runs.
#[cfg(feature = "unsafe-test-switches")]
fn switched_off(prompt: &[u32], requested: Option<u32>, context: u32) -> Option<u32> {
    use pagewarden_common::test_switches::{Switch, TestSwitches};
    if TestSwitches::current().is_on(Switch::RouterRejection) {
        return None;
    }
    let room = (u64::from(context).saturating_sub(prompt.len() as u64)).max(1) as u32;
    Some(requested.unwrap_or(room))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<AdmittedPrompt, RouterError>) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => e.reason(),
        }
    }

    #[test]
    fn boundaries() {
        let toks = |n: usize| vec![1u32; n];
        assert_eq!(code(admit(toks(99), None, 100, "prompt")), "ok");
        assert_eq!(admit(toks(99), None, 100, "prompt").unwrap().max_tokens, 1);
        assert_eq!(admit(toks(10), None, 100, "prompt").unwrap().max_tokens, 90);
        assert_eq!(
            admit(toks(10), None, 8192, "prompt").unwrap().max_tokens,
            8182,
            "the rest of the context"
        );
        assert_eq!(
            code(admit(toks(100), None, 100, "prompt")),
            "context_length_exceeded"
        );
        assert_eq!(
            code(admit(toks(101), None, 100, "prompt")),
            "context_length_exceeded"
        );
        assert_eq!(code(admit(toks(50), Some(50), 100, "prompt")), "ok");
        assert_eq!(
            code(admit(toks(50), Some(51), 100, "prompt")),
            "context_length_exceeded"
        );
        assert_eq!(
            code(admit(toks(1), Some(u32::MAX), u32::MAX, "prompt")),
            "context_length_exceeded"
        );
        assert_eq!(code(admit(toks(0), None, 100, "prompt")), "invalid_value");
        assert_eq!(
            code(admit(toks(5), Some(0), 100, "prompt")),
            "invalid_value"
        );
    }
}
