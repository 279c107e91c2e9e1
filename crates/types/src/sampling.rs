//! [`SamplingParams`]: how a request picks each next token and when it stops, the one
//! definition the router parses a client's body into, the wire carries
//! (`pagewarden.v1.SamplingParams`, converted in `pagewarden-proto`) and the engine samples
//! with; its [`Grammar`]; its limits; and its one range check, [`SamplingParams::check`],
//! whose [`SamplingError`] names the client-facing parameter. The router answers it with a
//! 400, a worker with `INVALID_ARGUMENT`.

use std::fmt;

/// At most this many stop sequences.
pub const MAX_STOP: usize = 16;
/// Longest stop sequence, in UTF-8 bytes (every generated token is matched against them all).
pub const MAX_STOP_BYTES: usize = 256;
/// At most this many `stop_token_ids`.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
/// The most top logprobs a request may ask for per token (vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// At most this many `logit_bias` entries (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;
/// The largest `logit_bias` value either way (OpenAI's range).
pub const LOGIT_BIAS_RANGE: f32 = 100.0;
/// The largest temperature (OpenAI's).
pub const MAX_TEMPERATURE: f32 = 2.0;
/// Largest `repetition_penalty` (1 is off; values above a few already forbid any repeat).
pub const MAX_REPETITION_PENALTY: f32 = 10.0;
/// The largest `presence_penalty` and `frequency_penalty` either way (OpenAI's range).
pub const PENALTY_RANGE: f32 = 2.0;
/// At most this many texts in a `choice` grammar.
pub const MAX_CHOICES: usize = 256;
/// Longest `choice` text or regular expression, in bytes.
pub const MAX_PATTERN_BYTES: usize = 4096;
/// Temperatures below this sample greedily: `1 / t` times any logit stays far from `f32`
/// overflow above it.
pub const GREEDY_BELOW: f32 = 1e-4;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A document valid under this JSON schema (`{"type": "json_schema", ...}`).
    JsonSchema(serde_json::Value),
    /// Text the whole of which matches this regular expression (vLLM's `regex`).
    Regex(String),
    /// Exactly one of these texts (vLLM's `choice`).
    Choice(Vec<String>),
}

impl Grammar {
    /// The wire's name of this form (`json_object`, `json_schema`, `regex`, `choice`).
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "json_object",
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::Regex(_) => "regex",
            Grammar::Choice(_) => "choice",
        }
    }

    /// The grammar's limits, an error naming `param` (the field the grammar came from): a
    /// regular expression is 1 to [`MAX_PATTERN_BYTES`] long, a choice holds 1 to
    /// [`MAX_CHOICES`] texts of that length. Whether it compiles is the model's check.
    pub fn check(&self, param: &str) -> Result<(), SamplingError> {
        match self {
            Grammar::JsonObject | Grammar::JsonSchema(_) => Ok(()),
            Grammar::Regex(rx) if rx.is_empty() => {
                Err(SamplingError::new(param, "must not be empty"))
            }
            Grammar::Regex(rx) if rx.len() > MAX_PATTERN_BYTES => Err(SamplingError::new(
                param,
                format!("may be at most {MAX_PATTERN_BYTES} bytes long"),
            )),
            Grammar::Regex(_) => Ok(()),
            Grammar::Choice(texts) if texts.is_empty() => {
                Err(SamplingError::new(param, "must hold at least one text"))
            }
            Grammar::Choice(texts) if texts.len() > MAX_CHOICES => Err(SamplingError::new(
                param,
                format!("may hold at most {MAX_CHOICES} texts"),
            )),
            Grammar::Choice(texts) => match texts
                .iter()
                .position(|t| t.is_empty() || t.len() > MAX_PATTERN_BYTES)
            {
                None => Ok(()),
                Some(i) => Err(SamplingError::new(
                    format!("{param}[{i}]"),
                    format!("must be 1 to {MAX_PATTERN_BYTES} bytes long"),
                )),
            },
        }
    }
}

