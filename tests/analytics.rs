//! The `analytics` schema: its views give the right numbers on a small
//! history written through the real server, expose no bodies, subjects or
//! tokens, reach their indexes, and the analyst role reads them and nothing
//! else. The role's creation survives many databases migrating at once.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio_postgres::{Client, NoTls};

/// Sets a message's times (the server stamps `now()`; the test needs known ones).
async fn stamp(db: &Client, id: &str, sent_at: &str, read_at: Option<&str>) {
    let id: i64 = id.trim_start_matches("msg_").parse().unwrap();
    db.execute(
        "UPDATE messages SET sent_at = $2::text::timestamptz, read_at = $3::text::timestamptz WHERE id = $1",
        &[&id, &sent_at, &read_at],
    )
    .await
    .unwrap();
}

async fn rows(db: &Client, sql: &str) -> Vec<Vec<String>> {
    db.simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL").to_owned())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn table(expected: &[&[&str]]) -> Vec<Vec<String>> {
    expected
        .iter()
        .map(|row| row.iter().map(|c| c.to_string()).collect())
        .collect()
}

#[tokio::test]
async fn views_count_a_known_history() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "plans", "team").await;
    let bob = register(&c, "bob", "codes", "team").await;
    let carol = register(&c, "carol", "operates", "ops").await;
    let send = |from: &Agent, args: serde_json::Value| {
        let args = from.with(args);
        let c = &c;
        async move {
            ok(c, "phone_send", args).await["id"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let m1 = send(
        &alice,
        json!({"to": "bob", "body": "secret one", "subject": "private subject"}),
    )
    .await;
    let m2 = send(&alice, json!({"to": "bob", "body": "secret two"})).await;
    let m3 = send(&bob, json!({"reply_to": m1, "body": "secret three"})).await;
    let m4 = send(&carol, json!({"to": "bob", "body": "secret four"})).await;
    let m5 = send(&alice, json!({"to": "carol", "body": "secret five"})).await;
    let m6 = send(&carol, json!({"reply_to": m5, "body": "secret six"})).await;

    let db = app.db().await;
    stamp(
        &db,
        &m1,
        "2026-11-02 10:00:00Z",
        Some("2026-11-02 10:01:00Z"),
    )
    .await;
    stamp(
        &db,
        &m2,
        "2026-11-02 10:05:00Z",
        Some("2026-11-02 10:08:00Z"),
    )
    .await;
    stamp(
        &db,
        &m3,
        "2026-11-02 10:02:00Z",
        Some("2026-11-02 10:02:30Z"),
    )
    .await;
    stamp(&db, &m4, "2026-11-03 09:00:00Z", None).await;
    stamp(
        &db,
        &m5,
        "2026-11-03 09:30:00Z",
        Some("2026-11-03 09:31:00Z"),
    )
    .await;
    stamp(&db, &m6, "2026-11-03 09:40:00Z", None).await;
    let _ = bob;

    assert_eq!(
        rows(
            &db,
            "SELECT day, messages, new_threads, replies, active_senders, active_recipients
                   FROM analytics.daily_messages ORDER BY day"
        )
        .await,
        table(&[
            &["2026-11-02", "3", "2", "1", "2", "2"],
            &["2026-11-03", "3", "2", "1", "2", "3"]
        ])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT day, project, sent, received, within_project
                   FROM analytics.project_daily_messages ORDER BY day, project"
        )
        .await,
        table(&[
            &["2026-11-02", "team", "3", "3", "3"],
            &["2026-11-03", "ops", "2", "1", "0"],
            &["2026-11-03", "team", "1", "2", "0"],
        ])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT agent, project, sent, replies_sent, received, read, unread,
                          extract(epoch FROM median_time_to_read)::int, answered,
                          extract(epoch FROM median_time_to_reply)::int
                   FROM analytics.agent_activity ORDER BY agent"
        )
        .await,
        table(&[
            &["alice", "team", "3", "0", "2", "1", "1", "30", "0", "NULL"],
            &["bob", "team", "1", "1", "3", "2", "1", "120", "1", "120"],
            &["carol", "ops", "2", "1", "1", "1", "0", "60", "1", "600"],
        ])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT thread, started_by, started_with, project, messages, replies,
                          extract(epoch FROM duration)::int, unread
                   FROM analytics.reply_chains ORDER BY started_at"
        )
        .await,
        table(&[
            &[&m1, "alice", "bob", "team", "2", "1", "120", "0"],
            &[&m2, "alice", "bob", "team", "1", "0", "0", "0"],
            &[&m4, "carol", "bob", "ops", "1", "0", "0", "1"],
            &[&m5, "alice", "carol", "team", "2", "1", "600", "1"],
        ])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT replies, threads, percent FROM analytics.reply_chain_lengths"
        )
        .await,
        table(&[&["0", "2", "50.0"], &["1", "2", "50.0"]])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT agent, unread, leased, oldest_unread_at AT TIME ZONE 'UTC'
                   FROM analytics.unread_backlog ORDER BY agent"
        )
        .await,
        table(&[
            &["alice", "1", "0", "2026-11-03 09:40:00"],
            &["bob", "1", "0", "2026-11-03 09:00:00"]
        ])
    );
    assert_eq!(
        rows(
            &db,
            "SELECT sender, recipient, messages FROM analytics.busiest_pairs"
        )
        .await,
        table(&[
            &["alice", "bob", "2"],
            &["alice", "carol", "1"],
            &["bob", "alice", "1"],
            &["carol", "alice", "1"],
            &["carol", "bob", "1"],
        ])
    );
    assert_eq!(
        rows(
            &db,
            &format!(
            "SELECT sender, recipient, is_reply, extract(epoch FROM time_to_read)::int, body_bytes
             FROM analytics.messages WHERE message = '{m3}'"
        )
        )
        .await,
        table(&[&["bob", "alice", "t", "30", "12"]])
    );

    // No view shows a body, a subject or a token, under any column name.
    let leaked = rows(
        &db,
        "SELECT table_name, column_name FROM information_schema.columns
         WHERE table_schema = 'analytics' AND (column_name ~ '(body|subject|token)' AND column_name <> 'body_bytes')",
    )
    .await;
    assert_eq!(leaked, Vec::<Vec<String>>::new());
    let all = rows(
        &db,
        "SELECT string_agg(t::text, ' ') FROM analytics.messages t",
    )
    .await;
    assert!(
        !all[0][0].contains("secret") && !all[0][0].contains("private"),
        "{all:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn views_reach_their_indexes() {
    let app = spawn_app().await;
    let db = app.db().await;
    // Plans need a history with statistics and a visibility map.
    db.batch_execute(
        "INSERT INTO agents (name, description, project, token_hash)
         SELECT 'agent' || g, 'd', 'p' || g % 3, sha256(('t' || g)::bytea) FROM generate_series(1, 20) g;
         INSERT INTO messages (id, sender_id, recipient_id, body, thread_id, reply_to, sent_at, read_at)
         SELECT g, 1 + g % 20, 1 + (g * 7) % 20, repeat('body ', 40), g - g % 3,
                CASE WHEN g % 3 > 0 THEN g - 1 END,
                now() - interval '30 days' + g * interval '1 minute', now()
         FROM generate_series(3, 30000) g;
         SELECT setval('messages_id_seq', 30000);",
    )
    .await
    .unwrap();
    // VACUUM marks pages all-visible only once no transaction anywhere that
    // could still see them is open (other tests run beside this one).
    for attempt in 0.. {
        db.batch_execute("VACUUM ANALYZE agents, messages")
            .await
            .unwrap();
        let visible = rows(
            &db,
            "SELECT relallvisible >= relpages FROM pg_class WHERE relname = 'messages'",
        )
        .await;
        if visible[0][0] == "t" {
            break;
        }
        assert!(attempt < 50, "VACUUM never marked the table all-visible");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Small tables: make the planner show what it would do at scale, where
    // reading the table (with its bodies) is what costs.
    db.batch_execute("SET enable_seqscan = off; SET enable_bitmapscan = off")
        .await
        .unwrap();
    let plan = |sql: &'static str| {
        let db = &db;
        async move {
            rows(db, &format!("EXPLAIN {sql}"))
                .await
                .concat()
                .join("\n")
        }
    };
    // A date range on the daily views is an index range scan.
    for sql in [
        "SELECT * FROM analytics.daily_messages WHERE day >= DATE '2026-11-01'",
        "SELECT * FROM analytics.project_daily_messages WHERE day BETWEEN DATE '2026-11-01' AND DATE '2026-11-07'",
        "SELECT * FROM analytics.messages WHERE day = DATE '2026-11-02'",
    ] {
        let p = plan(sql).await;
        assert!(
            p.contains("messages_day_idx") && p.contains("Index Cond"),
            "{sql}:\n{p}"
        );
    }
    // The other views read narrow covering indexes, never the table with
    // its bodies.
    for (sql, index) in [
        (
            "SELECT * FROM analytics.busiest_pairs LIMIT 10",
            "messages_",
        ),
        ("SELECT * FROM analytics.daily_messages", "messages_day_idx"),
        (
            "SELECT * FROM analytics.reply_chains ORDER BY messages DESC LIMIT 5",
            "messages_thread_cover_idx",
        ),
        (
            "SELECT * FROM analytics.reply_chain_lengths",
            "messages_thread_cover_idx",
        ),
        (
            "SELECT * FROM analytics.agent_activity WHERE agent = 'agent7'",
            "messages_inbox_cover_idx",
        ),
        (
            "SELECT * FROM analytics.agent_activity WHERE agent = 'agent7'",
            "messages_sender_cover_idx",
        ),
    ] {
        let p = plan(sql).await;
        assert!(
            p.contains(&format!("Index Only Scan using {index}")),
            "{sql}:\n{p}"
        );
        // Only index-only scans touch messages; nothing reads its rows.
        let reads_rows = p.lines().any(|l| {
            (l.contains("Seq Scan") || l.contains("Index Scan") || l.contains("Heap Scan"))
                && !l.contains("Index Only Scan")
                && (l.contains(" on messages") || l.contains("messages_"))
        });
        assert!(!reads_rows, "{sql}:\n{p}");
    }
    // The mailbox's own indexes were widened, not lost.
    let indexes = rows(
        &db,
        "SELECT string_agg(indexname, ' ' ORDER BY indexname) FROM pg_indexes WHERE tablename = 'messages'",
    )
    .await;
    assert_eq!(
        indexes[0][0],
        "messages_day_idx messages_expiring_idx messages_group_idx messages_idempotency_copy_idx messages_idempotency_idx messages_inbox_cover_idx messages_pkey \
         messages_reply_to_idx messages_search_words_idx messages_sender_cover_idx messages_thread_cover_idx messages_unread_idx \
         messages_unread_sender_idx messages_withdrawn_idx"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_analyst_role_reads_analytics_and_nothing_else() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "plans", "team").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "alice", "body": "note to self"})),
    )
    .await;
    let db = app.db().await;

    let role = rows(&db, "SELECT rolcanlogin, rolsuper, rolcreaterole, rolpassword IS NULL FROM pg_authid WHERE rolname = 'phone_analyst'").await;
    assert_eq!(
        role,
        table(&[&["f", "f", "f", "t"]]),
        "NOLOGIN, no password, no powers"
    );

    db.batch_execute("SET ROLE phone_analyst").await.unwrap();
    for view in [
        "messages",
        "daily_messages",
        "project_daily_messages",
        "agent_activity",
        "reply_chains",
        "reply_chain_lengths",
        "unread_backlog",
        "busiest_pairs",
    ] {
        rows(&db, &format!("SELECT count(*) FROM analytics.{view}")).await;
    }
    for sql in [
        "SELECT * FROM public.messages",
        "SELECT * FROM public.agents",
        "SELECT token_hash FROM agents",
        "CREATE VIEW analytics.mine AS SELECT 1",
        "CREATE TABLE public.mine (x int)",
    ] {
        let err = db.simple_query(sql).await.expect_err(sql);
        let code = err.code().map(|c| c.code().to_owned());
        // 42501: insufficient privilege (55000/0A000 would mean it got further).
        assert_eq!(code.as_deref(), Some("42501"), "{sql}: {err}");
    }
    db.batch_execute("RESET ROLE").await.unwrap();
    // Read, never write (the views are not updatable anyway).
    let privileges = rows(
        &db,
        "SELECT bool_and(has_table_privilege('phone_analyst', c.oid, 'SELECT')),
                bool_or(has_table_privilege('phone_analyst', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')),
                bool_or(has_table_privilege('phone_analyst', p.oid, 'SELECT'))
         FROM pg_class c, pg_class p
         WHERE c.relnamespace = 'analytics'::regnamespace AND p.relnamespace = 'public'::regnamespace",
    )
    .await;
    assert_eq!(privileges, table(&[&["t", "f", "f"]]));
    app.stop().await;
}

/// The migration's role block, run by two databases at once: the second
/// waits for the first's uncommitted role, then must not fail.
#[tokio::test]
async fn creating_the_role_is_safe_under_concurrent_migrations() {
    let migration = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/V4__analytics.sql"
    ))
    .unwrap();
    let start = migration
        .find("DO $$\nBEGIN\n    CREATE ROLE")
        .expect("the role block");
    let end = start + migration[start..].find("$$;").unwrap() + 3;
    let role = format!("phone_analyst_t{:08x}", rand::random::<u32>());
    let block = migration[start..end].replace("phone_analyst", &role);

    let connect = || async {
        let (client, connection) = tokio_postgres::connect(&admin_url(), NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    };
    let (first, second) = (connect().await, connect().await);
    first.batch_execute("BEGIN").await.unwrap();
    first.batch_execute(&block).await.unwrap();
    second.batch_execute("BEGIN").await.unwrap();
    let racing = tokio::spawn(async move {
        let outcome = second.batch_execute(&block).await;
        (second, outcome)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !racing.is_finished(),
        "the second creation waits for the first"
    );
    first.batch_execute("COMMIT").await.unwrap();
    let (second, outcome) = racing.await.unwrap();
    outcome.expect("the second database's migration goes on");
    second.batch_execute("COMMIT").await.unwrap();

    // And once it exists, running the block again is a no-op.
    first
        .batch_execute(&migration[start..end].replace("phone_analyst", &role))
        .await
        .unwrap();
    assert_eq!(
        rows(
            &first,
            &format!("SELECT count(*) FROM pg_roles WHERE rolname = '{role}'")
        )
        .await,
        table(&[&["1"]])
    );
    first
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .unwrap();

    // Several fresh databases migrating together all succeed.
    let urls: Vec<String> = futures_util::future::join_all((0..4).map(|_| fresh_database())).await;
    let migrated =
        futures_util::future::join_all(urls.iter().map(|u| phone::store::migrate(u))).await;
    for outcome in migrated {
        outcome.expect("migrates");
    }
}

/// Every message names agents that exist: the views join `agents` for the
/// names. Migration V19 dropped the foreign keys from `messages` to
/// `agents` (two row locks per stored copy); its triggers refuse what the
/// keys refused: deleting, renumbering or truncating away an agent that
/// has mail, as a sender or as a recipient. An agent without mail may
/// still be deleted.
#[tokio::test]
async fn an_agent_with_mail_cannot_be_deleted_from_under_it() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "plans", "team").await;
    register(&c, "bob", "codes", "team").await;
    register(&c, "carol", "idles", "team").await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "hello"})),
    )
    .await;

    let db = app.db().await;
    for (sql, who) in [
        ("DELETE FROM agents WHERE name = 'alice'", "the sender"),
        ("DELETE FROM agents WHERE name = 'bob'", "the recipient"),
        (
            "UPDATE agents SET id = DEFAULT WHERE name = 'bob'",
            "the recipient, renumbered",
        ),
        ("TRUNCATE agents CASCADE", "everyone, messages left"),
    ] {
        let err = db
            .batch_execute(sql)
            .await
            .expect_err(&format!("{who}: {sql} must be refused"));
        let db_err = err.as_db_error().expect("a database error");
        assert_eq!(
            db_err.code(),
            &tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION,
            "{who}: {db_err}"
        );
    }
    let names = rows(
        &db,
        "SELECT a.name || '>' || b.name FROM messages m
         JOIN agents a ON a.id = m.sender_id JOIN agents b ON b.id = m.recipient_id",
    )
    .await;
    assert_eq!(names, table(&[&["alice>bob"]]));
    // Without mail, nothing holds it; nor a wipe of both tables.
    db.batch_execute("DELETE FROM agents WHERE name = 'carol'")
        .await
        .unwrap();
    db.batch_execute("TRUNCATE messages, agents CASCADE")
        .await
        .unwrap();
}

