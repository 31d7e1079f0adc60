//! Loose argument parsing. Arguments arrive as any JSON; every mistake an agent
//! can make becomes an `InvalidInput` it can read and fix, never a protocol error.

use rmcp::model::JsonObject;
use serde_json::Value;

use crate::domain::InvalidInput;

pub struct Args<'a> {
    map: &'a JsonObject,
}

static EMPTY: std::sync::LazyLock<JsonObject> = std::sync::LazyLock::new(JsonObject::new);

impl<'a> Args<'a> {
    /// Refuses unknown keys, so a typo (`recipient` for `to`) is reported
    /// instead of silently ignored.
    pub fn new(
        tool: &str,
        arguments: Option<&'a JsonObject>,
        known: &[&str],
    ) -> Result<Self, InvalidInput> {
        let map = arguments.unwrap_or(&EMPTY);
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(InvalidInput::new(
                "arguments",
                format!(
                    "has an unknown key '{}'; {tool} takes: {}",
                    truncate(unknown, 40),
                    known.join(", ")
                ),
            ));
        }
        Ok(Self { map })
    }

    /// Whether `key` was given (and not null).
    pub fn is_given(&self, key: &str) -> bool {
        self.value(key).is_some()
    }

    fn value(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn str(&self, key: &'static str) -> Result<Option<&'a str>, InvalidInput> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(key, "a string", other)),
        }
    }

    pub fn required_str(&self, key: &'static str) -> Result<&'a str, InvalidInput> {
        self.str(key)?
            .ok_or_else(|| InvalidInput::new(key, "is required"))
    }

    /// A whole number in `min..=max`; digit strings are accepted too, since
    /// models often quote numbers.
    pub fn int(&self, key: &'static str, min: u32, max: u32) -> Result<Option<u32>, InvalidInput> {
        let out_of_range =
            || InvalidInput::new(key, format!("must be a whole number from {min} to {max}"));
        let n = match self.value(key) {
            None => return Ok(None),
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    i
                } else if n.as_u64().is_some() {
                    return Err(out_of_range());
                } else {
                    match n.as_f64() {
                        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => f as i64,
                        _ => return Err(out_of_range()),
                    }
                }
            }
            Some(Value::String(s)) => s.trim().parse::<i64>().map_err(|_| out_of_range())?,
            Some(other) => return Err(wrong_type(key, "a number", other)),
        };
        if n < i64::from(min) || n > i64::from(max) {
            return Err(InvalidInput::new(
                key,
                format!("must be from {min} to {max}; got {n}"),
            ));
        }
        Ok(Some(n as u32))
    }

    /// A list of strings; a single string counts as a list of one.
    pub fn str_list(&self, key: &'static str) -> Result<Vec<&'a str>, InvalidInput> {
        match self.value(key) {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![s.as_str()]),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(wrong_type(key, "a list of strings", other)),
                })
                .collect(),
            Some(other) => Err(wrong_type(key, "a list of strings", other)),
        }
    }

    /// `None` when absent.
    pub fn opt_bool(&self, key: &'static str) -> Result<Option<bool>, InvalidInput> {
        match self.value(key) {
            None => Ok(None),
            Some(_) => self.bool(key).map(Some),
        }
    }

    pub fn bool(&self, key: &'static str) -> Result<bool, InvalidInput> {
        match self.value(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(Value::String(s)) if s == "true" => Ok(true),
            Some(Value::String(s)) if s == "false" => Ok(false),
            Some(other) => Err(wrong_type(key, "true or false", other)),
        }
    }
}

fn wrong_type(key: &'static str, expected: &str, got: &Value) -> InvalidInput {
    let got = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    InvalidInput::new(key, format!("must be {expected}; got {got}"))
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn types_are_checked_with_readable_errors() {
        let map = obj(json!({"body": 5, "limit": -1, "peek": "yes", "to": null}));
        let args = Args::new("phone_send", Some(&map), &["body", "limit", "peek", "to"]).unwrap();
        assert_eq!(
            args.str("body").unwrap_err().to_string(),
            "`body` must be a string; got a number"
        );
        assert!(
            args.int("limit", 1, 100)
                .unwrap_err()
                .to_string()
                .contains("got -1")
        );
        assert!(args.bool("peek").is_err());
        assert_eq!(args.str("to").unwrap(), None);
    }

    #[test]
    fn numbers_may_be_quoted_but_not_fractional_or_huge() {
        for (v, ok) in [
            (json!("7"), true),
            (json!(7.0), true),
            (json!(7.5), false),
            (json!(1e30), false),
            (json!(u64::MAX), false),
        ] {
            let map = obj(json!({ "limit": v }));
            let args = Args::new("t", Some(&map), &["limit"]).unwrap();
            assert_eq!(args.int("limit", 1, 100).is_ok(), ok, "{v}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let map = obj(json!({"recipient": "x"}));
        let err = Args::new("phone_send", Some(&map), &["to"]).err().unwrap();
        assert!(err.to_string().contains("unknown key 'recipient'"));
    }
}
