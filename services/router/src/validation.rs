//! Parse, don't validate: request bodies become [`ValidCompletionRequest`] / [`ValidChatRequest`]
//! here, and nothing downstream accepts anything else. Every error names its field.
//!
//! The sampling fields are parsed into the one [`SamplingParams`] (OpenAI's and vLLM's
//! spellings and shapes are this module's); their ranges are [`SamplingParams::check`]'s,
//! the rule the workers apply too.

use pagewarden_model::{ChatMessage, Grammar, SamplingError, SamplingParams, LOGIT_BIAS_RANGE};
use serde_json::{json, Map, Value};

use crate::error::ValidationError;
use crate::extract::kind_of;
use crate::params::Fields;
use crate::tools::{parse_message_calls, ToolRequest};

/// Largest `max_tokens` accepted before the context check (which is tighter); also the
/// largest count a sampling field may spell (their own limits are `SamplingParams::check`'s).
pub const MAX_TOKENS_LIMIT: i64 = u32::MAX as i64;
/// Most prompts one `/v1/completions` request may hold (a batch, each its own choices).
pub const MAX_PROMPTS: usize = 64;
/// Most sequences one request may start (prompts × `n`): one request holds one concurrency
/// slot, so its fan-out is bounded.
pub const MAX_SEQUENCES: usize = 64;
/// Most choices (`n`) one request may ask for: each is a sequence of its own on decode.
pub const MAX_N: i64 = 16;

/// A completion prompt: text to tokenize, or token ids given by the client.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text; tokenized with special tokens parsed.
    Text(String),
    /// Token ids; checked against the vocabulary when tokenized.
    Tokens(Vec<u32>),
}

/// A request's one output constraint and the field it came from (`response_format`,
/// `structured_outputs`, `guided_*`), which an error about it names.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputConstraint {
    /// What the output must be.
    pub grammar: Grammar,
    /// The request field that said so.
    pub field: &'static str,
}

/// What every generation request carries besides its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCommon {
    /// The model named by the client, if any.
    pub model: Option<String>,
    /// `max_tokens` as given; `None` means "default" (decided at admission).
    pub max_tokens: Option<u32>,
    /// Sampling, in range. Its `max_tokens` is admission's, set when a job is made (0 until
    /// then); its `prompt_logprobs` is set by `echo` with `logprobs`.
    pub sampling: SamplingParams,
    /// The request field `sampling.grammar` came from (`response_format`, `guided_json`,
    /// `tool_choice`, ...), which an error about the grammar names.
    pub grammar_field: Option<&'static str>,
    /// Choices to generate (`n`), each its own sequence over the shared prompt.
    pub n: u32,
    /// Server-sent events instead of one JSON body.
    pub stream: bool,
    /// `stream_options.include_usage`: a final chunk with `usage`.
    pub include_usage: bool,
}

/// A `/v1/completions` body that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidCompletionRequest {
    /// The prompts (one, or a batch): each gets `n` choices, indexed on across the batch.
    pub prompts: Vec<Prompt>,
    /// `echo`: the prompt comes back before the completion (with its tokens' logprobs when
    /// `logprobs` is set); with `max_tokens: 0`, alone.
    pub echo: bool,
    /// Everything else.
    pub common: ValidCommon,
}

/// A `/v1/chat/completions` body that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidChatRequest {
    /// The conversation, at least one turn.
    pub messages: Vec<ChatMessage>,
    /// The tools the model may call, and how.
    pub tools: Option<ToolRequest>,
    /// Everything else.
    pub common: ValidCommon,
}

impl ValidCompletionRequest {
    /// Parses a `/v1/completions` body.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ValidationError> {
        let f = Fields::new(body);
        let prompts = parse_prompts(&f)?;
        let echo = f.bool("echo")?.unwrap_or(false);
        f.only_default("best_of", &[json!(1)])?;
        f.only_default("suffix", &[json!("")])?;
        let logprobs = f
            .integer("logprobs", 0, MAX_TOKENS_LIMIT)?
            .map(|n| n as usize);
        let mut common = parse_common(&f, "max_tokens", (logprobs, "logprobs"), echo)?;
        if prompts.len() * common.n as usize > MAX_SEQUENCES {
            return Err(f.err(
                "n",
                format!(
                    "times the {} prompts asks for {} choices; a request may start at most \
                     {MAX_SEQUENCES}",
                    prompts.len(),
                    prompts.len() * common.n as usize
                ),
            ));
        }
        if echo {
            if common.stream {
                return Err(f.err("echo", "is answered whole: send it with `stream: false`"));
            }
            common.sampling.prompt_logprobs = logprobs;
        }
        f.reject_unknown()?;
        Ok(Self {
            prompts,
            echo,
            common,
        })
    }
}

