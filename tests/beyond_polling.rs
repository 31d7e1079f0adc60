//! Waiting for mail, leases with acknowledgement, receipts, threads,
//! presence, token rotation and unregistering.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

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

/// A long poll started in the background: its answer and how long it took.
fn poll_in_background(client: Client, args: Value) -> tokio::task::JoinHandle<(Value, Duration)> {
    tokio::spawn(async move {
        let started = Instant::now();
        let out = ok(&client, "phone_inbox", args).await;
        (out, started.elapsed())
    })
}

/// A finished long poll removes its waiter row (just after answering).
async fn assert_no_waiters_left(db: &tokio_postgres::Client) {
    let mut waiters: i64 = -1;
    for _ in 0..100 {
        waiters = db
            .query_one("SELECT count(*) FROM inbox_waiters", &[])
            .await
            .unwrap()
            .get(0);
        if waiters == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{waiters} waiter rows left behind");
}

/// The race a wake-up must not lose: a send whose statement began before
/// the poll registered as a waiter, and which commits after the poll's own
/// last look at the inbox. Neither saw the other in its own snapshot; the
/// wake-up must still come (from a statement after the send's commit), not
/// the end of the wait.
#[tokio::test]
async fn a_send_in_flight_while_the_poll_registers_still_wakes_it() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let (lock, sending) =
        send_held_by_a_row_lock(&app, &a, a.with(json!({"to": "bob", "body": "in flight"}))).await;
    let watcher = app.db().await;
    let waiting = poll_in_background(app.client().await, b.with(json!({"wait_seconds": 20})));
    wait_until(
        &watcher,
        "the poll is registered",
        "SELECT EXISTS (SELECT 1 FROM inbox_waiters)",
    )
    .await;
    // Time for the poll's look after registering (it finds nothing: the
    // send has not committed).
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.batch_execute("COMMIT").await.unwrap();
    let sent = sending.await.unwrap();
    let (out, elapsed) = waiting.await.unwrap();
    assert_eq!(ids(&out), [sent["id"].as_str().unwrap()]);
    assert!(
        elapsed < Duration::from_secs(10),
        "slept through the wake-up: answered after {elapsed:?} of a 20 s wait"
    );
}

