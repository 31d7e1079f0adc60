//! A popular inbox: many pollers of one recipient at once share the group
//! commit statement, each with its own disjoint share of the oldest mail;
//! every message is delivered exactly once, in read and lease mode, across
//! replicas, also when a poller leaves mid-batch.

mod common;

use std::{collections::HashMap, time::Duration};

use common::*;
use serde_json::{Value, json};

fn ids(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn fill(c: &Client, from: &Agent, to: &str, n: usize) -> Vec<String> {
    let mut sent = Vec::new();
    for i in 0..n {
        let out = ok(
            c,
            "phone_send",
            from.with(json!({"to": to, "body": format!("job {i}")})),
        )
        .await;
        sent.push(out["id"].as_str().unwrap().to_owned());
    }
    sent
}

/// Pollers of one inbox on two replicas, until it is empty: every message
/// exactly once. `lease`: in lease mode, each worker acknowledging its own
/// receipts.
async fn drain_together(lease: bool) {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let c = one.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let help = register(&c, "helpdesk", "H", "p").await;
    let sent = fill(&c, &alice, "helpdesk", 240).await;
    let mut workers = Vec::new();
    for w in 0..12 {
        let client = if w % 2 == 0 {
            one.client().await
        } else {
            two.client().await
        };
        let mut args = help.with(json!({"limit": 1 + w % 4}));
        if lease {
            args["mode"] = json!("lease");
            args["lease_seconds"] = json!(600);
        }
        let ack = help.with(json!({}));
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..300 {
                let out = ok(&client, "phone_inbox", args.clone()).await;
                if out["messages"].as_array().unwrap().is_empty() && out["unread_remaining"] == 0 {
                    break;
                }
                if lease {
                    let receipts: Vec<Value> = out["messages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|m| m["receipt"].clone())
                        .collect();
                    if !receipts.is_empty() {
                        let mut a = ack.clone();
                        a["ids"] = Value::Array(receipts.clone());
                        let acked = ok(&client, "phone_ack", a).await;
                        assert_eq!(
                            acked["acknowledged"].as_array().unwrap().len(),
                            receipts.len()
                        );
                    }
                }
                got.extend(ids(&out));
            }
            got
        }));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for w in workers {
        for id in w.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<&String> = seen
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    assert!(twice.is_empty(), "handed out twice: {twice:?}");
    let missing: Vec<&String> = sent.iter().filter(|id| !seen.contains_key(*id)).collect();
    assert!(missing.is_empty(), "never handed out: {missing:?}");
    let state = if lease { "acked_at" } else { "read_at" };
    assert_eq!(
        one.count(&format!(
            "SELECT count(*) FROM messages WHERE {state} IS NULL"
        ))
        .await,
        0
    );
    assert_eq!(
        one.count("SELECT max(delivery_count)::bigint FROM messages")
            .await,
        1
    );
    two.stop().await;
    one.stop().await;
}

#[tokio::test]
async fn many_readers_of_one_inbox_get_every_message_exactly_once() {
    drain_together(false).await;
}

#[tokio::test]
async fn many_lease_workers_of_one_inbox_get_every_message_exactly_once() {
    drain_together(true).await;
}

/// Eight polls of one inbox held up together (the table is locked
/// elsewhere), so that they go to PostgreSQL in the same batch; one of the
/// callers leaves meanwhile. The others get disjoint shares; the leaver's
/// share goes back, and nothing is lost or doubled.
#[tokio::test]
async fn pollers_of_one_inbox_in_one_batch_and_one_that_leaves() {
    // The held polls wait for their batch while the lock is held: on a
    // loaded machine that can pass the default 2 s pool timeout ("busy").
    let app = spawn_app_with(&[("PHONE_POOL_TIMEOUT_MS", "10000")]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let help = register(&c, "helpdesk", "H", "p").await;
    let sent = fill(&c, &alice, "helpdesk", 40).await;
    let lock = app.db().await;
    lock.batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut polls = Vec::new();
    for p in 0..8 {
        let client = app.client().await;
        let mut args = help.with(json!({"limit": 4}));
        if p % 2 == 1 {
            args["mode"] = json!("lease");
        }
        polls.push(tokio::spawn(async move {
            ok(&client, "phone_inbox", args).await
        }));
    }
    // The one that leaves: a plain HTTP client that gives up.
    let leaver = {
        let url = app.mcp_url();
        let args = help.with(json!({"limit": 4}));
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                              "params": {"name": "phone_inbox", "arguments": args}});
            reqwest::Client::new()
                .post(url)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .timeout(Duration::from_millis(800))
                .json(&body)
                .send()
                .await
                .is_err()
        })
    };
    assert!(leaver.await.unwrap(), "the leaver should have given up");
    lock.batch_execute("COMMIT").await.unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in polls {
        let out = p.await.unwrap();
        assert_eq!(out["messages"].as_array().unwrap().len(), 4, "{out}");
        for id in ids(&out) {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 32, "disjoint shares: {seen:?}");
    // What the leaver took is back; the rest of the inbox comes out once.
    wait_until_settled(
        &app.db().await,
        "the leaver's share is back",
        "SELECT count(*) = 8 FROM messages WHERE read_at IS NULL AND leased_until IS NULL",
    )
    .await;
    let rest = ok(&c, "phone_inbox", help.with(json!({"limit": 20}))).await;
    for id in ids(&rest) {
        *seen.entry(id).or_default() += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert_eq!(seen.len(), sent.len());
    app.stop().await;
}