impl ValidChatRequest {
    /// Parses a `/v1/chat/completions` body.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ValidationError> {
        let f = Fields::new(body);
        let messages = parse_messages(&f)?;
        let top = f.integer("top_logprobs", 0, MAX_TOKENS_LIMIT)?;
        let logprobs = match (f.bool("logprobs")?.unwrap_or(false), top) {
            (true, top) => Some(top.unwrap_or(0) as usize),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(f.err("top_logprobs", "requires `logprobs: true`"));
            }
        };
        let tools = ToolRequest::parse(&f)?;
        f.only_default("functions", &[json!([])])?;
        f.only_default("function_call", &[json!("none"), json!("auto")])?;
        let max_field = match (f.get("max_completion_tokens"), f.get("max_tokens")) {
            (Some(_), Some(_)) => {
                return Err(f.err(
                    "max_tokens",
                    "and `max_completion_tokens` were both given; send one of them",
                ))
            }
            (Some(_), None) => "max_completion_tokens",
            (None, _) => "max_tokens",
        };
        let mut common = parse_common(&f, max_field, (logprobs, "top_logprobs"), false)?;
        if let Some(forced) = tools.as_ref().and_then(ToolRequest::constraint) {
            if let Some(other) = common.grammar_field {
                return Err(f.err(
                    "tool_choice",
                    format!(
                        "forces a call and cannot be combined with `{other}`: a request takes \
                         one output constraint"
                    ),
                ));
            }
            if common.sampling.ignore_eos {
                return Err(f.err(
                    "ignore_eos",
                    "cannot be combined with a forced `tool_choice`: a call ends when its \
                     arguments are complete",
                ));
            }
            common.sampling.grammar = Some(forced.grammar);
            common.grammar_field = Some(forced.field);
        }
        f.reject_unknown()?;
        Ok(Self {
            messages,
            tools,
            common,
        })
    }
}

/// What `/tokenize` turns into tokens.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizeInput {
    /// A completion prompt, tokenized as `/v1/completions` does.
    Prompt(Prompt),
    /// A conversation, rendered and tokenized as `/v1/chat/completions` does.
    Messages(Vec<ChatMessage>),
}

/// A `/tokenize` body that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidTokenizeRequest {
    /// The model named by the client, if any.
    pub model: Option<String>,
    /// The text to tokenize.
    pub input: TokenizeInput,
    /// vLLM's `add_special_tokens` (default true): false leaves a prompt's BOS out.
    pub add_special_tokens: bool,
}

impl ValidTokenizeRequest {
    /// Parses a `/tokenize` body: exactly one of `prompt` and `messages`.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, ValidationError> {
        let f = Fields::new(body);
        let model = f.string("model")?.map(str::to_owned);
        let input = match (f.get("prompt").is_some(), f.get("messages").is_some()) {
            (true, false) => TokenizeInput::Prompt(parse_prompt(&f)?),
            (false, true) => TokenizeInput::Messages(parse_messages(&f)?),
            (true, true) => return Err(f.err("prompt", "and `messages` were both given; send one")),
            (false, false) => return Err(f.err("prompt", "or `messages` is required")),
        };
        let add_special_tokens = f.bool("add_special_tokens")?.unwrap_or(true);
        f.reject_unknown()?;
        Ok(Self {
            model,
            input,
            add_special_tokens,
        })
    }
}

/// A `/detokenize` body that passed every check.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidDetokenizeRequest {
    /// The model named by the client, if any.
    pub model: Option<String>,
    /// Token ids, each inside the vocabulary.
    pub tokens: Vec<u32>,
}

