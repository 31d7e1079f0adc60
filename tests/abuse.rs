//! One stranger against a server with its default settings: it must not
//! silence, lock out or wear down anyone else. Each test is an attack as an
//! outsider would run it, and checks what it cost the others.

mod common;

use common::browser::Browser;
use common::*;
use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::json;

fn forged(i: usize) -> String {
    format!("phn_{:B>43}", i)
}

/// A neighbour at the owner's address (an office NAT, a cloud /64, an edge
/// set up without the client's header) fails 100 times, on both replicas.
/// The owner's right token is then served at once, on every replica,
/// through /mcp (the hot path and the others) and through the console.
#[tokio::test]
async fn a_neighbours_failures_never_lock_the_owner_out() {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let (c1, c2) = (one.client().await, two.client().await);
    let owner = register(&c1, "owner", "the owner", "p").await;
    let friend = register(&c1, "friend", "a friend", "p").await;

    let guesses = (0..100).map(|i| {
        let client = if i % 2 == 0 { &c1 } else { &c2 };
        let args = json!({"name": "owner", "token": forged(i)});
        async move { tool_err(client, "phone_inbox", args).await }
    });
    let errors = join_all(guesses).await;
    let limited = errors
        .iter()
        .filter(|e| e.starts_with("too many failed authentication attempts"))
        .count();
    assert!(
        limited >= 70,
        "the neighbour is limited (default 20 per 5 minutes): {limited} of 100"
    );

    for (client, app) in [(&c1, &one), (&c2, &two)] {
        ok(client, "phone_inbox", owner.with(json!({}))).await;
        ok(client, "phone_inbox", owner.with(json!({"peek": true}))).await;
        ok(
            client,
            "phone_send",
            owner.with(json!({"to": "friend", "body": "still here"})),
        )
        .await;
        ok(client, "phone_outbox", owner.with(json!({}))).await;
        // A lease and its acknowledgement, which verifies in its own statement.
        let (id, receipt) = sent_and_leased(client, &friend, &owner, "work item").await;
        let acked = ok(client, "phone_ack", owner.with(json!({"ids": [receipt]}))).await;
        assert_eq!(acked["acknowledged"], json!([id]), "{acked}");
        ok(
            client,
            "phone_register",
            owner.with(json!({"description": "the owner, unharmed", "project": "p"})),
        )
        .await;
        // The header form, as Claude Code sends it.
        let with_header = app.client_with(Some(&owner.token)).await;
        ok(&with_header, "phone_inbox", json!({})).await;

        let mut browser = Browser::new(app);
        let answer = browser.sign_in("owner", &owner.token).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        assert_eq!(browser.get("/console/inbox").await.status, StatusCode::OK);
    }
    // The neighbour is still refused, and its refusals were not counted on.
    let err = tool_err(&c2, "phone_inbox", json!({"token": forged(500)})).await;
    assert!(err.starts_with("too many failed"), "{err}");
    two.stop().await;
    one.stop().await;
}

/// Sends `body` from `from` to `to`; `Ok(())` when stored, else the tool
/// error's text.
async fn try_send(c: &Client, from: &Agent, to: &str, body: &str) -> Result<(), String> {
    let result = call(c, "phone_send", from.with(json!({"to": to, "body": body}))).await;
    if result.is_error == Some(true) {
        Err(text(&result))
    } else {
        Ok(())
    }
}

