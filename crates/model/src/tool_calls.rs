//! Tool calls in a model's own words: the format a chat template teaches its model to call tools
//! in ([`ToolCallFormat`], read from the template's source, never from a flag), the parsing of
//! a completion into text and [`ToolCall`]s, and [`ToolCallStream`], which lets a streamed
//! completion's text through until a call begins and holds the call back until it is whole.
//!
//! Formats:
//! - **Hermes** (Qwen 2.5/3, Hermes, SmolLM3, and the instructions this crate adds to a template
//!   that has no tool support): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one
//!   element per call, after optional text.
//! - **Llama 3.x JSON**: the whole reply is `{"name": …, "parameters": {…}}` (several separated
//!   by `;`), optionally after `<|python_tag|>`.
//! - **Mistral**: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`, or (v11
//!   templates) `[TOOL_CALLS]name[ARGS]{…}` per call.
//!
//! A reply that does not parse as calls in its format is text, whole: nothing is dropped.

use serde_json::Value;

/// How a template's model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{json}</tool_call>`.
    Hermes,
    /// A reply that is a JSON object `{"name", "parameters"}`.
    Llama3Json,
    /// `[TOOL_CALLS][{json}, …]` or `[TOOL_CALLS]name[ARGS]{json}`.
    Mistral,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";

impl ToolCallFormat {
    /// The format the template at `source` writes calls in: Mistral's marker, then Hermes'
    /// element, then Llama 3's `<|python_tag|>`/`ipython` role; a template with none of them
    /// gets Hermes (the instructions [`ChatTemplate`](crate::ChatTemplate) adds for it teach
    /// that form).
    pub fn of_template(source: &str) -> ToolCallFormat {
        if source.contains(MISTRAL_CALLS) {
            ToolCallFormat::Mistral
        } else if source.contains(HERMES_OPEN) {
            ToolCallFormat::Hermes
        } else if source.contains(PYTHON_TAG) || source.contains("ipython") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        }
    }

    /// The format's name, as logs and errors say it.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
        }
    }

    /// Where in `text` a call may begin: the byte offset of the format's marker, or for Llama 3
    /// offset 0 when the reply opens with `{` or the python tag (after white space).
    fn call_start(self, text: &str) -> Option<usize> {
        match self {
            ToolCallFormat::Hermes => text.find(HERMES_OPEN),
            ToolCallFormat::Mistral => text.find(MISTRAL_CALLS),
            ToolCallFormat::Llama3Json => {
                let t = text.trim_start();
                (t.starts_with('{') || t.starts_with(PYTHON_TAG)).then_some(0)
            }
        }
    }

    /// How many bytes at the end of `text` could still grow into the start of a call (held
    /// back while streaming).
    fn partial_start(self, text: &str, seen_text: bool) -> usize {
        let marker = match self {
            ToolCallFormat::Hermes => HERMES_OPEN,
            ToolCallFormat::Mistral => MISTRAL_CALLS,
            ToolCallFormat::Llama3Json => {
                // Only a reply's opening can be a call: hold back white space and a partial
                // python tag until something else arrives.
                if seen_text {
                    return 0;
                }
                let t = text.trim_start();
                return if PYTHON_TAG.starts_with(t) {
                    text.len()
                } else {
                    0
                };
            }
        };
        (1..marker.len().min(text.len() + 1))
            .rev()
            .find(|&n| {
                text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
            })
            .unwrap_or(0)
    }

    /// `text` as calls in this format, with the text before them; `None` when it is not.
    pub fn parse(self, text: &str) -> Option<ParsedReply> {
        let start = self.call_start(text)?;
        let content = text[..start].trim().to_string();
        let rest = &text[start..];
        let calls = match self {
            ToolCallFormat::Hermes => parse_hermes(rest)?,
            ToolCallFormat::Mistral => parse_mistral(&rest[MISTRAL_CALLS.len()..])?,
            ToolCallFormat::Llama3Json => {
                let body = rest.trim_start();
                let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
                parse_llama3(body)?
            }
        };
        Some(ParsedReply { content, calls })
    }
}

/// One call of a function, as the model wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON document as text (an object in every format here).
    pub arguments: String,
}

/// A reply that called tools: the text before the calls (possibly empty) and the calls, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedReply {
    /// Text the model wrote before its first call, trimmed.
    pub content: String,
    /// At least one call.
    pub calls: Vec<ToolCall>,
}

/// A call object `{"name": …, "arguments" | "parameters": {…}}`; arguments given as a JSON
/// string are taken as that string's document.
fn call_of(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let args = o.get("arguments").or_else(|| o.get("parameters"));
    let arguments = match args {
        None => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return None,
    };
    (!name.is_empty()).then_some(ToolCall { name, arguments })
}

/// The next JSON value at the start of `s` (after white space) and the rest after it.
fn json_prefix(s: &str) -> Option<(Value, &str)> {
    let s = s.trim_start();
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    let v = it.next()?.ok()?;
    Some((v, &s[it.byte_offset()..]))
}