#[tokio::test]
async fn a_waiting_poll_on_one_replica_wakes_for_a_send_on_another() {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let c1 = one.client().await;
    let c2 = two.client().await;
    let a = register(&c1, "alice", "A", "p").await;
    let b = register(&c1, "bob", "B", "p").await;

    // Nothing arrives: the wait ends empty, and leaves no waiter behind.
    let empty = ok(&c1, "phone_inbox", b.with(json!({"wait_seconds": 1}))).await;
    assert!(ids(&empty).is_empty());
    let db = one.db().await;
    assert_no_waiters_left(&db).await;

    let waiting = poll_in_background(c1, b.with(json!({"wait_seconds": 20})));
    // Send once the poll is registered as a waiter.
    for _ in 0..100 {
        let n: i64 = db
            .query_one("SELECT count(*) FROM inbox_waiters", &[])
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sent = ok(
        &c2,
        "phone_send",
        a.with(json!({"to": "bob", "body": "wake up"})),
    )
    .await;
    let (out, elapsed) = waiting.await.unwrap();
    assert_eq!(ids(&out), [sent["id"].as_str().unwrap()]);
    // Woken by the notification, not by the end of the 20 s wait.
    assert!(elapsed < Duration::from_secs(15), "woke after {elapsed:?}");
    assert_no_waiters_left(&db).await;

    let err = tool_err(&c2, "phone_inbox", b.with(json!({"wait_seconds": 26}))).await;
    assert!(err.contains("from 0 to 25"), "{err}");
    let err = tool_err(
        &c2,
        "phone_inbox",
        b.with(json!({"wait_seconds": 5, "include_read": true})),
    )
    .await;
    assert!(err.contains("cannot be combined"), "{err}");
    two.stop().await;
    one.stop().await;
}

/// A poll that stops at its byte budget held the rest of the inbox locked
/// while it ran, and a poll of that inbox elsewhere may have skipped it and
/// gone to wait: it is woken as for new mail, not left to its deadline.
#[tokio::test]
async fn a_poll_that_stops_at_its_budget_wakes_the_inboxs_waiting_polls() {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let c1 = one.client().await;
    let a = register(&c1, "alice", "A", "p").await;
    let b = register(&c1, "bob", "B", "p").await;
    let db = one.db().await;
    // The waiting poll looks once more just after its waiter row is
    // visible, and nothing outside the server shows when that look is
    // done: if it comes after the lock below is released, it takes the
    // mail itself and the case did not happen. Then again, a few times.
    for attempt in 1..=5 {
        for i in 0..3 {
            ok(
                &c1,
                "phone_send",
                a.with(json!({"to": "bob", "body": format!("{i}{}", "x".repeat(20_000))})),
            )
            .await;
        }
        // The mail is there but held: a waiting poll finds nothing and sleeps.
        let holder = one.db().await;
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .execute("SELECT id FROM messages FOR UPDATE", &[])
            .await
            .unwrap();
        let waiting = poll_in_background(two.client().await, b.with(json!({"wait_seconds": 20})));
        wait_until(
            &db,
            "the poll waits",
            "SELECT count(*) > 0 FROM inbox_waiters",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
        holder.batch_execute("COMMIT").await.unwrap();
        // A poll on the other replica takes two and stops at its budget.
        let taken = ok(&c1, "phone_inbox", b.with(json!({"limit": 10}))).await;
        let taken = taken["messages"].as_array().unwrap().len();
        let (out, elapsed) = waiting.await.unwrap();
        let woken = out["messages"].as_array().unwrap().len();
        assert_eq!(taken + woken, 3, "{out}");
        if taken == 1 && woken == 2 {
            // The waiting poll's second look came after the release.
            assert_no_waiters_left(&db).await;
            continue;
        }
        assert_eq!((taken, woken), (2, 1), "{out}");
        assert!(elapsed < Duration::from_secs(15), "woke after {elapsed:?}");
        two.stop().await;
        one.stop().await;
        return;
    }
    panic!("the waiting poll's second look came after the release five times");
}

#[tokio::test]
async fn leased_messages_come_back_unless_acknowledged() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let mut sent = Vec::new();
    for i in 0..3 {
        let out = ok(
            &c,
            "phone_send",
            a.with(json!({"to": "bob", "body": format!("job {i}")})),
        )
        .await;
        sent.push(out["id"].as_str().unwrap().to_owned());
    }

    let lease = ok(
        &c,
        "phone_inbox",
        b.with(json!({"mode": "lease", "lease_seconds": 60, "limit": 2})),
    )
    .await;
    assert_eq!(ids(&lease), sent[..2]);
    assert_eq!(lease["messages"][0]["delivery_count"], 1);
    assert!(lease["messages"][0]["lease_expires_at"].is_string());
    assert!(
        lease["messages"][0]["read_at"].is_null(),
        "a lease does not consume"
    );
    // While leased, neither a lease nor a read poll hands them out again.
    let read = ok(
        &c,
        "phone_inbox",
        b.with(json!({"limit": 10, "peek": true})),
    )
    .await;
    assert_eq!(ids(&read), sent[2..]);

    // Alice may not acknowledge Bob's mail.
    let foreign = ok(&c, "phone_ack", a.with(json!({"ids": [sent[0]]}))).await;
    assert_eq!(foreign["not_found"], json!([sent[0]]));
    let acked = ok(
        &c,
        "phone_ack",
        b.with(json!({"ids": [sent[0], "msg_999999", sent[0]]})),
    )
    .await;
    // Listed twice, acknowledged (and counted) once.
    assert_eq!(acked["acknowledged"], json!([sent[0]]));
    assert_eq!(acked["not_found"], json!(["msg_999999"]));

    // The lease ends (in SQL: a lease of a second ended before the peek
    // above when the machine was loaded).
    expire_leases(&app).await;
    let again = ok(
        &c,
        "phone_inbox",
        b.with(json!({"mode": "lease", "limit": 10})),
    )
    .await;
    assert_eq!(
        ids(&again),
        sent[1..],
        "the unacknowledged lease came back, the acknowledged did not"
    );
    assert_eq!(again["messages"][0]["delivery_count"], 2);
    ok(&c, "phone_ack", b.with(json!({"ids": ids(&again)}))).await;

    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    let states: Vec<&str> = outbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["acknowledged"; 3]);
    let err = tool_err(
        &c,
        "phone_inbox",
        b.with(json!({"mode": "lease", "peek": true})),
    )
    .await;
    assert!(err.contains("cannot be combined"), "{err}");
    let err = tool_err(&c, "phone_inbox", b.with(json!({"mode": "grab"}))).await;
    assert!(err.contains("\"read\" or \"lease\""), "{err}");
    let err = tool_err(&c, "phone_ack", b.with(json!({"ids": []}))).await;
    assert!(err.contains("at least one"), "{err}");
    app.stop().await;
}

/// Ends every lease now, as if `lease_seconds` had passed.
async fn expire_leases(app: &TestApp) {
    app.db()
        .await
        .batch_execute("UPDATE messages SET leased_until = now() - interval '1 second' WHERE leased_until IS NOT NULL")
        .await
        .unwrap();
}