/// With the default settings, a freshly registered stranger floods one
/// agent, 32 sends at a time. Its own next message is refused, to it, with
/// a reason it can act on; everyone else's mail still gets through; a
/// block takes the stranger's unread mail out of the inbox (kept, not
/// deleted) without telling the stranger, and an unblock brings it back.
#[tokio::test]
async fn one_stranger_cannot_fill_an_inbox_for_everyone_else() {
    let app = spawn_app().await;
    let c = app.client().await;
    let victim = register(&c, "victim", "V", "p").await;
    let stranger = register(&c, "stranger", "S", "elsewhere").await;
    let other = register(&c, "other", "O", "elsewhere").await;

    let mut refusal = None;
    'flood: for round in 0..40 {
        let sends = (0..32).map(|i| {
            let body = format!("flood {round}-{i}");
            let (c, stranger) = (&c, &stranger);
            async move { try_send(c, stranger, "victim", &body).await }
        });
        for outcome in join_all(sends).await {
            if let Err(e) = outcome {
                refusal = Some(e);
                break 'flood;
            }
        }
    }
    let refusal = refusal.expect("the stranger was never refused");
    assert!(
        refusal.contains("your share of its inbox is full"),
        "the stranger hears why: {refusal}"
    );
    let stored = app
        .count("SELECT count(*) FROM messages WHERE body LIKE 'flood %'")
        .await;
    assert!(
        (500..=532).contains(&stored),
        "one sender holds at most its share (500): {stored}"
    );
    // Another stranger, and the victim's own correspondents, get through.
    try_send(&c, &other, "victim", "hello from someone else")
        .await
        .unwrap();

    // A block withdraws the stranger's unread mail: out of the inbox and
    // its caps, kept in the table; the stranger's outbox does not show it.
    ok(
        &c,
        "phone_settings",
        victim.with(json!({"block": ["stranger"]})),
    )
    .await;
    let got = ok(
        &c,
        "phone_inbox",
        victim.with(json!({"peek": true, "limit": 100})),
    )
    .await;
    let senders: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["from"].as_str().unwrap())
        .collect();
    assert_eq!(senders, ["other"], "{got}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM messages WHERE body LIKE 'flood %' AND dead_reason = 'blocked'"
        )
        .await,
        stored
    );
    let outbox = ok(&c, "phone_outbox", stranger.with(json!({"limit": 5}))).await;
    for m in outbox["messages"].as_array().unwrap() {
        assert_eq!(m["state"], "waiting", "a block is not revealed: {m}");
    }
    // Unblocking brings back what is still unread.
    ok(
        &c,
        "phone_settings",
        victim.with(json!({"unblock": ["stranger"]})),
    )
    .await;
    let got = ok(
        &c,
        "phone_inbox",
        victim.with(json!({"peek": true, "limit": 3})),
    )
    .await;
    assert_eq!(got["messages"][0]["from"], "stranger", "{got}");
    app.stop().await;
}