impl ValidDetokenizeRequest {
    /// Parses a `/detokenize` body against a vocabulary of `vocab` tokens.
    pub fn parse(body: &Map<String, Value>, vocab: usize) -> Result<Self, ValidationError> {
        let f = Fields::new(body);
        let model = f.string("model")?.map(str::to_owned);
        let tokens = match f.require("tokens")? {
            Value::Array(ids) => token_ids(&f, "tokens", ids)?,
            v => {
                return Err(f.err(
                    "tokens",
                    format!("must be an array of token ids, found {}", kind_of(v)),
                ))
            }
        };
        if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(f.err(
                &format!("tokens[{i}]"),
                format!(
                    "is token id {}, outside the vocabulary of {vocab} tokens",
                    tokens[i]
                ),
            ));
        }
        f.reject_unknown()?;
        Ok(Self { model, tokens })
    }
}

/// `logprobs` is the endpoint's own reading of its logprobs fields.
/// `response_format`: `{"type": "text"}` (or absent), `{"type": "json_object"}`, or
/// `{"type": "json_schema", "json_schema": {"name": .., "schema": {..}, "strict": ..,
/// "description": ..}}` (OpenAI's shape; vLLM accepts it on both endpoints). Whether the schema
/// compiles is checked against the vocabulary at admission (`Frontend::check_grammar`).
fn parse_response_format(f: &Fields<'_>) -> Result<Option<Grammar>, ValidationError> {
    let rf = match f.get("response_format") {
        None => return Ok(None),
        Some(Value::Object(o)) => Fields::nested(o, "response_format"),
        Some(v) => {
            return Err(f.err(
                "response_format",
                format!("must be an object, found {}", kind_of(v)),
            ))
        }
    };
    let grammar = match rf.require("type")? {
        Value::String(t) if t == "text" => None,
        Value::String(t) if t == "json_object" => Some(Grammar::JsonObject),
        Value::String(t) if t == "json_schema" => {
            let js = match rf.require("json_schema")? {
                Value::Object(o) => Fields::nested(o, "response_format.json_schema"),
                v => {
                    return Err(rf.err(
                        "json_schema",
                        format!("must be an object, found {}", kind_of(v)),
                    ))
                }
            };
            js.string("name")?;
            js.string("description")?;
            js.bool("strict")?;
            let schema = match js.require("schema")? {
                v @ (Value::Object(_) | Value::Bool(true)) => v.clone(),
                v => {
                    return Err(js.err(
                        "schema",
                        format!("must be a JSON schema object, found {}", kind_of(v)),
                    ))
                }
            };
            js.reject_unknown()?;
            Some(Grammar::JsonSchema(schema))
        }
        v => {
            return Err(rf.err(
                "type",
                format!("must be `text`, `json_object` or `json_schema`, got {v}"),
            ))
        }
    };
    rf.reject_unknown()?;
    Ok(grammar)
}

