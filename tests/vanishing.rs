//! Callers that vanish: a poll whose caller left must not consume its mail,
//! a call whose caller left before its statement began does nothing, and a
//! long poll never outlives its request.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const ACCEPT: &str = "application/json, text/event-stream";

/// A phone_inbox call with `args` over a new connection, and the start of
/// another request behind it (an HTTP/1.1 pipeline), sent but not read.
async fn poll_with_a_request_behind_it(app: &TestApp, args: Value) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let address = app
        .mcp_url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let poll = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "phone_inbox", "arguments": args}})
    .to_string();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
                 Accept: {ACCEPT}\r\nMCP-Protocol-Version: 2025-06-18\r\n\
                 Content-Length: {}\r\n\r\n{poll}POST /mcp HTTP/1.1\r\n",
                poll.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    stream
}

/// The give-back's statement in pg_stat_statements (which shows constants
/// as parameters: only names are matched).
const GIVE_BACK_LIKE: &str = "%AS g(id, read_at, leased_until, delivery_count)%";

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

/// Holds `messages` locked on `lock` until it commits: every mail
/// statement waits meanwhile.
async fn lock_messages(lock: &tokio_postgres::Client) {
    lock.batch_execute("BEGIN; LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
}

/// A poll through `app` whose caller gives up after a second while
/// `messages` is locked: its statement still waits then.
async fn poll_given_up_behind_the_lock(app: &TestApp, args: Value) {
    let answer = call_giving_up(app, "phone_inbox", args, Duration::from_secs(1)).await;
    assert!(
        answer.is_none(),
        "the poll should still wait for the lock: {answer:?}"
    );
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
    lock_messages(&lock).await;
    poll_given_up_behind_the_lock(&app, bob.with(json!({"limit": 10}))).await;
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

/// A caller that left with a second request sent behind its long poll (an
/// HTTP/1.1 pipeline, or a stray line break) is gone all the same: hyper
/// stops watching for the close while unread input waits on the
/// connection, so the poll goes on waiting, and the mail that wakes it must
/// not be taken for a caller that will never read it (read mode: lost;
/// lease mode: held by a lease nobody acknowledges). An outsider's attack.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_long_poll_whose_caller_left_with_a_request_behind_it_takes_nothing() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let db = app.db().await;
    for (round, mode) in [json!({}), json!({"mode": "lease", "lease_seconds": 300})]
        .into_iter()
        .enumerate()
    {
        let mut args = bob.with(json!({"wait_seconds": 20}));
        args.as_object_mut()
            .unwrap()
            .extend(mode.as_object().unwrap().clone());
        let stream = poll_with_a_request_behind_it(&app, args).await;
        wait_until(
            &db,
            "the long poll waits",
            "SELECT count(*) = 1 FROM inbox_waiters",
        )
        .await;
        drop(stream);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let body = format!("after the caller left, {round}");
        let sent = ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": body})),
        )
        .await;
        // The departed poll has woken, taken what it takes, and ended, and
        // what it took is back (its waiter row goes before the give-back
        // lands). Without the fix the mail stays taken, and this times out.
        wait_until_settled(
            &db,
            "the departed long poll ended and the mail is in the inbox",
            "SELECT count(*) = 0 FROM inbox_waiters)
             AND (SELECT count(*) = 1 FROM messages WHERE read_at IS NULL AND leased_until IS NULL",
        )
        .await;
        // It took nothing: asked on waking, before its look.
        let give_backs: i64 = statements_like(&db, GIVE_BACK_LIKE)
            .await
            .iter()
            .map(|g| g.calls)
            .sum();
        assert_eq!(
            give_backs, 0,
            "round {round}: the departed poll took the mail and gave it back"
        );
        let got = ok(&c, "phone_inbox", bob.with(json!({}))).await;
        assert_eq!(
            got["messages"][0]["id"], sent["id"],
            "round {round}: mail for a caller that left was taken: {got}"
        );
    }
    app.stop().await;
}

/// Mail a poll gives back (its caller left) wakes the long polls of that
/// inbox, on every replica, as a send does: one waiting beside the caller
/// that left would otherwise get it only at the end of its wait. Here the
/// other poll is a waiter row, as a poll on another replica leaves, and the
/// wake-up is the NOTIFY every replica listens for.
#[tokio::test]
async fn mail_given_back_wakes_the_inboxs_waiting_polls() {
    use futures_util::StreamExt;
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let db = app.db().await;
    let (listener, mut connection) =
        tokio_postgres::connect(&app.database_url, tokio_postgres::NoTls)
            .await
            .unwrap();
    let (heard, mut wakes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = heard.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", phone::store::wakeup::CHANNEL))
        .await
        .unwrap();
    let bob_id: i64 = db
        .query_one("SELECT id FROM agents WHERE name = 'bob'", &[])
        .await
        .unwrap()
        .get(0);
    // A long poll of bob's inbox on another replica, from start to end.
    db.execute(
        "INSERT INTO inbox_waiters (id, agent_id, expires_at) OVERRIDING SYSTEM VALUE
         VALUES (1, $1, now() + interval '5 minutes')",
        &[&bob_id],
    )
    .await
    .unwrap();
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "back"})),
    )
    .await;
    let woke = tokio::time::timeout(Duration::from_secs(10), wakes.recv()).await;
    assert_eq!(
        woke.ok().flatten(),
        Some(bob_id.to_string()),
        "the send's wake-up"
    );
    // A poll whose statement waits on a lock while its caller gives up:
    // it takes the mail for nobody and gives it back.
    let lock = app.db().await;
    lock_messages(&lock).await;
    poll_given_up_behind_the_lock(&app, bob.with(json!({"limit": 10}))).await;
    lock.batch_execute("COMMIT").await.unwrap();
    wait_until_settled(
        &db,
        "the mail is back",
        "SELECT count(*) = 1 FROM messages WHERE read_at IS NULL AND delivery_count = 0",
    )
    .await;
    let woke = tokio::time::timeout(Duration::from_secs(10), wakes.recv()).await;
    assert_eq!(
        woke.ok().flatten(),
        Some(bob_id.to_string()),
        "the mail given back woke no waiting poll"
    );
    // The pattern another test counts give-backs by finds this one.
    let give_backs: i64 = statements_like(&db, GIVE_BACK_LIKE)
        .await
        .iter()
        .map(|g| g.calls)
        .sum();
    assert_eq!(give_backs, 1);
    app.stop().await;
}