/// A worker whose lease ended may not acknowledge a message that went to
/// another worker since: its receipt is for a delivery that is over.
#[tokio::test]
async fn a_stale_receipt_is_refused_and_the_current_one_acknowledges() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let sent = ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "job"})),
    )
    .await;
    let lease = |limit: u32| b.with(json!({"mode": "lease", "limit": limit}));

    let first = ok(&c, "phone_inbox", lease(1)).await;
    let old_receipt = first["messages"][0]["receipt"].as_str().unwrap().to_owned();
    assert!(old_receipt.starts_with("rcpt_"), "{first}");
    let text = text(&call(&c, "phone_inbox", b.with(json!({"include_read": true}))).await);
    assert!(!text.contains("rcpt_"), "history shows no receipt: {text}");
    expire_leases(&app).await;
    let second = ok(&c, "phone_inbox", lease(1)).await;
    assert_eq!(second["messages"][0]["id"], sent["id"]);
    let new_receipt = second["messages"][0]["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_receipt, old_receipt);

    // The first worker comes back late.
    let err = tool_err(&c, "phone_ack", b.with(json!({"ids": [old_receipt]}))).await;
    assert!(
        err.contains("handed to another worker") && err.contains(sent["id"].as_str().unwrap()),
        "{err}"
    );
    let state = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        state["messages"][0]["state"], "leased",
        "the stale ack changed nothing"
    );
    // The current holder's receipt works; acknowledging again is harmless.
    let acked = ok(
        &c,
        "phone_ack",
        b.with(json!({"ids": [new_receipt.clone()]})),
    )
    .await;
    assert_eq!(acked["acknowledged"], json!([sent["id"]]));
    let again = ok(&c, "phone_ack", b.with(json!({"ids": [new_receipt]}))).await;
    assert_eq!(again["acknowledged"], json!([sent["id"]]));
    // Receipts are the recipient's alone, and must be receipts.
    let stranger = ok(
        &c,
        "phone_ack",
        a.with(json!({"ids": [old_receipt_of(&first)]})),
    )
    .await;
    assert_eq!(stranger["not_found"], json!([sent["id"]]), "{stranger}");
    let forged = tool_err(&c, "phone_ack", b.with(json!({"ids": ["rcpt_xyz"]}))).await;
    assert!(forged.contains("is not a receipt"), "{forged}");
    app.stop().await;
}

/// A worker acknowledges what it handled with its next lease poll: one call
/// per round where `phone_ack` made two. Stale and foreign receipts are
/// reported beside the new mail and change nothing; the acknowledgement is
/// the caller's own, verified like any other.
#[tokio::test]
async fn a_lease_poll_acknowledges_what_the_worker_handled_before_taking_more() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let mut jobs = Vec::new();
    for i in 0..4 {
        let out = ok(
            &c,
            "phone_send",
            a.with(json!({"to": "bob", "body": format!("job {i}")})),
        )
        .await;
        jobs.push(out["id"].as_str().unwrap().to_owned());
    }
    let lease_acking = |ack: Value| b.with(json!({"mode": "lease", "limit": 1, "ack": ack}));
    let states = |outbox: &Value| -> Vec<String> {
        outbox["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .map(|m| m["state"].as_str().unwrap().to_owned())
            .collect()
    };

    let first = ok(&c, "phone_inbox", lease_acking(json!([]))).await;
    assert_eq!(ids(&first), jobs[..1], "an empty ack only polls");
    assert!(first.get("acks").is_none(), "{first}");
    let r0 = old_receipt_of(&first);

    let called = call(&c, "phone_inbox", lease_acking(json!([r0.clone()]))).await;
    let second = called
        .structured_content
        .clone()
        .expect("structured content");
    assert_eq!(ids(&second), jobs[1..2], "{second}");
    assert_eq!(second["acks"]["acknowledged"], json!([jobs[0]]), "{second}");
    assert_eq!(second["acks"]["stale"], json!([]));
    let said = text(&called);
    assert!(said.starts_with("Acknowledged 1 message(s)."), "{said}");
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        states(&outbox),
        ["acknowledged", "leased", "waiting", "waiting"]
    );

    // A retry of the same call acknowledges again, harmlessly.
    let r1 = old_receipt_of(&second);
    let retried = ok(&c, "phone_inbox", lease_acking(json!([r0]))).await;
    assert_eq!(retried["acks"]["acknowledged"], json!([jobs[0]]));
    assert_eq!(ids(&retried), jobs[2..3]);

    // The worker's lease on job 1 ends and job 1 goes out again; its late
    // acknowledgement with the old receipt changes nothing, and the poll
    // still hands out what waits.
    expire_leases(&app).await;
    let redelivered = ok(&c, "phone_inbox", lease_acking(json!([]))).await;
    assert_eq!(ids(&redelivered), jobs[1..2]);
    assert_eq!(redelivered["messages"][0]["delivery_count"], 2);
    let called = call(&c, "phone_inbox", lease_acking(json!([r1, "msg_999999"]))).await;
    let late = called
        .structured_content
        .clone()
        .expect("structured content");
    assert_eq!(late["acks"]["acknowledged"], json!([]), "{late}");
    assert_eq!(late["acks"]["stale"], json!([jobs[1]]), "{late}");
    assert_eq!(late["acks"]["not_found"], json!(["msg_999999"]), "{late}");
    assert_eq!(ids(&late), jobs[2..3], "job 2's lease ended too");
    let said = text(&called);
    assert!(said.contains("do not act on them again"), "{said}");
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        states(&outbox),
        ["acknowledged", "leased", "leased", "waiting"],
        "the stale receipt acknowledged nothing"
    );

    // A plain id acknowledges whatever delivery is current; named twice,
    // it is acknowledged (and counted) once.
    let by_id = ok(&c, "phone_inbox", lease_acking(json!([jobs[1], jobs[1]]))).await;
    assert_eq!(by_id["acks"]["acknowledged"], json!([jobs[1]]), "{by_id}");
    assert!(by_id["acks"].get("pending").is_none(), "{by_id}");
    assert_eq!(ids(&by_id), jobs[3..4]);
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        states(&outbox),
        ["acknowledged", "acknowledged", "leased", "leased"]
    );

    // Bob's receipts are Bob's: Alice's poll acknowledges none of them.
    let theirs = ok(
        &c,
        "phone_inbox",
        a.with(json!({"mode": "lease", "ack": [old_receipt_of(&late)]})),
    )
    .await;
    assert_eq!(theirs["acks"]["not_found"], json!([jobs[2]]), "{theirs}");
    // A wrong token acknowledges nothing and polls nothing.
    let wrong = json!({"name": "bob", "token": "tok_wrong", "mode": "lease", "ack": [old_receipt_of(&late)]});
    let err = tool_err(&c, "phone_inbox", wrong).await;
    assert!(err.contains("token"), "{err}");
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        states(&outbox),
        ["acknowledged", "acknowledged", "leased", "leased"]
    );

    for (args, expected) in [
        (
            json!({"ack": [old_receipt_of(&late)]}),
            "only applies with mode \"lease\"",
        ),
        (
            json!({"peek": true, "ack": ["msg_1"]}),
            "only applies with mode \"lease\"",
        ),
        (json!({"query": "job", "ack": ["msg_1"]}), "drop ack"),
        (
            json!({"mode": "lease", "ack": ["rcpt_xyz"]}),
            "is not a receipt",
        ),
        (json!({"mode": "lease", "ack": "msg_x"}), "ack"),
        (json!({"mode": "lease", "ack": [7]}), "a list of strings"),
    ] {
        let err = tool_err(&c, "phone_inbox", b.with(args.clone())).await;
        assert!(err.contains(expected), "{args}: {err}");
    }
    let too_many: Vec<String> = (1..=101).map(|i| format!("msg_{i}")).collect();
    let err = tool_err(
        &c,
        "phone_inbox",
        b.with(json!({"mode": "lease", "ack": too_many})),
    )
    .await;
    assert!(err.contains("at most 100"), "{err}");
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(
        states(&outbox),
        ["acknowledged", "acknowledged", "leased", "leased"],
        "refused calls changed nothing"
    );
    app.stop().await;
}

