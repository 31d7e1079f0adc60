//! The JSON-RPC envelope check in front of rmcp: a POST body that is not one
//! JSON-RPC message gets the JSON-RPC error and HTTP status the spec names.

use axum::{
    Json,
    body::{Body, to_bytes},
    extract::Request,
    http::{Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::json;

/// Rejects POST bodies that are not one JSON-RPC message with the JSON-RPC
/// error and HTTP status the spec names (rmcp answers these with a bare 415).
pub(super) async fn check_jsonrpc(max_body: usize, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !is_json {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            jsonrpc_error(
                -32600,
                "Invalid Request: Content-Type must be application/json",
            ),
        )
            .into_response();
    }
    // Declared too large: refused before anything is read. Said as a
    // JSON-RPC error, as when the body grows past the limit (tower-http's
    // 413 was a bare line of text).
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            jsonrpc_error(
                -32600,
                &format!(
                    "Invalid Request: the request is larger than {max_body} bytes (the server's PHONE_MAX_BODY_BYTES); send a shorter message"
                ),
            ),
        )
            .into_response()
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_body as u64) {
        return too_large();
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, max_body).await else {
        return too_large();
    };
    let mut parts = parts;
    let message = match validate_message(&bytes) {
        Err(problem) => return (StatusCode::BAD_REQUEST, problem).into_response(),
        Ok(message) => message,
    };
    if let Kind::Handshake = message.kind {
        parts.extensions.insert(Handshake);
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    // A tool call whose params rmcp could not read as one: rmcp answers as
    // if the method did not exist (-32601 "tools/call"), or cannot decode it
    // (415). After rmcp, so that its own checks (Host, Origin, Accept, the
    // protocol version) answer first.
    if let Some(answer) = message.bad_params {
        return bad_params_answer(response, answer).await;
    }
    // The Content-Type was right, so a 415 from rmcp means it could not
    // decode the message: that is the client's malformed request (400).
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        let detail = to_bytes(response.into_body(), 4096)
            .await
            .unwrap_or_default();
        let detail = String::from_utf8_lossy(&detail);
        return (
            StatusCode::BAD_REQUEST,
            jsonrpc_error(
                -32600,
                &format!("Invalid Request: {}", truncate(detail.trim(), 200)),
            ),
        )
            .into_response();
    }
    response
}

/// rmcp's `response` to a tool call with malformed params, or `answer`
/// (-32602, saying what is wrong) where rmcp did not understand the call.
async fn bad_params_answer(response: Response, answer: Json<serde_json::Value>) -> Response {
    match response.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => answer.into_response(),
        StatusCode::OK => {
            let (parts, body) = response.into_parts();
            // rmcp's answer to a call it could not read is a few bytes.
            let Ok(bytes) = to_bytes(body, 64 * 1024).await else {
                return answer.into_response();
            };
            let not_found = serde_json::from_slice::<serde_json::Value>(&bytes)
                .is_ok_and(|v| v["error"]["code"] == -32601);
            if not_found {
                answer.into_response()
            } else {
                Response::from_parts(parts, Body::from(bytes))
            }
        }
        _ => response,
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max_chars).collect::<String>())
    }
}

/// No MCP method name is anywhere near this long; longer ones are refused
/// before they are echoed into errors and logs.
const MAX_METHOD_CHARS: usize = 100;

#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a str>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    result: Option<serde::de::IgnoredAny>,
    error: Option<serde::de::IgnoredAny>,
    /// Echoed by a tool call's -32602 answer ([`is_request_id`]).
    id: Option<serde_json::Value>,
    /// Its kinds only: the content is skipped as it would be anyway.
    params: Option<super::call_shape::Params>,
}

/// The -32700 answer when `bytes` is not JSON at all.
fn parse_error(bytes: &[u8]) -> Option<Json<serde_json::Value>> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .err()
        .map(|e| jsonrpc_error(-32700, &format!("Parse error: {e}")))
}

/// Marks a request whose JSON-RPC method is a handshake, for the check of
/// its bearer token at the door (`bearer`), which needs not parse the body
/// again.
#[derive(Debug, Clone, Copy)]
pub(super) struct Handshake;

/// A well-formed message, as far as the layers around rmcp care.
struct Message {
    kind: Kind,
    /// A tool call's answer where its params are not a tool call's
    /// (-32602, with its id): given if rmcp does not understand the call.
    bad_params: Option<Json<serde_json::Value>>,
}

/// What kind of call a valid message is, as far as the layers before rmcp
/// care.
enum Kind {
    /// A client connecting or discovering the server (see `bearer`).
    Handshake,
    Other,
}

/// The calls a client makes to connect and see what the server offers.
const HANDSHAKE_METHODS: [&str; 3] = ["initialize", "server/discover", "tools/list"];

