//! `ChatTemplate`: renders `tokenizer.chat_template` (a Hugging Face Jinja template) with
//! minijinja, configured the way transformers does (trim_blocks, lstrip_blocks) and with the
//! helpers HF templates call (`raise_exception`, `tojson` as Python's `json.dumps` writes it,
//! Python string methods).
//!
//! Tools: `tools` (OpenAI's function definitions) and the tool turns of a conversation (an
//! assistant's `tool_calls`, `tool` messages) go to a template that renders them as they are. A
//! template that knows nothing of them (SmolLM2's, Gemma 3's) gets them as text in the Hermes
//! form its model is then asked to answer in ([`ToolCallFormat::of_template`]): the function
//! signatures and the way to call them in the system turn, earlier calls as `<tool_call>`
//! elements of the assistant's turn, results as `<tool_response>` elements of a user turn.

use std::borrow::Cow;

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, Value as JinjaValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat_guard::guard;
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;
use crate::tool_calls::ToolCallFormat;

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
    /// An assistant turn's calls, in OpenAI's shape (`{"id", "type": "function", "function":
    /// {"name", "arguments"}}`) with `arguments` as a JSON value (templates print it with
    /// `tojson`, as transformers and llama.cpp hand it to them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// A compiled chat template plus the special-token texts templates refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The Jinja source.
    source: String,
    /// The form this template's model calls tools in.
    tool_format: ToolCallFormat,
    /// What of a tool conversation the template renders itself.
    renders: ToolSupport,
}

/// The parts of a tool conversation a template's source refers to; the others are given to it
/// as text.
#[derive(Clone, Copy, Debug)]
struct ToolSupport {
    /// `tools`, the function definitions.
    tools: bool,
    /// An assistant message's `tool_calls`.
    calls: bool,
    /// Messages with `role: "tool"`.
    tool_role: bool,
}

impl ToolSupport {
    fn of(source: &str) -> Self {
        ToolSupport {
            tools: source.contains("tools"),
            calls: source.contains("tool_calls"),
            tool_role: source.contains("'tool'") || source.contains("\"tool\""),
        }
    }
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
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ChatError::Syntax(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            source: source.to_string(),
            tool_format: ToolCallFormat::of_template(source),
            renders: ToolSupport::of(source),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The form this template's model writes tool calls in.
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.tool_format
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// Renders `messages` with the function definitions `tools` (OpenAI's `tools` entries;
    /// none when empty).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(e.to_string()))?;
        let messages = self.adapt(messages, tools);
        let tools = (!tools.is_empty() && self.renders.tools).then_some(tools);
        tmpl.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| ChatError::Render(render_error(&e)))
    }

    /// `messages` with what this template does not render of a tool conversation turned into
    /// text (see the module's documentation); borrowed unchanged when there is nothing to do.
    fn adapt<'a>(&self, messages: &'a [ChatMessage], tools: &[Value]) -> Cow<'a, [ChatMessage]> {
        let as_text = |m: &ChatMessage| {
            (m.tool_calls.is_some() && !self.renders.calls)
                || (m.role == "tool" && !self.renders.tool_role)
        };
        let inject = !tools.is_empty() && !self.renders.tools;
        if !inject && !messages.iter().any(as_text) {
            return Cow::Borrowed(messages);
        }
        let mut out: Vec<ChatMessage> = messages
            .iter()
            .map(|m| {
                if !as_text(m) {
                    return m.clone();
                }
                if m.role == "tool" {
                    let mut user = ChatMessage::new(
                        "user",
                        format!("<tool_response>\n{}\n</tool_response>", m.content),
                    );
                    user.name.clone_from(&m.name);
                    return user;
                }
                let mut text = m.content.clone();
                for call in m.tool_calls.iter().flatten() {
                    let f = call.get("function").unwrap_or(call);
                    let shown = serde_json::json!({
                        "name": f.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": f.get("arguments").cloned().unwrap_or(Value::Null),
                    });
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!(
                        "<tool_call>\n{}\n</tool_call>",
                        python_json(&shown, None)
                    ));
                }
                let mut turn = ChatMessage::new(m.role.clone(), text);
                turn.name.clone_from(&m.name);
                turn
            })
            .collect();
        if inject {
            let instructions = tool_instructions(tools);
            match out.first_mut() {
                Some(first) if first.role == "system" => {
                    first.content = format!("{}\n\n{instructions}", first.content);
                }
                _ => out.insert(0, ChatMessage::new("system", instructions)),
            }
        }
        Cow::Owned(out)
    }
}

/// The system text that teaches a model whose template has no tool support to call `tools`
/// in the Hermes form.
fn tool_instructions(tools: &[Value]) -> String {
    let signatures: Vec<String> = tools.iter().map(|t| python_json(t, None)).collect();
    format!(
        "# Tools\n\nYou may call one or more of these functions to answer. Their signatures \
         are inside <tools></tools>, one per line:\n<tools>\n{}\n</tools>\n\nTo call a \
         function, answer with one <tool_call></tool_call> element per call, each holding a \
         JSON object with the function's name and its arguments:\n<tool_call>\n{{\"name\": \
         <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>",
        signatures.join("\n")
    )
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False, indent=indent)` writes it (the
/// `tojson` transformers gives templates): `", "` and `": "` between items without an indent,
/// no HTML escaping, keys in their order.
fn python_json(value: &Value, indent: Option<usize>) -> String {
    use serde::Serialize as _;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonSeparators,
        )),
    };
    match written {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => "null".to_string(),
    }
}

/// serde_json's compact form with Python's default separators.
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `", "` before every item but the first, as Python writes them.
fn item_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// The `tojson` filter: [`python_json`], with transformers' `indent` keyword.
fn tojson(value: JinjaValue, kwargs: Kwargs) -> Result<JinjaValue, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(JinjaValue::from_safe_string(python_json(&json, indent)))
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
        self.encode_with_tools(tok, messages, &[], add_generation_prompt)
    }

    /// [`ChatTemplate::encode`] with the function definitions `tools`; their text and every
    /// call's is guarded like content.
    pub fn encode_with_tools(
        &self,
        tok: &Tokenizer,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        let g = |s: &str| guard(s, tok.control_texts());
        let guarded: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage {
                role: g(&m.role),
                content: g(&m.content),
                name: m.name.as_deref().map(g),
                tool_calls: m
                    .tool_calls
                    .as_ref()
                    .map(|calls| calls.iter().map(|c| guard_json(c, &g)).collect()),
                tool_call_id: m.tool_call_id.as_deref().map(g),
            })
            .collect();
        let tools: Vec<Value> = tools.iter().map(|t| guard_json(t, &g)).collect();
        let text = self.render_with_tools(&guarded, &tools, add_generation_prompt)?;
        Ok(tok.encode_guarded_prompt(&text))
    }
}

/// `v` with every string in it (keys too) guarded by `g`.
fn guard_json(v: &Value, g: &impl Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(g(s)),
        Value::Array(items) => Value::Array(items.iter().map(|i| guard_json(i, g)).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (g(k), guard_json(v, g))).collect())
        }
        other => other.clone(),
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