/// The fields both endpoints take; `max_tokens` may be 0 only with `zero_tokens` (an echo that
/// generates nothing). `logprobs` is the endpoint's own reading of its logprobs fields, with
/// the field a client fixes when it is out of range.
fn parse_common(
    f: &Fields<'_>,
    max_field: &str,
    (logprobs, logprobs_field): (Option<usize>, &str),
    zero_tokens: bool,
) -> Result<ValidCommon, ValidationError> {
    let model = f.string("model")?.map(str::to_owned);
    let max_tokens = match f.integer(max_field, 0, MAX_TOKENS_LIMIT)? {
        Some(0) if !zero_tokens => {
            return Err(f.err(
                max_field,
                "must be at least 1 (0 only with `echo: true`, to score the prompt)",
            ))
        }
        n => n.map(|n| n as u32),
    };
    let n = f.integer("n", 1, MAX_N)?.unwrap_or(1) as u32;
    f.only_default("store", &[json!(false)])?;
    f.only_default("service_tier", &[json!("auto"), json!("default")])?;
    f.string("user")?;
    parse_metadata(f)?;
    let d = SamplingParams::default();
    let temperature = float(f, "temperature", d.temperature)?;
    let top_p = float(f, "top_p", d.top_p)?;
    let top_k = match f.integer("top_k", -1, MAX_TOKENS_LIMIT)? {
        None | Some(-1) => 0,
        Some(k) => k as usize,
    };
    // OpenAI seeds are any 64-bit integer; negative ones keep their bits.
    let seed = f.integer("seed", i64::MIN, i64::MAX)?.map(|s| s as u64);
    let (stop, single_stop) = parse_stop(f)?;
    let min_p = float(f, "min_p", d.min_p)?;
    let repetition_penalty = float(f, "repetition_penalty", d.repetition_penalty)?;
    let presence_penalty = float(f, "presence_penalty", d.presence_penalty)?;
    let frequency_penalty = float(f, "frequency_penalty", d.frequency_penalty)?;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let min_tokens = f.integer("min_tokens", 0, MAX_TOKENS_LIMIT)?.unwrap_or(0) as u32;
    if let Some(max) = max_tokens.filter(|&m| min_tokens > m) {
        return Err(f.err(
            "min_tokens",
            format!("must be at most `{max_field}` ({max}), got {min_tokens}"),
        ));
    }
    let stop_token_ids = match f.get("stop_token_ids") {
        None => Vec::new(),
        Some(Value::Array(ids)) if ids.is_empty() => Vec::new(),
        Some(Value::Array(ids)) => token_ids(f, "stop_token_ids", ids)?,
        Some(v) => {
            return Err(f.err(
                "stop_token_ids",
                format!("must be an array of token ids, found {}", kind_of(v)),
            ))
        }
    };
    let logit_bias = parse_logit_bias(f)?;
    let constraint = parse_output_constraint(f)?;
    if let Some(c) = constraint.as_ref().filter(|_| ignore_eos) {
        return Err(f.err(
            "ignore_eos",
            format!(
                "cannot be combined with `{}`: a constrained answer ends when its document is \
                 complete",
                c.field
            ),
        ));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            let so = Fields::nested(o, "stream_options");
            let include = so.bool("include_usage")?.unwrap_or(false);
            so.reject_unknown()?;
            include
        }
        Some(v) => {
            return Err(f.err(
                "stream_options",
                format!("must be an object, found {}", kind_of(v)),
            ))
        }
    };
    let grammar_field = constraint.as_ref().map(|c| c.field);
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
        max_tokens: 0,
        stop,
        min_p,
        repetition_penalty,
        presence_penalty,
        frequency_penalty,
        ignore_eos,
        min_tokens: min_tokens as usize,
        stop_token_ids,
        logprobs,
        grammar: constraint.map(|c| c.grammar),
        logit_bias,
        prompt_logprobs: None,
    };
    sampling.check().map_err(|e| {
        // The rule names the engine's parameter; the client fixes the field it sent.
        let param = match e.param.as_str() {
            "logprobs" | "prompt_logprobs" => logprobs_field,
            "stop[0]" if single_stop => "stop",
            _ => return ValidationError::from(e),
        };
        ValidationError::from(SamplingError::new(param, e.message))
    })?;
    Ok(ValidCommon {
        model,
        max_tokens,
        sampling,
        grammar_field,
        n,
        stream,
        include_usage,
    })
}

/// A number (its range is [`SamplingParams::check`]'s), `default` when absent.
fn float(f: &Fields<'_>, field: &str, default: f32) -> Result<f32, ValidationError> {
    Ok(f.number(field, f64::MIN, f64::MAX)?
        .map_or(default, |x| x as f32))
}

