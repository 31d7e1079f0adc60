//! The mailbox end to end: register, search, send, inbox, reply, through a
//! real MCP client against a real server and a real PostgreSQL.

mod common;

use std::collections::HashSet;

use common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[tokio::test]
async fn the_whole_flow_from_register_to_reply() {
    let app = spawn_app().await;
    let email_machine = app.client().await;
    let coder_machine = app.client().await;

    // 1. "email" registers and gets a token, shown once.
    let email = register(
        &email_machine,
        "email",
        "Email assistant with access to all Fortea mail",
        "hassing",
    )
    .await;
    assert!(email.token.starts_with("phn_"));
    let coder = register(
        &coder_machine,
        "coder",
        "Writes and reviews Rust code",
        "kodo",
    )
    .await;
    // Some noise in the directory.
    register(
        &coder_machine,
        "calendar",
        "Manages meetings and calendar invites",
        "hassing",
    )
    .await;
    register(&coder_machine, "mailroom", "Sorts incoming letters", "post").await;

    // 2. "coder" finds "email", ranked first, by name and by what it does.
    for query in ["email", "invoice mail", "Fortea mail"] {
        let found = ok(&coder_machine, "phone_search", json!({"query": query})).await;
        assert_eq!(
            found["agents"][0]["name"], "email",
            "query {query:?}: {found}"
        );
        assert_eq!(found["agents"][0]["project"], "hassing");
    }

    // 3. "coder" sends; "email" is not polling: the message waits in Postgres.
    let sent = ok(
        &coder_machine,
        "phone_send",
        coder.with(json!({"to": "email", "body": "Please fetch the latest invoice mail."})),
    )
    .await;
    assert_eq!(sent["to"], "email");
    assert_eq!(sent["replayed"], false);
    let question_id = sent["id"].as_str().unwrap().to_owned();
    assert_eq!(sent["thread_id"], question_id.as_str());
    let db = app.db().await;
    let waiting: i64 = db
        .query_one("SELECT count(*) FROM messages WHERE read_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(waiting, 1);

    // 4. Later, "email" polls, gets it (marked read), and replies.
    let inbox = ok(&email_machine, "phone_inbox", email.with(json!({}))).await;
    let messages = inbox["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{inbox}");
    let m = &messages[0];
    assert_eq!(m["id"], question_id.as_str());
    assert_eq!(m["from"], "coder");
    assert_eq!(m["from_project"], "kodo");
    assert_eq!(m["to"], "email");
    assert_eq!(m["body"], "Please fetch the latest invoice mail.");
    // Read just now, on its first delivery: the answer does not say so
    // (an inbox of 20 would say it 20 times); the history does.
    assert!(
        m.get("read_at").is_none() && m.get("delivery_count").is_none(),
        "{m}"
    );
    assert_eq!(inbox["unread_remaining"], 0);
    let again = ok(&email_machine, "phone_inbox", email.with(json!({}))).await;
    assert_eq!(
        again["messages"].as_array().unwrap().len(),
        0,
        "a read message is not delivered twice"
    );

    let reply = ok(
        &email_machine,
        "phone_send",
        email.with(json!({"reply_to": question_id, "body": "Found 3 invoices; summary attached."})),
    )
    .await;
    assert_eq!(
        reply["to"], "coder",
        "reply_to defaults `to` to the other party"
    );
    assert_eq!(reply["thread_id"], question_id.as_str());

    let answers = ok(&coder_machine, "phone_inbox", coder.with(json!({}))).await;
    let answer = &answers["messages"][0];
    assert_eq!(answer["from"], "email");
    assert_eq!(answer["reply_to"], question_id.as_str());
    assert_eq!(answer["thread_id"], question_id.as_str());

    // The text rendering names sender and project and fences the body as data.
    let result = call(
        &coder_machine,
        "phone_inbox",
        coder.with(json!({"include_read": true})),
    )
    .await;
    let rendered = text(&result);
    assert!(
        rendered.contains("from email (project \"hassing\")"),
        "{rendered}"
    );
    assert!(
        rendered.contains(" from=\"email\">\nFound 3 invoices"),
        "{rendered}"
    );

    // Tokens are stored only as SHA-256 digests.
    let row = db
        .query_one(
            "SELECT token_hash, agents::text AS whole FROM agents WHERE name = 'email'",
            &[],
        )
        .await
        .unwrap();
    let hash: Vec<u8> = row.get("token_hash");
    assert_eq!(hash, Sha256::digest(email.token.as_bytes()).to_vec());
    let whole: String = row.get("whole");
    assert!(!whole.contains(&email.token[4..]), "plaintext token stored");
    app.stop().await;
}

#[tokio::test]
async fn the_flow_over_protocol_2026_07_28_with_bearer_headers() {
    let app = spawn_app().await;
    let anonymous = app.modern_client(None).await;
    let email = register(&anonymous, "email", "Email assistant", "hassing").await;
    let coder = register(&anonymous, "coder", "Writes code", "kodo").await;

    let as_coder = app.modern_client(Some(&coder.token)).await;
    let as_email = app.modern_client(Some(&email.token)).await;
    let sent = ok(
        &as_coder,
        "phone_send",
        json!({"to": "email", "body": "hello"}),
    )
    .await;
    // `name` is optional with a header, and must match when given.
    let inbox = ok(&as_email, "phone_inbox", json!({"name": "EMAIL"})).await;
    assert_eq!(inbox["messages"][0]["id"], sent["id"]);
    let err = tool_err(&as_email, "phone_inbox", json!({"name": "coder"})).await;
    assert!(err.contains("different agent"), "{err}");
    // A header and an argument carrying different tokens are refused.
    let err = tool_err(&as_email, "phone_inbox", json!({"token": coder.token})).await;
    assert!(err.contains("different tokens"), "{err}");
    // The same token in both places is fine.
    ok(&as_email, "phone_inbox", json!({"token": email.token})).await;
    app.stop().await;
}

#[tokio::test]
async fn registering_again_needs_the_token() {
    let app = spawn_app().await;
    let c = app.client().await;
    let email = register(&c, "Email", "Email assistant", "hassing").await;
    assert_eq!(email.name, "email", "names are lowercased");

    for taken in ["email", "EMAIL", " eMail "] {
        let err = tool_err(
            &c,
            "phone_register",
            json!({"name": taken, "description": "impostor", "project": "x"}),
        )
        .await;
        assert!(err.starts_with("name already registered"), "{err}");
    }
    let other = register(&c, "other", "Someone else", "x").await;
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "email", "description": "hijack", "project": "x", "token": other.token}),
    )
    .await;
    assert!(err.contains("name already registered"), "{err}");
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "free-name", "description": "d", "project": "x", "token": other.token}),
    )
    .await;
    assert!(err.contains("without a token"), "{err}");

    let updated = ok(
        &c,
        "phone_register",
        json!({"name": "email", "description": "Now also calendars", "project": "fortea", "token": email.token}),
    )
    .await;
    assert_eq!(updated["created"], false);
    assert!(
        updated.get("token").is_none(),
        "a token is only ever shown when issued"
    );
    let found = ok(&c, "phone_search", json!({"query": "calendars"})).await;
    assert_eq!(found["agents"][0]["name"], "email");
    assert_eq!(found["agents"][0]["project"], "fortea");
    // The token still works after the update.
    ok(&c, "phone_inbox", email.with(json!({}))).await;
    app.stop().await;
}

#[tokio::test]
async fn search_ranks_stems_prefixes_filters_and_pages() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(&c, "billing", "Handles invoices and payments", "finance").await;
    register(&c, "mailer", "Sends mail and newsletters", "growth").await;
    register(
        &c,
        "invoice-mail",
        "Reads invoice mail for accounting",
        "finance",
    )
    .await;
    register(&c, "archivist", "Keeps mail archives", "ops").await;
    register(&c, "invoice", "Legacy bot", "ops").await;

    let names = |v: &Value| -> Vec<String> {
        v["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // An exact name first, then agents matching all words, then some.
    let r = ok(&c, "phone_search", json!({"query": "invoice"})).await;
    assert_eq!(names(&r)[0], "invoice", "{r}");
    let r = ok(&c, "phone_search", json!({"query": "invoice mail"})).await;
    let n = names(&r);
    assert_eq!(n[0], "invoice-mail", "{r}");
    assert!(
        n.contains(&"billing".to_owned()) && n.contains(&"mailer".to_owned()),
        "some-words matches follow: {n:?}"
    );
    let all_pos = n.iter().position(|x| x == "invoice-mail").unwrap();
    let some_pos = n.iter().position(|x| x == "mailer").unwrap();
    assert!(all_pos < some_pos);
    // Stemming: "invoices" finds "invoice"; prefix on the last word.
    let r = ok(&c, "phone_search", json!({"query": "invoices"})).await;
    assert!(names(&r).contains(&"invoice-mail".to_owned()), "{r}");
    let r = ok(&c, "phone_search", json!({"query": "newslet"})).await;
    assert_eq!(names(&r), ["mailer"]);
    let r = ok(&c, "phone_search", json!({"query": "archiv"})).await;
    assert_eq!(names(&r), ["archivist"]);
    // Project filter, with and without a query.
    let r = ok(
        &c,
        "phone_search",
        json!({"query": "invoice", "project": "finance"}),
    )
    .await;
    let mut n = names(&r);
    n.sort();
    assert_eq!(n, ["billing", "invoice-mail"]);
    let r = ok(&c, "phone_search", json!({"project": "OPS"})).await;
    assert_eq!(names(&r), ["archivist", "invoice"]);
    // No query lists the directory, in pages.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({"limit": 2});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let page = ok(&c, "phone_search", args).await;
        seen.extend(names(&page));
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["archivist", "billing", "invoice", "invoice-mail", "mailer"]
    );
    // Results never carry secrets.
    let r = ok(&c, "phone_search", json!({})).await;
    for agent in r["agents"].as_array().unwrap() {
        let mut keys: Vec<&str> = agent
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "description",
                "last_seen_at",
                "name",
                "project",
                "registered_at"
            ]
        );
    }
    app.stop().await;
}

