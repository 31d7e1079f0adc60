//! A global address book without spam: contact policies, contacts and
//! blocks, listing, quotas across replicas, and the operator's suspension.

mod common;

use common::*;
use serde_json::{Value, json};

async fn settings(c: &Client, me: &Agent, change: Value) -> Value {
    ok(c, "phone_settings", me.with(change)).await
}

async fn send(c: &Client, from: &Agent, to: &str, body: &str) -> rmcp::model::CallToolResult {
    call(c, "phone_send", from.with(json!({"to": to, "body": body}))).await
}

fn refused(result: &rmcp::model::CallToolResult) -> String {
    assert_eq!(
        result.is_error,
        Some(true),
        "{:?}",
        result.structured_content
    );
    text(result)
}

/// open, project, contacts, closed; a block wins over a contact; the
/// refusal says the same for a block and for a policy; nothing is stored.
#[tokio::test]
async fn each_policy_lets_through_whom_it_says() {
    let app = spawn_app().await;
    let c = app.client().await;
    let boss = register(&c, "boss", "B", "acme").await;
    let colleague = register(&c, "colleague", "C", "ACME").await;
    let stranger = register(&c, "stranger", "S", "elsewhere").await;
    let friend = register(&c, "friend", "F", "elsewhere").await;

    // open: anyone.
    assert_ne!(send(&c, &stranger, "boss", "hi").await.is_error, Some(true));
    // project: the same project (case-insensitively) and contacts.
    let now = settings(
        &c,
        &boss,
        json!({"contact_policy": "project", "allow": ["friend"]}),
    )
    .await;
    assert_eq!(now["contact_policy"], "project");
    assert_eq!(now["contacts"], json!(["friend"]));
    assert_ne!(
        send(&c, &colleague, "boss", "same project").await.is_error,
        Some(true)
    );
    assert_ne!(
        send(&c, &friend, "boss", "a contact").await.is_error,
        Some(true)
    );
    let policy_refusal = refused(&send(&c, &stranger, "boss", "cold mail").await);
    assert!(
        policy_refusal.contains("'boss' does not accept new conversations from you"),
        "{policy_refusal}"
    );
    // contacts: only contacts.
    settings(&c, &boss, json!({"contact_policy": "contacts"})).await;
    refused(&send(&c, &colleague, "boss", "same project, not a contact").await);
    assert_ne!(
        send(&c, &friend, "boss", "still a contact").await.is_error,
        Some(true)
    );
    // A block wins over being a contact, and reads exactly like a policy.
    settings(&c, &boss, json!({"block": ["friend"]})).await;
    let block_refusal = refused(&send(&c, &friend, "boss", "blocked").await);
    assert_eq!(block_refusal, policy_refusal.replace("stranger", "friend"));
    // closed: no one starts a conversation.
    settings(
        &c,
        &boss,
        json!({"contact_policy": "closed", "unblock": ["friend"]}),
    )
    .await;
    refused(&send(&c, &friend, "boss", "closed").await);
    // Nothing refused was stored, and every refusal was logged.
    for body in [
        "cold mail",
        "same project, not a contact",
        "blocked",
        "closed",
    ] {
        let n = app
            .count(&format!(
                "SELECT count(*) FROM messages WHERE body = '{body}'"
            ))
            .await;
        assert_eq!(n, 0, "{body} was stored");
    }
    assert_eq!(
        app.count("SELECT sum(hits)::bigint FROM refused_sends")
            .await,
        4
    );
    app.stop().await;
}

