//! Tool calling at the edge. `tools`, `tool_choice` and `parallel_tool_calls` are validated
//! into a [`ToolRequest`]; the conversation's tool turns (an assistant's `tool_calls`, `tool`
//! messages) into [`ChatMessage`] fields the chat template renders. A forced choice (`required`,
//! or one named function) becomes the request's output constraint, so the reply is a call
//! whose arguments parse and validate against the function's schema, always. A free choice
//! (`auto`) is read from the reply in the format the model's template teaches
//! ([`ToolCallFormat`]). [`ToolReader`] does that reading for a whole reply and for a stream.

use pagewarden_model::tool_calls::parse_forced;
use pagewarden_model::{FinishReason, Grammar, ToolCall, ToolCallFormat, ToolCallStream};
use rand::Rng;
use serde_json::{json, Map, Value};

use crate::error::ValidationError;
use crate::extract::kind_of;
use crate::params::Fields;
use crate::validation::OutputConstraint;

/// At most this many tools in one request.
pub const MAX_TOOLS: usize = 128;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model is not asked to call (the tools are still shown to it, as vLLM does).
    None,
    /// The model decides; its reply is read for calls.
    Auto,
    /// The reply is one or more calls (constrained).
    Required,
    /// The reply is a call of this function (constrained to its parameters).
    Named(String),
}

/// A request's tools and how they may be called.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    /// OpenAI's `tools` entries, validated, as the client wrote them.
    pub tools: Vec<Value>,
    /// `tool_choice` (default `auto` with tools).
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): more than one call per reply.
    pub parallel: bool,
}

impl ToolRequest {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools (a
    /// `tool_choice` other than `none`/`auto` is then refused).
    pub fn parse(f: &Fields<'_>) -> Result<Option<ToolRequest>, ValidationError> {
        let tools = match f.get("tools") {
            None => Vec::new(),
            Some(Value::Array(items)) if items.len() > MAX_TOOLS => {
                return Err(f.err("tools", format!("may hold at most {MAX_TOOLS} tools")))
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| parse_tool(f, i, t))
                .collect::<Result<Vec<_>, _>>()?,
            Some(v) => {
                return Err(f.err(
                    "tools",
                    format!("must be an array of tools, found {}", kind_of(v)),
                ))
            }
        };
        let names: Vec<&str> = tools.iter().map(tool_name).collect();
        if let Some((i, n)) = names
            .iter()
            .enumerate()
            .find(|(i, n)| names[..*i].contains(n))
        {
            return Err(f.err(
                &format!("tools[{i}].function.name"),
                format!("repeats the name `{n}`"),
            ));
        }
        let choice = match f.get("tool_choice") {
            None if tools.is_empty() => ToolChoice::None,
            None => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(f.err(
                        "tool_choice",
                        format!(
                            "must be `none`, `auto`, `required` or {{\"type\": \"function\", \
                             \"function\": {{\"name\": …}}}}; got `{other}`"
                        ),
                    ))
                }
            },
            Some(Value::Object(o)) => {
                let c = Fields::nested(o, "tool_choice");
                match c.require("type")? {
                    Value::String(t) if t == "function" => {}
                    v => return Err(c.err("type", format!("must be `function`, got {v}"))),
                }
                let name = match c.require("function")? {
                    Value::Object(fo) => {
                        let cf = Fields::nested(fo, "tool_choice.function");
                        let name = cf
                            .string("name")?
                            .ok_or_else(|| cf.err("name", "is required"))?;
                        cf.reject_unknown()?;
                        name.to_string()
                    }
                    v => {
                        return Err(c.err(
                            "function",
                            format!("must be an object, found {}", kind_of(v)),
                        ))
                    }
                };
                c.reject_unknown()?;
                if !names.contains(&name.as_str()) {
                    return Err(f.err(
                        "tool_choice",
                        format!("names `{name}`, which is not one of `tools`"),
                    ));
                }
                ToolChoice::Named(name)
            }
            Some(v) => {
                return Err(f.err(
                    "tool_choice",
                    format!("must be a string or an object, found {}", kind_of(v)),
                ))
            }
        };
        let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
        if tools.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err(f.err("tool_choice", "requires `tools`")),
            };
        }
        Ok(Some(ToolRequest {
            tools,
            choice,
            parallel,
        }))
    }

    /// The output constraint a forced choice puts on the reply: the named function's
    /// parameters, or for `required` a call `{"name", "arguments"}` of any tool (an array of
    /// at least one with `parallel_tool_calls`).
    pub fn constraint(&self) -> Option<OutputConstraint> {
        let grammar = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Named(name) => {
                let tool = self.tools.iter().find(|t| tool_name(t) == name)?;
                Grammar::JsonSchema(parameters(tool))
            }
            ToolChoice::Required => {
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {
                                "name": {"const": tool_name(t)},
                                "arguments": parameters(t),
                            },
                            "required": ["name", "arguments"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let call = json!({"anyOf": calls});
                Grammar::JsonSchema(if self.parallel {
                    json!({"type": "array", "items": call, "minItems": 1})
                } else {
                    call
                })
            }
        };
        Some(OutputConstraint {
            grammar,
            field: "tool_choice",
        })
    }

    /// How to read the reply for calls, when the model may make any (`None` for
    /// `tool_choice: "none"`).
    pub fn reader(&self, format: ToolCallFormat) -> Option<ToolReader> {
        let mode = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Auto => Mode::Free(ToolCallStream::new(format)),
            ToolChoice::Required => Mode::Forced(None),
            ToolChoice::Named(n) => Mode::Forced(Some(n.clone())),
        };
        Some(ToolReader {
            mode,
            held: String::new(),
            parallel: self.parallel,
        })
    }
}

