//! The model's text side as the router needs it: tokenizer and chat template from the GGUF file,
//! turning a validated prompt or conversation into token ids.

use std::path::Path;

use pagewarden_model::{ChatMessage, ChatTemplate, GgufFile, Grammar, Tokenizer, ToolCallFormat};
use serde_json::Value;

use crate::error::{RouterError, ValidationError};
use crate::validation::Prompt;

/// Why the model's text side could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// The GGUF file could not be opened or parsed.
    #[error("cannot open model {path}: {message}")]
    Open {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The tokenizer or chat template metadata is unusable.
    #[error("cannot load the tokenizer or chat template: {0}")]
    Text(String),
}

/// Tokenizer + chat template + the served model name.
pub struct Frontend {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    model_name: String,
}

impl Frontend {
    /// Loads from a GGUF file; the served name defaults to the file stem.
    pub fn load(path: &Path, served_name: Option<String>) -> Result<Self, FrontendError> {
        let file = GgufFile::open(path).map_err(|e| FrontendError::Open {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let name = served_name.unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        });
        Self::from_gguf(&file, name)
    }

    /// The seeded tiny test model (`tiny_llama_gguf(seed)`), for tests without the real model.
    pub fn tiny(seed: u64, model_name: String) -> Result<Self, FrontendError> {
        let file = GgufFile::from_bytes(pagewarden_model::tiny_llama_gguf(seed)).map_err(|e| {
            FrontendError::Open {
                path: format!("tiny test model (seed {seed})"),
                message: e.to_string(),
            }
        })?;
        Self::from_gguf(&file, model_name)
    }

    /// Builds from an opened GGUF file.
    pub fn from_gguf(file: &GgufFile, model_name: String) -> Result<Self, FrontendError> {
        let tokenizer =
            Tokenizer::from_gguf(file).map_err(|e| FrontendError::Text(e.to_string()))?;
        let template =
            ChatTemplate::from_gguf(file).map_err(|e| FrontendError::Text(e.to_string()))?;
        Ok(Self {
            tokenizer,
            template,
            model_name,
        })
    }

    /// The name `/v1/models` lists and requests may name.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Tokens of a completion prompt: text is encoded with special tokens parsed and BOS first
    /// when the model asks for it (as llama.cpp's server does); client token ids are checked
    /// against the vocabulary and sent as given.
    pub fn completion_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, RouterError> {
        self.prompt_tokens(prompt, true)
    }

    /// [`Frontend::completion_tokens`], with BOS only when `bos` (vLLM's
    /// `add_special_tokens`) and the model asks for it.
    pub fn prompt_tokens(&self, prompt: &Prompt, bos: bool) -> Result<Vec<u32>, RouterError> {
        let tokens = match prompt {
            Prompt::Text(text) if bos => self.tokenizer.encode_prompt(text),
            Prompt::Text(text) => self.tokenizer.encode(text, true),
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some(i) = ids.iter().position(|&t| t as usize >= vocab) {
                    return Err(ValidationError::new(
                        format!("prompt[{i}]"),
                        format!(
                            "`prompt[{i}]` is token id {}, outside the vocabulary of {vocab} tokens",
                            ids[i]
                        ),
                    )
                    .into());
                }
                ids.clone()
            }
        };
        non_empty(tokens, "prompt")
    }

    /// Refuses a `logit_bias` token id outside this vocabulary.
    pub fn check_logit_bias(&self, bias: &[(u32, f32)]) -> Result<(), RouterError> {
        let vocab = self.tokenizer.vocab_size();
        match bias.iter().find(|&&(id, _)| id as usize >= vocab) {
            None => Ok(()),
            Some(&(id, _)) => Err(ValidationError::new(
                "logit_bias",
                format!(
                    "`logit_bias` names token id {id}, outside the vocabulary of {vocab} tokens"
                ),
            )
            .into()),
        }
    }

    /// Refuses an output constraint whose schema or regular expression does not compile
    /// against this vocabulary, naming its field, with the grammar library's reason (the first
    /// such request also builds the vocabulary index).
    pub fn check_grammar(&self, constraint: Option<&(Grammar, &str)>) -> Result<(), RouterError> {
        let Some((g, field)) = constraint else {
            return Ok(());
        };
        self.tokenizer
            .grammars()
            .and_then(|grammars| grammars.compile(g))
            .map(drop)
            .map_err(|e| ValidationError::new(*field, format!("`{field}`: {e}")).into())
    }

    /// The chat template's Jinja source, when the model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template.as_ref().map(ChatTemplate::source)
    }

    /// The form this model's template teaches it to call tools in (Hermes without a template).
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.template
            .as_ref()
            .map_or(ToolCallFormat::Hermes, ChatTemplate::tool_call_format)
    }

    /// Tokens of a conversation rendered through the model's chat template, with the function
    /// definitions `tools` (OpenAI's `tools` entries; none when empty).
    pub fn chat_tokens(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
    ) -> Result<Vec<u32>, RouterError> {
        let template = self.template.as_ref().ok_or_else(|| {
            ValidationError::new(
                "messages",
                "this model has no chat template; use /v1/completions",
            )
        })?;
        // Content is tokenized as text: only the template's markup yields control tokens.
        let tokens = template
            .encode_with_tools(&self.tokenizer, messages, tools, true)
            .map_err(|e| {
                ValidationError::new(
                    "messages",
                    format!("`messages` could not be rendered with the chat template: {e}"),
                )
            })?;
        non_empty(tokens, "messages")
    }
}

fn non_empty(tokens: Vec<u32>, field: &str) -> Result<Vec<u32>, RouterError> {
    if tokens.is_empty() {
        Err(
            ValidationError::new(field, format!("`{field}` must contain at least one token"))
                .into(),
        )
    } else {
        Ok(tokens)
    }
}