/// Answering is always allowed, under any policy but a block: an agent
/// with a closed inbox still gets answers to what it sent.
#[tokio::test]
async fn replies_to_the_recipients_own_mail_always_pass_but_not_a_block() {
    let app = spawn_app().await;
    let c = app.client().await;
    let hermit = register(&c, "hermit", "H", "p").await;
    let helper = register(&c, "helper", "H", "q").await;
    settings(&c, &hermit, json!({"contact_policy": "closed"})).await;
    let question = ok(
        &c,
        "phone_send",
        hermit.with(json!({"to": "helper", "body": "help?"})),
    )
    .await;
    // A new conversation is refused; the answer to hermit's question is not.
    refused(&send(&c, &helper, "hermit", "new topic").await);
    let answer = call(
        &c,
        "phone_send",
        helper.with(json!({"reply_to": question["id"], "body": "here"})),
    )
    .await;
    assert_ne!(answer.is_error, Some(true), "{}", text(&answer));
    // Replying to its own earlier message is not answering the recipient.
    let own = ok(
        &c,
        "phone_send",
        helper.with(json!({"reply_to": question["id"], "body": "one more"})),
    )
    .await;
    let again = call(
        &c,
        "phone_send",
        helper.with(json!({"reply_to": own["id"], "body": "and more"})),
    )
    .await;
    refused(&again);
    // A block stops answers too.
    settings(&c, &hermit, json!({"block": ["helper"]})).await;
    refused(
        &call(
            &c,
            "phone_send",
            helper.with(json!({"reply_to": question["id"], "body": "hi?"})),
        )
        .await,
    );
    app.stop().await;
}

