//! The shape of a `tools/call` request's `params`, read in the envelope
//! check's one parse of the body. rmcp answers a `tools/call` whose params
//! it cannot read as a call's (none, a name that is not a string,
//! arguments that are not an object) with -32601 "tools/call", as if the
//! method did not exist, and one whose params are not an object with 415
//! (our 400 -32600); the caller's mistake is its params (-32602), and the
//! answer says which.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A JSON value's kind; its content is skipped, never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    fn named(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "a list",
            Kind::Object => "an object",
        }
    }
}

impl<'de> de::Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_none<E>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Kind, E> {
        Ok(Kind::Bool)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Kind, E> {
        Ok(Kind::Number)
    }
    fn visit_str<E>(self, _: &str) -> Result<Kind, E> {
        Ok(Kind::String)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Kind::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Kind::Object)
    }
}

/// `params` as far as a `tools/call` needs it: its kind, and the kinds of
/// its `name` and `arguments` when it is an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Params {
    kind: Kind,
    name: Option<Kind>,
    arguments: Option<Kind>,
}

impl Params {
    /// Why these cannot be a `tools/call`'s params, if they cannot.
    pub(super) fn tool_call_problem(params: Option<Self>) -> Option<String> {
        let Some(params) = params else {
            return Some(
                "Invalid params: tools/call needs params {\"name\": the tool's name, \
                 \"arguments\": an object}"
                    .into(),
            );
        };
        if params.kind != Kind::Object {
            return Some(format!(
                "Invalid params: tools/call's params must be an object; got {}",
                params.kind.named()
            ));
        }
        match params.name {
            Some(Kind::String) => {}
            None => {
                return Some(
                    "Invalid params: tools/call needs params.name, the tool's name".into(),
                );
            }
            Some(other) => {
                return Some(format!(
                    "Invalid params: params.name must be a string, the tool's name; got {}",
                    other.named()
                ));
            }
        }
        match params.arguments {
            None | Some(Kind::Object | Kind::Null) => None,
            Some(other) => Some(format!(
                "Invalid params: params.arguments must be an object of the tool's arguments; got {}",
                other.named()
            )),
        }
    }
}

impl<'de> de::Deserialize<'de> for Params {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ParamsVisitor)
    }
}

struct ParamsVisitor;

/// The keys of `params` that matter here.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Name,
    Arguments,
    #[serde(other)]
    Other,
}

impl<'de> Visitor<'de> for ParamsVisitor {
    type Value = Params;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Params, A::Error> {
        let mut params = Params {
            kind: Kind::Object,
            name: None,
            arguments: None,
        };
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Name => params.name = Some(map.next_value()?),
                Key::Arguments => params.arguments = Some(map.next_value()?),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(params)
    }
    // Anything else: its kind (the content skipped).
    fn visit_unit<E>(self) -> Result<Params, E> {
        Ok(other(Kind::Null))
    }
    fn visit_none<E>(self) -> Result<Params, E> {
        Ok(other(Kind::Null))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Params, E> {
        Ok(other(Kind::Bool))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Params, E> {
        Ok(other(Kind::Number))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Params, E> {
        Ok(other(Kind::Number))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Params, E> {
        Ok(other(Kind::Number))
    }
    fn visit_str<E>(self, _: &str) -> Result<Params, E> {
        Ok(other(Kind::String))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Params, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(other(Kind::Array))
    }
}

fn other(kind: Kind) -> Params {
    Params {
        kind,
        name: None,
        arguments: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(params: &str) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Envelope {
            params: Option<Params>,
        }
        let envelope: Envelope =
            serde_json::from_str(&format!("{{\"params\": {params}}}")).unwrap();
        Params::tool_call_problem(envelope.params)
    }

    #[test]
    fn a_tool_call_s_params_are_an_object_with_a_name_and_arguments() {
        assert_eq!(
            problem(r#"{"name": "phone_send", "arguments": {"a": [1, {"b": 2}]}}"#),
            None
        );
        assert_eq!(problem(r#"{"name": "phone_search"}"#), None);
        assert_eq!(
            problem(r#"{"name": "x", "arguments": null, "_meta": {"k": 1}}"#),
            None
        );
        for (params, says) in [
            ("null", "needs params"),
            ("[1, 2]", "must be an object; got a list"),
            ("\"phone_send\"", "must be an object; got a string"),
            ("{}", "needs params.name"),
            (
                r#"{"name": 7}"#,
                "params.name must be a string, the tool's name; got a number",
            ),
            (
                r#"{"name": "x", "arguments": [1]}"#,
                "params.arguments must be an object",
            ),
            (r#"{"name": "x", "arguments": "a=1"}"#, "got a string"),
        ] {
            let said = problem(params).unwrap_or_default();
            assert!(said.contains(says), "{params}: {said}");
        }
        assert!(
            Params::tool_call_problem(None)
                .unwrap()
                .contains("needs params")
        );
    }
}
