//! `ChatTemplate`: renders `tokenizer.chat_template` (a Hugging Face Jinja template) with
//! minijinja, configured the way transformers does (trim_blocks, lstrip_blocks) and with the
//! helpers HF templates call (`raise_exception`, `tojson`, Python string methods).

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::chat_guard::guard;
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// Why a template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `tokenizer.chat_template` is not a string.
    #[error("tokenizer.chat_template: {0}")]
    Metadata(#[from] crate::gguf::GgufError),
    /// The template does not compile.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed (including the template's own `raise_exception`).
    #[error("chat template failed to render: {0}")]
    Render(String),
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, …
    pub role: String,
    /// The message text.
    pub content: String,
    /// The participant's name (OpenAI's `messages[].name`), for templates that show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            name: None,
        }
    }
}

/// A compiled chat template plus the special-token texts templates refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, or `None` when the file has none.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<ChatTemplate>, ChatError> {
        let md = f.metadata();
        if md.get("tokenizer.chat_template").is_none() {
            return Ok(None);
        }
        let src = md.get_str("tokenizer.chat_template")?;
        let token_text = |key: &str| -> String {
            let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap_or(&[]);
            md.get_u32(key)
                .ok()
                .and_then(|id| tokens.get(id as usize))
                .cloned()
                .unwrap_or_default()
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        ChatTemplate::new(src, &bos, &eos).map(Some)
    }

    /// Compiles `source`; `bos_token` and `eos_token` are exposed to the template.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_utc(&fmt, unix_now()));
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(e.to_string()))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| ChatError::Render(render_error(&e)))
    }
}

impl ChatTemplate {
    /// The token ids of `messages` rendered for the model. Only the template's own markup
    /// produces control tokens: content (and role and name) text that spells one, such as a user
    /// message `<|im_end|><|im_start|>system`, is tokenized as text, exactly as
    /// `tok.encode(text, false)` would tokenize it (invariant I13). BOS as
    /// [`Tokenizer::encode_prompt`].
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        let guarded: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: guard(&m.role, tok.control_texts()),
                content: guard(&m.content, tok.control_texts()),
                name: m.name.as_deref().map(|n| guard(n, tok.control_texts())),
            })
            .collect();
        let text = self.render(&guarded, add_generation_prompt)?;
        Ok(tok.encode_guarded_prompt(&text))
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A small `strftime` over UTC for the date templates print (Llama 3's `strftime_now`):
/// `%d %m %Y %y %b %B %H %M %S %%`; other directives are kept verbatim.
pub fn strftime_utc(fmt: &str, unix: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&name[..3]),
            Some('B') => out.push_str(name),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The error with its causes, so a template's `raise_exception` message reaches the caller.
fn render_error(e: &Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}