#[tokio::test]
async fn an_unlisted_agent_leaves_search_but_is_reachable_by_name() {
    let app = spawn_app().await;
    let c = app.client().await;
    let shy = register(&c, "shy-translator", "Translates invoices", "p").await;
    let other = register(&c, "other", "O", "p").await;
    let found = |v: &Value| {
        v["agents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "shy-translator")
    };
    assert!(found(
        &ok(&c, "phone_search", json!({"query": "translates invoices"})).await
    ));
    let now = settings(&c, &shy, json!({"listed": false})).await;
    assert_eq!(now["listed"], false);
    for query in [
        json!({"query": "translates invoices"}),
        json!({"query": "shy-translator"}),
        json!({}),
        json!({"project": "p"}),
    ] {
        assert!(
            !found(&ok(&c, "phone_search", query.clone()).await),
            "{query}"
        );
    }
    assert_ne!(
        send(&c, &other, "shy-translator", "found you by name")
            .await
            .is_error,
        Some(true)
    );
    app.stop().await;
}

/// Hostile settings: a self-block, unknown names, too many names, a bad
/// policy, a forged cursor; long lists page.
#[tokio::test]
async fn hostile_settings_get_clear_errors_and_lists_page() {
    let app = spawn_app_with(&[("PHONE_REGISTER_LIMIT", "0")]).await;
    let c = app.client().await;
    let me = register(&c, "me", "M", "p").await;
    let err = tool_err(&c, "phone_settings", me.with(json!({"block": ["me"]}))).await;
    assert!(err.contains("names yourself"), "{err}");
    let err = tool_err(
        &c,
        "phone_settings",
        me.with(json!({"contact_policy": "friends"})),
    )
    .await;
    assert!(
        err.contains("must be one of open, project, contacts, closed"),
        "{err}"
    );
    let many: Vec<String> = (0..101).map(|i| format!("n{i}")).collect();
    let err = tool_err(&c, "phone_settings", me.with(json!({"allow": many}))).await;
    assert!(err.contains("at most 100"), "{err}");
    let err = tool_err(&c, "phone_settings", me.with(json!({"cursor": "forged"}))).await;
    assert!(err.contains("cursor"), "{err}");
    let err = tool_err(
        &c,
        "phone_settings",
        me.with(json!({"allow": ["bad name!"]})),
    )
    .await;
    assert!(err.contains("`allow`"), "{err}");
    let out = settings(&c, &me, json!({"allow": ["ghost"], "block": ["nobody"]})).await;
    assert_eq!(out["unknown"], json!(["ghost", "nobody"]));
    assert_eq!(out["contacts_total"], 0);
    // 120 contacts, paged 50 at a time.
    let mut names = Vec::new();
    for i in 0..120 {
        let name = format!("c{i:03}");
        register(&c, &name, "d", "p").await;
        names.push(name);
    }
    settings(&c, &me, json!({"allow": names[..100]})).await;
    let first = settings(&c, &me, json!({"allow": names[100..]})).await;
    assert_eq!(first["contacts_total"], 120);
    assert_eq!(first["contacts"].as_array().unwrap().len(), 50);
    let mut seen: Vec<String> = Vec::new();
    let mut page = first;
    for _ in 0..5 {
        seen.extend(
            page["contacts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_owned()),
        );
        let Some(cursor) = page["next_cursor"].as_str() else {
            break;
        };
        page = settings(&c, &me, json!({"cursor": cursor})).await;
    }
    assert_eq!(seen, names);
    // Disallow removes; the count follows.
    let out = settings(&c, &me, json!({"disallow": names[..20]})).await;
    assert_eq!(out["contacts_total"], 100);
    app.stop().await;
}

/// Quotas are shared across replicas: sends per hour, first messages to new
/// recipients per day, and a full inbox refuses new mail without touching
/// what it holds.
#[tokio::test]
async fn quotas_hold_across_two_replicas() {
    let quotas = [
        ("PHONE_SEND_QUOTA_PER_HOUR", "6"),
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "3"),
        ("PHONE_INBOX_UNREAD_MAX", "4"),
        ("PHONE_REGISTER_LIMIT", "0"),
    ];
    let one = spawn_app_with(&quotas).await;
    let two = spawn_app_on(&one.database_url, &quotas).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let spammer = register(&c1, "spammer", "S", "p").await;
    for i in 0..5 {
        register(&c1, &format!("target{i}"), "T", "p").await;
    }
    // New recipients: 3 a day, counted on both replicas.
    for (i, c) in [&c1, &c2, &c1].into_iter().enumerate() {
        assert_ne!(
            send(c, &spammer, &format!("target{i}"), "first")
                .await
                .is_error,
            Some(true)
        );
    }
    let err = refused(&send(&c2, &spammer, "target3", "first").await);
    assert!(
        err.contains("first messages to new recipients today"),
        "{err}"
    );
    // Known recipients are not new; the hourly quota (6) ends them too,
    // and the refused send above counted against it.
    assert_ne!(
        send(&c2, &spammer, "target0", "again").await.is_error,
        Some(true)
    );
    assert_ne!(
        send(&c1, &spammer, "target1", "again").await.is_error,
        Some(true)
    );
    let err = refused(&send(&c1, &spammer, "target0", "seventh").await);
    assert!(err.contains("messages this hour"), "{err}");
    // A full inbox: 4 unread at most; what it holds is untouched.
    let busy = register(&c1, "busy", "B", "p").await;
    let fans: Vec<Agent> = {
        let mut v = Vec::new();
        for i in 0..5 {
            v.push(register(&c1, &format!("fan{i}"), "F", "p").await);
        }
        v
    };
    for (i, fan) in fans.iter().take(4).enumerate() {
        let c = if i % 2 == 0 { &c1 } else { &c2 };
        assert_ne!(send(c, fan, "busy", "hello").await.is_error, Some(true));
    }
    let err = refused(&send(&c2, &fans[4], "busy", "one too many").await);
    assert!(err.contains("'busy''s inbox is full"), "{err}");
    let got = ok(&c1, "phone_inbox", busy.with(json!({"limit": 10}))).await;
    assert_eq!(got["messages"].as_array().unwrap().len(), 4);
    assert_ne!(
        send(&c2, &fans[4], "busy", "now there is room")
            .await
            .is_error,
        Some(true)
    );
    two.stop().await;
    one.stop().await;
}

/// `phone admin suspend`: the token stops working at once on every replica,
/// the agent leaves search, mail to it is refused, its history stays;
/// `unsuspend` gives it all back.
#[tokio::test]
async fn suspension_by_the_operator_holds_on_every_replica() {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let abuser = register(&c1, "abuser", "Sends spam", "p").await;
    let victim = register(&c1, "victim", "V", "p").await;
    ok(
        &c1,
        "phone_send",
        abuser.with(json!({"to": "victim", "body": "spam"})),
    )
    .await;
    let admin = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_phone"))
            .arg("admin")
            .args(args)
            .env("DATABASE_URL", &one.database_url)
            .output()
            .expect("phone admin runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    // Mail the abuser leased before the suspension cannot be acknowledged
    // after it: phone_ack verifies its caller in its own statement.
    let (_, receipt) = sent_and_leased(&c1, &victim, &abuser, "who are you?").await;
    let (done, said) = admin(&["suspend", "abuser"]);
    assert!(done && said.contains("'abuser' is suspended"), "{said}");
    for c in [&c1, &c2] {
        let err = tool_err(c, "phone_ack", abuser.with(json!({"ids": [&receipt]}))).await;
        assert!(err.starts_with("invalid token"), "{err}");
        let err = tool_err(
            c,
            "phone_send",
            abuser.with(json!({"to": "victim", "body": "more spam"})),
        )
        .await;
        assert!(err.starts_with("invalid token"), "{err}");
        let err = tool_err(c, "phone_inbox", abuser.with(json!({}))).await;
        assert!(err.starts_with("invalid token"), "{err}");
        // Nor can it rewrite its directory entry.
        let err = tool_err(
            c,
            "phone_register",
            abuser.with(json!({"description": "totally legit", "project": "p"})),
        )
        .await;
        assert!(err.contains("token"), "{err}");
        refused(&send(c, &victim, "abuser", "stop it").await);
        let found = ok(c, "phone_search", json!({"query": "spam"})).await;
        assert_eq!(found["agents"], json!([]), "{found}");
    }
    assert_eq!(
        one.count("SELECT count(*) FROM agents WHERE description = 'totally legit'")
            .await,
        0,
        "a suspended agent rewrote its entry"
    );
    assert_eq!(
        one.count("SELECT count(*) FROM messages WHERE acked_at IS NOT NULL")
            .await,
        0,
        "a suspended agent acknowledged mail"
    );
    // Its history stays.
    let got = ok(&c2, "phone_inbox", victim.with(json!({}))).await;
    assert_eq!(got["messages"][0]["body"], "spam");
    let (_, said) = admin(&["top-senders", "1"]);
    assert!(
        said.contains("abuser") && said.contains("(suspended)"),
        "{said}"
    );
    let (_, said) = admin(&["refused"]);
    assert!(said.contains("victim -> abuser  refused  2"), "{said}");
    let (done, said) = admin(&["suspend", "nobody"]);
    assert!(
        !done && said.contains("no registered agent named 'nobody'"),
        "{said}"
    );
    let (done, said) = admin(&["unsuspend", "abuser"]);
    assert!(done && said.contains("no longer suspended"), "{said}");
    ok(
        &c2,
        "phone_send",
        abuser.with(json!({"to": "victim", "body": "sorry"})),
    )
    .await;
    two.stop().await;
    one.stop().await;
}

/// Refused sends and finished webhook deliveries are kept a week: a replica
/// prunes older ones when it starts (and every ten minutes); pending
/// deliveries and recent rows stay.
#[tokio::test]
async fn refused_sends_and_finished_deliveries_are_pruned_after_a_week() {
    let first = spawn_app().await;
    let db = first.db().await;
    db.batch_execute(
        "INSERT INTO refused_sends (sender_id, recipient_id, reason, at) VALUES
             (1, 2, 'old', now() - interval '8 days'), (1, 2, 'recent', now() - interval '1 day');
         INSERT INTO webhook_deliveries (agent_id, message_id, state, created_at, finished_at) VALUES
             (1, 1, 'delivered', now() - interval '9 days', now() - interval '8 days'),
             (1, 2, 'failed', now() - interval '9 days', now() - interval '8 days'),
             (1, 3, 'delivered', now() - interval '2 days', now() - interval '1 day'),
             (1, 4, 'pending', now() - interval '9 days', NULL);",
    )
    .await
    .unwrap();
    let _second = spawn_app_on(&first.database_url, &[]).await;
    wait_until(
        &db,
        "the old rows are gone",
        "SELECT NOT EXISTS (SELECT 1 FROM refused_sends WHERE reason = 'old')
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries WHERE message_id IN (1, 2))",
    )
    .await;
    let left: Vec<String> = db
        .query(
            "SELECT reason FROM refused_sends
             UNION ALL SELECT state || ' ' || message_id FROM webhook_deliveries ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["delivered 3", "pending 4", "recent"]);
}

/// The unread cap costs a send one index probe while the recipient's
/// backlog is young (its pollers keep up), not a walk of every unread row
/// per send; an old backlog at the cap is still refused.
#[tokio::test]
async fn the_unread_cap_does_not_walk_a_young_backlog() {
    let app = spawn_app_with(&[("PHONE_INBOX_UNREAD_MAX", "1000")]).await;
    let c = app.client().await;
    let writer = register(&c, "writer", "W", "p").await;
    register(&c, "reader", "R", "p").await;
    let db = app.db().await;
    // 300 unread for the reader, the newest ids issued.
    db.batch_execute(
        "INSERT INTO messages (sender_id, recipient_id, body, thread_id)
         SELECT w.id, r.id, 'old', 0 FROM agents w, agents r, generate_series(1, 300)
         WHERE w.name = 'writer' AND r.name = 'reader';
         ANALYZE messages;",
    )
    .await
    .unwrap();
    let before = messages_scans_from_zero(&db).await;
    for i in 0..10 {
        ok(
            &c,
            "phone_send",
            writer.with(json!({"to": "reader", "body": format!("m{i}")})),
        )
        .await;
    }
    let (_, _, fetched) = messages_scans_after(&db, before, 10).await;
    // Counting the backlog fetches its 300 rows per send (3,000 in all).
    assert!(
        fetched < 300,
        "10 sends fetched {fetched} messages rows: the backlog was counted"
    );

    // Once the backlog could be full (older than 1,000 ids), it is counted,
    // and a full inbox refuses.
    db.batch_execute(
        "SELECT setval('messages_id_seq', nextval('messages_id_seq') + 5000);
         INSERT INTO messages (sender_id, recipient_id, body, thread_id)
         SELECT w.id, r.id, 'more', 0 FROM agents w, agents r, generate_series(1, 690)
         WHERE w.name = 'writer' AND r.name = 'reader';",
    )
    .await
    .unwrap();
    let full = call(
        &c,
        "phone_send",
        writer.with(json!({"to": "reader", "body": "one too many"})),
    )
    .await;
    assert_eq!(full.is_error, Some(true), "{full:?}");
    assert!(text(&full).contains("inbox is full"), "{}", text(&full));
    app.stop().await;
}

/// Scans of the contacts' primary key so far.
async fn contact_probes(db: &tokio_postgres::Client) -> i64 {
    index_counter(db, "contacts_pkey", "idx_scan", STATS_SETTLED).await
}

/// Mail to an agent that never marked anyone is decided without a look in
/// `contacts` (its flag says no row can exist), alone or in a group send;
/// mail to one that did looks its sender up. The first half fails when the
/// flag is checked after the probe instead of before it.
#[tokio::test]
async fn mail_to_an_agent_without_contacts_never_looks_them_up() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let sender = register(&c, "sender", "S", "p").await;
    for name in ["plain-1", "plain-2", "plain-3"] {
        register(&c, name, "P", "p").await;
    }
    let careful = register(&c, "careful", "C", "p").await;
    settings(&c, &careful, json!({"allow": ["plain-1"]})).await;

    let before = contact_probes(&db).await;
    assert_ne!(
        send(&c, &sender, "plain-1", "one").await.is_error,
        Some(true)
    );
    let group = call(
        &c,
        "phone_send",
        sender.with(json!({"to": ["plain-1", "plain-2", "plain-3"], "body": "all"})),
    )
    .await;
    assert_ne!(group.is_error, Some(true), "{}", text(&group));
    assert_eq!(
        contact_probes(&db).await,
        before,
        "no recipient ever marked anyone: nothing to look up"
    );

    assert_ne!(
        send(&c, &sender, "careful", "two").await.is_error,
        Some(true)
    );
    assert!(
        contact_probes(&db).await > before,
        "a recipient with contacts has its sender looked up"
    );
}

