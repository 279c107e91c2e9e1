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

/// Counts with the model's own tokenizer, as the router does: BOS (when the model adds one)
/// plus the prompt encoded with special tokens parsed (llama.cpp's completion semantics, as in
/// the reference ids).
pub struct GgufTokenCounter {
    tokenizer: pagewarden_model::tokenizer::Tokenizer,
}

/// The tokenizer could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerLoadError {
    /// The GGUF file could not be opened or parsed.
    #[error("opening {0}: {1}")]
    Open(std::path::PathBuf, pagewarden_model::gguf::GgufError),
    /// Its tokenizer metadata is unusable.
    #[error("tokenizer of {0}: {1}")]
    Tokenizer(
        std::path::PathBuf,
        pagewarden_model::tokenizer::TokenizerError,
    ),
}

impl GgufTokenCounter {
    /// Loads the tokenizer of the GGUF model at `path`.
    pub fn open(path: &std::path::Path) -> Result<Self, TokenizerLoadError> {
        let file = pagewarden_model::gguf::GgufFile::open(path)
            .map_err(|e| TokenizerLoadError::Open(path.to_path_buf(), e))?;
        let tokenizer = pagewarden_model::tokenizer::Tokenizer::from_gguf(&file)
            .map_err(|e| TokenizerLoadError::Tokenizer(path.to_path_buf(), e))?;
        Ok(GgufTokenCounter { tokenizer })
    }
}

impl TokenCounter for GgufTokenCounter {
    fn count(&self, prompt: &str) -> Result<u32, String> {
        let n = self.tokenizer.encode(prompt, true).len() + usize::from(self.tokenizer.add_bos());
        u32::try_from(n).map_err(|e| e.to_string())
    }
}
