//! No token (issued or presented) and no message body reaches the log, at
//! any level: the real binary at `RUST_LOG=trace`, in both log formats,
//! driven through every tool.

mod common;

use std::time::Duration;

use common::process::Process;
use common::*;
use serde_json::json;

async fn every_tool_at_trace(format: &str) {
    let db = fresh_database().await;
    let server = Process::start(&db, &[("RUST_LOG", "trace"), ("PHONE_LOG_FORMAT", format)]).await;
    let app = TestApp::external(&server.url);
    let c = app.client().await;
    let mut secrets = Vec::new();
    let alice = register(&c, "alice", "sender", "p").await;
    let bob = register(&c, "bob", "recipient", "p").await;
    secrets.extend([alice.token.clone(), bob.token.clone()]);
    let body = "the-secret-body-7f1e: wire the money";
    let reply = "the-secret-reply-93ac";
    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": body, "subject": "s", "idempotency_key": "k1"})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": body, "subject": "s", "idempotency_key": "k1"})),
    )
    .await;
    ok(&c, "phone_search", json!({"query": "recipient"})).await;
    ok(&c, "phone_inbox", bob.with(json!({"peek": true}))).await;
    ok(&c, "phone_inbox", bob.with(json!({"mode": "lease"}))).await;
    let history = ok(&c, "phone_inbox", bob.with(json!({"include_read": true}))).await;
    let id = history["messages"][0]["id"].clone();
    ok(&c, "phone_ack", bob.with(json!({"ids": [id.clone()]}))).await;
    ok(
        &c,
        "phone_send",
        bob.with(json!({"reply_to": sent["id"], "body": reply})),
    )
    .await;
    ok(&c, "phone_inbox", alice.with(json!({"wait_seconds": 1}))).await;
    ok(&c, "phone_outbox", alice.with(json!({}))).await;
    ok(
        &c,
        "phone_thread",
        alice.with(json!({"message_id": sent["id"]})),
    )
    .await;
    // Presented by header too, and wrongly.
    let by_header = app.client_with(Some(&bob.token)).await;
    ok(&by_header, "phone_inbox", json!({})).await;
    let forged = format!("phn_{}", "Q".repeat(43));
    tool_err(&c, "phone_inbox", json!({"token": forged.clone()})).await;
    secrets.push(forged);
    let rotated = ok(&c, "phone_rotate_token", alice.with(json!({}))).await;
    secrets.push(rotated["token"].as_str().unwrap().to_owned());
    let alice_now = Agent {
        name: "alice".into(),
        token: rotated["token"].as_str().unwrap().to_owned(),
    };
    ok(&c, "phone_unregister", alice_now.with(json!({}))).await;
    let log = server.stop();

    assert!(
        log.lines().count() > 50,
        "trace logging produced little: {log}"
    );
    assert!(log.contains("/mcp"), "the log shows the requests");
    assert!(
        log.contains("answer left the server"),
        "the log has this crate's debug lines: {log}"
    );
    for secret in secrets
        .iter()
        .map(String::as_str)
        .chain([body, "the-secret-body-7f1e", reply])
    {
        let hits: Vec<&str> = log.lines().filter(|l| l.contains(secret)).take(3).collect();
        assert!(
            hits.is_empty(),
            "{secret:?} in the {format} log at trace: {hits:#?}"
        );
    }
    // Nor the tokens' digests, as Rust or SQL would print them.
    for token in &secrets {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(token.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!log.contains(&hex), "a token digest in the log");
        assert!(
            !log.contains(&format!("{:?}", digest.as_slice())),
            "a token digest in the log"
        );
    }
}

#[tokio::test]
async fn no_secret_in_the_text_log_at_trace() {
    every_tool_at_trace("text").await;
}

#[tokio::test]
async fn no_secret_in_the_json_log_at_trace() {
    every_tool_at_trace("json").await;
}

/// A local receiver answering every POST with `status` (a `Location` too).
async fn answering(status: u16) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || async move {
        (
            axum::http::StatusCode::from_u16(status).unwrap(),
            [("location", "/elsewhere/secret-in-a-redirect")],
            "no",
        )
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Webhook URLs carry secrets in their paths and queries (Slack-style
/// paths, tokens). Through every way a delivery can fail — no connection,
/// no answer in time, an error status, a refusal, a redirect, a TLS
/// handshake with a plain-http server, a host that does not resolve — no
/// URL reaches the log (at trace) or a delivery's stored error.
#[tokio::test]
async fn webhook_urls_never_reach_the_log_or_the_database() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hang.accept().await {
            held.push(socket);
        }
    });
    let (failing, refusing, redirecting) = (
        answering(503).await,
        answering(404).await,
        answering(302).await,
    );
    let destinations = [
        ("refused", format!("http://{closed}")),
        ("hanging", format!("http://{hang_addr}")),
        ("failing", format!("http://{failing}")),
        ("refusing", format!("http://{refusing}")),
        ("redirecting", format!("http://{redirecting}")),
        ("tls", format!("https://{failing}")),
        ("unresolved", "http://phone-test.invalid".to_owned()),
    ];
    let db = fresh_database().await;
    let server = Process::start(
        &db,
        &[
            ("RUST_LOG", "trace"),
            ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
            ("PHONE_WEBHOOK_TIMEOUT_SECS", "1"),
            ("PHONE_WEBHOOK_FIRST_RETRY_MS", "100"),
            ("PHONE_DNS_TIMEOUT_MS", "300"),
        ],
    )
    .await;
    let app = TestApp::external(&server.url);
    let c = app.client().await;
    let alice = register(&c, "alice", "sender", "p").await;
    for (i, (name, base)) in destinations.iter().enumerate() {
        let agent = register(&c, name, "receiver", "p").await;
        let url = format!("{base}/services/T0SECRETPATH{i}/B0/XyZ?token=SECRETQUERY{i}");
        let set = call(
            &c,
            "phone_settings",
            agent.with(json!({"webhook_url": url})),
        )
        .await;
        if set.is_error == Some(true) {
            // Refused when set (the name does not resolve): said without the URL.
            let said = text(&set);
            assert!(!said.contains("SECRET"), "{said}");
            let pg = connect(&db).await;
            pg.execute(
                "UPDATE agents SET webhook_url = $1, webhook_host = 'phone-test.invalid:80',
                        webhook_secret = 'whsec_AAAA' WHERE name = $2",
                &[&url, name],
            )
            .await
            .unwrap();
        }
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": name, "body": "x"})),
        )
        .await;
    }
    let pg = connect(&db).await;
    wait_until_for(
        &pg,
        "every delivery was tried and its failure recorded",
        &format!(
            "SELECT count(*) = {} FROM webhook_deliveries
             WHERE last_error IS NOT NULL OR last_status IS NOT NULL",
            destinations.len()
        ),
        Duration::from_secs(20),
    )
    .await;
    let errors: Vec<String> = pg
        .query(
            "SELECT coalesce(last_error, '') FROM webhook_deliveries",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let log = server.stop();
    assert!(
        log.contains("webhook delivery did not go through"),
        "the failures are logged: {log}"
    );
    for error in &errors {
        assert!(!error.contains("SECRET"), "a URL in last_error: {error}");
    }
    let hits: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("SECRET"))
        .take(3)
        .collect();
    assert!(hits.is_empty(), "a URL in the log: {hits:#?}");
}