fn tool_name(t: &Value) -> &str {
    t["function"]["name"].as_str().unwrap_or_default()
}

/// A function's parameter schema as a forced call is constrained to (any object when it
/// declares none). Objects that list their `properties` and say nothing of others take no
/// others, as under OpenAI's `strict` mode: the schema's default (anything more is allowed) let a
/// small model write a `"city"` and then ramble in made-up keys until `max_tokens`.
fn parameters(t: &Value) -> Value {
    let mut schema = t["function"]
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}));
    close_objects(&mut schema);
    schema
}

fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            if o.contains_key("properties") && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            o.values_mut().for_each(close_objects);
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// One `tools` entry: `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`.
fn parse_tool(f: &Fields<'_>, i: usize, t: &Value) -> Result<Value, ValidationError> {
    let at = f.name(&format!("tools[{i}]"));
    let o = match t {
        Value::Object(o) => o,
        v => {
            return Err(ValidationError::new(
                at.clone(),
                format!("`{at}` must be an object, found {}", kind_of(v)),
            ))
        }
    };
    let tf = Fields::nested(o, at.clone());
    match tf.require("type")? {
        Value::String(s) if s == "function" => {}
        v => return Err(tf.err("type", format!("must be `function`, got {v}"))),
    }
    let func = match tf.require("function")? {
        Value::Object(fo) => fo,
        v => {
            return Err(tf.err(
                "function",
                format!("must be an object, found {}", kind_of(v)),
            ))
        }
    };
    tf.reject_unknown()?;
    let ff = Fields::nested(func, format!("{at}.function"));
    let name = ff
        .string("name")?
        .ok_or_else(|| ff.err("name", "is required"))?;
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !valid_name {
        return Err(ff.err(
            "name",
            "must be 1 to 64 letters, digits, underscores, dots or dashes",
        ));
    }
    ff.string("description")?;
    ff.bool("strict")?;
    match ff.get("parameters") {
        None | Some(Value::Object(_)) => {}
        Some(v) => {
            return Err(ff.err(
                "parameters",
                format!("must be a JSON schema object, found {}", kind_of(v)),
            ))
        }
    }
    ff.reject_unknown()?;
    Ok(t.clone())
}