/// A full inbox (here 6 unread, 2 per sender) takes no more mail from
/// strangers, but its owner's contacts, agents it wrote to and answers to
/// its own mail still pass, up to twice the cap.
#[tokio::test]
async fn a_full_inbox_still_hears_from_those_its_owner_knows() {
    let app = spawn_app_with(&[
        ("PHONE_INBOX_UNREAD_MAX", "6"),
        ("PHONE_INBOX_UNREAD_PER_SENDER", "2"),
    ])
    .await;
    let c = app.client().await;
    let owner = register(&c, "owner", "O", "p").await;
    let contact = register(&c, "contact", "C", "q").await;
    let colleague = register(&c, "colleague", "C", "q").await;
    let asked = register(&c, "asked", "A", "q").await;
    let mut strangers = Vec::new();
    for i in 0..4 {
        strangers.push(register(&c, &format!("stranger{i}"), "S", "q").await);
    }
    ok(
        &c,
        "phone_settings",
        owner.with(json!({"allow": ["contact"]})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        owner.with(json!({"to": "colleague", "body": "hi"})),
    )
    .await;
    let question = ok(
        &c,
        "phone_send",
        owner.with(json!({"to": "asked", "body": "?"})),
    )
    .await;

    for s in &strangers[..3] {
        for _ in 0..2 {
            try_send(&c, s, "owner", "filler").await.unwrap();
        }
    }
    let err = try_send(&c, &strangers[3], "owner", "one more")
        .await
        .unwrap_err();
    assert!(err.contains("'owner''s inbox is full"), "{err}");
    try_send(&c, &contact, "owner", "from a contact")
        .await
        .unwrap();
    try_send(&c, &colleague, "owner", "from one it wrote to")
        .await
        .unwrap();
    ok(
        &c,
        "phone_send",
        asked.with(json!({"reply_to": question["id"], "body": "an answer"})),
    )
    .await;
    app.stop().await;
}

/// Quotas set to 0 are off, and their bookkeeping with them: no hourly
/// count, no record of who wrote to whom, no refusal, and mail beyond
/// what the smallest quotas would allow gets through. With every quota
/// off, the mail statements hold none of their parts, so the sends pay
/// nothing for them (a part is set up on every execution, run or not).
/// A send to one without a key, a group send and a send with a key each
/// run a shape of their own: only the group send's stores its copies as a
/// group, and only the keyed send's insert skips what conflicts.
#[tokio::test]
async fn quotas_set_to_zero_are_off_and_keep_no_bookkeeping() {
    let app = spawn_app_with(&[
        ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "0"),
        ("PHONE_INBOX_UNREAD_MAX", "0"),
        ("PHONE_INBOX_UNREAD_PER_SENDER", "0"),
    ])
    .await;
    let c = app.client().await;
    let sender = register(&c, "sender", "S", "p").await;
    let one = register(&c, "one", "O", "q").await;
    let _two = register(&c, "two", "T", "q").await;
    for i in 0..3 {
        try_send(&c, &sender, "one", &format!("note {i}"))
            .await
            .unwrap();
    }
    ok(
        &c,
        "phone_send",
        sender.with(json!({"to": ["one", "two"], "body": "to both"})),
    )
    .await;
    assert_eq!(app.count("SELECT count(*) FROM messages").await, 5);
    // A key on a send to one: the shape that looks for earlier copies.
    let keyed = sender.with(json!({"to": "one", "body": "once", "idempotency_key": "k-1"}));
    let first = ok(&c, "phone_send", keyed.clone()).await;
    let again = ok(&c, "phone_send", keyed).await;
    assert_eq!(
        (&first["replayed"], &again["replayed"]),
        (&json!(false), &json!(true))
    );
    assert_eq!(first["id"], again["id"]);
    for (table, rows) in [
        (
            "send_counts",
            app.count("SELECT count(*) FROM send_counts").await,
        ),
        (
            "correspondents",
            app.count("SELECT count(*) FROM correspondents").await,
        ),
        (
            "refused_sends",
            app.count("SELECT count(*) FROM refused_sends").await,
        ),
    ] {
        assert_eq!(rows, 0, "{table} holds {rows} rows with every quota off");
    }
    let got = ok(&c, "phone_inbox", one.with(json!({"limit": 10}))).await;
    assert_eq!(got["messages"].as_array().unwrap().len(), 5, "{got}");
    let db = app.db().await;
    let mut sends: Vec<(bool, bool, bool)> = statements_like(&db, "WITH woken AS%")
        .await
        .iter()
        .filter(|x| x.calls > 0 && x.query.contains("INSERT INTO messages"))
        .map(|x| {
            (
                x.query.contains("send_counts") || x.query.contains("correspondents"),
                x.query.contains("WINDOW same_send"),
                x.query.contains(phone::store::KEYED_INSERT),
            )
        })
        .collect();
    sends.sort();
    assert_eq!(
        sends,
        [
            (false, false, false),
            (false, false, true),
            (false, true, false)
        ],
        "(quota parts, copies stored as a group, inserts that skip conflicts) of the send statements that ran"
    );
    app.stop().await;
}