/// A block written without phone's own mark (a replica older than the flag
/// during a rolling deploy, an operator's INSERT) still holds: the database
/// sets the recipient's flag with the row, so sends look it up. Fails
/// without migration V22's trigger (the send is delivered).
#[tokio::test]
async fn a_block_written_by_hand_still_holds() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(&c, "boss", "B", "p").await;
    let pest = register(&c, "pest", "P", "elsewhere").await;
    assert_ne!(send(&c, &pest, "boss", "before").await.is_error, Some(true));
    app.db()
        .await
        .batch_execute(
            "INSERT INTO contacts (agent_id, other_id, is_blocked)
             SELECT b.id, p.id, true FROM agents b, agents p
             WHERE b.name = 'boss' AND p.name = 'pest'",
        )
        .await
        .unwrap();
    let refusal = refused(&send(&c, &pest, "boss", "after").await);
    assert!(refusal.contains("does not accept"), "{refusal}");
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE body = 'after'")
            .await,
        0,
        "nothing past the block is stored"
    );

    // A row written past the trigger (a restore with triggers disabled)
    // is ignored until the migration's last statement flags its owner.
    register(&c, "careless", "C", "p").await;
    let db = app.db().await;
    db.batch_execute(
        "ALTER TABLE contacts DISABLE TRIGGER contacts_flag_their_owner;
         INSERT INTO contacts (agent_id, other_id, is_blocked)
         SELECT b.id, p.id, true FROM agents b, agents p
         WHERE b.name = 'careless' AND p.name = 'pest';
         ALTER TABLE contacts ENABLE TRIGGER contacts_flag_their_owner;",
    )
    .await
    .unwrap();
    assert_ne!(
        send(&c, &pest, "careless", "slips through").await.is_error,
        Some(true),
        "without its flag the block is not looked up"
    );
    db.batch_execute(include_str!(
        "../migrations/V22__contacts_flag_their_owner.sql"
    ))
    .await
    .unwrap();
    refused(&send(&c, &pest, "careless", "held").await);
}

