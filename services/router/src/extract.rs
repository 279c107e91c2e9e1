//! The body extractor for the OpenAI routes: reads the body under the configured limit and turns
//! it into a JSON object, answering oversize, non-UTF-8 and malformed bodies with OpenAI error
//! bodies instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde_json::{Map, Value};

use crate::error::RouterError;
use crate::server::AppState;

/// A request body that parsed as a JSON object. Field checks happen later, in `validation`.
#[derive(Debug)]
pub struct JsonObject(pub Map<String, Value>);

impl JsonObject {
    /// Parses raw body bytes: UTF-8 first (with the byte offset of the first bad byte), then JSON,
    /// then "is an object".
    pub fn parse(bytes: &[u8]) -> Result<Self, RouterError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            RouterError::InvalidUtf8(format!("invalid byte at offset {}", e.valid_up_to()))
        })?;
        let value: Value =
            serde_json::from_str(text).map_err(|e| RouterError::InvalidJson(e.to_string()))?;
        match value {
            Value::Object(map) => Ok(Self(map)),
            other => Err(RouterError::InvalidJson(format!(
                "expected a JSON object, found {}",
                kind_of(&other)
            ))),
        }
    }
}

/// The JSON type name of a value, for messages.
pub fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl FromRequest<AppState> for JsonObject {
    type Rejection = RouterError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                RouterError::PayloadTooLarge {
                    limit: state.settings.max_body_bytes,
                }
            } else {
                RouterError::InvalidJson(format!("could not read the body: {rejection}"))
            }
        })?;
        Self::parse(&bytes)
    }
}