/// A long poll that acknowledges reports its acknowledgements even when it
/// waited and came back with other mail, or with none.
#[tokio::test]
async fn a_waiting_lease_poll_still_reports_what_it_acknowledged() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    let waited = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"mode": "lease", "wait_seconds": 1, "ack": [receipt]})),
    )
    .await;
    assert_eq!(ids(&waited), Vec::<String>::new(), "{waited}");
    assert_eq!(waited["acks"]["acknowledged"], json!([id]), "{waited}");
    app.stop().await;
}

/// An acknowledgement carried by a poll never holds the poll's batch on a
/// row another transaction has locked: the batch takes the new mail and
/// commits, and only that acknowledgement waits, on a statement of its
/// own, then reports as phone_ack would.
#[tokio::test]
async fn an_acknowledgement_in_a_poll_never_holds_the_batch_on_a_locked_row() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "next"})),
    )
    .await;
    // Another acknowledgement of the same message, holding its row.
    let other = app.db().await;
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(
            "UPDATE messages SET acked_at = now(), read_at = coalesce(read_at, now()),
                                 leased_until = NULL
             WHERE body = 'job'",
            &[],
        )
        .await
        .unwrap();
    let polling = {
        let c = app.client().await;
        let args = bob.with(json!({"mode": "lease", "limit": 1, "ack": [receipt]}));
        tokio::spawn(async move { ok(&c, "phone_inbox", args).await })
    };
    wait_until(
        &app.db().await,
        "the poll's batch leased the next message while the row stayed locked",
        "SELECT delivery_count = 1 FROM messages WHERE body = 'next'",
    )
    .await;
    sends_waiting_on_locks(&app, 1).await;
    other.batch_execute("COMMIT").await.unwrap();
    let polled = polling.await.expect("the poll succeeds");
    assert_eq!(polled["acks"]["acknowledged"], json!([id]), "{polled}");
    assert_eq!(polled["messages"][0]["body"], "next", "{polled}");
    app.stop().await;
}