/// The copies of one statement count against the quotas in order, and
/// only those the contact policy let through. A sender that wrote to one
/// agent today sends to a closed agent, an unknown name, that agent and
/// new recipients, in one group send: under a quota of three first
/// contacts a day, two new ones are stored (the first new pair is not the
/// copy's first); under an hourly quota of four, the known one and the
/// first two new ones.
#[tokio::test]
async fn the_copies_of_one_batch_count_against_the_quotas_in_order() {
    for (quota, limit, stored_new) in [
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", 3, 2),
        ("PHONE_SEND_QUOTA_PER_HOUR", 4, 2),
    ] {
        let new = 5;
        let limit_text = limit.to_string();
        let mut env: Vec<(&str, &str)> = [
            "PHONE_SEND_QUOTA_PER_HOUR",
            "PHONE_NEW_RECIPIENT_QUOTA_PER_DAY",
            "PHONE_INBOX_UNREAD_MAX",
            "PHONE_INBOX_UNREAD_PER_SENDER",
        ]
        .into_iter()
        .filter(|k| *k != quota)
        .map(|k| (k, "0"))
        .collect();
        env.push((quota, &limit_text));
        let app = spawn_app_with(&env).await;
        let c = app.client().await;
        let boss = register(&c, "boss", "B", "p").await;
        let closed = register(&c, "closed", "C", "p").await;
        set_policy(&c, &closed, "closed").await;
        register(&c, "known", "K", "p").await;
        ok(
            &c,
            "phone_send",
            boss.with(json!({"to": "known", "body": "earlier today"})),
        )
        .await;
        let mut to = vec!["closed".to_owned(), "nobody".to_owned(), "known".to_owned()];
        for i in 0..new {
            let name = format!("t{i}");
            register(&c, &name, "T", "p").await;
            to.push(name);
        }
        let out = ok(
            &c,
            "phone_send",
            boss.with(json!({"to": to, "body": "hello, everyone"})),
        )
        .await;
        let recipients = out["recipients"].as_array().unwrap();
        let stored: Vec<bool> = recipients
            .iter()
            .map(|r| r.get("error").is_none())
            .collect();
        let expected: Vec<bool> = (0..to.len())
            .map(|i| i >= 2 && i < 3 + stored_new)
            .collect();
        assert_eq!(stored, expected, "{quota}: {out}");
        let reason = match quota {
            "PHONE_SEND_QUOTA_PER_HOUR" => "messages this hour",
            _ => "first messages to new recipients today",
        };
        for r in &recipients[3 + stored_new..] {
            let error = r["error"].as_str().unwrap();
            assert!(error.contains(reason), "{quota}: {out}");
        }
        app.stop().await;
    }
}

/// Sends of one sender in statements that run at once (two replicas)
/// share one new-recipient quota. Each statement counted in its own
/// snapshot, so each let the whole quota through: an outsider's burst with
/// 60 KB bodies stored 220-500 first messages against the daily 100. Here
/// the first send is held mid-statement (its snapshot taken) while the
/// second runs on the other replica: five first contacts a day, ten tried.
#[tokio::test]
async fn sends_at_once_on_two_replicas_share_one_new_recipient_quota() {
    let database = fresh_database().await;
    let env = [
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "5"),
        ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
    ];
    let one = spawn_app_on(&database, &env).await;
    let two = spawn_app_on(&database, &env).await;
    let c = one.client().await;
    let spammer = register(&c, "spammer", "S", "p").await;
    let mut firsts = Vec::new();
    let mut seconds = Vec::new();
    for i in 0..5 {
        for (prefix, names) in [("a", &mut firsts), ("b", &mut seconds)] {
            let name = format!("{prefix}{i}");
            register(&c, &name, "T", "q").await;
            names.push(name);
        }
    }
    let (lock, first) = send_held_by_a_row_lock(
        &one,
        &spammer,
        spammer.with(json!({"to": firsts, "body": "hello, new friend"})),
    )
    .await;
    let c2 = two.client().await;
    let second_args = spammer.with(json!({"to": seconds, "body": "hello, new friend"}));
    let second = tokio::spawn(async move { call(&c2, "phone_send", second_args).await });
    // The second waits, for the first's lock on the sender's quota (or,
    // before, on the sender's row for its presence, its snapshot taken).
    sends_waiting_on_locks(&one, 2).await;
    lock.batch_execute("COMMIT").await.unwrap();
    let first = first.await.unwrap();
    let second = second.await.unwrap();
    let stored_of = |out: &serde_json::Value| {
        out["recipients"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.get("error").is_none())
            .count()
    };
    // A send whose every copy is refused is a tool error that names them.
    let stored = stored_of(&first)
        + if second.is_error == Some(true) {
            let why = text(&second);
            assert!(why.contains("first messages to new recipients"), "{why}");
            0
        } else {
            stored_of(second.structured_content.as_ref().unwrap())
        };
    assert_eq!(stored, 5, "first contacts stored against a quota of 5");
    let in_the_database = one
        .count(
            "SELECT count(*) FROM messages m JOIN agents a ON a.id = m.sender_id
             WHERE a.name = 'spammer'",
        )
        .await;
    assert_eq!(in_the_database, 5);
    one.stop().await;
    two.stop().await;
}

