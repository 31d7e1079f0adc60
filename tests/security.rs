//! Rate limits that hold across replicas, and identity that cannot be borrowed.

mod common;

use common::*;
use serde_json::json;

fn forged(i: usize) -> String {
    format!("phn_{:A>43}", i)
}

#[tokio::test]
async fn failed_authentication_is_limited_per_address_across_replicas() {
    let limits = [("PHONE_AUTH_FAILURE_LIMIT", "4")];
    let one = spawn_app_with(&limits).await;
    let two = spawn_app_on(&one.database_url, &limits).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let alice = register(&c1, "alice", "A", "p").await;

    // Four failures, spread over both replicas, are answered plainly...
    for (i, client) in [&c1, &c2, &c1, &c2].into_iter().enumerate() {
        let err = tool_err(client, "phone_inbox", json!({"token": forged(i)})).await;
        assert!(err.starts_with("invalid token"), "{err}");
    }
    // ...the fifth, on either replica, hits the shared limit.
    let err = tool_err(&c2, "phone_inbox", json!({"token": forged(9)})).await;
    assert!(
        err.starts_with("too many failed authentication attempts from here; retry after"),
        "{err}"
    );
    // That replica now refuses this address without asking the database,
    // even with a valid token, until the window ends.
    let err = tool_err(&c2, "phone_inbox", alice.with(json!({}))).await;
    assert!(
        err.starts_with("too many failed authentication attempts"),
        "{err}"
    );
    let err = tool_err(
        &c1,
        "phone_send",
        json!({"token": forged(10), "to": "alice", "body": "x"}),
    )
    .await;
    assert!(
        err.starts_with("too many failed authentication attempts"),
        "{err}"
    );

    // Searching needs no authentication and is unaffected.
    ok(&c1, "phone_search", json!({})).await;
    let hits: i32 = one
        .db()
        .await
        .query_one(
            "SELECT hits FROM rate_limits WHERE bucket = 'auth:addr:127.0.0.1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(hits >= 5, "{hits}");
    two.stop().await;
    one.stop().await;
}

#[tokio::test]
async fn failures_against_one_name_are_limited_but_its_owner_still_gets_in() {
    // Per-name counting from many addresses cannot be simulated on loopback
    // without trusting X-Forwarded-For, which is what a proxy deployment does.
    let app = spawn_app_with(&[
        ("PHONE_AUTH_FAILURE_LIMIT", "3"),
        ("PHONE_TRUST_FORWARDED_FOR", "true"),
    ])
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let http = reqwest::Client::new();
    let call = |address: String, args: serde_json::Value| {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": "phone_inbox", "arguments": args}});
        http.post(app.mcp_url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("x-forwarded-for", format!("198.51.100.250, {address}"))
            .body(body.to_string())
            .send()
    };
    let mut last = String::new();
    for i in 0..4 {
        let r: serde_json::Value = call(
            format!("192.0.2.{i}"),
            json!({"name": "alice", "token": forged(i)}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        last = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    assert!(
        last.starts_with("too many failed authentication attempts"),
        "{last}"
    );
    // The owner's valid token is never refused because others guessed at its name.
    let r: serde_json::Value = call("192.0.2.77".into(), alice.with(json!({})))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["result"]["isError"], false, "{r}");
    app.stop().await;
}

#[tokio::test]
async fn registrations_are_limited_per_address() {
    let app = spawn_app_with(&[("PHONE_REGISTER_LIMIT", "2")]).await;
    let c = app.client().await;
    let first = register(&c, "one", "d", "p").await;
    register(&c, "two", "d", "p").await;
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "three", "description": "d", "project": "p"}),
    )
    .await;
    assert!(
        err.starts_with("too many registrations from here; retry after"),
        "{err}"
    );
    // Updating an existing entry is not a new registration.
    let updated = ok(
        &c,
        "phone_register",
        json!({"name": "one", "description": "new", "project": "p", "token": first.token}),
    )
    .await;
    assert_eq!(updated["created"], false);
    let count = app.count("SELECT count(*) FROM agents").await;
    assert_eq!(count, 2);
    app.stop().await;
}

#[tokio::test]
async fn no_tool_lets_one_agent_act_as_another() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "for bob only"})),
    )
    .await;
    let id = sent["id"].as_str().unwrap();
    // Alice's token under Bob's name, for every tool that acts as Bob.
    let impostor = json!({"name": "bob", "token": alice.token});
    for (tool, extra) in [
        ("phone_inbox", json!({})),
        ("phone_inbox", json!({"peek": true})),
        ("phone_inbox", json!({"include_read": true})),
        ("phone_send", json!({"reply_to": id, "body": "x"})),
        ("phone_ack", json!({"ids": [id]})),
        ("phone_outbox", json!({})),
        ("phone_thread", json!({"message_id": id})),
        ("phone_rotate_token", json!({})),
        ("phone_unregister", json!({})),
    ] {
        let mut args = impostor.clone();
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let err = tool_err(&c, tool, args).await;
        assert!(
            err.contains("belongs to a different agent"),
            "{tool}: {err}"
        );
    }
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "bob", "description": "mine now", "project": "p", "token": alice.token}),
    )
    .await;
    assert!(err.contains("name already registered"), "{err}");
    // Bob's message is still unread and his entry unchanged.
    let inbox = ok(&c, "phone_inbox", bob.with(json!({}))).await;
    assert_eq!(inbox["messages"][0]["body"], "for bob only");
    let found = ok(&c, "phone_search", json!({"query": "bob"})).await;
    assert_eq!(found["agents"][0]["description"], "B");
    app.stop().await;
}

/// `/health` is public: it says which dependency is down, never the
/// database's own error text (here it would name the database).
#[tokio::test]
async fn health_names_the_dependency_not_its_error_text() {
    let app = spawn_app().await;
    let name = app.database_url.rsplit('/').next().unwrap().to_owned();
    let admin = connect(&admin_url()).await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS false;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}';"
        ))
        .await
        .unwrap();
    let health = reqwest::get(app.url("/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    let body = health.text().await.unwrap();
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["status"], "unavailable", "{body}");
    assert_eq!(json["database"], "unreachable", "{body}");
    // Fixed words only: no field carries an error's text.
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["database", "notifications", "status"], "{body}");
    for secret in [name.as_str(), "postgres", "127.0.0.1", "error"] {
        assert!(!body.contains(secret), "/health told '{secret}': {body}");
    }
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    app.stop().await;
}
