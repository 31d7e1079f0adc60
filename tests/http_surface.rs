//! The HTTP edge: raw requests that no well-behaved client sends, and the
//! endpoints around `/mcp`.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const ACCEPT: &str = "application/json, text/event-stream";

async fn post_raw(
    app: &TestApp,
    body: impl Into<reqwest::Body>,
    content_type: &str,
) -> reqwest::Response {
    reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", content_type)
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
        .send()
        .await
        .expect("request reaches the server")
}

fn tools_call(name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}})
}

async fn expect_jsonrpc_error(response: reqwest::Response, status: u16, code: i64) {
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().await.expect("a JSON-RPC error body");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

#[tokio::test]
async fn malformed_requests_get_clear_errors_never_a_500() {
    let app = spawn_app().await;

    expect_jsonrpc_error(
        post_raw(&app, "{\"jsonrpc\": \"2.0\", ", "application/json").await,
        400,
        -32700,
    )
    .await;
    expect_jsonrpc_error(
        post_raw(&app, vec![0xff, 0xfe, b'{', b'}'], "application/json").await,
        400,
        -32700,
    )
    .await;

    let wrong_type = post_raw(
        &app,
        tools_call("phone_search", json!({})).to_string(),
        "text/plain",
    )
    .await;
    assert_eq!(wrong_type.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let nested = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    expect_jsonrpc_error(
        post_raw(&app, nested, "application/json").await,
        400,
        -32700,
    )
    .await;
    let nested_args = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"phone_search\",\"arguments\":{{\"query\":{}1{}}}}}}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    expect_jsonrpc_error(
        post_raw(&app, nested_args, "application/json").await,
        400,
        -32700,
    )
    .await;

    let huge = "x".repeat(300 * 1024);
    let too_big = post_raw(
        &app,
        tools_call("phone_search", json!({"query": huge})).to_string(),
        "application/json",
    )
    .await;
    // A JSON-RPC error that names the limit (it was tower-http's bare line).
    expect_jsonrpc_error(too_big, 413, -32600).await;

    expect_jsonrpc_error(
        post_raw(
            &app,
            json!({"hello": "world"}).to_string(),
            "application/json",
        )
        .await,
        400,
        -32600,
    )
    .await;
    expect_jsonrpc_error(post_raw(&app, "42", "application/json").await, 400, -32600).await;
    let empty_method = json!({"jsonrpc": "2.0", "id": 1, "method": ""});
    expect_jsonrpc_error(
        post_raw(&app, empty_method.to_string(), "application/json").await,
        400,
        -32600,
    )
    .await;
    let numeric_method = json!({"jsonrpc": "2.0", "id": 1, "method": 5});
    expect_jsonrpc_error(
        post_raw(&app, numeric_method.to_string(), "application/json").await,
        400,
        -32600,
    )
    .await;

    // Batches left MCP in 2025-06-18.
    let batch = json!([
        tools_call("phone_search", json!({})),
        tools_call("phone_search", json!({}))
    ]);
    expect_jsonrpc_error(
        post_raw(&app, batch.to_string(), "application/json").await,
        400,
        -32600,
    )
    .await;

    let unknown_method = post_raw(
        &app,
        json!({"jsonrpc": "2.0", "id": 3, "method": "phone/teleport", "params": {}}).to_string(),
        "application/json",
    )
    .await;
    let status = unknown_method.status();
    let text = unknown_method.text().await.unwrap();
    assert!(status.as_u16() < 500, "{status}");
    assert!(text.contains("-32601"), "method not found: {text}");

    // A tools/call whose params are not a tool call's: rmcp answered
    // -32601 "tools/call", as if the method did not exist (or 400 -32600
    // for params that are not an object). It is the params (-32602), said
    // plainly, with the request's id.
    for (params, says) in [
        (json!(null), "tools/call needs params"),
        (json!([1, 2]), "params must be an object; got a list"),
        (json!({"arguments": {}}), "needs params.name"),
        (json!({"name": 7}), "params.name must be a string"),
        (
            json!({"name": "phone_search", "arguments": ["q"]}),
            "params.arguments must be an object",
        ),
    ] {
        let mut request = json!({"jsonrpc": "2.0", "id": "call-9", "method": "tools/call"});
        if !params.is_null() {
            request["params"] = params.clone();
        }
        let response = post_raw(&app, request.to_string(), "application/json").await;
        assert_eq!(response.status().as_u16(), 200, "{params}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["id"], "call-9", "{body}");
        assert_eq!(body["error"]["code"], -32602, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{params}: {message}");
    }
    // The same as a notification (no id) gets no answer, as rmcp gives
    // none; from a foreign host it meets rmcp's DNS-rebinding check first.
    let notification = post_raw(
        &app,
        json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": 7}}).to_string(),
        "application/json",
    )
    .await;
    assert_eq!(notification.status().as_u16(), 202);
    assert_eq!(notification.text().await.unwrap(), "");
    let foreign = reqwest::Client::new()
        .post(app.mcp_url())
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2025-11-25")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": []}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status().as_u16(), 403);

    // The server still serves normal requests afterwards.
    let c = app.client().await;
    ok(&c, "phone_search", json!({})).await;
    app.stop().await;
}

#[tokio::test]
async fn endpoints_around_mcp() {
    let app = spawn_app().await;
    let http = reqwest::Client::new();

    // The first look opens the pool's first connection, within the check's
    // one second: on a loaded machine it may take longer, and the check
    // says 503 until it does.
    let mut health = http.get(app.url("/health")).send().await.unwrap();
    for _ in 0..20 {
        if health.status() == StatusCode::OK {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        health = http.get(app.url("/health")).send().await.unwrap();
    }
    assert_eq!(health.status(), StatusCode::OK);
    let body: Value = health.json().await.unwrap();
    assert_eq!(body["status"], "ok");
    // Liveness: the process serves, whatever the database does.
    let live = http.get(app.url("/health/live")).send().await.unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    assert_eq!(live.json::<Value>().await.unwrap()["status"], "ok");

    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let r = http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
    }

    // Stateless: no standalone SSE stream, no session to delete.
    let get = http
        .get(app.mcp_url())
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let delete = http.delete(app.mcp_url()).send().await.unwrap();
    assert_eq!(delete.status(), StatusCode::METHOD_NOT_ALLOWED);

    // No session id is ever issued.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let r = post_raw(&app, init.to_string(), "application/json").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("mcp-session-id").is_none());
    assert_eq!(
        r.headers().get("x-content-type-options").unwrap(),
        "nosniff"
    );
    let body: Value = r.json().await.unwrap();
    let instructions = body["result"]["instructions"].as_str().unwrap();
    assert!(instructions.contains("phone_register") && instructions.contains("reply_to"));
    app.stop().await;
}

#[tokio::test]
async fn dns_rebinding_is_refused() {
    let app = spawn_app().await;
    let http = reqwest::Client::new();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let send = |host: Option<&str>, origin: Option<&str>| {
        let mut req = http
            .post(app.mcp_url())
            .header("content-type", "application/json")
            .header("accept", ACCEPT)
            .body(list.clone());
        if let Some(h) = host {
            req = req.header("host", h);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    assert_eq!(
        send(Some("evil.example"), None).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send(None, Some("https://evil.example"))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send(None, Some("http://localhost.evil.example"))
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    // The server's own (loopback) origin is not a rebinding attack.
    let own = format!("http://{}", app.addr);
    assert_eq!(
        send(None, Some(&own)).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(send(None, None).await.unwrap().status(), StatusCode::OK);
    app.stop().await;

    // A configured public host and origin are accepted.
    let app = spawn_app_with(&[
        ("PHONE_ALLOWED_HOSTS", "phone.example.com"),
        ("PHONE_ALLOWED_ORIGINS", "https://console.example.com"),
    ])
    .await;
    let r = http
        .post(app.mcp_url())
        .header("host", "phone.example.com")
        .header("origin", "https://console.example.com")
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .body(list.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn the_tool_surface_is_small_complete_and_annotated() {
    let app = spawn_app().await;
    let c = app.client().await;
    let tools = c.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "phone_register",
            "phone_search",
            "phone_send",
            "phone_inbox",
            "phone_ack",
            "phone_outbox",
            "phone_thread",
            "phone_settings",
            "phone_rotate_token",
            "phone_unregister",
        ]
    );
    let mut model_reads = 0;
    for tool in &tools {
        assert!(
            tool.output_schema.is_some(),
            "{} has an outputSchema",
            tool.name
        );
        let a = tool.annotations.as_ref().expect("annotations");
        assert!(a.read_only_hint.is_some() && a.destructive_hint.is_some());
        assert!(a.idempotent_hint.is_some() && a.open_world_hint.is_some());
        model_reads += tool.name.len()
            + tool.description.as_deref().unwrap_or("").len()
            + serde_json::to_string(&*tool.input_schema).unwrap().len();
    }
    println!("tool surface a model reads: {model_reads} bytes");
    assert!(model_reads < 5 * 1024, "{model_reads} bytes");
    let hints = |name: &str| {
        let a = tools
            .iter()
            .find(|t| t.name == name)
            .unwrap()
            .annotations
            .clone()
            .unwrap();
        (a.read_only_hint.unwrap(), a.destructive_hint.unwrap())
    };
    assert_eq!(hints("phone_search"), (true, false));
    assert_eq!(hints("phone_outbox"), (true, false));
    assert_eq!(
        hints("phone_inbox"),
        (false, false),
        "a poll marks messages read"
    );
    assert_eq!(hints("phone_unregister"), (false, true));
    app.stop().await;
}

#[tokio::test]
async fn text_renderings_are_compact_not_a_second_copy_of_the_json() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "Writes reports", "research").await;
    let b = register(&c, "bob", "Reads reports", "research").await;
    for i in 0..3 {
        ok(&c, "phone_send", a.with(json!({"to": "bob", "subject": format!("report {i}"), "body": "The quarterly numbers are in; see the summary below.\nRevenue up 4%."}))).await;
    }
    let result = call(&c, "phone_inbox", b.with(json!({}))).await;
    let text_len = text(&result).len();
    let json_len = serde_json::to_string(result.structured_content.as_ref().unwrap())
        .unwrap()
        .len();
    println!("inbox of 3 messages: text {text_len} bytes, structuredContent {json_len} bytes");
    // The text carries fences the JSON does not need, but not the JSON's keys.
    assert!(
        text_len < 2 * json_len,
        "text {text_len} vs json {json_len}"
    );
    assert!(
        !text(&result).contains("\"from_project\"") && !text(&result).contains("\"body\""),
        "{}",
        text(&result)
    );
    let rendered = text(&result);
    for needle in [
        "from alice (project \"research\")",
        "Subject: report 0",
        "msg_",
        "Revenue up 4%.",
    ] {
        assert!(rendered.contains(needle), "{needle} in {rendered}");
    }
    app.stop().await;
}

#[tokio::test]
async fn unsupported_protocol_versions_get_the_specified_errors() {
    let app = spawn_app().await;
    let http = reqwest::Client::new();
    // A request whose MCP-Protocol-Version header names no supported version: 400.
    let r = http
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "1999-01-01")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // initialize with an unknown version: the server answers with one it supports.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "old", "version": "0"}}});
    let r = http
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    let version = body["result"]["protocolVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        ["2025-03-26", "2025-06-18", "2025-11-25"].contains(&version.as_str()),
        "{version}"
    );
    app.stop().await;
}

/// Output schemas use no JSON Schema `type` arrays (`["string","null"]`),
/// which the Inspector's --strict mode flags and some clients refuse.
#[tokio::test]
async fn output_schemas_carry_no_type_arrays() {
    fn type_arrays(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if map.get("type").is_some_and(Value::is_array) {
                    found.push(path.to_owned());
                }
                for (k, child) in map {
                    type_arrays(child, &format!("{path}.{k}"), found);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    type_arrays(child, &format!("{path}[{i}]"), found);
                }
            }
            _ => {}
        }
    }
    let app = spawn_app().await;
    let c = app.client().await;
    let mut found = Vec::new();
    for tool in c.list_all_tools().await.unwrap() {
        let output = Value::Object((*tool.output_schema.clone().unwrap()).clone());
        type_arrays(&output, &format!("{}.outputSchema", tool.name), &mut found);
        let input = Value::Object((*tool.input_schema).clone());
        type_arrays(&input, &format!("{}.inputSchema", tool.name), &mut found);
    }
    assert!(found.is_empty(), "type arrays at {found:?}");
}