/// A directory big enough for search to take common words from its samples
/// (every 32nd and 256th agent) while rare ones, names, small projects and
/// wordless projects still come from the whole directory.
#[tokio::test]
async fn search_at_scale_keeps_rare_matches_and_tiers() {
    let app = spawn_app().await;
    let c = app.client().await;
    // 3,000 agents that all mention reports, in two big projects.
    app.db()
        .await
        .execute(
            "INSERT INTO agents (name, description, project, token_hash)
             SELECT 'clerk-' || g, 'Files expense reports for the team.',
                    CASE WHEN g % 2 = 0 THEN 'north' ELSE 'south' END,
                    sha256(convert_to('clerk-' || g, 'UTF8'))
             FROM generate_series(1, 3000) g",
            &[],
        )
        .await
        .unwrap();
    // Ids 3001-3006: in no sample.
    register(&c, "reports-bot", "Answers questions", "north").await;
    register(&c, "flag-expert", "Files reports on vexillology", "south").await;
    register(&c, "ledger-a", "Tracks inventory levels", "Tiny").await;
    register(&c, "ledger-b", "Reconciles invoices", "tiny").await;
    register(&c, "the-one", "Files expense reports", "The").await;
    register(&c, "inventor", "Invents gadgets", "south").await;
    let names = |v: &Value| -> Vec<String> {
        v["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let search = |args: Value| {
        let c = &c;
        async move { names(&ok(c, "phone_search", args).await) }
    };

    // The one agent named after a common word comes first.
    assert_eq!(search(json!({"query": "reports"})).await[0], "reports-bot");
    // A rare conjunction of a common and a rare word; a rare prefix.
    assert_eq!(
        search(json!({"query": "reports vexillology"})).await[0],
        "flag-expert"
    );
    assert_eq!(search(json!({"query": "vexil"})).await, ["flag-expert"]);
    assert_eq!(
        search(json!({"query": "clerk-1234"})).await[0],
        "clerk-1234"
    );
    // Prefix matches within a small project, in any letter case.
    let mut n = search(json!({"query": "inv", "project": "TINY"})).await;
    n.sort();
    assert_eq!(n, ["ledger-a", "ledger-b"]);
    // A project whose name is only a stop word; a query of stop words.
    assert_eq!(
        search(json!({"query": "reports", "project": "the"})).await,
        ["the-one"]
    );
    assert!(
        search(json!({"query": "the", "project": "north"}))
            .await
            .is_empty()
    );
    // A common word within a big project, and a rare prefix there.
    let r = ok(
        &c,
        "phone_search",
        json!({"query": "reports", "project": "north", "limit": 50}),
    )
    .await;
    let agents = r["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 50);
    assert_eq!(agents[0]["name"], "reports-bot");
    assert!(agents.iter().all(|a| a["project"] == "north"), "{r}");
    assert_eq!(
        search(json!({"query": "invent", "project": "south"})).await,
        ["inventor"]
    );

    // Pages of a common word: full, never repeating, and they end.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({"query": "reports", "limit": 50});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let page = ok(&c, "phone_search", args).await;
        seen.extend(names(&page));
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a page repeated a result");
    assert!(seen.len() > 50, "{}", seen.len());
    app.stop().await;
}

#[tokio::test]
async fn hostile_search_text_is_only_data() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(&c, "billing", "Handles invoices", "finance").await;
    for query in [
        "foo & (",
        "!!!",
        "a:* | b <-> c",
        "'; DROP TABLE agents; --",
        "\" OR 1=1 --",
        "invoice')) OR true --",
        "\\",
        "the",
        "ü日本語",
        "%_",
        "$1",
        "billing & !",
    ] {
        let result = call(&c, "phone_search", json!({"query": query})).await;
        assert_ne!(result.is_error, Some(true), "{query:?}: {}", text(&result));
    }
    let r = ok(&c, "phone_search", json!({"query": "billing & !"})).await;
    assert_eq!(
        r["agents"][0]["name"], "billing",
        "operators are separators, words still match"
    );
    let r = ok(&c, "phone_search", json!({})).await;
    assert_eq!(
        r["agents"].as_array().unwrap().len(),
        1,
        "nothing was dropped"
    );
    app.stop().await;
}

#[tokio::test]
async fn replies_share_the_thread_and_only_participants_may_reply() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let eve = register(&c, "eve", "E", "p").await;

    let first = ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "one", "subject": "plan"})),
    )
    .await;
    let first_id = first["id"].as_str().unwrap();
    let second = ok(
        &c,
        "phone_send",
        b.with(json!({"reply_to": first_id, "body": "two"})),
    )
    .await;
    assert_eq!(second["to"], "alice");
    // The original sender may follow up on its own message too.
    let third = ok(
        &c,
        "phone_send",
        a.with(json!({"reply_to": second["id"], "body": "three"})),
    )
    .await;
    assert_eq!(third["to"], "bob");
    assert_eq!(third["thread_id"], first_id);
    let explicit = ok(
        &c,
        "phone_send",
        b.with(json!({"reply_to": third["id"], "to": "alice", "body": "four"})),
    )
    .await;
    assert_eq!(explicit["thread_id"], first_id);

    // A third agent cannot reply into the conversation, nor learn it exists.
    let err = tool_err(
        &c,
        "phone_send",
        eve.with(json!({"reply_to": first_id, "body": "hi"})),
    )
    .await;
    assert!(
        err.contains("not found among the messages you sent or received"),
        "{err}"
    );
    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"reply_to": "msg_999999", "body": "hi"})),
    )
    .await;
    assert!(err.contains("msg_999999 not found"), "{err}");
    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"reply_to": first_id, "to": "eve", "body": "hi"})),
    )
    .await;
    assert!(err.contains("conversation with 'bob'"), "{err}");
    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"reply_to": "42", "body": "hi"})),
    )
    .await;
    assert!(err.contains("not a message id"), "{err}");

    let bob_inbox = ok(&c, "phone_inbox", b.with(json!({}))).await;
    let threads: HashSet<&str> = bob_inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(threads, HashSet::from([first_id]));
    assert_eq!(bob_inbox["messages"][0]["subject"], "plan");
    app.stop().await;
}

#[tokio::test]
async fn idempotent_send_replays_instead_of_duplicating() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;

    let args = a.with(json!({"to": "bob", "body": "pay invoice 7", "idempotency_key": "inv-7"}));
    let first = ok(&c, "phone_send", args.clone()).await;
    let second = ok(&c, "phone_send", args.clone()).await;
    assert_eq!(first["replayed"], false);
    assert_eq!(second["replayed"], true);
    assert_eq!(first["id"], second["id"]);
    assert_eq!(first["sent_at"], second["sent_at"]);

    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "pay invoice 8", "idempotency_key": "inv-7"})),
    )
    .await;
    assert!(
        err.contains("already used for a different message"),
        "{err}"
    );
    // Keys are per sender: another agent may use the same key.
    let b = Agent {
        name: "bob".into(),
        token: bob.token,
    };
    let from_bob = ok(
        &c,
        "phone_send",
        b.with(json!({"to": "alice", "body": "pay invoice 7", "idempotency_key": "inv-7"})),
    )
    .await;
    assert_eq!(from_bob["replayed"], false);
    let count = app.count("SELECT count(*) FROM messages").await;
    assert_eq!(count, 2);
    app.stop().await;
}