/// A lease that ended but went to nobody else yet is still the worker's to
/// acknowledge; the poll that carries that acknowledgement does not hand
/// the same message out again.
#[tokio::test]
async fn a_late_acknowledgement_in_a_poll_is_not_handed_out_by_that_poll() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    expire_leases(&app).await;
    let polled = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"mode": "lease", "ack": [receipt]})),
    )
    .await;
    assert_eq!(polled["acks"]["acknowledged"], json!([id]), "{polled}");
    assert_eq!(ids(&polled), Vec::<String>::new(), "{polled}");
    assert_eq!(polled["unread_remaining"], 0, "{polled}");
    let row = app
        .db()
        .await
        .query_one(
            "SELECT delivery_count, acked_at IS NOT NULL AS acked, leased_until IS NULL AS free
             FROM messages WHERE body = 'job'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>("delivery_count"), 1);
    assert!(row.get::<_, bool>("acked") && row.get::<_, bool>("free"));
    app.stop().await;
}

/// Workers on two replicas that acknowledge each lease in their next poll
/// take every message exactly once, and acknowledge each once.
#[tokio::test]
async fn workers_acknowledging_in_their_next_poll_take_each_message_once() {
    let (one, two, b) = two_replicas_and_tasks_for_bob(120).await;
    let mut workers = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 {
            one.client().await
        } else {
            two.client().await
        };
        let args = b.with(json!({"mode": "lease", "lease_seconds": 600, "limit": 3}));
        workers.push(tokio::spawn(async move {
            let (mut got, mut acked) = (Vec::new(), Vec::new());
            let mut receipts: Vec<String> = Vec::new();
            for _ in 0..100 {
                let mut args = args.clone();
                args["ack"] = json!(receipts);
                let out = ok(&client, "phone_inbox", args).await;
                if !receipts.is_empty() {
                    let done = out["acks"]["acknowledged"].as_array().unwrap();
                    acked.extend(done.iter().map(|x| x.as_str().unwrap().to_owned()));
                }
                receipts = out["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["receipt"].as_str().unwrap().to_owned())
                    .collect();
                if receipts.is_empty() {
                    break;
                }
                got.extend(ids(&out));
            }
            (got, acked)
        }));
    }
    let (mut all, mut acked) = (Vec::new(), Vec::new());
    for w in workers {
        let (got, done) = w.await.unwrap();
        all.extend(got);
        acked.extend(done);
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a message was leased twice");
    assert_eq!(all.len(), 120);
    all.sort();
    acked.sort();
    assert_eq!(acked, all, "each message acknowledged once");
    let left = one
        .db()
        .await
        .query_one(
            "SELECT count(*) FILTER (WHERE acked_at IS NULL), max(delivery_count) FROM messages",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(left.get::<_, i64>(0), 0, "every message acknowledged");
    assert_eq!(left.get::<_, Option<i32>>(1), Some(1));
    two.stop().await;
    one.stop().await;
}

fn old_receipt_of(out: &Value) -> String {
    out["messages"][0]["receipt"].as_str().unwrap().to_owned()
}

/// A message that keeps failing stops coming back after `max_deliveries`
/// leases: dead to its sender and in its recipient's history, never deleted,
/// and no poll of either mode hands it out again.
#[tokio::test]
async fn a_message_leased_too_often_dies_and_stays() {
    let app = spawn_app_with(&[("PHONE_MAX_DELIVERIES", "3")]).await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let poison = ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "poison"})),
    )
    .await;
    let lease = b.with(json!({"mode": "lease"}));
    for delivery in 1..=3 {
        let got = ok(&c, "phone_inbox", lease.clone()).await;
        assert_eq!(got["messages"][0]["delivery_count"], delivery, "{got}");
        expire_leases(&app).await;
    }
    let after = ok(&c, "phone_inbox", lease.clone()).await;
    assert_eq!(after["messages"], json!([]), "{after}");
    assert_eq!(after["unread_remaining"], 0);
    let read = ok(&c, "phone_inbox", b.with(json!({}))).await;
    assert_eq!(
        read["messages"],
        json!([]),
        "a dead message is not read either"
    );

    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(outbox["messages"][0]["id"], poison["id"]);
    assert_eq!(outbox["messages"][0]["state"], "dead", "{outbox}");
    let history = call(&c, "phone_inbox", b.with(json!({"include_read": true}))).await;
    let out = history.structured_content.clone().unwrap();
    assert!(out["messages"][0]["dead_at"].is_string(), "{out}");
    assert!(text(&history).contains("dead"), "{}", text(&history));
    assert_eq!(
        app.count("SELECT count(*) FROM messages").await,
        1,
        "never deleted"
    );

    // Per poll, a lower bound: a fresh message dies after one lease.
    ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "fragile"})),
    )
    .await;
    let once = b.with(json!({"mode": "lease", "max_deliveries": 1}));
    assert_eq!(
        ok(&c, "phone_inbox", once.clone()).await["messages"][0]["body"],
        "fragile"
    );
    expire_leases(&app).await;
    assert_eq!(ok(&c, "phone_inbox", once).await["messages"], json!([]));
    let err = tool_err(&c, "phone_inbox", b.with(json!({"max_deliveries": 2}))).await;
    assert!(err.contains("only applies with mode"), "{err}");
    app.stop().await;
}