/// The same caller, gone while its poll's statement ran (it waited on a
/// lock): the statement takes the mail, and the answer, about to confirm
/// it, finds the connection closed and gives it back.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_poll_whose_caller_left_with_a_request_behind_it_while_it_ran_takes_nothing() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let db = app.db().await;
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .unwrap();
    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "held"})),
    )
    .await;
    let lock = app.db().await;
    lock_messages(&lock).await;
    let stream = poll_with_a_request_behind_it(&app, bob.with(json!({}))).await;
    wait_until(
        &db,
        "the poll's statement waits on the lock",
        "SELECT count(*) > 0 FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.batch_execute("COMMIT").await.unwrap();
    // Without the check, the mail is confirmed taken and this times out.
    wait_until_settled(
        &db,
        "the poll gave the mail back",
        &format!(
            "SELECT count(*) = 1 FROM messages WHERE read_at IS NULL AND delivery_count = 0)
             AND (SELECT coalesce(sum(calls), 0) = 1 FROM pg_stat_statements
                  WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND query LIKE '{GIVE_BACK_LIKE}'"
        ),
    )
    .await;
    let got = ok(&c, "phone_inbox", bob.with(json!({}))).await;
    assert_eq!(got["messages"][0]["id"], sent["id"], "{got}");
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
    lock_messages(&lock).await;
    poll_given_up_behind_the_lock(
        &app,
        bob.with(json!({"limit": 10, "mode": "lease", "lease_seconds": 600})),
    )
    .await;
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
    lock_messages(&lock).await;
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

/// Refuses every give-back (a read message made unread again) while the
/// flag is on: the give-back fails, as it does when the pool is busy or the
/// database blinks.
async fn refuse_give_backs(db: &tokio_postgres::Client) {
    db.batch_execute(
        "CREATE TABLE give_backs_refused (on_ boolean NOT NULL);
         INSERT INTO give_backs_refused VALUES (true);
         CREATE FUNCTION refuse_give_back() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT on_ FROM give_backs_refused) THEN
                 RAISE EXCEPTION 'give-back refused by the test';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_give_back BEFORE UPDATE ON messages FOR EACH ROW
             WHEN (OLD.read_at IS NOT NULL AND NEW.read_at IS NULL)
             EXECUTE FUNCTION refuse_give_back();",
    )
    .await
    .unwrap();
}

/// A give-back that fails (the pool busy, the database blinking) is
/// retried until it lands: the mail of a caller that left is never lost
/// to a single failed statement.
#[tokio::test]
async fn a_give_back_that_fails_is_retried_until_it_lands() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    send_five(&c, &alice, "bob").await;
    let db = app.db().await;
    refuse_give_backs(&db).await;

    let lock = app.db().await;
    lock_messages(&lock).await;
    // The caller leaves once its poll waits on the lock (leaving at a fixed
    // time, a poll not yet begun on a loaded machine was dropped unrun, and
    // nothing was ever taken).
    let poll = call_giving_up(
        &app,
        "phone_inbox",
        bob.with(json!({"limit": 10})),
        Duration::from_secs(60),
    );
    tokio::select! {
        answer = poll => panic!("answered while the table was locked: {answer:?}"),
        () = wait_until(
            &db,
            "the poll waits on the lock",
            "SELECT count(*) > 0 FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%messages%'",
        ) => {}
    }
    lock.batch_execute("COMMIT").await.unwrap();
    // The poll committed after its caller left; its give-back fails...
    wait_until(
        &db,
        "the abandoned poll took the mail",
        "SELECT count(*) = 5 FROM messages WHERE read_at IS NOT NULL",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE read_at IS NULL")
            .await,
        0
    );
    // ...until it can land.
    db.batch_execute("UPDATE give_backs_refused SET on_ = false")
        .await
        .unwrap();
    wait_until_for(
        &db,
        "the give-back was retried and landed",
        "SELECT count(*) = 5 FROM messages WHERE read_at IS NULL",
        Duration::from_secs(10),
    )
    .await;
    app.stop().await;
}

/// SIGTERM while a read poll runs whose caller already left: the replica
/// finishes the poll's statement and puts its mail back before it closes
/// its pool and exits.
#[tokio::test]
async fn a_poll_running_at_shutdown_gives_its_mail_back_before_exit() {
    let url = fresh_database().await;
    let server = common::process::Process::start(
        &url,
        &[("RUST_LOG", "info"), ("PHONE_SHUTDOWN_GRACE_SECS", "10")],
    )
    .await;
    let app = TestApp::external(&server.url);
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    send_five(&c, &alice, "bob").await;

    let lock = connect(&url).await;
    lock_messages(&lock).await;
    poll_given_up_behind_the_lock(&app, bob.with(json!({"limit": 10}))).await;
    std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    // The poll's statement is still held by the lock when the signal comes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    lock.batch_execute("COMMIT").await.unwrap();
    let log = server.stop();
    let db = connect(&url).await;
    let unread: i64 = db
        .query_one("SELECT count(*) FROM messages WHERE read_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        unread, 5,
        "mail taken for a caller that left was lost: {log}"
    );
}