#[tokio::test]
async fn concurrent_sends_with_one_idempotency_key_store_one_message() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    register(&c, "bob", "B", "p").await;

    let mut tasks = Vec::new();
    for _ in 0..16 {
        let client = app.client().await;
        let args = a.with(json!({"to": "bob", "body": "once", "idempotency_key": "k-1"}));
        tasks.push(tokio::spawn(async move {
            ok(&client, "phone_send", args).await
        }));
    }
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for t in tasks {
        let out = t.await.unwrap();
        ids.insert(out["id"].as_str().unwrap().to_owned());
        if out["replayed"] == false {
            fresh += 1;
        }
    }
    assert_eq!(ids.len(), 1, "every caller sees the same message");
    assert_eq!(fresh, 1, "exactly one call sent it");
    let count = app.count("SELECT count(*) FROM messages").await;
    assert_eq!(count, 1);
    app.stop().await;
}

#[tokio::test]
async fn inbox_marks_read_peeks_and_shows_history() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    for i in 0..5 {
        ok(
            &c,
            "phone_send",
            a.with(json!({"to": "bob", "body": format!("m{i}")})),
        )
        .await;
    }
    let bodies = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned())
            .collect()
    };

    let peek = ok(&c, "phone_inbox", b.with(json!({"peek": true, "limit": 2}))).await;
    assert_eq!(bodies(&peek), ["m0", "m1"]);
    assert!(peek["messages"][0]["read_at"].is_null());
    assert_eq!(
        peek["unread_remaining"], 5,
        "a peek leaves everything waiting"
    );

    let first = ok(&c, "phone_inbox", b.with(json!({"limit": 2}))).await;
    assert_eq!(bodies(&first), ["m0", "m1"], "oldest unread first");
    assert_eq!(first["unread_remaining"], 3);
    let rest = ok(&c, "phone_inbox", b.with(json!({"limit": 10}))).await;
    assert_eq!(bodies(&rest), ["m2", "m3", "m4"]);
    assert_eq!(rest["unread_remaining"], 0);

    ok(&c, "phone_send", a.with(json!({"to": "bob", "body": "m5"}))).await;
    // History: newest first, read and unread, and it marks nothing.
    let history = ok(
        &c,
        "phone_inbox",
        b.with(json!({"include_read": true, "limit": 3})),
    )
    .await;
    assert_eq!(bodies(&history), ["m5", "m4", "m3"]);
    assert!(history["messages"][0]["read_at"].is_null());
    assert!(history["messages"][1]["read_at"].is_string());
    assert_eq!(history["unread_remaining"], 1);
    let last = ok(&c, "phone_inbox", b.with(json!({}))).await;
    assert_eq!(bodies(&last), ["m5"]);
    // Alice's inbox holds none of it.
    let alice = ok(&c, "phone_inbox", a.with(json!({"include_read": true}))).await;
    assert!(alice["messages"].as_array().unwrap().is_empty());
    app.stop().await;
}

#[tokio::test]
async fn unread_remaining_is_capped_at_one_hundred() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let db = app.db().await;
    // A backlog far larger than the cap, written directly for speed.
    db.execute(
        "INSERT INTO messages (sender_id, recipient_id, body, thread_id)
         SELECT s.id, r.id, 'bulk ' || g, 0 FROM agents s, agents r, generate_series(1, 250) g
         WHERE s.name = 'alice' AND r.name = 'bob'",
        &[],
    )
    .await
    .unwrap();
    let out = ok(&c, "phone_inbox", b.with(json!({"limit": 100}))).await;
    assert_eq!(out["messages"].as_array().unwrap().len(), 100);
    assert_eq!(out["unread_remaining"], 100, "100 means 100 or more");
    let out = ok(&c, "phone_inbox", b.with(json!({"limit": 100}))).await;
    assert_eq!(out["unread_remaining"], 50);
    app.stop().await;
}

/// A poll that takes mail stops at 32 KiB of text: always one message,
/// then each while those before it hold less. What it leaves stays
/// unread (or unleased) for the next poll, and the text says why the
/// answer is short. Without it, a hundred messages of 64 KiB were one
/// 13 MB answer, marked read, that no model reads whole.
#[tokio::test]
async fn a_poll_stops_at_its_byte_budget_and_leaves_the_rest_for_the_next() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let send = |body: String| {
        let args = alice.with(json!({"to": "bob", "body": body}));
        let c = &c;
        async move { ok(c, "phone_send", args).await }
    };
    for i in 0..5 {
        send(format!("{i}{}", "x".repeat(20_000))).await;
    }
    let firsts = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap()[..1].to_owned())
            .collect()
    };
    let poll = |args: Value| {
        let args = bob.with(args);
        let c = &c;
        async move {
            let called = call(c, "phone_inbox", args).await;
            (called.structured_content.clone().unwrap(), text(&called))
        }
    };
    // 20 kB each: the second starts below 32 KiB, the third would not.
    let (first, said) = poll(json!({"limit": 10})).await;
    assert_eq!(firsts(&first), ["0", "1"], "{said}");
    assert_eq!(first["unread_remaining"], 3);
    assert!(said.contains("stops here, past 32 KiB"), "{said}");
    // In lease mode too; what the reads left was never touched.
    let (leased, said) = poll(json!({"mode": "lease", "limit": 10})).await;
    assert_eq!(firsts(&leased), ["2", "3"], "{said}");
    assert_eq!(leased["messages"][0]["delivery_count"], 1);
    assert_eq!(leased["unread_remaining"], 1);
    assert!(said.contains("stops here"), "{said}");
    let (last, said) = poll(json!({"limit": 10})).await;
    assert_eq!(firsts(&last), ["4"]);
    assert_eq!(last["unread_remaining"], 0);
    assert!(!said.contains("stops here"), "{said}");

    // One message alone may be as large as a body may be; the next waits.
    send("b".repeat(64 * 1024)).await;
    send("small".into()).await;
    let (alone, said) = poll(json!({"mode": "lease", "limit": 10})).await;
    assert_eq!(firsts(&alone), ["b"], "{said}");
    assert_eq!(alone["unread_remaining"], 1);
    // A message that dies in a poll (leased too often) is not in its answer
    // and takes none of its budget: the small one behind it comes.
    app.db()
        .await
        .batch_execute("UPDATE messages SET leased_until = now() - interval '1 second' WHERE leased_until IS NOT NULL")
        .await
        .unwrap();
    let (after, said) = poll(json!({"mode": "lease", "limit": 10, "max_deliveries": 1})).await;
    let bodies: Vec<&str> = after["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert!(bodies.contains(&"small"), "{said}");
    assert!(!said.contains("stops here"), "{said}");
    app.stop().await;
}