/// An agent's first block while a batch holds one of the blocked sender's
/// messages to it and then writes the agent's presence (a poll after a quiet
/// minute does both, in that order): both finish. When the mark wrote the
/// flag itself, it held the agent's row while it waited for the message,
/// the batch waited for the row, and PostgreSQL aborted one of them. The
/// same with a policy changed in the same call, which locked the row before
/// the block waited (an outsider's attack).
#[tokio::test]
async fn a_first_block_racing_a_poll_does_not_deadlock() {
    for also in [
        json!({}),
        json!({"contact_policy": "project"}),
        json!({"listed": false}),
    ] {
        a_block_racing_a_poll(also).await;
    }
}

async fn a_block_racing_a_poll(also: serde_json::Value) {
    let app = spawn_app().await;
    let c = app.client().await;
    let boss = register(&c, "boss", "B", "p").await;
    let pest = register(&c, "pest", "P", "p").await;
    assert_ne!(send(&c, &pest, "boss", "unread").await.is_error, Some(true));

    // The batch: it has taken the message (FOR UPDATE, as a poll's pool).
    let batch = app.db().await;
    batch
        .batch_execute(
            "BEGIN;
             SELECT m.id FROM messages m JOIN agents a ON a.id = m.recipient_id
             WHERE a.name = 'boss' FOR UPDATE OF m;",
        )
        .await
        .unwrap();
    let mut change = also.clone();
    change["block"] = json!(["pest"]);
    let (c2, args) = (app.client().await, boss.with(change));
    let mark = tokio::spawn(async move { call(&c2, "phone_settings", args).await });
    // The mark now waits for the message.
    wait_until(
        &app.db().await,
        "the mark waits for the message the batch holds",
        "SELECT count(*) > 0 FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'
           AND query LIKE '%INSERT INTO contacts%'",
    )
    .await;
    // The batch's presence write, then its commit.
    let presence = batch
        .execute(
            "UPDATE agents SET last_seen_at = now() WHERE name = 'boss'",
            &[],
        )
        .await;
    assert!(presence.is_ok(), "the batch's presence write: {presence:?}");
    batch.batch_execute("COMMIT").await.unwrap();
    let marked = mark.await.unwrap();
    assert_ne!(marked.is_error, Some(true), "{also}: {}", text(&marked));
    // The block took: the message is withdrawn, later sends are refused.
    refused(&send(&c, &pest, "boss", "after").await);
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE dead_reason = 'blocked'")
            .await,
        1
    );
    app.stop().await;
}