/// Two replicas of one database, and `tasks` messages from alice waiting
/// in bob's inbox.
async fn two_replicas_and_tasks_for_bob(tasks: usize) -> (TestApp, TestApp, Agent) {
    let one = spawn_app().await;
    let two = spawn_app_on(&one.database_url, &[]).await;
    let c = one.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    for i in 0..tasks {
        ok(
            &c,
            "phone_send",
            a.with(json!({"to": "bob", "body": format!("task {i}")})),
        )
        .await;
    }
    (one, two, b)
}

#[tokio::test]
async fn concurrent_lease_holders_on_two_replicas_never_share_a_message() {
    let (one, two, b) = two_replicas_and_tasks_for_bob(120).await;
    let mut workers = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 {
            one.client().await
        } else {
            two.client().await
        };
        let args = b.with(json!({"mode": "lease", "lease_seconds": 600, "limit": 5}));
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..100 {
                let out = ok(&client, "phone_inbox", args.clone()).await;
                let batch = ids(&out);
                if batch.is_empty() {
                    break;
                }
                got.extend(batch);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "a message was leased twice");
    assert_eq!(all.len(), 120);
    two.stop().await;
    one.stop().await;
}

#[tokio::test]
async fn outbox_and_threads_show_state_and_conversation_to_participants_only() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "q").await;
    let eve = register(&c, "eve", "E", "p").await;

    let q = ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "question", "subject": "s"})),
    )
    .await;
    let q_id = q["id"].as_str().unwrap();
    ok(&c, "phone_inbox", b.with(json!({}))).await;
    let r = ok(
        &c,
        "phone_send",
        b.with(json!({"reply_to": q_id, "body": "answer"})),
    )
    .await;
    let f = ok(
        &c,
        "phone_send",
        a.with(json!({"reply_to": r["id"], "body": "follow-up"})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        a.with(json!({"to": "eve", "body": "unrelated"})),
    )
    .await;

    let outbox = ok(&c, "phone_outbox", a.with(json!({"limit": 2}))).await;
    let first_page: Vec<&str> = outbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(first_page, ["waiting", "waiting"]);
    let page2 = ok(
        &c,
        "phone_outbox",
        a.with(json!({"limit": 2, "cursor": outbox["next_cursor"]})),
    )
    .await;
    assert_eq!(page2["messages"][0]["id"], q_id);
    assert_eq!(page2["messages"][0]["state"], "read");
    assert!(page2["messages"][0]["read_at"].is_string());
    assert!(page2.get("next_cursor").is_none());

    for (who, start) in [(&a, f["id"].as_str().unwrap()), (&b, q_id)] {
        let thread = ok(&c, "phone_thread", who.with(json!({"message_id": start}))).await;
        let bodies: Vec<&str> = thread["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap())
            .collect();
        assert_eq!(bodies, ["question", "answer", "follow-up"]);
        assert_eq!(thread["thread_id"], q_id);
        assert_eq!(thread["messages"][1]["from"], "bob");
        assert_eq!(thread["messages"][1]["to"], "alice");
    }
    let err = tool_err(&c, "phone_thread", eve.with(json!({"message_id": q_id}))).await;
    assert!(
        err.contains("not found among the messages you sent or received"),
        "{err}"
    );
    let page = ok(
        &c,
        "phone_thread",
        b.with(json!({"message_id": q_id, "limit": 2})),
    )
    .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 2);
    let rest = ok(
        &c,
        "phone_thread",
        b.with(json!({"message_id": q_id, "limit": 2, "cursor": page["next_cursor"]})),
    )
    .await;
    assert_eq!(rest["messages"][0]["body"], "follow-up");
    app.stop().await;
}

#[tokio::test]
async fn presence_is_written_at_most_once_a_minute() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let db = app.db().await;
    db.execute(
        "UPDATE agents SET last_seen_at = now() - interval '2 hours'",
        &[],
    )
    .await
    .unwrap();
    ok(&c, "phone_inbox", a.with(json!({}))).await;
    let fresh: bool = db
        .query_one(
            "SELECT last_seen_at > now() - interval '1 minute' FROM agents",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(fresh, "a call after a long absence updates last_seen_at");
    db.execute(
        "UPDATE agents SET last_seen_at = now() - interval '30 seconds'",
        &[],
    )
    .await
    .unwrap();
    let before: String = db
        .query_one("SELECT last_seen_at::text FROM agents", &[])
        .await
        .unwrap()
        .get(0);
    ok(&c, "phone_inbox", a.with(json!({}))).await;
    let after: String = db
        .query_one("SELECT last_seen_at::text FROM agents", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "no write within the minute");
    let found = ok(&c, "phone_search", json!({"query": "alice"})).await;
    assert!(found["agents"][0]["last_seen_at"].is_string());
    app.stop().await;
}

