//! The error of parsing a text that is none of an enum's spellings (a database column, a URL
//! parameter, a label).

/// A text that is not one of the enum's spellings.
#[derive(Debug, thiserror::Error)]
#[error("unknown {what} value {value:?}")]
pub struct UnknownValue {
    /// Which enum was being parsed.
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
}