/// An assistant message's `tool_calls`: `[{"id", "type": "function", "function": {"name",
/// "arguments"}}]`, `arguments` a JSON text, handed to the template as its JSON value (as
/// transformers and llama.cpp do; a text that is not JSON stays a string).
pub fn parse_message_calls(mf: &Fields<'_>) -> Result<Option<Vec<Value>>, ValidationError> {
    let items = match mf.get("tool_calls") {
        None => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(mf.err(
                "tool_calls",
                format!("must be an array, found {}", kind_of(v)),
            ))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, c) in items.iter().enumerate() {
        let at = format!("tool_calls[{i}]");
        let Value::Object(o) = c else {
            return Err(mf.err(&at, format!("must be an object, found {}", kind_of(c))));
        };
        let cf = Fields::nested(o, mf.name(&at));
        let id = cf.string("id")?.unwrap_or_default().to_string();
        match cf.get("type") {
            None => {}
            Some(Value::String(s)) if s == "function" => {}
            Some(v) => return Err(cf.err("type", format!("must be `function`, got {v}"))),
        }
        let Some(Value::Object(fo)) = cf.get("function") else {
            return Err(cf.err(
                "function",
                "is required, an object with `name` and `arguments`",
            ));
        };
        cf.reject_unknown()?;
        let ff = Fields::nested(fo, cf.name("function"));
        let name = ff
            .string("name")?
            .ok_or_else(|| ff.err("name", "is required"))?;
        let arguments = match ff.get("arguments") {
            None => json!({}),
            Some(Value::String(s)) => {
                serde_json::from_str::<Value>(s).unwrap_or_else(|_| Value::String(s.clone()))
            }
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => {
                return Err(ff.err(
                    "arguments",
                    format!("must be a JSON text, found {}", kind_of(v)),
                ))
            }
        };
        ff.reject_unknown()?;
        out.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
    }
    Ok(Some(out))
}

enum Mode {
    /// `auto`: text until the template's call format begins.
    Free(ToolCallStream),
    /// `required` (`None`) or one named function: the whole reply is the constrained call.
    Forced(Option<String>),
}

/// Reads one reply for tool calls, whole or as it streams.
pub struct ToolReader {
    mode: Mode,
    /// A forced reply so far (nothing of it is text).
    held: String,
    parallel: bool,
}

/// What a reply turned out to be.
#[derive(Debug, Default, PartialEq)]
pub struct ReplyEnd {
    /// Text not released yet.
    pub text: String,
    /// The calls, in OpenAI's shape (empty: the reply is text).
    pub calls: Vec<Value>,
}

impl ToolReader {
    /// The next piece of the reply; returns the text to show now.
    pub fn push(&mut self, text: &str) -> String {
        match &mut self.mode {
            Mode::Free(s) => s.push(text),
            Mode::Forced(_) => {
                self.held.push_str(text);
                String::new()
            }
        }
    }

    /// The reply ended with `finish`: its calls (and `finish` becomes `tool_calls`) or the
    /// rest of its text. A reply aborted by a worker is never read as calls; a forced reply
    /// that does not parse (cut by `max_tokens`) is its text.
    pub fn finish(&mut self, finish: FinishReason) -> (ReplyEnd, FinishReason) {
        if finish == FinishReason::Abort {
            let text = match &mut self.mode {
                Mode::Free(s) => s.abandon(),
                Mode::Forced(_) => std::mem::take(&mut self.held),
            };
            return (
                ReplyEnd {
                    text,
                    calls: vec![],
                },
                finish,
            );
        }
        let (text, calls) = match &mut self.mode {
            Mode::Free(s) => s.finish(),
            Mode::Forced(named) => {
                let held = std::mem::take(&mut self.held);
                match parse_forced(&held, named.as_deref()) {
                    Some(calls) => (String::new(), calls),
                    None => (held, Vec::new()),
                }
            }
        };
        if calls.is_empty() {
            return (
                ReplyEnd {
                    text,
                    calls: vec![],
                },
                finish,
            );
        }
        let keep = if self.parallel { calls.len() } else { 1 };
        let calls = calls
            .into_iter()
            .take(keep)
            .map(|c| call_json(&c))
            .collect();
        (ReplyEnd { text, calls }, FinishReason::ToolCalls)
    }
}