/// The one output constraint a request may carry: OpenAI's `response_format`, vLLM's
/// `structured_outputs` (`json`, `regex`, `choice`, `json_object`) or its older `guided_json`,
/// `guided_regex`, `guided_choice`; with the field it came from. Two of them are refused, and
/// so are the forms the constrained decoder does not take (`grammar`, `structural_tag`).
fn parse_output_constraint(f: &Fields<'_>) -> Result<Option<OutputConstraint>, ValidationError> {
    let mut found: Vec<(Grammar, &'static str)> = Vec::new();
    if let Some(g) = parse_response_format(f)? {
        found.push((g, "response_format"));
    }
    if let Some(v) = f.get("guided_json") {
        found.push((json_schema(f, "guided_json", v)?, "guided_json"));
    }
    if let Some(v) = f.get("guided_regex") {
        found.push((regex(f, "guided_regex", v)?, "guided_regex"));
    }
    if let Some(v) = f.get("guided_choice") {
        found.push((choice(f, "guided_choice", v)?, "guided_choice"));
    }
    for unsupported in [
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
    ] {
        if f.get(unsupported).is_some() {
            return Err(f.err(unsupported, UNSUPPORTED_FORM));
        }
    }
    match f.get("structured_outputs") {
        None => {}
        Some(Value::Object(o)) => {
            let so = Fields::nested(o, "structured_outputs");
            let mut forms = Vec::new();
            if let Some(v) = so.get("json") {
                forms.push(json_schema(&so, "json", v)?);
            }
            if let Some(v) = so.get("regex") {
                forms.push(regex(&so, "regex", v)?);
            }
            if let Some(v) = so.get("choice") {
                forms.push(choice(&so, "choice", v)?);
            }
            if so.bool("json_object")? == Some(true) {
                forms.push(Grammar::JsonObject);
            }
            for unsupported in ["grammar", "structural_tag", "whitespace_pattern"] {
                if so.get(unsupported).is_some() {
                    return Err(so.err(unsupported, UNSUPPORTED_FORM));
                }
            }
            so.reject_unknown()?;
            match forms.len() {
                0 => {
                    return Err(f.err(
                        "structured_outputs",
                        "must give one of `json`, `regex`, `choice` or `json_object`",
                    ))
                }
                1 => found.extend(forms.into_iter().map(|g| (g, "structured_outputs"))),
                _ => {
                    return Err(f.err(
                        "structured_outputs",
                        "may give only one of `json`, `regex`, `choice` and `json_object`",
                    ))
                }
            }
        }
        Some(v) => {
            return Err(f.err(
                "structured_outputs",
                format!("must be an object, found {}", kind_of(v)),
            ))
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => {
            let (grammar, field) = found.remove(0);
            Ok(Some(OutputConstraint { grammar, field }))
        }
        _ => Err(f.err(
            found[1].1,
            format!(
                "cannot be combined with `{}`: a request takes one output constraint",
                found[0].1
            ),
        )),
    }
}

const UNSUPPORTED_FORM: &str = "is not supported: the constrained decoder takes JSON schemas, \
     regular expressions and choices (`structured_outputs.json`, `.regex`, `.choice`, or \
     `response_format`)";

/// A JSON schema given as an object (or `true`) or as JSON text.
fn json_schema(f: &Fields<'_>, field: &str, v: &Value) -> Result<Grammar, ValidationError> {
    let schema = match v {
        Value::Object(_) | Value::Bool(true) => v.clone(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(s @ (Value::Object(_) | Value::Bool(true))) => s,
            Ok(_) | Err(_) => {
                return Err(f.err(field, "must be a JSON schema (an object, or its JSON text)"))
            }
        },
        v => {
            return Err(f.err(
                field,
                format!("must be a JSON schema object, found {}", kind_of(v)),
            ))
        }
    };
    Ok(Grammar::JsonSchema(schema))
}

/// A regular expression the whole output must match, within the grammar's limits.
fn regex(f: &Fields<'_>, field: &str, v: &Value) -> Result<Grammar, ValidationError> {
    match v {
        Value::String(rx) => checked(f, field, Grammar::Regex(rx.clone())),
        v => Err(f.err(
            field,
            format!(
                "must be a regular expression (a string), found {}",
                kind_of(v)
            ),
        )),
    }
}

/// The texts one of which the output must be, within the grammar's limits.
fn choice(f: &Fields<'_>, field: &str, v: &Value) -> Result<Grammar, ValidationError> {
    let items = match v {
        Value::Array(items) => items,
        v => {
            return Err(f.err(
                field,
                format!("must be an array of strings, found {}", kind_of(v)),
            ))
        }
    };
    checked(f, field, Grammar::Choice(strings(f, field, items)?))
}

/// Every item of the array `field` as a string, an error naming the first that is not.
fn strings(f: &Fields<'_>, field: &str, items: &[Value]) -> Result<Vec<String>, ValidationError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            v => Err(f.err(
                &format!("{field}[{i}]"),
                format!("must be a string, found {}", kind_of(v)),
            )),
        })
        .collect()
}

