//! Why a generation ended: the one definition, for the engine, the decode worker's streams,
//! the wire (`pagewarden-proto`'s `convert`) and the router's answers.

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// A worker ended the generation early (cancelled, or it failed); the engine itself never
    /// ends with it.
    Abort,
    /// The router read the reply as calls of the request's tools. Only an answer ends so: a
    /// generation that produced them ended with `Stop` (on the wire it is `Stop`).
    ToolCalls,
}

impl FinishReason {
    /// The OpenAI-style name (`"stop"`, `"length"`, `"abort"` or `"tool_calls"`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}