/// A call in OpenAI's shape, with a fresh id.
fn call_json(c: &ToolCall) -> Value {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let id: String = (0..24)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    json!({
        "id": format!("call_{id}"),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// `calls` as a streamed delta's `tool_calls`: each with its `index`.
pub fn delta_calls(calls: &[Value]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut d = Map::new();
            d.insert("index".into(), json!(i));
            if let Value::Object(o) = c {
                d.extend(o.clone());
            }
            Value::Object(d)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<Option<ToolRequest>, ValidationError> {
        let map = body.as_object().unwrap().clone();
        let f = Fields::new(&map);
        ToolRequest::parse(&f)
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn choices_and_their_refusals() {
        let r = request(json!({"tools": [weather()]})).unwrap().unwrap();
        assert_eq!((r.choice.clone(), r.parallel), (ToolChoice::Auto, true));
        assert_eq!(r.constraint(), None);
        let r = request(
            json!({"tools": [weather()], "tool_choice": {"type": "function",
            "function": {"name": "get_weather"}}}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        let c = r.constraint().unwrap();
        assert_eq!(c.field, "tool_choice");
        let mut closed = weather()["function"]["parameters"].clone();
        closed["additionalProperties"] = json!(false);
        assert_eq!(c.grammar, Grammar::JsonSchema(closed));
        assert!(request(json!({"tool_choice": "none"})).unwrap().is_none());
        for (body, field) in [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather()], "tool_choice": "always"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice": {"type": "function",
                "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather(), weather()]}),
                "tools[1].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f", "params": {}}}]}),
                "tools[0].function.params",
            ),
            (json!({"tools": "f"}), "tools"),
        ] {
            let err = request(body.clone()).unwrap_err();
            assert_eq!(err.param, field, "{body}: {}", err.message);
        }
    }

    #[test]
    fn forced_replies_become_calls_and_cut_ones_stay_text() {
        let r = request(json!({"tools": [weather()], "tool_choice": "required"}))
            .unwrap()
            .unwrap();
        let mut reader = r.reader(ToolCallFormat::Hermes).unwrap();
        assert_eq!(reader.push("[{\"name\": \"get_weather\", "), "");
        assert_eq!(reader.push("\"arguments\": {\"city\": \"Oslo\"}}]"), "");
        let (end, finish) = reader.finish(FinishReason::Stop);
        assert_eq!(finish, FinishReason::ToolCalls);
        assert_eq!(end.calls.len(), 1);
        assert_eq!(end.calls[0]["function"]["name"], "get_weather");
        assert_eq!(end.calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        assert!(end.calls[0]["id"].as_str().unwrap().starts_with("call_"));

        let mut reader = r.reader(ToolCallFormat::Hermes).unwrap();
        reader.push("[{\"name\": \"get_wea");
        let (end, finish) = reader.finish(FinishReason::Length);
        assert_eq!(finish, FinishReason::Length);
        assert_eq!(
            (end.text.as_str(), end.calls.len()),
            ("[{\"name\": \"get_wea", 0)
        );
    }

    #[test]
    fn free_replies_and_parallel_calls() {
        let mut r = request(json!({"tools": [weather()]})).unwrap().unwrap();
        let two = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call>\
                   <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"B\"}}</tool_call>";
        let mut reader = r.reader(ToolCallFormat::Hermes).unwrap();
        assert_eq!(reader.push(two), "");
        let (end, finish) = reader.finish(FinishReason::Stop);
        assert_eq!((end.calls.len(), finish), (2, FinishReason::ToolCalls));
        r.parallel = false;
        let mut reader = r.reader(ToolCallFormat::Hermes).unwrap();
        reader.push(two);
        assert_eq!(reader.finish(FinishReason::Stop).0.calls.len(), 1);
        // Aborted: never calls.
        let mut reader = r.reader(ToolCallFormat::Hermes).unwrap();
        reader.push(two);
        let (end, finish) = reader.finish(FinishReason::Abort);
        assert_eq!((end.calls.len(), finish), (0, FinishReason::Abort));
        assert!(!end.text.is_empty());
        // tool_choice none: no reader.
        let none = request(json!({"tools": [weather()], "tool_choice": "none"}))
            .unwrap()
            .unwrap();
        assert!(none.reader(ToolCallFormat::Hermes).is_none());
    }

    #[test]
    fn message_calls_take_arguments_as_json() {
        let m = json!({"tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
        let map = m.as_object().unwrap().clone();
        let f = Fields::nested(&map, "messages[1]");
        let calls = parse_message_calls(&f).unwrap().unwrap();
        assert_eq!(calls[0]["function"]["arguments"], json!({"x": 1}));
        let bad = json!({"tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": 3}}]});
        let map = bad.as_object().unwrap().clone();
        let f = Fields::nested(&map, "messages[1]");
        let err = parse_message_calls(&f).unwrap_err();
        assert_eq!(err.param, "messages[1].tool_calls[0].function.arguments");
    }
}