/// Strangers who write first cannot use up the quota of the agent that
/// answers them: a reply goes to parties of a message someone else began,
/// so it is no first contact. Before, 101 strangers that each sent one
/// "hello" to a bot that answered everyone left it unable to write to a
/// single new coworker for a day (a helper's attack). A reply to everyone
/// on a stranger's group send is not counted either.
#[tokio::test]
async fn answering_strangers_does_not_use_up_the_new_recipient_quota() {
    let app = spawn_app_with(&[
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "3"),
        ("PHONE_REGISTER_LIMIT", "0"),
    ])
    .await;
    let c = app.client().await;
    let bot = register(&c, "bot", "answers everyone", "p").await;
    let mut strangers = Vec::new();
    for i in 0..4 {
        let stranger = register(&c, &format!("stranger{i}"), "S", "x").await;
        let hello = ok(
            &c,
            "phone_send",
            stranger.with(json!({"to": "bot", "body": "hello"})),
        )
        .await;
        strangers.push((stranger, hello["id"].as_str().unwrap().to_owned()));
    }
    for (_, id) in &strangers {
        ok(
            &c,
            "phone_send",
            bot.with(json!({"reply_to": id, "body": "hi, how can I help?"})),
        )
        .await;
    }
    // A stranger's group send to the bot and two others (within its own
    // quota); the bot answers all of them.
    let mut others = Vec::new();
    for i in 0..2 {
        register(&c, &format!("bystander{i}"), "B", "x").await;
        others.push(format!("bystander{i}"));
    }
    let mut to = vec!["bot".to_owned()];
    to.extend(others.iter().cloned());
    let group = ok(
        &c,
        "phone_send",
        strangers[0]
            .0
            .with(json!({"to": to, "body": "status, everyone?"})),
    )
    .await;
    let bot_copy = ok(&c, "phone_inbox", bot.with(json!({"limit": 20}))).await;
    let copy_id = bot_copy["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["body"] == "status, everyone?")
        .unwrap_or_else(|| panic!("{group} {bot_copy}"))["id"]
        .clone();
    let all = ok(
        &c,
        "phone_send",
        bot.with(json!({"reply_to": copy_id, "to": "*", "body": "all fine"})),
    )
    .await;
    assert!(!all.to_string().contains("quota"), "{all}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM messages m JOIN agents a ON a.id = m.sender_id
             WHERE a.name = 'bot' AND m.body = 'all fine'"
        )
        .await,
        3
    );
    // Its quota is whole: three first messages to agents of its choosing.
    for i in 0..4 {
        register(&c, &format!("coworker{i}"), "C", "p").await;
    }
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            bot.with(json!({"to": format!("coworker{i}"), "body": "let us work"})),
        )
        .await;
    }
    let err = tool_err(
        &c,
        "phone_send",
        bot.with(json!({"to": "coworker3", "body": "one too many"})),
    )
    .await;
    assert!(
        err.contains("first messages to new recipients today"),
        "{err}"
    );
    app.stop().await;
}