#[tokio::test]
async fn rotating_a_token_revokes_the_old_one_at_once() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let rotated = ok(&c, "phone_rotate_token", a.with(json!({}))).await;
    let new_token = rotated["token"].as_str().unwrap().to_owned();
    assert_ne!(new_token, a.token);
    let err = tool_err(&c, "phone_inbox", a.with(json!({}))).await;
    assert!(err.starts_with("invalid token"), "revoked token: {err}");
    let renewed = Agent {
        name: a.name.clone(),
        token: new_token,
    };
    ok(&c, "phone_inbox", renewed.with(json!({}))).await;
    // Updating the entry needs the new token too.
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "alice", "description": "x", "project": "p", "token": a.token}),
    )
    .await;
    assert!(err.contains("name already registered"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn unregistering_revokes_hides_reserves_and_keeps_history() {
    let app = spawn_app().await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let q = ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "before"})),
    )
    .await;

    let gone = ok(&c, "phone_unregister", b.with(json!({}))).await;
    assert_eq!(gone["name"], "bob");
    let err = tool_err(&c, "phone_inbox", b.with(json!({}))).await;
    assert!(err.starts_with("invalid token"), "{err}");
    let found = ok(&c, "phone_search", json!({"query": "bob"})).await;
    assert!(found["agents"].as_array().unwrap().is_empty());
    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "hello?"})),
    )
    .await;
    assert!(err.contains("no agent named 'bob'"), "{err}");
    let err = tool_err(
        &c,
        "phone_register",
        json!({"name": "bob", "description": "new bob", "project": "p"}),
    )
    .await;
    assert!(err.contains("stays reserved until"), "{err}");
    // History is kept for the other party.
    let outbox = ok(&c, "phone_outbox", a.with(json!({}))).await;
    assert_eq!(outbox["messages"][0]["id"], q["id"]);

    // After the reservation, the name is free for a new identity, which
    // inherits nothing: not the old inbox, not replies to old threads.
    app.db()
        .await
        .execute(
            "UPDATE agents SET unregistered_at = now() - interval '31 days' WHERE name = 'bob'",
            &[],
        )
        .await
        .unwrap();
    let new_bob = register(&c, "bob", "A different bob", "p").await;
    let inbox = ok(
        &c,
        "phone_inbox",
        new_bob.with(json!({"include_read": true})),
    )
    .await;
    assert!(ids(&inbox).is_empty());
    let err = tool_err(
        &c,
        "phone_send",
        a.with(json!({"reply_to": q["id"], "body": "still there?"})),
    )
    .await;
    // Not "no agent named 'bob'": there is one, which search finds.
    assert!(
        err.contains("'bob' of this conversation left the directory"),
        "{err}"
    );
    let err = tool_err(
        &c,
        "phone_thread",
        new_bob.with(json!({"message_id": q["id"]})),
    )
    .await;
    assert!(err.contains("not found"), "{err}");
    app.stop().await;
}

/// How often this test's database ran a caller's verification on its own
/// (`WITH holder AS …`, what tools that do not verify inside their own
/// statement run first).
async fn verifications(db: &tokio_postgres::Client) -> i64 {
    statements_like(db, "WITH holder AS%")
        .await
        .iter()
        .map(|x| x.calls)
        .sum()
}

/// An acknowledgement verifies its caller inside its own statement, as
/// sends and polls do: one round trip, where a verification of its own came
/// first (a lease worker acknowledges after every poll that took mail).
/// The same rules hold: a token nobody holds, or a name its holder does not
/// bear, acknowledges nothing.
#[tokio::test]
async fn an_acknowledgement_verifies_its_caller_in_its_own_statement() {
    let app = spawn_app().await;
    let c = app.client().await;
    let db = app.db().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &a, &b, "lease me").await;

    let forged = json!({"ids": [&receipt], "token": format!("phn_{}", "A".repeat(43))});
    let err = tool_err(&c, "phone_ack", forged).await;
    assert!(err.contains("invalid token"), "{err}");
    let mut posing = b.with(json!({"ids": [&receipt]}));
    posing["name"] = json!("alice");
    let err = tool_err(&c, "phone_ack", posing).await;
    assert!(err.contains("belongs to a different agent"), "{err}");

    let acked_now = "SELECT count(*) FROM messages WHERE acked_at IS NOT NULL";
    assert_eq!(
        app.count(acked_now).await,
        0,
        "a refused acknowledgement took the message"
    );
    let before = verifications(&db).await;
    let acked = ok(&c, "phone_ack", b.with(json!({"ids": [&receipt]}))).await;
    assert_eq!(acked["acknowledged"], json!([id]), "{acked}");
    assert_eq!(
        verifications(&db).await,
        before,
        "phone_ack verified its caller in a statement of its own"
    );
    assert_eq!(app.count(acked_now).await, 1);
    app.stop().await;
}

