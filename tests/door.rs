//! A bad bearer token is refused at the door: the calls a client makes to
//! connect (`initialize`, `server/discover`, `tools/list`) get HTTP 401
//! with `WWW-Authenticate: Bearer …` when their Authorization header holds
//! a token no agent holds, so clients such as `claude mcp list` report the
//! failure instead of "connected". Requests without the header work as
//! before; tool calls are not looked at here (they verify the token in
//! their own statement).

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const NOBODYS: &str = "phn_0000000000000000000000000000000000000000000";

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "door-test", "version": "0"}}})
}

fn discover() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "door-test", "version": "0"}}}})
}

fn tools_list() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
}

async fn post(app: &TestApp, body: &Value, authorization: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if body["method"] == "server/discover" {
        request = request
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "server/discover");
    } else {
        request = request.header("mcp-protocol-version", "2025-11-25");
    }
    if let Some(a) = authorization {
        request = request.header("authorization", a);
    }
    request
        .send()
        .await
        .expect("the request reaches the server")
}

async fn assert_refused(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{what}");
    let challenge = response
        .headers()
        .get("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"))
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        challenge.starts_with("Bearer ") && challenge.contains("error=\"invalid_token\""),
        "{what}: {challenge}"
    );
    let body: Value = response.json().await.expect("a JSON-RPC error body");
    assert!(body["error"]["message"].is_string(), "{what}: {body}");
}

#[tokio::test]
async fn a_token_nobody_holds_is_refused_at_every_handshake_and_a_good_one_is_not() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "receives", "q").await;
    let bad = format!("Bearer {NOBODYS}");
    let good = format!("Bearer {}", bob.token);

    for body in [initialize(), discover(), tools_list()] {
        let what = body["method"].as_str().unwrap().to_owned();
        assert_refused(post(&app, &body, Some(&bad)).await, &what).await;
        // Malformed: refused too (without a lookup).
        assert_refused(post(&app, &body, Some("Bearer phn_short")).await, &what).await;
        assert_refused(post(&app, &body, Some("Basic Ym9iOnB3")).await, &what).await;
        for fine in [Some(good.as_str()), None, Some("Bearer "), Some("Bearer")] {
            let response = post(&app, &body, fine).await;
            assert_eq!(response.status(), StatusCode::OK, "{what} with {fine:?}");
        }
    }

    // rmcp's client sees the 401 as "authorization required".
    let refused = rmcp::ServiceExt::serve(
        rmcp::model::ClientConfig::default(),
        rmcp::transport::StreamableHttpClientTransport::from_config(
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                app.mcp_url(),
            )
            .auth_header(NOBODYS.to_owned()),
        ),
    )
    .await;
    let err = match refused {
        Ok(_) => panic!("the handshake with a token nobody holds succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("Auth required"), "{err}");
    let _fine = app.client_with(Some(&bob.token)).await;
}

#[tokio::test]
async fn tool_calls_are_not_checked_at_the_door_and_still_fail_in_the_call() {
    let app = spawn_app().await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "phone_inbox", "arguments": {"peek": true}}});
    let response = post(&app, &call, Some(&format!("Bearer {NOBODYS}"))).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("invalid token"),
        "{body}"
    );
    // Registration needs no header and still works with none.
    let register = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "phone_register",
        "arguments": {"name": "carol", "description": "d", "project": "p"}}});
    let response = post(&app, &register, None).await;
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["created"], true,
        "{body}"
    );
}

#[tokio::test]
async fn refusals_at_the_door_count_toward_the_limit_on_failed_authentication() {
    let app = spawn_app_with(&[("PHONE_AUTH_FAILURE_LIMIT", "3")]).await;
    let bad = format!("Bearer {NOBODYS}");
    for _ in 0..3 {
        assert_refused(post(&app, &initialize(), Some(&bad)).await, "initialize").await;
    }
    let blocked = post(&app, &initialize(), Some(&bad)).await;
    assert_eq!(blocked.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = blocked.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many failed authentication attempts"),
        "{body}"
    );
    assert_eq!(
        app.count(
            "SELECT coalesce(max(hits), 0)::bigint FROM rate_limits WHERE bucket LIKE 'auth:addr:%'"
        )
        .await
        .min(4),
        4,
        "each refusal was counted"
    );
}

#[tokio::test]
async fn oauth_discovery_still_finds_nothing() {
    let app = spawn_app().await;
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-authorization-server",
    ] {
        let response = reqwest::get(app.url(path)).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
    }
}
