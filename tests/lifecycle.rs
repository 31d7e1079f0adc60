//! What ages: agents unseen for long go stale (out of search, back when
//! seen, unregistered by the operator), and with a retention set, old
//! messages are deleted by every replica.

mod common;

use common::*;
use phone::admin::{self, Command};
use serde_json::{Value, json};

fn names(found: &Value) -> Vec<String> {
    found["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_stale_agent_leaves_search_until_it_is_seen_again() {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let fresh = register(&c1, "invoicer", "Reads invoice mail", "acme").await;
    let old = register(&c1, "old-invoicer", "Reads invoice mail too", "acme").await;
    one.db()
        .await
        .execute(
            "UPDATE agents SET last_seen_at = now() - interval '100 days',
                               registered_at = now() - interval '200 days'
             WHERE name = 'old-invoicer'",
            &[],
        )
        .await
        .unwrap();
    // Out of search and of the directory listing, on any replica.
    for args in [
        json!({"query": "invoice"}),
        json!({}),
        json!({"project": "acme"}),
    ] {
        let found = ok(&c2, "phone_search", args.clone()).await;
        assert_eq!(names(&found), ["invoicer"], "{args}: {found}");
    }
    // Its exact name still finds it, marked stale; mail still reaches it.
    let exact = call(&c2, "phone_search", json!({"query": "old-invoicer"})).await;
    let card = &exact.structured_content.as_ref().unwrap()["agents"][0];
    assert_eq!(card["name"], "old-invoicer");
    assert_eq!(card["stale"], true);
    assert!(text(&exact).contains(", stale)"), "{}", text(&exact));
    ok(
        &c1,
        "phone_send",
        fresh.with(json!({"to": "old-invoicer", "body": "still there?"})),
    )
    .await;
    // Seen again (any call with its token): back in search, not stale.
    let inbox = ok(&c2, "phone_inbox", old.with(json!({"peek": true}))).await;
    assert_eq!(inbox["messages"][0]["body"], "still there?");
    let found = ok(&c1, "phone_search", json!({"query": "invoice"})).await;
    assert_eq!(names(&found).len(), 2, "{found}");
    assert!(found["agents"][1].get("stale").is_none(), "{found}");
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn the_operator_lists_and_unregisters_stale_agents_without_losing_mail() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alive = register(&c, "alive", "A", "p").await;
    register(&c, "gone", "G", "p").await;
    ok(
        &c,
        "phone_send",
        alive.with(json!({"to": "gone", "body": "for the record"})),
    )
    .await;
    app.db()
        .await
        .execute(
            "UPDATE agents SET last_seen_at = now() - interval '120 days' WHERE name = 'gone'",
            &[],
        )
        .await
        .unwrap();
    let listed = admin::run(&app.database_url, &Command::Stale { days: 90 })
        .await
        .unwrap();
    assert!(
        listed.starts_with("1 agent(s) unseen for 90 day(s)"),
        "{listed}"
    );
    assert!(
        listed.contains("gone") && !listed.contains("alive"),
        "{listed}"
    );
    let done = admin::run(&app.database_url, &Command::UnregisterStale { days: 90 })
        .await
        .unwrap();
    assert!(
        done.contains("gone: unregistered, name reserved until"),
        "{done}"
    );
    // The usual reservation; the mail stays.
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "gone", "description": "x", "project": "p"}),
    )
    .await;
    assert!(err.contains("stays reserved"), "{err}");
    assert_eq!(app.count("SELECT count(*) FROM messages").await, 1);
    let none = admin::run(&app.database_url, &Command::Stale { days: 90 })
        .await
        .unwrap();
    assert!(none.starts_with("0 agent(s)"), "{none}");
    app.stop().await;
}

/// With PHONE_RETENTION_DAYS, a replica deletes messages older than that
/// (at its start and every ten minutes); a reply to a deleted message stays,
/// without its reply_to. Without it, nothing is deleted.
#[tokio::test]
async fn retention_deletes_old_messages_on_every_replica() {
    let one = spawn_app().await;
    let c = one.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let sent = ok(
            &c,
            "phone_send",
            a.with(json!({"to": "bob", "body": format!("old {i}")})),
        )
        .await;
        ids.push(sent["id"].as_str().unwrap().to_owned());
    }
    let reply = ok(
        &c,
        "phone_send",
        b.with(json!({"reply_to": ids[0], "body": "a new answer"})),
    )
    .await;
    let db = one.db().await;
    db.execute(
        "UPDATE messages SET sent_at = now() - interval '40 days' WHERE body LIKE 'old %'",
        &[],
    )
    .await
    .unwrap();
    // A replica without a retention keeps them.
    let keeper = spawn_app_on(&one.database_url, &[]).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(one.count("SELECT count(*) FROM messages").await, 4);
    // One with a retention of 30 days deletes them when it starts.
    let pruner = spawn_app_on(&one.database_url, &[("PHONE_RETENTION_DAYS", "30")]).await;
    wait_until(
        &db,
        "old messages deleted",
        "SELECT count(*) = 1 FROM messages",
    )
    .await;
    let left = ok(&c, "phone_inbox", a.with(json!({"include_read": true}))).await;
    assert_eq!(left["messages"][0]["id"], reply["id"]);
    assert!(left["messages"][0].get("reply_to").is_none(), "{left}");
    assert_eq!(
        left["messages"][0]["thread_id"], ids[0],
        "the thread keeps its id"
    );
    keeper.stop().await;
    pruner.stop().await;
    one.stop().await;
}

/// Retention deletes a group send's first copy (the one search finds the
/// group by) while a copy a retry added to the group later is kept: that
/// copy's recipient and its sender still find it.
#[tokio::test]
async fn retention_keeps_a_later_copy_of_a_group_searchable() {
    let one = spawn_app().await;
    let c = one.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    register(&c, "bob", "B", "p").await;
    let carol = register(&c, "carol", "C", "else").await;
    let policy = |p: &str| carol.with(json!({"contact_policy": p}));
    ok(&c, "phone_settings", policy("closed")).await;
    let args = alice.with(
        json!({"to": ["bob", "carol"], "body": "The albatross budget.", "idempotency_key": "g"}),
    );
    let first = ok(&c, "phone_send", args.clone()).await;
    assert!(first["recipients"][1]["error"].is_string(), "{first}");
    ok(&c, "phone_settings", policy("open")).await;
    let retry = ok(&c, "phone_send", args).await;
    let late = retry["recipients"][1]["id"].as_str().unwrap().to_owned();
    let db = one.db().await;
    db.execute(
        "UPDATE messages SET sent_at = now() - interval '40 days'
         WHERE id = (SELECT min(id) FROM messages)",
        &[],
    )
    .await
    .unwrap();
    let pruner = spawn_app_on(&one.database_url, &[("PHONE_RETENTION_DAYS", "30")]).await;
    wait_until(
        &db,
        "the first copy deleted, the group named after the copy left",
        "SELECT count(*) = 1 AND bool_and(group_id = id AND words IS NOT NULL) FROM messages",
    )
    .await;
    let found = ok(&c, "phone_inbox", carol.with(json!({"query": "albatross"}))).await;
    assert_eq!(found["messages"][0]["id"], late.as_str(), "{found}");
    let found = ok(&c, "phone_inbox", alice.with(json!({"query": "albatross"}))).await;
    assert_eq!(found["messages"][0]["id"], late.as_str(), "{found}");
    pruner.stop().await;
    one.stop().await;
}