/// 110 agents that mention a word, each unlisted at once, hid every agent
/// that mentions it: a search ranks at most 100 matches per level, taken in
/// no order, and dropped the unlisted ones only after taking them (found
/// by an outsider's attack). The victim is found again, by its word and by
/// its words, and none of the hidden ones is shown.
#[tokio::test]
async fn unlisted_agents_cannot_crowd_an_agent_out_of_search() {
    let app = spawn_app_with(&[("PHONE_REGISTER_LIMIT", "0")]).await;
    let c = app.client().await;
    register(
        &c,
        "zorbex-translator",
        "Translates zorbex documents into English",
        "lang",
    )
    .await;
    for chunk in (0..110).collect::<Vec<_>>().chunks(16) {
        join_all(chunk.iter().map(|i| {
            let c = &c;
            async move {
                let filler = register(
                    c,
                    &format!("zbx-{i:03}"),
                    "zorbex zorbex translator",
                    "zorbex",
                )
                .await;
                ok(c, "phone_settings", filler.with(json!({"listed": false}))).await;
            }
        }))
        .await;
    }
    for query in ["zorbex", "zorbex translator", "translator"] {
        let found = ok(&c, "phone_search", json!({"query": query, "limit": 50})).await;
        let names: Vec<&str> = found["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["zorbex-translator"], "{query}: {found}");
    }
    app.stop().await;
}

/// A stranger registered `phone`, `system` and `operator`, and wrote as
/// `phone-notices` asking for tokens: names a model would read as the
/// service speaking. New agents cannot take them; names that only contain
/// the word can.
#[tokio::test]
async fn no_new_agent_takes_the_services_names() {
    let app = spawn_app().await;
    let c = app.client().await;
    for name in [
        "phone",
        "Phone-Notices",
        "phone.support",
        "system",
        "operator",
        "ADMIN",
        // Look-alikes that read as the service's in a header.
        "system.",
        "admin_",
        "no_reply",
        "_phone",
        "phone.",
    ] {
        let refused = tool_err(
            &c,
            "phone_register",
            json!({"name": name, "description": "d", "project": "p"}),
        )
        .await;
        assert!(
            refused.contains("kept for the service"),
            "{name}: {refused}"
        );
    }
    for name in ["phonebook", "my-phone", "systems-team"] {
        register(&c, name, "d", "p").await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM agents").await,
        3,
        "only the ordinary names were registered"
    );
    app.stop().await;
}

/// A stranger pipelines peeks of answers of hundreds of kB on a connection
/// whose receive buffer is tiny, and reads nothing: the server waited on
/// the full send buffer past every timeout (over five minutes seen; 200
/// such connections held 750 MB of the kernel's TCP memory, and enough of
/// them would hold every connection slot: an outsider's attack). An answer
/// that makes no progress for the idle timeout now ends the connection.
#[tokio::test]
async fn a_client_that_reads_nothing_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(&[("PHONE_IDLE_TIMEOUT_SECS", "2")]).await;
    let c = app.client().await;
    let me = register(&c, "hoarder", "H", "x").await;
    // Control characters: six bytes each once escaped in JSON, twice (the
    // text and structuredContent).
    let body = "\u{1}".repeat(10_000);
    for _ in 0..3 {
        try_send(&c, &me, "hoarder", &body).await.unwrap();
    }
    let address: std::net::SocketAddr = app
        .mcp_url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .parse()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(address).await.unwrap();
    let peek = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "phone_inbox", "arguments": me.with(json!({"peek": true, "limit": 3}))}})
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n\
         Content-Length: {}\r\n\r\n{peek}",
        peek.len()
    );
    stream
        .write_all(request.repeat(12).as_bytes())
        .await
        .unwrap();
    // Reads nothing for three times the limit, then all it can.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let answers = String::from_utf8_lossy(&got)
        .matches("HTTP/1.1 200")
        .count();
    assert!(
        answers < 12,
        "the connection was kept open for a reader that read nothing: {answers} answers, {} bytes",
        got.len()
    );
    // The server still answers everyone else.
    ok(
        &c,
        "phone_inbox",
        me.with(json!({"peek": true, "limit": 1})),
    )
    .await;
    app.stop().await;
}

