//! Typed readers over a JSON object: each returns a [`ValidationError`] that names the field and
//! says what was expected, so `validation` reads as a list of fields. Every field read is
//! remembered, so that [`Fields::reject_unknown`] can refuse the ones nobody read: OpenAI answers
//! an unknown argument with a 400, and a silently dropped parameter changes what a client gets.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::error::ValidationError;
use crate::extract::kind_of;

/// A JSON object being parsed field by field. `null` counts as absent, as OpenAI clients send it.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
    read: RefCell<BTreeSet<String>>,
}

impl<'a> Fields<'a> {
    /// Wraps a top-level object.
    pub fn new(map: &'a Map<String, Value>) -> Self {
        Self {
            map,
            prefix: String::new(),
            read: RefCell::default(),
        }
    }

    /// Wraps a nested object whose fields are reported as `prefix.field`.
    pub fn nested(map: &'a Map<String, Value>, prefix: impl Into<String>) -> Self {
        Self {
            map,
            prefix: prefix.into(),
            read: RefCell::default(),
        }
    }

    /// The client-facing name of `field`.
    pub fn name(&self, field: &str) -> String {
        if self.prefix.is_empty() {
            field.to_string()
        } else {
            format!("{}.{field}", self.prefix)
        }
    }

    /// An error about `field`.
    pub fn err(&self, field: &str, what: impl std::fmt::Display) -> ValidationError {
        let name = self.name(field);
        ValidationError::new(name.clone(), format!("`{name}` {what}"))
    }

    /// The raw value, `None` when absent or null. Marks `field` as known.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.read.borrow_mut().insert(field.to_owned());
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// Refuses the first field (in name order) that no reader asked for, naming it.
    pub fn reject_unknown(&self) -> Result<(), ValidationError> {
        let read = self.read.borrow();
        match self.map.keys().find(|k| !read.contains(k.as_str())) {
            None => Ok(()),
            Some(k) => Err(self.err(
                k,
                "is not a recognized parameter (docs/api.md lists the accepted ones)",
            )),
        }
    }

    /// A value that must be present.
    pub fn require(&self, field: &str) -> Result<&'a Value, ValidationError> {
        self.get(field)
            .ok_or_else(|| self.err(field, "is required"))
    }

    fn wrong_type(&self, field: &str, expected: &str, found: &Value) -> ValidationError {
        self.err(
            field,
            format!("must be {expected}, found {}", kind_of(found)),
        )
    }

    /// An optional boolean.
    pub fn bool(&self, field: &str) -> Result<Option<bool>, ValidationError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(field, "a boolean", v)),
        }
    }

    /// An optional string.
    pub fn string(&self, field: &str) -> Result<Option<&'a str>, ValidationError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.wrong_type(field, "a string", v)),
        }
    }

    /// An optional number in `[lo, hi]`.
    pub fn number(&self, field: &str, lo: f64, hi: f64) -> Result<Option<f64>, ValidationError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if (lo..=hi).contains(&x) {
                    Ok(Some(x))
                } else {
                    Err(self.err(field, format!("must be between {lo} and {hi}, got {n}")))
                }
            }
            Some(v) => Err(self.wrong_type(field, "a number", v)),
        }
    }

    /// An optional integer in `[lo, hi]`.
    pub fn integer(&self, field: &str, lo: i64, hi: i64) -> Result<Option<i64>, ValidationError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
                _ if n.is_i64() || n.is_u64() => Err(self.err(
                    field,
                    format!("must be an integer between {lo} and {hi}, got {n}"),
                )),
                _ => Err(self.err(field, format!("must be an integer, got {n}"))),
            },
            Some(v) => Err(self.wrong_type(field, "an integer", v)),
        }
    }

    /// Accepts the field only when absent or equal to one of `defaults`: for OpenAI parameters
    /// this server does not implement, so a client never silently gets different semantics.
    pub fn only_default(&self, field: &str, defaults: &[Value]) -> Result<(), ValidationError> {
        match self.get(field) {
            None => Ok(()),
            Some(v) if defaults.contains(v) => Ok(()),
            Some(v) => Err(self.err(field, format!("is not supported (got {v})"))),
        }
    }
}