/// An acknowledgement that waits for another of the same message (a retry
/// sent to another replica, say) hears "acknowledged", not "stale receipt":
/// the message is acknowledged, and its receipt was the current delivery.
/// (It read the message as it was before the other committed.)
#[tokio::test]
async fn an_acknowledgement_racing_another_of_the_same_message_hears_acknowledged() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    // The other acknowledgement, holding the message's row until it commits.
    let other = app.db().await;
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(
            "UPDATE messages SET acked_at = now(), read_at = coalesce(read_at, now()),
                                 leased_until = NULL
             WHERE body = 'job'",
            &[],
        )
        .await
        .unwrap();
    let racing = {
        let c = app.client().await;
        let args = bob.with(json!({"ids": [receipt]}));
        tokio::spawn(async move { ok(&c, "phone_ack", args).await })
    };
    sends_waiting_on_locks(&app, 1).await;
    other.batch_execute("COMMIT").await.unwrap();
    let acked = racing.await.expect("the racing acknowledgement succeeds");
    assert_eq!(acked["acknowledged"], json!([id]), "{acked}");
    app.stop().await;
}

/// A receipt of a delivery that is over stays stale once the next delivery
/// is acknowledged, through `phone_ack` and through a poll's `ack`: the
/// worker whose lease ended is told another worker had it (an outsider's
/// attack found it answered "acknowledged" about 70% of the time, as soon as
/// the other worker had finished).
#[tokio::test]
async fn a_stale_receipt_stays_stale_after_the_next_delivery_is_acknowledged() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    for body in ["one", "two"] {
        let (id, old) = sent_and_leased(&c, &alice, &bob, body).await;
        expire_leases(&app).await;
        let again = ok(
            &c,
            "phone_inbox",
            bob.with(json!({"mode": "lease", "limit": 1})),
        )
        .await;
        let new = again["messages"][0]["receipt"].as_str().unwrap().to_owned();
        let acked = ok(&c, "phone_ack", bob.with(json!({"ids": [new]}))).await;
        assert_eq!(acked["acknowledged"], json!([id]), "{acked}");
        if body == "one" {
            let err = tool_err(&c, "phone_ack", bob.with(json!({"ids": [old]}))).await;
            assert!(err.contains("handed to another worker"), "{err}");
        } else {
            let polled = ok(
                &c,
                "phone_inbox",
                bob.with(json!({"mode": "lease", "ack": [old.clone(), new]})),
            )
            .await;
            assert_eq!(polled["acks"]["stale"], json!([id]), "{polled}");
            assert_eq!(polled["acks"]["acknowledged"], json!([id]), "{polled}");
        }
    }
    app.stop().await;
}

/// A poll's acknowledgement left undecided (its row busy, and the
/// acknowledgement alone failed too) is handed back as it was given: a
/// receipt, not its message's plain id, which would acknowledge whatever
/// delivery is current: another worker's, once the lease ended (an
/// outsider's attack).
#[tokio::test]
async fn pending_acknowledgements_come_back_as_the_receipts_given() {
    let app = spawn_app_with(&[("PHONE_STATEMENT_TIMEOUT_MS", "300")]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    let holder = app.db().await;
    holder
        .batch_execute("BEGIN; SELECT 1 FROM messages WHERE body = 'job' FOR UPDATE")
        .await
        .unwrap();
    let polled = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"mode": "lease", "ack": [receipt.clone()]})),
    )
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(polled["acks"]["pending"], json!([receipt]), "{polled}");
    // Passed again after the lease went to another worker, it is stale.
    expire_leases(&app).await;
    ok(
        &c,
        "phone_inbox",
        bob.with(json!({"mode": "lease", "limit": 1})),
    )
    .await;
    let err = tool_err(&c, "phone_ack", bob.with(json!({"ids": [receipt]}))).await;
    assert!(
        err.contains("handed to another worker") && err.contains(&id),
        "{err}"
    );
    app.stop().await;
}

/// A message named twice in one list, by its receipt and by its plain id,
/// is acknowledged once: it was "Acknowledged 2 message(s)", listed twice.
#[tokio::test]
async fn a_message_named_by_receipt_and_by_id_is_acknowledged_once() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job").await;
    let call = crate::call(
        &c,
        "phone_ack",
        bob.with(json!({"ids": [receipt.clone(), id.clone()]})),
    )
    .await;
    let out = call.structured_content.clone().unwrap();
    assert_eq!(out["acknowledged"], json!([id]), "{out}");
    assert!(
        text(&call).contains("Acknowledged 1 message"),
        "{}",
        text(&call)
    );
    // And in a poll's `ack`.
    let (id, receipt) = sent_and_leased(&c, &alice, &bob, "job two").await;
    let polled = ok(
        &c,
        "phone_inbox",
        bob.with(json!({"mode": "lease", "ack": [id.clone(), receipt]})),
    )
    .await;
    assert_eq!(polled["acks"]["acknowledged"], json!([id]), "{polled}");
    app.stop().await;
}