/// Answers that take nothing and page on with a cursor stop at the same
/// 32 KiB of text as a poll: include_read, a thread, a search of one's mail
/// and the outbox. The next page starts after the last message shown, and
/// the text says where the rest are. A peek keeps every message (the hooks
/// look among its 100 for what is new) but shows bodies only within the
/// budget: past it, a message's size.
/// Without it, a thread of a hundred 64 KiB messages was one answer of
/// 6.4 MB of text, twice over (text and structured content).
#[tokio::test]
async fn answers_that_take_nothing_stop_at_the_byte_budget() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    // A thread of five 20 kB messages, alice and bob in turn.
    let long = |i: usize| format!("{i} albatross {}", "word ".repeat(4_000));
    let first = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": long(0)})),
    )
    .await;
    let first = first["id"].as_str().unwrap().to_owned();
    let mut last = first.clone();
    for i in 1..5 {
        let who = if i % 2 == 1 { &bob } else { &alice };
        let sent = ok(
            &c,
            "phone_send",
            who.with(json!({"reply_to": last, "body": long(i)})),
        )
        .await;
        last = sent["id"].as_str().unwrap().to_owned();
    }
    let firsts =
        |v: &Value| -> Vec<String> { bodies(v).iter().map(|b| b[..1].to_owned()).collect() };
    let look = |who: &Agent, tool: &'static str, args: Value| {
        let args = who.with(args);
        let c = &c;
        async move {
            let called = call(c, tool, args).await;
            assert_ne!(called.is_error, Some(true), "{}", text(&called));
            (called.structured_content.clone().unwrap(), text(&called))
        }
    };

    // Bob's inbox holds 0, 2 and 4.
    let (peeked, said) = look(&bob, "phone_inbox", json!({"peek": true, "limit": 10})).await;
    let listed = peeked["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{said}");
    assert_eq!(
        listed
            .iter()
            .map(|m| m["body"]
                .as_str()
                .unwrap()
                .get(..1)
                .unwrap_or("")
                .to_owned())
            .collect::<Vec<_>>(),
        ["0", "2", ""],
        "{said}"
    );
    assert_eq!(listed[2]["body_omitted_bytes"], long(4).len());
    assert!(!said.contains("stops here"), "{said}");
    assert!(
        said.contains("is not shown: this peek shows bodies up to 32 KiB"),
        "{said}"
    );
    let (history, said) = look(
        &bob,
        "phone_inbox",
        json!({"include_read": true, "limit": 10}),
    )
    .await;
    assert_eq!(firsts(&history), ["4", "2"], "{said}");
    assert!(said.contains("stops here, past 32 KiB"), "{said}");
    let cursor = history["next_cursor"].clone();
    let (older, said) = look(
        &bob,
        "phone_inbox",
        json!({"include_read": true, "limit": 10, "cursor": cursor}),
    )
    .await;
    assert_eq!(firsts(&older), ["0"], "{said}");
    assert!(older["next_cursor"].is_null(), "{older}");

    // A thread, page by page: each stops at the budget.
    let mut pages = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let mut args = json!({"message_id": first, "limit": 10});
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let (page, said) = look(&alice, "phone_thread", args).await;
        let more = !page["next_cursor"].is_null();
        assert_eq!(said.contains("stops here"), more, "{said}");
        pages.push(firsts(&page));
        cursor = page["next_cursor"].clone();
        if !more {
            break;
        }
        assert!(pages.len() < 5, "the pages never end: {pages:?}");
    }
    assert_eq!(pages, [vec!["0", "1"], vec!["2", "3"], vec!["4"]]);

    // A search of alice's mail (all five are hers, sent or received).
    let mut found = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..5 {
        let mut args = json!({"query": "albatross", "limit": 10});
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let (page, said) = look(&alice, "phone_inbox", args).await;
        assert!(firsts(&page).len() <= 2, "{said}");
        found.extend(firsts(&page));
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            assert!(!said.contains("stops here"), "{said}");
            break;
        }
        assert!(said.contains("stops here"), "{said}");
    }
    found.sort();
    assert_eq!(found, ["0", "1", "2", "3", "4"]);
    // Short messages are not cut: the whole page, as before.
    let carol = register(&c, "carol", "C", "p").await;
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "carol", "body": format!("short {i}")})),
        )
        .await;
    }
    let (found, said) = look(
        &carol,
        "phone_inbox",
        json!({"query": "short", "limit": 10}),
    )
    .await;
    assert_eq!(bodies(&found).len(), 3, "{said}");
    assert!(found["next_cursor"].is_null(), "{found}");
    assert!(!said.contains("stops here"), "{said}");
    // Alice's outbox, newest first: its result carries the bodies.
    let (sent, said) = look(&alice, "phone_outbox", json!({"limit": 10})).await;
    assert_eq!(firsts(&sent), ["s", "s", "s", "4", "2"], "{said}");
    assert!(said.contains("stops here"), "{said}");
    let cursor = sent["next_cursor"].clone();
    assert!(cursor.is_string(), "{sent}");
    let (rest, _) = look(
        &alice,
        "phone_outbox",
        json!({"limit": 10, "cursor": cursor}),
    )
    .await;
    assert_eq!(firsts(&rest), ["0"]);
    assert!(rest["next_cursor"].is_null(), "{rest}");
    app.stop().await;
}

/// include_read is where the mail of a poll whose answer was lost is found
/// (the error of such a poll says so). A poll fills its budget oldest
/// first, the history newest first: a history page may show less than one
/// poll took, and its cursor goes on until every message is shown. Pages
/// of short mail go on by `limit`, and the last one says no more.
#[tokio::test]
async fn include_read_pages_back_through_everything_a_poll_took() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    for (name, size) in [("a", 1_000), ("b", 30_000), ("c", 64_000)] {
        let body = format!("{name}{}", "x".repeat(size - 1));
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": body})),
        )
        .await;
    }
    let took = ok(&c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
    let firsts =
        |v: &Value| -> Vec<String> { bodies(v).iter().map(|b| b[..1].to_owned()).collect() };
    assert_eq!(firsts(&took), ["a", "b", "c"]);
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..5 {
        let mut args = json!({"include_read": true, "limit": 10});
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let page = ok(&c, "phone_inbox", bob.with(args)).await;
        seen.extend(firsts(&page));
        cursor = page["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(seen, ["c", "b", "a"]);

    // Short mail: pages of `limit`.
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": format!("s{i}")})),
        )
        .await;
    }
    let page = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"include_read": true, "limit": 2})),
    )
    .await;
    assert_eq!(bodies(&page), ["s2", "s1"]);
    let page = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"include_read": true, "limit": 2, "cursor": page["next_cursor"]})),
    )
    .await;
    assert_eq!(firsts(&page), ["s", "c"]);
    // Another tool's cursor (which pages its own way) is refused.
    let sent = ok(&c, "phone_outbox", alice.with(json!({"limit": 1}))).await;
    let err = tool_err(
        &c,
        "phone_inbox",
        bob.with(json!({"include_read": true, "cursor": sent["next_cursor"]})),
    )
    .await;
    assert!(err.contains("not a cursor of include_read"), "{err}");
    // Hostile cursors are refused, not read as a place to start.
    for bad in [
        "",
        "x!",
        "aDotMQ",
        "aDo5OTk5OTk5OTk5OTk5OTk5OTk5OTk5",
        &"h".repeat(5000),
    ] {
        let err = tool_err(
            &c,
            "phone_inbox",
            bob.with(json!({"include_read": true, "cursor": bad})),
        )
        .await;
        assert!(err.contains("cursor"), "{bad:?}: {err}");
    }
    // A cursor pages include_read or a search, nothing else.
    let err = tool_err(
        &c,
        "phone_inbox",
        bob.with(json!({"peek": true, "cursor": page["next_cursor"]})),
    )
    .await;
    assert!(err.contains("include_read"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn four_concurrent_pollers_get_every_message_exactly_once() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    const TOTAL: usize = 200;

    let sender = {
        let client = app.client().await;
        let a_args = a.with(json!({}));
        tokio::spawn(async move {
            for i in 0..TOTAL {
                let mut args = a_args.clone();
                args["to"] = json!("bob");
                args["body"] = json!(format!("n{i}"));
                ok(&client, "phone_send", args).await;
            }
        })
    };
    let mut pollers = Vec::new();
    for _ in 0..4 {
        let client = app.client().await;
        let args = b.with(json!({"limit": 7}));
        pollers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut empty_in_a_row = 0;
            // Bounded: at most 2,000 polls each.
            for _ in 0..2000 {
                let out = ok(&client, "phone_inbox", args.clone()).await;
                let batch = out["messages"].as_array().unwrap();
                if batch.is_empty() {
                    empty_in_a_row += 1;
                    if empty_in_a_row > 20 {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                } else {
                    empty_in_a_row = 0;
                    got.extend(batch.iter().map(|m| m["id"].as_str().unwrap().to_owned()));
                }
            }
            got
        }));
    }
    sender.await.unwrap();
    let mut all = Vec::new();
    for p in pollers {
        all.extend(p.await.unwrap());
    }
    // Whatever the pollers left (if they gave up early) is still waiting.
    let leftover = ok(&c, "phone_inbox", b.with(json!({"limit": 100}))).await;
    all.extend(
        leftover["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned()),
    );
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a message was delivered twice");
    assert_eq!(all.len(), TOTAL, "every message delivered");
    app.stop().await;
}