/// How to pick each next token, and when to stop.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature, in `[0, 2]`; below [`GREEDY_BELOW`] means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`, in
    /// `(0, 1]`; 1 disables.
    pub top_p: f32,
    /// RNG seed; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Stop sequences, each non-empty; generation ends before the first one.
    pub stop: Vec<String>,
    /// Drop tokens less likely than `min_p` times the most likely one, in `[0, 1]`; 0
    /// disables.
    pub min_p: f32,
    /// Repetition penalty over prompt and generated tokens (vLLM/HF), in `(0, 10]`; 1
    /// disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token generated so far, in `[-2, 2]`; 0
    /// disables.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it was generated, in `[-2, 2]`; 0 disables.
    pub frequency_penalty: f32,
    /// The model's end-of-generation tokens do not end generation (they are then ordinary
    /// tokens); `stop_token_ids` still do.
    pub ignore_eos: bool,
    /// End tokens cannot be sampled before this many tokens were generated.
    pub min_tokens: usize,
    /// Token ids that end generation like an end-of-generation token (not part of the output).
    pub stop_token_ids: Vec<u32>,
    /// Report each chosen token's logprob and this many top logprobs; `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// What the output must be (`response_format`); `None`: free text.
    pub grammar: Option<Grammar>,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`: −100 bans a
    /// token in practice, 100 all but forces it), by ascending id, after penalties and before
    /// a grammar's or `min_tokens`' masks, which therefore still hold. Ids outside the
    /// vocabulary are ignored by the engine (the router refuses them).
    pub logit_bias: Vec<(u32, f32)>,
    /// Logprobs of the prompt's own tokens (every one after the first), this many top each;
    /// `None`: none. Prefill then computes the whole prompt (no prefix cache).
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            max_tokens: 256,
            stop: Vec::new(),
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ignore_eos: false,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
            logprobs: None,
            grammar: None,
            logit_bias: Vec::new(),
            prompt_logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..SamplingParams::default()
        }
    }

    /// Whether sampling reduces to argmax: no temperature, a temperature so small that
    /// `logit / temperature` would overflow (it tends to argmax anyway; left to the arithmetic
    /// it picked the least likely token), or `top_k == 1`.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW || self.top_k == 1
    }

    /// The one range check of every parameter; the error names the first one out of range,
    /// as a client spells it.
    pub fn check(&self) -> Result<(), SamplingError> {
        between("temperature", self.temperature, 0.0, MAX_TEMPERATURE)?;
        positive_at_most("top_p", self.top_p, 1.0)?;
        check_stop(&self.stop)?;
        between("min_p", self.min_p, 0.0, 1.0)?;
        positive_at_most(
            "repetition_penalty",
            self.repetition_penalty,
            MAX_REPETITION_PENALTY,
        )?;
        between(
            "presence_penalty",
            self.presence_penalty,
            -PENALTY_RANGE,
            PENALTY_RANGE,
        )?;
        between(
            "frequency_penalty",
            self.frequency_penalty,
            -PENALTY_RANGE,
            PENALTY_RANGE,
        )?;
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(SamplingError::new(
                "stop_token_ids",
                format!("may hold at most {MAX_STOP_TOKEN_IDS} ids"),
            ));
        }
        top_logprobs("logprobs", self.logprobs)?;
        top_logprobs("prompt_logprobs", self.prompt_logprobs)?;
        check_logit_bias(&self.logit_bias)?;
        match &self.grammar {
            None => Ok(()),
            Some(g) => g.check(g.kind()),
        }
    }
}

/// A sampling parameter out of range: which one, as the client spells it, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{param}` {message}")]
pub struct SamplingError {
    /// The parameter (`temperature`, `stop[2]`, ...).
    pub param: String,
    /// What is wrong with it, to follow its name.
    pub message: String,
}

