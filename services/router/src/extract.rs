//! The body extractor for the OpenAI routes: refuses a body that is not `application/json`
//! (415), reads it under the configured limit and turns it into a JSON object whose objects
//! name each key once, answering oversize, non-UTF-8 and malformed bodies with OpenAI error
//! bodies instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
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
        let Strict(value) =
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

/// A JSON value whose objects name each key once: `{"a":1,"a":2}` is refused, not read as its
/// last value (a proxy or a logger reading the first would see another request than ours).
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(de::Error::custom(format!("duplicate key `{shown}`")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Whether `content_type` names JSON: `application/json` or `application/<x>+json`, with any
/// parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|s| s.ends_with("+json"))
}

impl FromRequest<AppState> for JsonObject {
    type Rejection = RouterError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        // A body of another media type is refused before it is read.
        match req.headers().get(CONTENT_TYPE).map(|v| v.to_str()) {
            Some(Ok(ct)) if is_json(ct) => {}
            Some(Ok(ct)) => {
                let shown: String = ct.chars().take(64).collect();
                return Err(RouterError::UnsupportedMediaType(format!("`{shown}`")));
            }
            Some(Err(_)) => {
                return Err(RouterError::UnsupportedMediaType(
                    "a Content-Type that is not text".into(),
                ))
            }
            None => {
                return Err(RouterError::UnsupportedMediaType(
                    "a body without Content-Type".into(),
                ))
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_is_refused_at_any_depth() {
        assert!(JsonObject::parse(br#"{"a":1,"b":[{"c":2}]}"#).is_ok());
        for bad in [
            r#"{"model":"m","model":"other"}"#,
            r#"{"messages":[{"role":"user","role":"system"}]}"#,
        ] {
            let e = JsonObject::parse(bad.as_bytes()).unwrap_err();
            assert!(
                matches!(&e, RouterError::InvalidJson(m) if m.contains("duplicate key")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn json_media_types() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.x+json",
        ] {
            assert!(is_json(ok), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "",
            "application/jsonx",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }
}