/// Concurrent sends on one replica share statements and commits (group
/// commit); each caller must still get exactly its own outcome, and one
/// refused send must not fail the others.
#[tokio::test]
async fn concurrent_sends_each_get_their_own_outcome() {
    let app = spawn_app().await;
    let c = app.client().await;
    let mut senders = Vec::new();
    for i in 0..8 {
        senders.push(register(&c, &format!("sender-{i}"), "Sends", "p").await);
    }
    let inbox = register(&c, "inbox", "Receives", "p").await;
    let original = ok(
        &c,
        "phone_send",
        inbox.with(json!({"to": "sender-4", "body": "original"})),
    )
    .await;
    let original_id = original["id"].as_str().unwrap().to_owned();

    const ROUNDS: usize = 8;
    let clients: Vec<_> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    let calls = (0..ROUNDS * 8).map(|i| {
        let (kind, round) = (i % 8, i / 8);
        let me = &senders[kind];
        let args = match kind {
            0 => me.with(json!({"to": format!("nobody-{round}"), "body": "lost"})),
            1 => json!({"name": me.name, "token": format!("phn_{}", "x".repeat(43)), "to": "inbox", "body": "forged"}),
            // The same message under one key, sent 8 times at once.
            2 => me.with(json!({"to": "inbox", "body": "same", "idempotency_key": "k-same"})),
            // Different messages under one key: one wins, the rest conflict.
            3 => me.with(json!({"to": "inbox", "body": format!("v{round}"), "idempotency_key": "k-clash"})),
            4 => me.with(json!({"reply_to": original_id, "body": format!("reply {round}")})),
            _ => me.with(json!({"to": "inbox", "body": format!("plain {kind}.{round}")})),
        };
        let client = &clients[i % clients.len()];
        async move { (kind, round, call(client, "phone_send", args).await) }
    });
    let results = futures_util::future::join_all(calls).await;

    let mut same_ids = HashSet::new();
    let (mut same_fresh, mut clash_won) = (0, 0);
    let mut plain_ids = HashSet::new();
    for (kind, round, result) in &results {
        let failed = result.is_error == Some(true);
        let body = result.structured_content.clone().unwrap_or_default();
        match kind {
            0 => assert!(
                text(result).contains(&format!("no agent named 'nobody-{round}'")),
                "{}",
                text(result)
            ),
            1 => assert!(failed && text(result).contains("token"), "{}", text(result)),
            2 => {
                assert!(!failed, "{}", text(result));
                same_ids.insert(body["id"].as_str().unwrap().to_owned());
                if body["replayed"] == false {
                    same_fresh += 1;
                }
            }
            3 if failed => assert!(
                text(result).contains("already used for a different message"),
                "{}",
                text(result)
            ),
            3 => clash_won += 1,
            4 => {
                assert!(!failed, "{}", text(result));
                assert_eq!(body["to"], "inbox");
                assert_eq!(body["thread_id"], original_id);
            }
            _ => {
                assert!(!failed, "{}", text(result));
                assert_eq!(body["to"], "inbox");
                assert!(plain_ids.insert(body["id"].as_str().unwrap().to_owned()));
            }
        }
    }
    assert_eq!(same_ids.len(), 1, "one message for one key");
    assert_eq!(same_fresh, 1, "the others are replays");
    assert_eq!(clash_won, 1, "one message per key");
    assert_eq!(plain_ids.len(), 3 * ROUNDS);

    // What is stored is what the callers were told, body for body.
    let db = app.db().await;
    for (kind, round, result) in &results {
        if *kind < 5 || result.is_error == Some(true) {
            continue;
        }
        let id: i64 = result.structured_content.as_ref().unwrap()["id"]
            .as_str()
            .unwrap()
            .trim_start_matches("msg_")
            .parse()
            .unwrap();
        let row = db
            .query_one(
                "SELECT s.name, m.body FROM messages m JOIN agents s ON s.id = m.sender_id WHERE m.id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), format!("sender-{kind}"));
        assert_eq!(row.get::<_, &str>(1), format!("plain {kind}.{round}"));
    }
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE body IN ('lost', 'forged')")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE body LIKE 'reply %'")
            .await,
        ROUNDS as i64
    );
    // Sends that were in flight together were written by one statement
    // (one transaction, one `now()`): the batching this test is about.
    assert!(
        app.count("SELECT count(*) FROM (SELECT sent_at FROM messages GROUP BY sent_at HAVING count(*) > 1) t")
            .await
            > 0,
        "no two sends shared a statement"
    );
}

/// Read polls in flight together share a statement too: each poller gets
/// only its own inbox's messages, every message exactly once.
#[tokio::test]
async fn concurrent_polls_of_many_inboxes_each_get_their_own_mail() {
    let app = spawn_app().await;
    let c = app.client().await;
    let sender = register(&c, "sender", "Sends", "p").await;
    let mut inboxes = Vec::new();
    for i in 0..16 {
        let agent = register(&c, &format!("inbox-{i}"), "Receives", "p").await;
        for n in 0..5 {
            ok(
                &c,
                "phone_send",
                sender.with(json!({"to": agent.name, "body": format!("{} #{n}", agent.name)})),
            )
            .await;
        }
        inboxes.push(agent);
    }
    let clients: Vec<_> = futures_util::future::join_all((0..8).map(|_| app.client())).await;
    // Two polls per inbox at once (limit 3 of 5), and a forged token among them.
    let polls = inboxes
        .iter()
        .chain(inboxes.iter())
        .enumerate()
        .map(|(i, agent)| {
            let client = &clients[i % clients.len()];
            let args = agent.with(json!({"limit": 3}));
            async move { (agent.name.clone(), call(client, "phone_inbox", args).await) }
        });
    let forged = call(
        &clients[0],
        "phone_inbox",
        json!({"name": "inbox-0", "token": format!("phn_{}", "y".repeat(43))}),
    );
    let (results, forged) = tokio::join!(futures_util::future::join_all(polls), forged);
    assert_eq!(forged.is_error, Some(true), "{}", text(&forged));

    let mut got: std::collections::HashMap<String, Vec<String>> = Default::default();
    for (name, result) in &results {
        assert_ne!(result.is_error, Some(true), "{}", text(result));
        let out = result.structured_content.as_ref().unwrap();
        for m in out["messages"].as_array().unwrap() {
            assert_eq!(m["to"], name.as_str(), "someone else's mail");
            assert!(
                m["body"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{name} #"))
            );
            got.entry(name.clone())
                .or_default()
                .push(m["id"].as_str().unwrap().to_owned());
        }
    }
    for agent in &inboxes {
        let ids = got.remove(&agent.name).unwrap_or_default();
        let unique: HashSet<_> = ids.iter().collect();
        assert_eq!(
            unique.len(),
            ids.len(),
            "a message delivered twice to {}",
            agent.name
        );
        assert_eq!(
            ids.len(),
            5,
            "{} got {} of its 5 messages",
            agent.name,
            ids.len()
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE read_at IS NULL")
            .await,
        0
    );
    // Polls of different inboxes went together (one statement, one `now()`).
    assert!(
        app.count(
            "SELECT count(*) FROM (SELECT read_at FROM messages GROUP BY read_at
             HAVING count(DISTINCT recipient_id) > 1) t"
        )
        .await
            > 0,
        "no two polls shared a statement"
    );
}

/// An agent that never polls piles up mail. The other inboxes must still be
/// read through the inbox indexes, not by walking `messages`: with generic
/// plans (what a busy server runs) and statistics that say one inbox holds
/// most unread mail, the poll once hash-joined the whole table and counted
/// unread mail with a sequential scan. Counted with PostgreSQL's own scan
/// statistics, not timed.
#[tokio::test]
async fn one_inbox_with_a_huge_backlog_leaves_the_others_on_their_indexes() {
    let database_url = fresh_database().await;
    let name = database_url.rsplit('/').next().unwrap();
    // The plans a server settles on after a few executions, from the first.
    connect(&database_url)
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET plan_cache_mode = force_generic_plan"
        ))
        .await
        .unwrap();
    let app = spawn_app_on(&database_url, &[]).await;
    let c = app.client().await;
    let hoarder = register(&c, "hoarder", "Never reads its mail", "p").await;
    let writer = register(&c, "writer", "Writes a lot", "p").await;
    let reader = register(&c, "reader", "Reads promptly", "p").await;
    // The reader's own sends come before the pile: newest first, its outbox
    // lies behind all of it in primary-key order.
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            reader.with(json!({"to": "writer", "body": format!("early {i}")})),
        )
        .await;
    }
    let db = app.db().await;
    db.batch_execute(
        "INSERT INTO messages (id, sender_id, recipient_id, body, thread_id)
         SELECT x.n, w.id, h.id, 'unread ' || x.n, x.n
         FROM agents w, agents h,
              (SELECT nextval('messages_id_seq') AS n FROM generate_series(1, 30000)) x
         WHERE w.name = 'writer' AND h.name = 'hoarder';
         ANALYZE messages;",
    )
    .await
    .unwrap();
    let _ = &hoarder;

    let before = messages_scans_from_zero(&db).await;

    let mut read = 0;
    for round in 0..8 {
        for i in 0..3 {
            ok(
                &c,
                "phone_send",
                writer.with(json!({"to": "reader", "body": format!("r{round} m{i}")})),
            )
            .await;
        }
        let peeked = ok(&c, "phone_inbox", reader.with(json!({"peek": true}))).await;
        assert_eq!(peeked["messages"].as_array().unwrap().len(), 3, "{peeked}");
        let leased = ok(
            &c,
            "phone_inbox",
            reader.with(json!({"mode": "lease", "limit": 1})),
        )
        .await;
        assert_eq!(leased["messages"].as_array().unwrap().len(), 1, "{leased}");
        let got = ok(&c, "phone_inbox", reader.with(json!({"limit": 10}))).await;
        read += got["messages"].as_array().unwrap().len();
        let history = ok(
            &c,
            "phone_inbox",
            reader.with(json!({"include_read": true, "limit": 5})),
        )
        .await;
        assert_eq!(
            history["messages"].as_array().unwrap().len(),
            5.min(3 * (round + 1))
        );
        let outbox = ok(&c, "phone_outbox", reader.with(json!({"limit": 5}))).await;
        assert_eq!(outbox["messages"].as_array().unwrap().len(), 3, "{outbox}");
    }
    // The leased ones come back after their lease; the rest were read.
    assert_eq!(read, 16);

    let (seq, idx, fetched) = messages_scans_after(&db, before, 8 * 5).await;
    assert_eq!(
        seq, 0,
        "polls scanned the whole messages table ({idx} index scans)"
    );
    // 48 calls that each touch a few messages; one walk past the pile
    // fetches 30,000 rows.
    assert!(
        fetched < 5_000,
        "calls walked an index through the pile: {fetched} rows fetched"
    );
    app.stop().await;
}