/// JSON as Python's `json.dumps(value, separators=(",", ":"))` writes it
/// (the official Python client's view; non-ASCII escaped as `\uXXXX`).
fn python_compact(value: &Value) -> usize {
    serde_json::to_string(value)
        .unwrap()
        .chars()
        .map(|c| match c.len_utf16() {
            _ if c.is_ascii() => 1,
            n => 6 * n,
        })
        .sum()
}

/// The surface budget (issue 28), measured from outside as the official
/// Python client sees it: the tools' names, descriptions and input schemas
/// as compact JSON at most 5,000 bytes, at most 10 tools; an inbox of 20
/// short messages (54-byte bodies) at most 8,000 bytes of text plus
/// `structuredContent`, its fence still a fresh mark found in no body.
#[tokio::test]
async fn the_surface_stays_within_its_budget() {
    let app = spawn_app().await;
    let c = app.client().await;
    let tools = c.list_all_tools().await.unwrap();
    assert!(tools.len() <= 10, "{} tools", tools.len());
    let listed: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"name": t.name, "description": t.description, "inputSchema": *t.input_schema})
        })
        .collect();
    let surface = python_compact(&Value::Array(listed));
    println!("tool surface (names, descriptions, input schemas): {surface} bytes");
    assert!(surface <= 5_000, "tool surface {surface} bytes");

    let coder = register(&c, "coder", "Writes code", "hassing").await;
    let email = register(&c, "email", "Reads mail", "hassing").await;
    for i in 0..20 {
        let body = format!("Please fetch the latest invoice mail, number {i:03}, now.");
        assert_eq!(body.len(), 54);
        ok(
            &c,
            "phone_send",
            coder.with(json!({"to": "email", "body": body})),
        )
        .await;
    }
    let inbox = call(&c, "phone_inbox", email.with(json!({"limit": 20}))).await;
    let structured = inbox.structured_content.clone().unwrap();
    assert_eq!(structured["messages"].as_array().unwrap().len(), 20);
    let rendered = text(&inbox);
    let bytes = rendered.len() + python_compact(&structured);
    println!(
        "inbox of 20: text {} + structuredContent {} = {bytes} bytes",
        rendered.len(),
        python_compact(&structured)
    );
    assert!(bytes <= 8_000, "inbox of 20: {bytes} bytes");
    // The fence: announced once, a mark no body holds, around every body.
    let mark = rendered
        .split("mark ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .expect("the answer announces its fence mark")
        .to_owned();
    assert!(mark.len() >= 8, "{mark}");
    assert_eq!(
        rendered.matches(&format!("fence=\"{mark}\"")).count(),
        40,
        "{rendered}"
    );
    app.stop().await;
}