fn parse_hermes(mut rest: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let body = rest.strip_prefix(HERMES_OPEN)?;
        let (v, after) = json_prefix(body)?;
        calls.push(call_of(&v)?);
        let after = after.trim_start();
        // The closing tag may be missing at the very end (generation stopped on it).
        rest = after.strip_prefix(HERMES_CLOSE).unwrap_or(after);
        if rest.len() == after.len() && !after.is_empty() {
            return None;
        }
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_mistral(rest: &str) -> Option<Vec<ToolCall>> {
    let rest = rest.trim_start();
    if rest.starts_with('[') {
        let (v, after) = json_prefix(rest)?;
        if !after.trim().is_empty() {
            return None;
        }
        let calls: Option<Vec<ToolCall>> = v.as_array()?.iter().map(call_of).collect();
        return calls.filter(|c| !c.is_empty());
    }
    // v11: name[ARGS]{…}, repeated after further [TOOL_CALLS] markers.
    let mut calls = Vec::new();
    for part in rest.split(MISTRAL_CALLS) {
        let (name, args) = part.split_once(MISTRAL_ARGS)?;
        let (v, after) = json_prefix(args)?;
        if !v.is_object() || !after.trim().is_empty() || name.trim().is_empty() {
            return None;
        }
        calls.push(ToolCall {
            name: name.trim().to_string(),
            arguments: v.to_string(),
        });
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_llama3(mut rest: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    loop {
        let (v, after) = json_prefix(rest)?;
        calls.push(call_of(&v)?);
        let after = after.trim_start();
        if after.is_empty() {
            return Some(calls);
        }
        rest = after.strip_prefix(';')?;
    }
}

/// A streamed reply split as it arrives: text is released until a call may be starting; from
/// there on everything is held until [`ToolCallStream::finish`] parses it.
#[derive(Debug)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    /// Text not released yet (a possible marker's beginning, or the captured call).
    held: String,
    /// Text was released already (Llama 3's calls can only open a reply).
    seen_text: bool,
    capturing: bool,
}

impl ToolCallStream {
    /// A stream of a reply in `format`.
    pub fn new(format: ToolCallFormat) -> Self {
        ToolCallStream {
            format,
            held: String::new(),
            seen_text: false,
            capturing: false,
        }
    }

    /// Takes the next piece of the reply; returns the text that is certainly not part of a call.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.capturing {
            return String::new();
        }
        let start = if self.format == ToolCallFormat::Llama3Json && self.seen_text {
            None
        } else {
            self.format.call_start(&self.held)
        };
        if let Some(start) = start {
            self.capturing = true;
            let out: String = self.held.drain(..start).collect();
            self.seen_text |= !out.is_empty();
            return out;
        }
        let keep = self.format.partial_start(&self.held, self.seen_text);
        let out: String = self.held.drain(..self.held.len() - keep).collect();
        self.seen_text |= !out.is_empty();
        out
    }

    /// Everything held, as text (the reply was cut off: nothing is read as calls).
    pub fn abandon(&mut self) -> String {
        self.capturing = false;
        std::mem::take(&mut self.held)
    }

    /// The end of the reply: the calls, if what was held parses as calls, and the text still
    /// to release otherwise (everything held, unchanged).
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        if self.capturing {
            if let Some(parsed) = self.format.parse(&held) {
                return (parsed.content, parsed.calls);
            }
        }
        (held, Vec::new())
    }
}