/// The server keeps its statements' plans for as long as it keeps its
/// connections, and PostgreSQL re-plans them only when the statistics
/// change: a plan made while `messages` was empty (a new deployment, the
/// first seconds of a benchmark) must not scan the whole table once it
/// holds thousands of messages (seen in `make bench`: the first phase's
/// polls read every page of `messages`, slower by the second).
#[tokio::test]
async fn plans_made_on_an_empty_mailbox_still_use_the_indexes_once_it_fills() {
    let database_url = fresh_database().await;
    let name = database_url.rsplit('/').next().unwrap();
    let setup = connect(&database_url).await;
    setup
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET plan_cache_mode = force_generic_plan"
        ))
        .await
        .unwrap();
    let app = spawn_app_on(&database_url, &[("PHONE_POOL_SIZE", "2")]).await;
    let db = app.db().await;
    // Statistics of the empty table, and no autovacuum to refresh them.
    db.batch_execute(
        "ALTER TABLE messages SET (autovacuum_enabled = false);
         ANALYZE messages, agents;",
    )
    .await
    .unwrap();
    let c = app.client().await;
    let alice = register(&c, "alice", "Sends", "p").await;
    let bob = register(&c, "bob", "Reads", "p").await;
    let round = |i: usize| {
        let (c, alice, bob) = (&c, &alice, &bob);
        async move {
            ok(
                c,
                "phone_send",
                alice.with(json!({"to": "bob", "body": format!("m{i}")})),
            )
            .await;
            let got = ok(c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
            assert_eq!(got["messages"].as_array().unwrap().len(), 1, "{got}");
        }
    };
    // Every pooled connection plans the statements on the empty table.
    for i in 0..6 {
        round(i).await;
    }
    // History neither poll needs arrives (alice's notes to herself, read);
    // nothing refreshes the statistics.
    db.batch_execute(
        "INSERT INTO messages (id, sender_id, recipient_id, body, thread_id, read_at)
         SELECT x.n, a.id, a.id, 'old ' || x.n, x.n, now()
         FROM agents a,
              (SELECT nextval('messages_id_seq') AS n FROM generate_series(1, 30000)) x
         WHERE a.name = 'alice'",
    )
    .await
    .unwrap();

    let before = messages_scans_from_zero(&db).await;
    for i in 0..8 {
        round(i).await;
    }
    let (seq, idx, fetched) = messages_scans_after(&db, before, 8).await;
    assert_eq!(
        seq, 0,
        "sends and polls scanned the whole messages table ({idx} index scans)"
    );
    assert!(fetched < 1_000, "{fetched} rows fetched for 16 calls");
    app.stop().await;
}

/// Sends and polls of a replica share one statement at a time (group
/// commit). One stuck on a row lock must not hold up everybody else's mail
/// on that replica until its lock timeout: the calls behind it start a
/// batch of their own, and the stuck call still completes afterwards.
#[tokio::test]
async fn a_call_stuck_on_a_lock_does_not_hold_up_the_others() {
    // A call may wait 5 s for its turn: calls that waited for the stuck one
    // would fail. The stuck call gives up only after 30 s, long after the
    // others are done however loaded the machine (with 3 s, four calls on
    // a loaded machine could outlast it, and the test would fail).
    let app = spawn_app_on(
        &fresh_database().await,
        &[
            ("PHONE_STATEMENT_TIMEOUT_MS", "30000"),
            ("PHONE_POOL_TIMEOUT_MS", "5000"),
        ],
    )
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let carol = register(&c, "carol", "C", "p").await;
    let (lock, stuck) = send_held_by_a_row_lock(
        &app,
        &alice,
        alice.with(json!({"to": "carol", "body": "stuck"})),
    )
    .await;

    // Meanwhile bob and carol exchange mail on the same replica.
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            bob.with(json!({"to": "carol", "body": format!("b{i}")})),
        )
        .await;
    }
    let got = ok(&c, "phone_inbox", carol.with(json!({"limit": 10}))).await;
    let bodies: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["b0", "b1", "b2"], "{got}");
    assert!(
        !stuck.is_finished(),
        "alice's send ended (lock timeout) before the others went through: they waited for it"
    );

    lock.batch_execute("COMMIT").await.unwrap();
    let sent = stuck.await.unwrap();
    let got = ok(&c, "phone_inbox", carol.with(json!({"limit": 10}))).await;
    assert_eq!(got["messages"][0]["id"], sent["id"], "{got}");
    assert_eq!(got["messages"][0]["body"], "stuck", "{got}");
}

/// How often the mail statement was planned and run in this test's
/// database.
async fn mail_statement_plans(db: &tokio_postgres::Client) -> (i64, i64) {
    statements_like(db, "WITH woken AS%")
        .await
        .iter()
        .fold((0, 0), |(plans, calls), x| {
            (plans + x.plans, calls + x.calls)
        })
}

/// The mail statement (every shape runs through `query_generic`; this test
/// sends, so its shape for sends) runs on its generic plan, also
/// after the statistics change. PostgreSQL compares a new generic plan's
/// cost with the average of the custom plans a connection made before;
/// made while `messages` was small, that average stays below the generic
/// plan of a grown table, and every batch was planned again (~3 ms each, more
/// than the statement runs) until enough custom plans had raised it, longer
/// with each growth. `make bench` saw it after an autovacuum ANALYZE: 852
/// plans in one run, a third fewer group sends in that round.
#[tokio::test]
async fn the_mail_statement_keeps_its_generic_plan_as_the_table_grows() {
    let app = spawn_app_with(&[("PHONE_POOL_SIZE", "2")]).await;
    let c = app.client().await;
    let db = app.db().await;
    // Plans are counted only with track_planning (scripts/pg.sh sets it).
    let tracked: String = db
        .query_one(
            "SELECT current_setting('pg_stat_statements.track_planning')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tracked, "on", "pg_stat_statements.track_planning");
    // Only this test's ANALYZE changes the statistics while it counts.
    db.batch_execute("ALTER TABLE messages SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let alice = register(&c, "alice", "A", "p").await;
    let _bob = register(&c, "bob", "B", "p").await;
    let send = async |n: usize| {
        for i in 0..n {
            ok(
                &c,
                "phone_send",
                alice.with(json!({"to": "bob", "body": format!("note {i}")})),
            )
            .await;
        }
    };
    // Each connection's first plans, on a table of a few rows.
    send(20).await;
    // The table grows past them (a backlog of unread mail, outside the
    // search index) and is analysed, as autovacuum does.
    db.batch_execute(
        "INSERT INTO messages (sender_id, recipient_id, body, thread_id, group_id, sent_at)
         SELECT b.id, a.id, 'old', -g, -1, now() - interval '1 day'
         FROM agents a, agents b, generate_series(1, 60000) g
         WHERE a.name = 'alice' AND b.name = 'bob'",
    )
    .await
    .unwrap();
    db.batch_execute("VACUUM ANALYZE messages").await.unwrap();
    let (plans, calls) = mail_statement_plans(&db).await;
    send(30).await;
    let (plans_after, calls_after) = mail_statement_plans(&db).await;
    let (planned, ran) = (plans_after - plans, calls_after - calls);
    eprintln!("after the ANALYZE: {planned} plans for {ran} executions");
    assert!(
        ran >= 30,
        "{ran} executions of the mail statement for 30 sends"
    );
    // A new generic plan per connection (two; the ANALYZE invalidated
    // each), with room for each to be replaced once; at least one, or
    // nothing was counted.
    assert!(
        (1..=4).contains(&planned),
        "{planned} plans for {ran} executions"
    );
    app.stop().await;
}

/// The shapes of the mail statement that ran in this test's database
/// (executions that failed are not counted), sorted: (stores sends, takes
/// read polls' mail, leases).
async fn mail_statement_shapes(db: &tokio_postgres::Client) -> Vec<(bool, bool, bool)> {
    let mut shapes: Vec<_> = statements_like(db, "WITH woken AS%")
        .await
        .iter()
        .filter(|x| x.calls > 0)
        .map(|x| {
            (
                x.query.contains("INSERT INTO messages"),
                x.query.contains("read_taken AS"),
                x.query.contains("lease_taken AS"),
            )
        })
        .collect();
    shapes.sort();
    shapes
}

/// A batch's statement holds only the parts its calls use: every part of a
/// statement is set up on each execution, whether it runs or not (in
/// pgbench, a read poll alone took 0.46 ms in the statement for
/// everything and 0.21 ms in its own; bench/RESULTS.md). Calls made one at
/// a time are batches of one: a send, a read poll and a lease poll each run
/// a statement without the others' parts.
#[tokio::test]
async fn a_batch_runs_only_the_parts_of_the_mail_statement_its_calls_use() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    for i in 0..2 {
        let body = format!("note {i}");
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": body})),
        )
        .await;
    }
    let read = ok(&c, "phone_inbox", bob.with(json!({"limit": 1}))).await;
    assert_eq!(read["messages"][0]["body"], "note 0", "{read}");
    let leased = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"limit": 1, "mode": "lease", "lease_seconds": 60})),
    )
    .await;
    assert_eq!(leased["messages"][0]["body"], "note 1", "{leased}");
    // The sends alone, the read poll alone, the lease poll with the read
    // polls' part (a batch with a lease poll may hold read polls too).
    assert_eq!(
        mail_statement_shapes(&db).await,
        [
            (false, true, false),
            (false, true, true),
            (true, false, false)
        ]
    );
    app.stop().await;
}