/// `g`, when within its limits ([`Grammar::check`]), an error naming `field` otherwise.
fn checked(f: &Fields<'_>, field: &str, g: Grammar) -> Result<Grammar, ValidationError> {
    g.check(&f.name(field))?;
    Ok(g)
}

/// OpenAI's `logit_bias`: an object from token ids (as strings, JSON's keys) to a number;
/// returned by ascending id (how many, and their range, are [`SamplingParams::check`]'s).
fn parse_logit_bias(f: &Fields<'_>) -> Result<Vec<(u32, f32)>, ValidationError> {
    let map = match f.get("logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(v) => {
            return Err(f.err(
                "logit_bias",
                format!(
                    "must be an object from token ids to numbers, found {}",
                    kind_of(v)
                ),
            ))
        }
    };
    let mut bias = Vec::with_capacity(map.len());
    for (key, v) in map {
        let id: u32 = match key.parse() {
            Ok(id) if !key.starts_with('+') => id,
            _ => {
                return Err(f.err(
                    "logit_bias",
                    format!("keys must be token ids (non-negative integers), got {key:?}"),
                ))
            }
        };
        let Some(b) = v.as_f64() else {
            return Err(f.err(
                "logit_bias",
                format!(
                    "values must be numbers between -{LOGIT_BIAS_RANGE} and {LOGIT_BIAS_RANGE}, \
                     got {v} for token {id}"
                ),
            ));
        };
        bias.push((id, b as f32));
    }
    bias.sort_unstable_by_key(|&(id, _)| id);
    Ok(bias)
}

/// OpenAI's `metadata`: at most 16 string pairs, keys up to 64 characters, values up to 512.
/// Checked and dropped: it carries nothing for generation.
fn parse_metadata(f: &Fields<'_>) -> Result<(), ValidationError> {
    let map = match f.get("metadata") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(map)) => map,
        Some(v) => {
            return Err(f.err(
                "metadata",
                format!("must be an object of strings, found {}", kind_of(v)),
            ))
        }
    };
    if map.len() > 16 {
        return Err(f.err("metadata", "may hold at most 16 keys"));
    }
    for (k, v) in map {
        if k.chars().count() > 64 {
            return Err(f.err("metadata", "keys may be at most 64 characters"));
        }
        match v {
            Value::String(s) if s.chars().count() <= 512 => {}
            Value::String(_) => {
                return Err(f.err("metadata", "values may be at most 512 characters"))
            }
            v => {
                return Err(f.err(
                    "metadata",
                    format!("values must be strings, found {}", kind_of(v)),
                ))
            }
        }
    }
    Ok(())
}

/// `stop`: one string or an array of them (their number and length are
/// [`SamplingParams::check`]'s); with whether it was one string, which an error then names
/// `stop`.
fn parse_stop(f: &Fields<'_>) -> Result<(Vec<String>, bool), ValidationError> {
    let items = match f.get("stop") {
        None => return Ok((Vec::new(), false)),
        Some(Value::String(s)) => return Ok((vec![s.clone()], true)),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(f.err(
                "stop",
                format!(
                    "must be a string or an array of strings, found {}",
                    kind_of(v)
                ),
            ))
        }
    };
    Ok((strings(f, "stop", items)?, false))
}

/// A completions `prompt`: one (as [`parse_prompt`]) or a batch, an array of several strings
/// or several arrays of token ids.
fn parse_prompts(f: &Fields<'_>) -> Result<Vec<Prompt>, ValidationError> {
    let batch = match f.get("prompt") {
        Some(Value::Array(items))
            if items.len() > 1 && items.iter().all(|v| v.is_string() || v.is_array()) =>
        {
            items
        }
        _ => return parse_prompt(f).map(|p| vec![p]),
    };
    if batch.len() > MAX_PROMPTS {
        return Err(f.err("prompt", format!("may hold at most {MAX_PROMPTS} prompts")));
    }
    batch
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(ids) => token_ids(f, &format!("prompt[{i}]"), ids).map(Prompt::Tokens),
            other => Err(f.err(
                &format!("prompt[{i}]"),
                format!("must be a string or token ids, found {}", kind_of(other)),
            )),
        })
        .collect()
}