fn validate_message(bytes: &[u8]) -> Result<Message, Json<serde_json::Value>> {
    // Skipping over strings does not check their UTF-8; this does.
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(jsonrpc_error(
            -32700,
            &format!("Parse error: invalid UTF-8 ({e})"),
        ));
    }
    if nesting_depth(bytes) > MAX_JSON_DEPTH {
        return Err(jsonrpc_error(
            -32700,
            &format!("Parse error: JSON nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[') => {
            if let Some(parse) = parse_error(bytes) {
                return Err(parse);
            }
            return Err(jsonrpc_error(
                -32600,
                "Invalid Request: JSON-RPC batches are not supported; send one message per request",
            ));
        }
        _ => {
            if let Some(parse) = parse_error(bytes) {
                return Err(parse);
            }
            return Err(jsonrpc_error(
                -32600,
                "Invalid Request: expected a JSON-RPC object",
            ));
        }
    }
    // Skipping over strings does not check their escapes either: half of a
    // surrogate pair (`"\ud83d"`, an emoji a client cut in two) passed, and
    // rmcp refused the body with a -32600 about a "hex escape". Only a body
    // with a surrogate's escape (clients that escape all non-ASCII send
    // emoji so) is parsed in full.
    if has_surrogate_escape(bytes) {
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(bytes) {
            return Err(jsonrpc_error(
                -32700,
                &format!(
                    "Parse error: {e} (a string holds half of a UTF-16 surrogate pair, as when an emoji is cut in two; send whole characters)"
                ),
            ));
        }
    }
    // One parse on the happy path; only a refused body is parsed again, to
    // tell malformed JSON (-32700) from a malformed message (-32600).
    let envelope: Envelope<'_> =
        serde_json::from_slice(bytes).map_err(|e| match parse_error(bytes) {
            Some(parse) => parse,
            None => jsonrpc_error(-32600, &format!("Invalid Request: {e}")),
        })?;
    if envelope.jsonrpc != Some("2.0") {
        return Err(jsonrpc_error(
            -32600,
            "Invalid Request: \"jsonrpc\" must be \"2.0\"",
        ));
    }
    if envelope
        .method
        .as_deref()
        .is_some_and(|m| m.trim().is_empty())
    {
        return Err(jsonrpc_error(
            -32600,
            "Invalid Request: \"method\" must not be empty",
        ));
    }
    if envelope
        .method
        .as_deref()
        .is_some_and(|m| m.chars().count() > MAX_METHOD_CHARS)
    {
        return Err(jsonrpc_error(
            -32600,
            &format!("Invalid Request: \"method\" is longer than {MAX_METHOD_CHARS} characters"),
        ));
    }
    if envelope.method.is_none() && envelope.result.is_none() && envelope.error.is_none() {
        return Err(jsonrpc_error(
            -32600,
            "Invalid Request: a request needs a \"method\"",
        ));
    }
    // Only a request (a notification gets no answer) whose id rmcp would
    // take: a string, or a whole number (echoed as it came).
    let bad_params = match (&envelope.method, envelope.id) {
        (Some(method), Some(id)) if method == "tools/call" && is_request_id(&id) => {
            super::call_shape::Params::tool_call_problem(envelope.params).map(|problem| {
                Json(json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {"code": -32602, "message": problem},
                }))
            })
        }
        _ => None,
    };
    let kind = match envelope.method.as_deref() {
        Some(m) if HANDSHAKE_METHODS.contains(&m) => Kind::Handshake,
        _ => Kind::Other,
    };
    Ok(Message { kind, bad_params })
}

/// Whether `bytes` may hold a `\uD800`–`\uDFFF` escape (or text that
/// looks like one after an escaped backslash: a harmless extra parse).
fn has_surrogate_escape(bytes: &[u8]) -> bool {
    bytes
        .windows(3)
        .any(|w| w[0] == b'\\' && w[1] == b'u' && matches!(w[2], b'd' | b'D'))
}

/// No tool argument needs more; deeper input only costs stack and time.
const MAX_JSON_DEPTH: usize = 64;

/// The deepest nesting of arrays and objects in valid JSON, ignoring strings.
fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// An id rmcp takes, and short enough to echo: a string of at most 200
/// characters, or a whole number.
fn is_request_id(id: &serde_json::Value) -> bool {
    match id {
        serde_json::Value::String(s) => s.chars().count() <= 200,
        serde_json::Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

pub(super) fn jsonrpc_error(code: i32, message: &str) -> Json<serde_json::Value> {
    Json(json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}}))
}

#[cfg(test)]
mod tests {
    use super::nesting_depth;

    #[test]
    fn depth_ignores_brackets_in_strings() {
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":"[[[{{{\"]]]"}]}"#), 3);
        assert_eq!(nesting_depth(b"1"), 0);
    }
}