/// A poll hands out its messages oldest first, whatever order the
/// statement's rows come back in (it sorts none of them).
#[tokio::test]
async fn a_poll_hands_out_its_messages_oldest_first() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    for i in 0..5 {
        let body = format!("note {i}");
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": body})),
        )
        .await;
    }
    let read = ok(&c, "phone_inbox", bob.with(json!({"limit": 3}))).await;
    assert_eq!(bodies(&read), ["note 0", "note 1", "note 2"], "{read}");
    let leased = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"limit": 3, "mode": "lease", "lease_seconds": 60})),
    )
    .await;
    assert_eq!(bodies(&leased), ["note 3", "note 4"], "{leased}");
    app.stop().await;
}

/// Every shape of the mail statement a batch can run prepares, plans and
/// does its work: a send's copies stored (two where the shape takes
/// groups), a poll answered, an acknowledgement decided. A broken shape
/// would not fail its calls (a refused batch runs again call by call, in
/// shapes of one), only slow them, so the usual tests, which mostly run
/// batches of one, would not see it.
#[tokio::test]
async fn every_shape_of_the_mail_statement_runs() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    register(&c, "carol", "C", "p").await;
    let recipients: Vec<i64> = db
        .query_one(
            "SELECT array_agg(id ORDER BY id) FROM agents WHERE name IN ('bob', 'carol')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let digest = |token: &str| Sha256::digest(token.as_bytes()).to_vec();
    let shapes = phone::store::every_mail_statement();
    // Sends: none, or with or without keys, groups and quotas (9); polls:
    // none, or with or without leases and acknowledgements (5); not neither.
    assert_eq!(shapes.len(), 9 * 5 - 1);
    for (n, (sql, types)) in shapes.into_iter().enumerate() {
        let (sends, polls) = (sql.contains("sreq AS"), sql.contains("preq AS"));
        let (leases, acks) = (sql.contains("lease_taken AS"), sql.contains("areq AS"));
        let keyed = sql.contains(phone::store::KEYED_INSERT);
        let quotas = sql.contains("hour_counted AS");
        // A send to bob, and to carol too where the shape takes groups.
        let windowed = sql.contains("WINDOW same_send");
        let to: &[&str] = match (sends, windowed) {
            (false, _) => &[],
            (true, false) => &["bob"],
            (true, true) => &["bob", "carol"],
        };
        let one = |yes: bool| usize::from(yes);
        let quota = if quotas { 1000 } else { 0 };
        let keys: Vec<Option<String>> = to
            .iter()
            .map(|name| {
                keyed.then(|| phone::store::copy_key(&format!("shape-{n}"), name, to.len()))
            })
            .collect();
        let other_keys: Vec<Option<String>> = to
            .iter()
            .map(|name| {
                keyed.then(|| phone::store::other_copy_key(&format!("shape-{n}"), name, to.len()))
            })
            .collect();
        let stmt = db.prepare_typed(sql, types).await.unwrap_or_else(|e| {
            panic!("shape {n} (sends {sends}, polls {polls}, leases {leases}, acks {acks}, keyed {keyed}, quotas {quotas}): {e}")
        });
        let rows = db
            .query(
                &stmt,
                &[
                    &vec![digest(&alice.token); one(sends)],
                    &vec![None::<String>; one(sends)],
                    &to.to_vec(),
                    &vec![None::<String>; one(sends)],
                    &vec![format!("shape {n}"); one(sends)],
                    &vec![None::<i64>; one(sends)],
                    &vec![None::<i64>; one(sends)],
                    &keys,
                    &vec![None::<i64>; to.len()],
                    &vec![digest(&bob.token); one(polls)],
                    &vec![None::<String>; one(polls)],
                    &vec![10_i64; one(polls)],
                    &100_i64,
                    &Vec::<i64>::new(),
                    &vec![leases.then_some(60.0_f64); one(polls)],
                    &vec![leases.then_some(5_i32); one(polls)],
                    &vec![false; to.len()],
                    &quota,
                    &quota,
                    &quota,
                    &quota,
                    &100_i32,
                    &vec![None::<f64>; one(sends)],
                    &vec![1_i64; to.len()],
                    &vec![1_i64; one(acks)],
                    &vec![0_i64; one(acks)],
                    &vec![None::<i32>; one(acks)],
                    &100_000_i64,
                    &other_keys,
                ],
            )
            .await
            .unwrap_or_else(|e| panic!("shape {n}: {e}"));
        // (id, thread, group) of each copy stored, in order.
        let copies: Vec<(i64, Option<i64>, Option<i64>)> = rows
            .iter()
            .filter(|r| r.get::<_, Option<bool>>("is_poll") == Some(false))
            .filter_map(|r| {
                let id = r.get::<_, Option<i64>>("id")?;
                Some((id, r.get("thread_id"), r.get("group_id")))
            })
            .collect();
        let stored = copies.len();
        // A group's copies share the first copy's id as group and thread,
        // and the first lists the recipients; a lone copy is its own thread.
        if let Some(&(first, _, _)) = copies.first() {
            let grouped = to.len() > 1;
            for &(id, thread, group) in &copies {
                assert_eq!(thread, Some(if grouped { first } else { id }), "shape {n}");
                assert_eq!(group, grouped.then_some(first), "shape {n}");
            }
            let listed: Option<Vec<i64>> = db
                .query_one(
                    "SELECT group_recipients FROM messages WHERE id = $1",
                    &[&first],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(listed, grouped.then(|| recipients.clone()), "shape {n}");
        }
        let polled = rows.iter().any(|r| {
            r.get::<_, Option<bool>>("is_poll") == Some(true)
                && r.get::<_, Option<i64>>("me_id").is_some()
        });
        let acked = rows
            .iter()
            .any(|r| r.get::<_, Option<&str>>("ack_state") == Some("not_found"));
        assert_eq!(
            (stored, polled, acked),
            (to.len(), polls, acks),
            "shape {n}: (copies stored, a poll answered, an acknowledgement decided)"
        );
    }
    app.stop().await;
}

/// One plain send of a statement (no key, one recipient).
struct PlainSend {
    to: String,
    to_id: Option<i64>,
    reply_to: Option<i64>,
    thread: Option<i64>,
    answers: bool,
}

impl PlainSend {
    fn to(name: &str) -> Self {
        Self {
            to: name.to_owned(),
            to_id: None,
            reply_to: None,
            thread: None,
            answers: false,
        }
    }
}

/// The quotas a statement is run with (0: off).
struct Quotas {
    per_hour: i32,
    new_per_day: i32,
    unread_max: i32,
    per_sender: i32,
}

impl Quotas {
    const OFF: Self = Self {
        per_hour: 0,
        new_per_day: 0,
        unread_max: 0,
        per_sender: 0,
    };
}

/// `sends`, all by the holder of `token`, run as one mail statement of the
/// shape of plain sends under quotas, as a batch would run them (the
/// tests' calls cannot be made to share a batch for certain). Each send's
/// (refusal, stored), in order.
async fn run_plain_sends(
    db: &tokio_postgres::Client,
    token: &str,
    sends: &[PlainSend],
    quotas: Quotas,
) -> Vec<(Option<String>, bool)> {
    let (sql, types) = phone::store::every_mail_statement()
        .into_iter()
        .find(|(sql, _)| {
            sql.contains("sreq AS")
                && sql.contains("hour_counted AS")
                && !sql.contains("preq AS")
                && !sql.contains("WINDOW same_send")
                && !sql.contains(phone::store::KEYED_INSERT)
        })
        .expect("the shape of plain sends under quotas");
    let stmt = db.prepare_typed(sql, types).await.unwrap();
    let n = sends.len();
    let token = Sha256::digest(token.as_bytes()).to_vec();
    let to: Vec<String> = sends.iter().map(|s| s.to.clone()).collect();
    let reply_to: Vec<Option<i64>> = sends.iter().map(|s| s.reply_to).collect();
    let thread: Vec<Option<i64>> = sends.iter().map(|s| s.thread).collect();
    let to_id: Vec<Option<i64>> = sends.iter().map(|s| s.to_id).collect();
    let answers: Vec<bool> = sends.iter().map(|s| s.answers).collect();
    let rows = db
        .query(
            &stmt,
            &[
                &vec![token; n],
                &vec![None::<String>; n],
                &to,
                &vec![None::<String>; n],
                &(0..n).map(|i| format!("note {i}")).collect::<Vec<_>>(),
                &reply_to,
                &thread,
                &vec![None::<String>; n],
                &to_id,
                &Vec::<Vec<u8>>::new(),
                &Vec::<Option<String>>::new(),
                &Vec::<i64>::new(),
                &100_i64,
                &Vec::<i64>::new(),
                &Vec::<Option<f64>>::new(),
                &Vec::<Option<i32>>::new(),
                &answers,
                &quotas.per_hour,
                &quotas.new_per_day,
                &quotas.unread_max,
                &quotas.per_sender,
                &100_i32,
                &vec![None::<f64>; n],
                &(1..=n as i64).collect::<Vec<_>>(),
                &Vec::<i64>::new(),
                &Vec::<i64>::new(),
                &Vec::<Option<i32>>::new(),
                &100_000_i64,
                &vec![None::<String>; n],
            ],
        )
        .await
        .unwrap();
    let mut decided: Vec<(i64, Option<String>, bool)> = rows
        .iter()
        .filter(|r| r.get::<_, Option<bool>>("is_poll") == Some(false))
        .map(|r| {
            (
                r.get::<_, i64>("ord"),
                r.get::<_, Option<String>>("refusal"),
                r.get::<_, Option<i64>>("id").is_some(),
            )
        })
        .collect();
    decided.sort();
    decided
        .into_iter()
        .map(|(_, refusal, stored)| (refusal, stored))
        .collect()
}

/// Several sends of one sender to one inbox in one statement (a batch can
/// carry them: calls from parallel connections) leave the sender's share of
/// that inbox and no more, an empty inbox included: the backlog's bound
/// counts the statement's earlier copies of the pair. A copy to the same
/// inbox that its contact policy refused, ahead of them, counts for nothing
/// (the others pass the policy as answers to the recipient's own mail). Run
/// through the statement itself, as a batch would: the tests' calls cannot
/// be made to share a batch for certain.
#[tokio::test]
async fn one_statement_of_sends_to_one_inbox_keeps_the_senders_share() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    set_policy(&c, &bob, "closed").await;
    let copies: Vec<PlainSend> = [false, true, true, true]
        .into_iter()
        .map(|answers| PlainSend {
            answers,
            ..PlainSend::to("bob")
        })
        .collect();
    let decided = run_plain_sends(
        &db,
        &alice.token,
        &copies,
        Quotas {
            per_sender: 2,
            ..Quotas::OFF
        },
    )
    .await;
    let refusals: Vec<(Option<&str>, bool)> = decided
        .iter()
        .map(|(refusal, stored)| (refusal.as_deref(), *stored))
        .collect();
    assert_eq!(
        refusals,
        [
            (Some("refused"), false),
            (None, true),
            (None, true),
            (Some("inbox_share"), false)
        ],
        "(refusal, stored) of each copy"
    );
    let held = app
        .count("SELECT count(*) FROM messages m JOIN agents a ON a.id = m.recipient_id WHERE a.name = 'bob'")
        .await;
    assert_eq!(held, 2);
    app.stop().await;
}

