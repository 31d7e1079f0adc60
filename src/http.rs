//! The HTTP surface: `/mcp` (rmcp's streamable HTTP server, stateless),
//! `/health`, and the layers around them.

use std::time::Duration;

use axum::{
    Json, Router,
    body::{Body, to_bytes},
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use serde_json::json;
use tower_http::{
    limit::RequestBodyLimitLayer, set_header::SetResponseHeaderLayer, timeout::TimeoutLayer,
};

use crate::{
    config::Config,
    domain::Phone,
    mcp::{ClientAddressFrom, PhoneServer},
    store,
};

const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

pub fn router(config: &Config, phone: Phone) -> Router {
    let server = PhoneServer::new(phone.clone(), ClientAddressFrom::from_config(config));
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(config.allowed_hosts.iter().cloned());
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(allowed_origins(config))
        // No browser origin is trusted unless configured: DNS rebinding.
        .enforce_origin_validation()
        .with_max_request_body_bytes(config.max_body_bytes);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        NeverSessionManager::default().into(),
        mcp_config,
    );

    let max_body = config.max_body_bytes;
    crate::metrics::watch(&phone);
    Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn(move |req, next| {
            check_jsonrpc(max_body, req, next)
        }))
        .route("/health", get(health))
        // Claude Code probes OAuth discovery; a plain 404 tells it no auth flow exists.
        .route(
            "/.well-known/{*rest}",
            any(|| async { StatusCode::NOT_FOUND }),
        )
        .with_state(phone)
        .layer(RequestBodyLimitLayer::new(config.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            config.request_timeout,
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        // Outermost: the request's span (joining the caller's W3C trace
        // context), its trace id for the log, and the request metrics.
        .layer(middleware::from_fn(crate::telemetry::trace_request))
}

/// Browser origins accepted on `/mcp`: the server's own (loopback on any
/// port, and each configured public host over HTTPS) plus configured ones.
/// Any other Origin gets 403; requests without an Origin are not affected.
fn allowed_origins(config: &Config) -> Vec<String> {
    let mut origins: Vec<String> = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        .map(String::from)
        .into();
    for host in &config.allowed_hosts {
        if host.contains(':') {
            origins.push(format!("https://{host}"));
        } else {
            origins.push(format!("https://{host}:443"));
        }
    }
    origins.extend(config.allowed_origins.iter().cloned());
    origins
}

/// 200 when Postgres answers within a second, 503 otherwise.
async fn health(State(phone): State<Phone>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(1), store::ping(phone.pool())).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            Json(json!({"status": "ok", "database": "ok"})),
        ),
        outcome => {
            // An exhausted pool is a busy replica, not a database outage:
            // both take the replica out of rotation, but say which it is.
            let (reason, database) = match outcome {
                Ok(Err(store::StoreError::Unavailable(reason))) => (reason, "busy"),
                Ok(Err(e)) => (e.to_string(), "unreachable"),
                Ok(Ok(())) | Err(_) => ("timed out".into(), "unreachable"),
            };
            tracing::warn!(%reason, "health check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": database, "reason": reason})),
            )
        }
    }
}

/// Rejects POST bodies that are not one JSON-RPC message with the JSON-RPC
/// error and HTTP status the spec names (rmcp answers these with a bare 415).
async fn check_jsonrpc(max_body: usize, req: Request, next: Next) -> Response {
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
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, max_body).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                jsonrpc_error(
                    -32600,
                    &format!("Invalid Request: body is larger than {max_body} bytes"),
                ),
            )
                .into_response();
        }
    };
    if let Err(problem) = validate_message(&bytes) {
        return (StatusCode::BAD_REQUEST, problem).into_response();
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
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
}

/// The -32700 answer when `bytes` is not JSON at all.
fn parse_error(bytes: &[u8]) -> Option<Json<serde_json::Value>> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .err()
        .map(|e| jsonrpc_error(-32700, &format!("Parse error: {e}")))
}

fn validate_message(bytes: &[u8]) -> Result<(), Json<serde_json::Value>> {
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
    Ok(())
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

fn jsonrpc_error(code: i32, message: &str) -> Json<serde_json::Value> {
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