fn parse_prompt(f: &Fields<'_>) -> Result<Prompt, ValidationError> {
    match f.require("prompt")? {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => match items.as_slice() {
            [] => Err(f.err("prompt", "must not be empty")),
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => token_ids(f, "prompt[0]", ids).map(Prompt::Tokens),
            [Value::Number(_), ..] => token_ids(f, "prompt", items).map(Prompt::Tokens),
            [_, _, ..] if items.iter().all(|v| v.is_string() || v.is_array()) => Err(f.err(
                "prompt",
                "holds several prompts; batched prompts are not supported, send one per request",
            )),
            _ => Err(f.err(
                "prompt",
                "must be a string, an array of token ids, or an array holding one of those",
            )),
        },
        v => Err(f.err(
            "prompt",
            format!(
                "must be a string or an array of token ids, found {}",
                kind_of(v)
            ),
        )),
    }
}

fn token_ids(f: &Fields<'_>, field: &str, ids: &[Value]) -> Result<Vec<u32>, ValidationError> {
    if ids.is_empty() {
        return Err(f.err(field, "must not be empty"));
    }
    ids.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    f.err(
                        &format!("{field}[{i}]"),
                        format!("must be a token id (a non-negative integer), got {v}"),
                    )
                })
        })
        .collect()
}

fn parse_messages(f: &Fields<'_>) -> Result<Vec<ChatMessage>, ValidationError> {
    let items = match f.require("messages")? {
        Value::Array(a) if a.is_empty() => return Err(f.err("messages", "must not be empty")),
        Value::Array(a) => a,
        v => {
            return Err(f.err(
                "messages",
                format!("must be an array of messages, found {}", kind_of(v)),
            ))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(f, i, m))
        .collect()
}

fn parse_message(f: &Fields<'_>, i: usize, m: &Value) -> Result<ChatMessage, ValidationError> {
    let at = format!("messages[{i}]");
    let obj = match m {
        Value::Object(o) => o,
        v => return Err(f.err(&at, format!("must be an object, found {}", kind_of(v)))),
    };
    let mf = Fields::nested(obj, f.name(&at));
    let role = match mf.require("role")? {
        Value::String(r) => match r.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(mf.err(
                    "role",
                    format!(
                        "must be one of system, developer, user, assistant, tool; got `{other}`"
                    ),
                ))
            }
        },
        v => return Err(mf.err("role", format!("must be a string, found {}", kind_of(v)))),
    };
    // An assistant turn that called tools may have no content (null).
    let content = match mf.get("content") {
        None if role == "assistant" => String::new(),
        None => return Err(mf.err("content", "is required")),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(&mf, parts)?,
        Some(v) => {
            return Err(mf.err(
                "content",
                format!(
                    "must be a string or an array of text parts, found {}",
                    kind_of(v)
                ),
            ))
        }
    };
    let name = mf.string("name")?.map(str::to_owned);
    let tool_calls = if role == "assistant" {
        parse_message_calls(&mf)?
    } else {
        None
    };
    let tool_call_id = if role == "tool" {
        let id = mf
            .string("tool_call_id")?
            .ok_or_else(|| mf.err("tool_call_id", "is required in a `tool` message"))?;
        Some(id.to_string())
    } else {
        None
    };
    mf.reject_unknown()?;
    Ok(ChatMessage {
        role: role.to_string(),
        content,
        name,
        tool_calls,
        tool_call_id,
    })
}

fn text_parts(mf: &Fields<'_>, parts: &[Value]) -> Result<String, ValidationError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("content[{j}]");
        let Value::Object(p) = part else {
            return Err(mf.err(&at, format!("must be an object, found {}", kind_of(part))));
        };
        let pf = Fields::nested(p, mf.name(&at));
        let (ty, t) = (pf.string("type")?, pf.string("text")?);
        pf.reject_unknown()?;
        match (ty, t) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some("text"), None) => return Err(pf.err("text", "is required")),
            (Some(other), _) => {
                return Err(pf.err(
                    "type",
                    format!("`{other}` is not supported; only `text` parts are"),
                ))
            }
            (None, _) => return Err(pf.err("type", "is required")),
        }
    }
    Ok(text)
}
