//! Token counting for the probe check `usage.prompt_tokens == tokenizer count`. A trait so
//! tests (and deployments without the model file) can plug in their own counter.

/// Counts the tokens the router will see for a prompt (including BOS, as the router encodes).
pub trait TokenCounter: Send + Sync {
    /// The token count of `prompt`, or why it could not be counted.
    fn count(&self, prompt: &str) -> Result<u32, String>;
}

/// Counts whitespace-separated words plus one for BOS: the fake router's tokenizer in tests.
pub struct WordCounter;

impl TokenCounter for WordCounter {
    fn count(&self, prompt: &str) -> Result<u32, String> {
        u32::try_from(prompt.split_whitespace().count() + 1).map_err(|e| e.to_string())
    }
}