/// Two Authorization headers in one request: the tool call went out as
/// the first one's agent, silently. Which agent is meant is the caller's to
/// say: refused, whichever of them is right.
#[tokio::test]
async fn two_authorization_headers_are_refused() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let body = tools_call("phone_send", json!({"to": "bob", "body": "who am I?"}));
    let response = reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2025-11-25")
        .header("authorization", format!("Bearer {}", alice.token))
        .header("authorization", format!("Bearer {}", bob.token))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("more than once")),
        "{answer}"
    );
    assert_eq!(app.count("SELECT count(*) FROM messages").await, 0);
    app.stop().await;
}

/// Half of a surrogate pair in a string (an emoji a client cut in two) is
/// a parse error that says so: it passed the envelope check, and rmcp's
/// refusal was a -32600 about a "hex escape". A whole pair is a character
/// like any other.
#[tokio::test]
async fn half_an_emoji_is_a_parse_error_that_says_so() {
    let app = spawn_app().await;
    for half in [r"\ud83d", r"\uDE00", r"\ud83d\u0041"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"phone_search","arguments":{{"query":"cut {half}"}}}}}}"#
        );
        let response = post_raw(&app, body, "application/json").await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{half}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["error"]["code"], -32700, "{half}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("surrogate"), "{half}: {message}");
    }
    let whole = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"phone_search","arguments":{"query":"\ud83d\ude00 x"}}}"#;
    let response = post_raw(&app, whole, "application/json").await;
    assert_eq!(response.status(), StatusCode::OK);
    app.stop().await;
}