/// Sends and polls queued together run as one statement of their shape, and
/// each call gets what it asked for. A broken shape would not fail its
/// calls (a refused batch is run again call by call, in shapes of one), so
/// this looks for the shape among the statements that succeeded.
#[tokio::test]
async fn sends_and_polls_queued_together_share_one_statement_of_their_shape() {
    let app = spawn_app().await;
    let c = app.client().await;
    let c2 = app.client().await;
    let db = app.db().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let carol = register(&c, "carol", "C", "p").await;
    let dave = register(&c, "dave", "D", "p").await;
    // While a batch is stuck on a lock, the calls behind it queue; the
    // first to have waited 100 ms starts a batch of all that wait.
    let (lock, stuck) = send_held_by_a_row_lock(
        &app,
        &alice,
        alice.with(json!({"to": "dave", "body": "stuck"})),
    )
    .await;
    let mut sent_to_dave = vec!["stuck".to_owned()];
    for (lease, shape) in [(false, (true, true, false)), (true, (true, true, true))] {
        // Two calls arrive within a few milliseconds; a slow machine may
        // still split them, so a few tries.
        for attempt in 0..5 {
            let body = format!("for bob, lease {lease}, try {attempt}");
            ok(
                &c,
                "phone_send",
                carol.with(json!({"to": "bob", "body": body})),
            )
            .await;
            let mut poll = json!({"limit": 1});
            if lease {
                poll["mode"] = json!("lease");
                poll["lease_seconds"] = json!(60);
            }
            let beside = format!("beside a poll, lease {lease}, try {attempt}");
            let (sent, got) = tokio::join!(
                ok(
                    &c,
                    "phone_send",
                    carol.with(json!({"to": "dave", "body": beside}))
                ),
                ok(&c2, "phone_inbox", bob.with(poll)),
            );
            assert!(sent["id"].is_string(), "{sent}");
            sent_to_dave.push(beside);
            assert_eq!(got["messages"][0]["body"], body, "{got}");
            if mail_statement_shapes(&db).await.contains(&shape) {
                break;
            }
        }
        assert!(
            mail_statement_shapes(&db).await.contains(&shape),
            "no statement of shape {shape:?} ran: {:?}",
            mail_statement_shapes(&db).await
        );
    }
    assert!(
        !stuck.is_finished(),
        "the stuck send ended before the lock was released"
    );
    lock.batch_execute("COMMIT").await.unwrap();
    stuck.await.unwrap();
    let got = ok(&c, "phone_inbox", dave.with(json!({"limit": 20}))).await;
    let mut to_dave = bodies(&got);
    to_dave.sort();
    sent_to_dave.sort();
    assert_eq!(to_dave, sent_to_dave, "{got}");
    app.stop().await;
}

/// Replies in one statement are no first contacts either: a batch holding
/// an agent's answers to three strangers and its first messages to two
/// coworkers, under a quota of two new recipients a day, stores all five.
/// Counted in order, the answers used up the quota and the coworkers' mail
/// (and the third answer) was refused. Run through the statement itself.
#[tokio::test]
async fn replies_in_one_statement_are_not_first_contacts() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let bot = register(&c, "bot", "B", "p").await;
    for name in ["coworker0", "coworker1"] {
        register(&c, name, "C", "p").await;
    }
    let mut hellos = Vec::new();
    for i in 0..3 {
        let stranger = register(&c, &format!("stranger{i}"), "S", "x").await;
        let sent = ok(
            &c,
            "phone_send",
            stranger.with(json!({"to": "bot", "body": "hello"})),
        )
        .await;
        let id: i64 = sent["id"].as_str().unwrap()[4..].parse().unwrap();
        let row = db
            .query_one(
                "SELECT sender_id, thread_id FROM messages WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        hellos.push((
            id,
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            format!("stranger{i}"),
        ));
    }
    // The answers first, then the first messages.
    let mut copies: Vec<PlainSend> = hellos
        .iter()
        .map(|(id, sender, thread, name)| PlainSend {
            to_id: Some(*sender),
            reply_to: Some(*id),
            thread: Some(*thread),
            answers: true,
            ..PlainSend::to(name)
        })
        .collect();
    copies.extend([PlainSend::to("coworker0"), PlainSend::to("coworker1")]);
    let decided = run_plain_sends(
        &db,
        &bot.token,
        &copies,
        Quotas {
            new_per_day: 2,
            ..Quotas::OFF
        },
    )
    .await;
    assert_eq!(
        decided.iter().map(|d| d.0.as_deref()).collect::<Vec<_>>(),
        [None; 5],
        "refusals, in order"
    );
    // The answers' pairs are marked, so that no later count holds them.
    assert_eq!(
        app.count("SELECT count(*) FROM correspondents WHERE by_reply")
            .await,
        3
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM correspondents c JOIN agents a ON a.id = c.sender_id
                   WHERE a.name = 'bot' AND NOT c.by_reply"
        )
        .await,
        2
    );
    app.stop().await;
}