/// Mail past its lifetime leaves the unread index: a stranger sent 30,000
/// one-second messages to an agent that was away (the share and the inbox
/// cap count live mail only, so nothing stopped it), and every poll of that
/// inbox, every send to it and the share's count walked past each of them
/// for ever (15 ms a poll at 33,000; 230 ms at 550,000; every batch holding
/// such a call made everyone else's calls wait: an outsider's attack).
#[tokio::test]
async fn a_strangers_expired_mail_costs_the_inbox_nothing() {
    let app = spawn_app().await;
    let c = app.client().await;
    let stranger = register(&c, "stranger", "S", "p").await;
    let bob = register(&c, "bob", "B", "q").await;
    join_all((0..50).map(|i| {
        ok(
            &c,
            "phone_send",
            stranger.with(json!({"to": "bob", "body": format!("gone {i}"), "expires_in": 1})),
        )
    }))
    .await;
    let db = app.db().await;
    // Marked by a replica's sweep, every few seconds.
    wait_until_for(
        &db,
        "the expired mail is marked",
        "SELECT count(*) = 50 FROM messages WHERE dead_reason = 'expired' AND dead_at = expires_at",
        std::time::Duration::from_secs(15),
    )
    .await;
    // A poll's look at the inbox, as the mail statement makes it, walks
    // none of it.
    db.batch_execute("SET enable_seqscan = off").await.unwrap();
    let plan: serde_json::Value = db
        .query_one(
            &format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT m.id FROM messages m
                 WHERE {} ORDER BY m.id LIMIT 10",
                phone::store::fragments::available_to("(SELECT id FROM agents WHERE name = 'bob')")
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    fn rows_walked(node: &serde_json::Value) -> i64 {
        let own = if node["Relation Name"] == "messages" {
            node["Actual Rows"].as_i64().unwrap_or(0)
                + node["Rows Removed by Filter"].as_i64().unwrap_or(0)
                + node["Rows Removed by Index Recheck"].as_i64().unwrap_or(0)
        } else {
            0
        };
        own + node["Plans"]
            .as_array()
            .map_or(0, |plans| plans.iter().map(rows_walked).sum())
    }
    assert_eq!(rows_walked(&plan[0]["Plan"]), 0, "{plan}");
    // Still expired to its sender, and nothing for bob.
    let outbox = ok(&c, "phone_outbox", stranger.with(json!({"limit": 50}))).await;
    let states: std::collections::BTreeSet<&str> = outbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["expired"].into(), "{outbox}");
    let inbox = ok(&c, "phone_inbox", bob.with(json!({}))).await;
    assert!(inbox["messages"].as_array().unwrap().is_empty(), "{inbox}");
    // Expired, not dead, wherever it is shown: as dead it read as a failed
    // delivery, and beside mail a block withdrew (no `dead_at` to its
    // sender) it told a sender who had blocked it.
    let history = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"include_read": true, "limit": 50})),
    )
    .await;
    let thread = ok(
        &c,
        "phone_thread",
        stranger.with(json!({"message_id": outbox["messages"][0]["id"]})),
    )
    .await;
    for m in history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .chain(thread["messages"].as_array().unwrap())
    {
        assert!(m.get("dead_at").is_none_or(|d| d.is_null()), "{m}");
    }
    app.stop().await;
}