/// An agent deleted while it sends: the send waits for the deleting
/// transaction, then finds its sender gone. Stored, the message would
/// name no sender, and the recipient's inbox could not show it.
#[tokio::test]
async fn an_agent_deleted_while_it_sends_leaves_no_mail_without_a_sender() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "plans", "team").await;
    let bob = register(&c, "bob", "codes", "team").await;

    let deleting = app.db().await;
    deleting
        .batch_execute("BEGIN; DELETE FROM agents WHERE name = 'alice'")
        .await
        .unwrap();
    let sender = app.client().await;
    let args = alice.with(json!({"to": "bob", "body": "hello"}));
    let sending = tokio::spawn(async move { call(&sender, "phone_send", args).await });
    sends_waiting_on_locks(&app, 1).await;
    deleting.batch_execute("COMMIT").await.unwrap();
    let sent = sending.await.unwrap();
    assert_eq!(sent.is_error, Some(true), "{}", text(&sent));

    let db = app.db().await;
    let orphans = rows(
        &db,
        "SELECT count(*)::text FROM messages m
         WHERE NOT EXISTS (SELECT 1 FROM agents a WHERE a.id = m.sender_id)",
    )
    .await;
    assert_eq!(orphans, table(&[&["0"]]));
    ok(&c, "phone_inbox", bob.with(json!({}))).await;
}