/// The calls in a reply that was constrained to a forced choice: for one named function the
/// reply is that function's arguments; for `required` it is a JSON array of
/// `{"name", "arguments"}` (or one such object). `None` when it does not parse (cut by
/// `max_tokens`).
pub fn parse_forced(text: &str, named: Option<&str>) -> Option<Vec<ToolCall>> {
    let (v, after) = json_prefix(text)?;
    if !after.trim().is_empty() {
        return None;
    }
    match named {
        Some(name) => v.is_object().then(|| {
            vec![ToolCall {
                name: name.to_string(),
                arguments: v.to_string(),
            }]
        }),
        None => match &v {
            Value::Array(items) => {
                let calls: Option<Vec<ToolCall>> = items.iter().map(call_of).collect();
                calls.filter(|c| !c.is_empty())
            }
            Value::Object(_) => call_of(&v).map(|c| vec![c]),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn format_is_read_from_the_template() {
        let qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> <tool_call>{% endif %}";
        assert_eq!(ToolCallFormat::of_template(qwen), ToolCallFormat::Hermes);
        let mistral = "{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}";
        assert_eq!(
            ToolCallFormat::of_template(mistral),
            ToolCallFormat::Mistral
        );
        let llama = "<|start_header_id|>ipython<|end_header_id|> {{ '<|python_tag|>' }}";
        assert_eq!(
            ToolCallFormat::of_template(llama),
            ToolCallFormat::Llama3Json
        );
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
        assert_eq!(ToolCallFormat::of_template(chatml), ToolCallFormat::Hermes);
    }

    #[test]
    fn hermes_calls_with_text_before_and_without_a_closing_tag() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}";
        let p = ToolCallFormat::Hermes.parse(text).unwrap();
        assert_eq!(p.content, "Let me look.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("now", "{}")
            ]
        );
        assert_eq!(ToolCallFormat::Hermes.parse("no calls here"), None);
        // Broken JSON or trailing prose after a call: text, not calls.
        assert_eq!(
            ToolCallFormat::Hermes.parse("<tool_call>{\"name\": \"f\""),
            None
        );
        assert_eq!(
            ToolCallFormat::Hermes.parse("<tool_call>{\"name\": \"f\"}</tool_call> and more"),
            None
        );
        // Arguments given as a JSON string.
        let p = ToolCallFormat::Hermes
            .parse(r#"<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>"#)
            .unwrap();
        assert_eq!(p.calls, vec![call("f", r#"{"a": 1}"#)]);
    }

    #[test]
    fn llama3_and_mistral_calls() {
        let p = ToolCallFormat::Llama3Json
            .parse(" {\"name\": \"f\", \"parameters\": {\"x\": 2}}; {\"name\": \"g\", \"parameters\": {}}")
            .unwrap();
        assert_eq!(p.calls, vec![call("f", r#"{"x":2}"#), call("g", "{}")]);
        assert!(ToolCallFormat::Llama3Json
            .parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}")
            .is_some());
        assert_eq!(ToolCallFormat::Llama3Json.parse("The answer is {x}"), None);
        assert_eq!(ToolCallFormat::Llama3Json.parse("{\"a\": 1}"), None);

        let p = ToolCallFormat::Mistral
            .parse("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]")
            .unwrap();
        assert_eq!(p.calls, vec![call("f", r#"{"q":"x"}"#)]);
        let p = ToolCallFormat::Mistral
            .parse("[TOOL_CALLS]f[ARGS]{\"q\": 1}[TOOL_CALLS]g[ARGS]{}")
            .unwrap();
        assert_eq!(p.calls, vec![call("f", r#"{"q":1}"#), call("g", "{}")]);
    }

    /// Feeds `text` in pieces of `n` bytes (on char boundaries); returns (released, calls).
    fn stream(format: ToolCallFormat, text: &str, n: usize) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallStream::new(format);
        let mut out = String::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut k = n.min(rest.len());
            while !rest.is_char_boundary(k) {
                k += 1;
            }
            out += &s.push(&rest[..k]);
            rest = &rest[k..];
        }
        let (tail, calls) = s.finish();
        (out + &tail, calls)
    }

    #[test]
    fn streams_release_text_and_hold_calls_at_every_split() {
        let text = "Sure <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"é\"}}</tool_call>";
        for n in 1..8 {
            let (released, calls) = stream(ToolCallFormat::Hermes, text, n);
            assert_eq!(released, "Sure ", "piece size {n}");
            assert_eq!(calls, vec![call("f", r#"{"a":"é"}"#)]);
        }
        // A marker's beginning that never completes is text in the end.
        for n in 1..6 {
            let (released, calls) = stream(ToolCallFormat::Hermes, "a <tool_ca", n);
            assert_eq!((released.as_str(), calls.len()), ("a <tool_ca", 0));
            let (released, _) = stream(ToolCallFormat::Hermes, "1 < 2 <tool", n);
            assert_eq!(released, "1 < 2 <tool");
        }
        // A captured call that does not parse comes out as text, whole.
        let broken = "x <tool_call>{\"name\": ";
        assert_eq!(
            stream(ToolCallFormat::Hermes, broken, 3),
            (broken.to_string(), vec![])
        );
        // Llama 3: only an opening brace at the start is a call.
        let (released, calls) = stream(
            ToolCallFormat::Llama3Json,
            "{\"name\": \"f\", \"parameters\": {}}",
            2,
        );
        assert_eq!((released.as_str(), calls), ("", vec![call("f", "{}")]));
        let (released, calls) = stream(ToolCallFormat::Llama3Json, "ok {\"name\": \"f\"}", 2);
        assert_eq!(
            (released.as_str(), calls.len()),
            ("ok {\"name\": \"f\"}", 0)
        );
    }

    #[test]
    fn forced_replies() {
        assert_eq!(
            parse_forced("{\"city\": \"Oslo\"}", Some("weather")),
            Some(vec![call("weather", r#"{"city":"Oslo"}"#)])
        );
        assert_eq!(
            parse_forced(
                r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]"#,
                None
            ),
            Some(vec![call("a", "{}"), call("b", r#"{"x":1}"#)])
        );
        assert_eq!(parse_forced("{\"city\": ", Some("weather")), None);
        assert_eq!(parse_forced("[]", None), None);
    }
}
