//! Callers that vanish: a poll whose caller left must not consume its mail,
//! a call whose caller left before its statement began does nothing, and a
//! long poll never outlives its request.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const ACCEPT: &str = "application/json, text/event-stream";

/// One tools/call over plain HTTP that gives up after `timeout`, as a
/// client that goes away does: `None` when it gave up.
async fn call_giving_up(
    app: &TestApp,
    tool: &str,
    args: Value,
    timeout: Duration,
) -> Option<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": tool, "arguments": args}});
    let response = reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", ACCEPT)
        .header("mcp-protocol-version", "2025-11-25")
        .timeout(timeout)
        .json(&body)
        .send()
        .await;
    match response {
        Ok(r) => Some(r.json().await.expect("a JSON body")),
        Err(e) if e.is_timeout() => None,
        Err(e) => panic!("request failed: {e}"),
    }
}

async fn send_five(c: &Client, from: &Agent, to: &str) {
    for i in 0..5 {
        ok(
            c,
            "phone_send",
            from.with(json!({"to": to, "body": format!("m{i}")})),
        )
        .await;
    }
}

/// The reproduction from the issue: the messages table is locked elsewhere
/// while an agent with 5 unread messages polls; the client gives up after
/// a second; when the lock goes, the poll's statement commits. Its messages
/// must come back unread, not be lost to a caller that is gone.
#[tokio::test]
async fn a_poll_whose_caller_left_leaves_its_mail_unread() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    send_five(&c, &alice, "bob").await;

    let lock = app.db().await;
    lock.batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let answer = call_giving_up(
        &app,
        "phone_inbox",
        bob.with(json!({"limit": 10})),
        Duration::from_secs(1),
    )
    .await;
    assert!(
        answer.is_none(),
        "the poll should still wait for the lock: {answer:?}"
    );
    lock.batch_execute("COMMIT").await.unwrap();

    // The poll's statement ran after the caller left; what it took is
    // unread again (and its delivery not counted).
    let db = app.db().await;
    wait_until_settled(
        &db,
        "the abandoned poll's messages are unread again",
        "SELECT count(*) = 5 FROM messages WHERE read_at IS NULL AND delivery_count = 0",
    )
    .await;
    let got = ok(&c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
    assert_eq!(got["messages"].as_array().unwrap().len(), 5, "{got}");
    app.stop().await;
}

/// The same in lease mode: the lease a vanished caller never heard of is
/// released, so another worker gets the messages at once.
#[tokio::test]
async fn a_lease_whose_caller_left_is_released() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    send_five(&c, &alice, "bob").await;

    let lock = app.db().await;
    lock.batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let answer = call_giving_up(
        &app,
        "phone_inbox",
        bob.with(json!({"limit": 10, "mode": "lease", "lease_seconds": 600})),
        Duration::from_secs(1),
    )
    .await;
    assert!(answer.is_none(), "{answer:?}");
    lock.batch_execute("COMMIT").await.unwrap();
    wait_until_settled(
        &app.db().await,
        "the abandoned lease is released",
        "SELECT count(*) = 5 FROM messages WHERE leased_until IS NULL AND delivery_count = 0",
    )
    .await;
    let got = ok(&c, "phone_inbox", bob.with(json!({"mode": "lease"}))).await;
    assert_eq!(got["messages"].as_array().unwrap().len(), 5, "{got}");
    app.stop().await;
}

/// A send queued behind a batch stuck on a row lock, whose caller gives up
/// before any statement takes it: it is never stored.
#[tokio::test]
async fn a_send_whose_caller_left_before_its_statement_is_not_stored() {
    // One connection for batches when stuck (half the pool): the queued
    // send cannot start a batch of its own.
    let app = spawn_app_on(
        &fresh_database().await,
        &[("PHONE_POOL_SIZE", "2"), ("PHONE_POOL_TIMEOUT_MS", "5000")],
    )
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    register(&c, "carol", "C", "p").await;
    let (lock, stuck) = send_held_by_a_row_lock(
        &app,
        &alice,
        alice.with(json!({"to": "carol", "body": "stuck"})),
    )
    .await;
    let answer = call_giving_up(
        &app,
        "phone_send",
        bob.with(json!({"to": "carol", "body": "from a caller who left"})),
        Duration::from_millis(600),
    )
    .await;
    assert!(
        answer.is_none(),
        "the send should have been queued: {answer:?}"
    );
    lock.batch_execute("COMMIT").await.unwrap();
    stuck.await.unwrap();
    // A later send from bob goes through, so any batch that could have
    // carried the abandoned one has run.
    ok(
        &c,
        "phone_send",
        bob.with(json!({"to": "carol", "body": "later"})),
    )
    .await;
    let stored = app
        .count("SELECT count(*) FROM messages WHERE body = 'from a caller who left'")
        .await;
    assert_eq!(
        stored, 0,
        "a send whose caller left before its statement was stored"
    );
    app.stop().await;
}

/// The wait of a long poll counts from the request's arrival: a poll held
/// up before it began to wait still answers before the request times out.
#[tokio::test]
async fn a_long_poll_ends_before_its_request_does() {
    // 8 s per request; waits up to 5 s (2 s are kept for the last look).
    let app = spawn_app_on(
        &fresh_database().await,
        &[
            ("PHONE_REQUEST_TIMEOUT_MS", "8000"),
            ("PHONE_MAX_WAIT_SECS", "5"),
        ],
    )
    .await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let lock = app.db().await;
    lock.batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let polling = {
        let app_url = app.mcp_url();
        let args = bob.with(json!({"wait_seconds": 5}));
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "phone_inbox", "arguments": args}});
            let response = reqwest::Client::new()
                .post(app_url)
                .header("accept", ACCEPT)
                .header("mcp-protocol-version", "2025-11-25")
                .timeout(Duration::from_secs(20))
                .json(&body)
                .send()
                .await
                .expect("an answer");
            (response.status().as_u16(), response.text().await.unwrap())
        })
    };
    // The first poll waits for the lock for 4 s: counted from then, a 5 s
    // wait and its last look would end after the 8 s request timeout.
    tokio::time::sleep(Duration::from_secs(4)).await;
    lock.batch_execute("COMMIT").await.unwrap();
    let (status, body) = polling.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    assert_eq!(answer["result"]["structuredContent"]["messages"], json!([]));
    app.stop().await;
}