impl SamplingError {
    /// `param` is wrong: `message` says how.
    pub fn new(param: impl Into<String>, message: impl fmt::Display) -> Self {
        SamplingError {
            param: param.into(),
            message: message.to_string(),
        }
    }
}

/// `v` in `[lo, hi]` (NaN never is).
fn between(param: &str, v: f32, lo: f32, hi: f32) -> Result<(), SamplingError> {
    if (lo..=hi).contains(&v) {
        return Ok(());
    }
    Err(SamplingError::new(
        param,
        format!("must be between {lo} and {hi}, got {v}"),
    ))
}

/// `v` in `(0, hi]`.
fn positive_at_most(param: &str, v: f32, hi: f32) -> Result<(), SamplingError> {
    between(param, v, 0.0, hi)?;
    if v <= 0.0 {
        return Err(SamplingError::new(param, "must be greater than 0"));
    }
    Ok(())
}

fn top_logprobs(param: &str, n: Option<usize>) -> Result<(), SamplingError> {
    match n {
        Some(n) if n > MAX_TOP_LOGPROBS => Err(SamplingError::new(
            param,
            format!("must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
        )),
        Some(_) | None => Ok(()),
    }
}

/// At most [`MAX_STOP`] sequences, each 1 to [`MAX_STOP_BYTES`] bytes long.
fn check_stop(stop: &[String]) -> Result<(), SamplingError> {
    if stop.len() > MAX_STOP {
        return Err(SamplingError::new(
            "stop",
            format!("may hold at most {MAX_STOP} sequences"),
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() {
            return Err(SamplingError::new(
                format!("stop[{i}]"),
                "must not be empty",
            ));
        }
        if s.len() > MAX_STOP_BYTES {
            return Err(SamplingError::new(
                format!("stop[{i}]"),
                format!("may be at most {MAX_STOP_BYTES} bytes long"),
            ));
        }
    }
    Ok(())
}

/// At most [`MAX_LOGIT_BIAS`] tokens, each once, each bias within [`LOGIT_BIAS_RANGE`].
fn check_logit_bias(bias: &[(u32, f32)]) -> Result<(), SamplingError> {
    if bias.len() > MAX_LOGIT_BIAS {
        return Err(SamplingError::new(
            "logit_bias",
            format!("may hold at most {MAX_LOGIT_BIAS} tokens"),
        ));
    }
    let range = LOGIT_BIAS_RANGE;
    if let Some((id, b)) = bias.iter().find(|(_, b)| !(-range..=range).contains(b)) {
        return Err(SamplingError::new(
            "logit_bias",
            format!("values must be numbers between -{range} and {range}, got {b} for token {id}"),
        ));
    }
    let mut ids: Vec<u32> = bias.iter().map(|&(id, _)| id).collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(SamplingError::new(
            "logit_bias",
            format!("names token {} twice", w[0]),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(p: SamplingParams) -> SamplingError {
        p.check().expect_err("out of range")
    }

    #[test]
    fn defaults_and_the_limits_themselves_pass() {
        SamplingParams::default().check().unwrap();
        let edge = SamplingParams {
            temperature: MAX_TEMPERATURE,
            top_p: 1.0,
            min_p: 1.0,
            repetition_penalty: MAX_REPETITION_PENALTY,
            presence_penalty: -PENALTY_RANGE,
            frequency_penalty: PENALTY_RANGE,
            stop: vec!["x".repeat(MAX_STOP_BYTES); MAX_STOP],
            stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS],
            logprobs: Some(MAX_TOP_LOGPROBS),
            prompt_logprobs: Some(MAX_TOP_LOGPROBS),
            logit_bias: (0..MAX_LOGIT_BIAS as u32)
                .map(|t| (t, LOGIT_BIAS_RANGE))
                .collect(),
            grammar: Some(Grammar::Choice(vec!["a".into(); MAX_CHOICES])),
            ..SamplingParams::default()
        };
        edge.check().unwrap();
    }

    #[test]
    fn each_parameter_out_of_range_is_refused_by_its_client_name() {
        let d = SamplingParams::default;
        let cases = [
            (
                SamplingParams {
                    temperature: 2.5,
                    ..d()
                },
                "`temperature` must be between 0 and 2, got 2.5",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..d()
                },
                "`temperature` must be between 0 and 2, got NaN",
            ),
            (
                SamplingParams { top_p: 0.0, ..d() },
                "`top_p` must be greater than 0",
            ),
            (
                SamplingParams { top_p: 1.5, ..d() },
                "`top_p` must be between 0 and 1, got 1.5",
            ),
            (
                SamplingParams {
                    stop: vec!["a".into(); MAX_STOP + 1],
                    ..d()
                },
                "`stop` may hold at most 16 sequences",
            ),
            (
                SamplingParams {
                    stop: vec!["ok".into(), String::new()],
                    ..d()
                },
                "`stop[1]` must not be empty",
            ),
            (
                SamplingParams { min_p: -0.1, ..d() },
                "`min_p` must be between 0 and 1, got -0.1",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..d()
                },
                "`repetition_penalty` must be greater than 0",
            ),
            (
                SamplingParams {
                    repetition_penalty: 11.0,
                    ..d()
                },
                "`repetition_penalty` must be between 0 and 10, got 11",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..d()
                },
                "`presence_penalty` must be between -2 and 2, got 2.5",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::INFINITY,
                    ..d()
                },
                "`frequency_penalty` must be between -2 and 2, got inf",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1],
                    ..d()
                },
                "`stop_token_ids` may hold at most 64 ids",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..d()
                },
                "`logprobs` must be an integer between 0 and 20, got 21",
            ),
            (
                SamplingParams {
                    prompt_logprobs: Some(21),
                    ..d()
                },
                "`prompt_logprobs` must be an integer between 0 and 20, got 21",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(5, 100.5)],
                    ..d()
                },
                "`logit_bias` values must be numbers between -100 and 100, got 100.5 for token 5",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(5, 1.0), (5, 2.0)],
                    ..d()
                },
                "`logit_bias` names token 5 twice",
            ),
            (
                SamplingParams {
                    grammar: Some(Grammar::Regex(String::new())),
                    ..d()
                },
                "`regex` must not be empty",
            ),
            (
                SamplingParams {
                    grammar: Some(Grammar::Choice(vec!["a".into(), String::new()])),
                    ..d()
                },
                "`choice[1]` must be 1 to 4096 bytes long",
            ),
        ];
        for (p, want) in cases {
            assert_eq!(refused(p).to_string(), want);
        }
        let e = refused(SamplingParams {
            stop: vec!["x".repeat(MAX_STOP_BYTES + 1)],
            ..d()
        });
        assert_eq!(e.param, "stop[0]");
    }

    #[test]
    fn a_grammar_error_names_the_field_it_came_from() {
        let e = Grammar::Choice(Vec::new())
            .check("guided_choice")
            .unwrap_err();
        assert_eq!(e.param, "guided_choice");
        assert_eq!(e.to_string(), "`guided_choice` must hold at least one text");
        let long = Grammar::Regex("a".repeat(MAX_PATTERN_BYTES + 1));
        assert_eq!(
            long.check("structured_outputs.regex").unwrap_err().param,
            "structured_outputs.regex"
        );
        Grammar::JsonSchema(serde_json::json!({"type": "object"}))
            .check("response_format")
            .unwrap();
    }

    #[test]
    fn greedy_below_the_floor_or_with_top_k_one() {
        assert!(SamplingParams::greedy(4).is_greedy());
        let tiny = SamplingParams {
            temperature: GREEDY_BELOW / 2.0,
            ..SamplingParams::default()
        };
        assert!(tiny.is_greedy());
        let k1 = SamplingParams {
            top_k: 1,
            ..SamplingParams::default()
        };
        assert!(k1.is_greedy());
        assert!(!SamplingParams::default().is_greedy());
    }
}
