//! Faults inside the database that must stay where they are: a failing
//! wake-up fails only wake-ups, conflicts between concurrent statements are
//! retried or reported as "retry" (never "internal error"), and the name
//! reservation holds under a register/unregister race.

mod common;

use common::*;
use serde_json::json;

/// A database where the server runs as its own, unprivileged role, which
/// may not call `pg_notify` (revoked from PUBLIC in this database only):
/// every NOTIFY the server tries fails, as a full notification queue would
/// make it fail.
async fn database_where_notify_fails() -> String {
    let admin_url = fresh_database().await;
    phone::store::migrate(&admin_url).await.expect("migrations");
    let role = format!("phone_app_{:08x}", rand::random::<u32>());
    let db = connect(&admin_url).await;
    db.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN;
         GRANT ALL ON SCHEMA public TO {role};
         GRANT ALL ON ALL TABLES IN SCHEMA public TO {role};
         GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role};
         REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC;"
    ))
    .await
    .unwrap();
    let (base, rest) = admin_url.split_once("://").unwrap();
    let (_user, host) = rest.split_once('@').unwrap();
    format!("{base}://{role}@{host}")
}

#[tokio::test]
async fn a_failing_wake_up_fails_only_the_wake_up() {
    let app = spawn_app_on(&database_where_notify_fails().await, &[]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;

    // bob waits; alice writes to him: the NOTIFY for bob fails.
    let waiting = {
        let c = app.client().await;
        let args = bob.with(json!({"wait_seconds": 10}));
        tokio::spawn(async move { ok(&c, "phone_inbox", args).await })
    };
    wait_until(
        &app.db().await,
        "bob waits",
        "SELECT EXISTS (SELECT 1 FROM inbox_waiters)",
    )
    .await;
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": format!("m{i}")})),
        )
        .await;
    }
    // The mail itself is untouched by the failing wake-ups: bob gets it
    // (his wait ends on this replica's own wake-up, or on its last look).
    let got = waiting.await.unwrap();
    let mut bodies: Vec<String> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_owned())
        .collect();
    let rest = ok(&c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
    bodies.extend(
        rest["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["body"].as_str().unwrap().to_owned()),
    );
    assert_eq!(bodies, ["m0", "m1", "m2"]);
    // And polls and sends of everyone else go on.
    ok(
        &c,
        "phone_send",
        bob.with(json!({"to": "alice", "body": "thanks"})),
    )
    .await;
    let got = ok(&c, "phone_inbox", alice.with(json!({}))).await;
    assert_eq!(got["messages"][0]["body"], "thanks");
    app.stop().await;
}

/// An operator who runs the database at SERIALIZABLE (a database-wide
/// default): concurrent polls of one inbox and sends conflict, PostgreSQL
/// aborts some with 40001, and none of that may reach an agent as
/// "internal error". Each is retried once, then reported as "retry".
#[tokio::test]
async fn serialization_failures_are_retried_or_reported_as_retry() {
    let url = fresh_database().await;
    let db_name = url.rsplit('/').next().unwrap().to_owned();
    connect(&admin_url())
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {db_name} SET default_transaction_isolation = 'serializable'"
        ))
        .await
        .unwrap();
    let app = spawn_app_on(&url, &[]).await;
    let other = spawn_app_on(&url, &[]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let isolation: String = app
        .db()
        .await
        .query_one("SHOW transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(isolation, "serializable");

    // Two replicas, and leases (a statement per call), so that statements
    // on one inbox really run at once.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let c = if w % 2 == 0 {
            app.client().await
        } else {
            other.client().await
        };
        let mode = if w % 4 < 2 { "read" } else { "lease" };
        let (alice, bob) = (
            Agent {
                name: alice.name.clone(),
                token: alice.token.clone(),
            },
            Agent {
                name: bob.name.clone(),
                token: bob.token.clone(),
            },
        );
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut taken = Vec::new();
            for i in 0..30 {
                let sent = call(
                    &c,
                    "phone_send",
                    alice.with(json!({"to": "bob", "body": format!("w{w}-{i}")})),
                )
                .await;
                if sent.is_error == Some(true) {
                    errors.push(text(&sent));
                }
                let polled = call(
                    &c,
                    "phone_inbox",
                    bob.with(json!({"limit": 3, "mode": mode})),
                )
                .await;
                if polled.is_error == Some(true) {
                    errors.push(text(&polled));
                } else {
                    for m in polled.structured_content.unwrap()["messages"]
                        .as_array()
                        .unwrap()
                    {
                        taken.push(m["id"].as_str().unwrap().to_owned());
                    }
                }
            }
            (errors, taken)
        }));
    }
    let mut errors = Vec::new();
    let mut taken = Vec::new();
    for t in tasks {
        let (e, m) = t.await.unwrap();
        errors.extend(e);
        taken.extend(m);
    }
    eprintln!("{} calls reported an error: {errors:?}", errors.len());
    for e in &errors {
        assert!(
            e.contains("retry") && !e.contains("internal error"),
            "a conflict reached an agent as: {e}"
        );
    }
    // Exactly once still: no message handed out twice.
    let mut unique = taken.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), taken.len(), "a message was handed out twice");
    // The workload did conflict: PostgreSQL rolled back statements.
    let conflicts: i64 = app
        .db()
        .await
        .query_one(
            "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("{conflicts} transactions rolled back");
    other.stop().await;
    app.stop().await;
}

/// Many rounds of one agent unregistering while a stranger registers its
/// name at the same moment: the stranger must never get the name (it is
/// either still registered, or reserved for 30 days).
#[tokio::test]
async fn the_name_reservation_holds_when_register_races_unregister() {
    let app = spawn_app_with(&[("PHONE_REGISTER_LIMIT", "0")]).await;
    let c1 = app.client().await;
    let c2 = app.client().await;
    let mut stolen = Vec::new();
    for round in 0..120 {
        let name = format!("racer-{round}");
        let owner = register(&c1, &name, "the owner", "p").await;
        let leaving = call(&c1, "phone_unregister", owner.with(json!({})));
        let arriving = call(
            &c2,
            "phone_register",
            json!({"name": name, "description": "a stranger", "project": "q"}),
        );
        let (left, arrived) = tokio::join!(leaving, arriving);
        assert_ne!(left.is_error, Some(true), "{}", text(&left));
        if arrived.is_error != Some(true) {
            stolen.push(name);
        } else {
            let why = text(&arrived);
            assert!(
                why.contains("already registered") || why.contains("reserved"),
                "{why}"
            );
        }
    }
    assert!(
        stolen.is_empty(),
        "names taken during their reservation: {stolen:?}"
    );
    app.stop().await;
}

/// A replica that starts while another holds the migrations (here a
/// session holding their advisory lock for 12 s) waits for them as long as
/// PHONE_MIGRATION_TIMEOUT_SECS allows, then starts; a wait longer than
/// that fails with words that name the setting.
#[tokio::test]
async fn a_replica_waits_for_another_replicas_long_migration() {
    const MIGRATION_LOCK_KEY: i64 = 0x7068_6f6e_655f_6d69;
    let url = fresh_database().await;
    let holder = connect(&url).await;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let release = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(12)).await;
        holder
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
            .await
            .unwrap();
        holder
    });
    let app = spawn_app_on(&url, &[("PHONE_MIGRATION_TIMEOUT_SECS", "60")]).await;
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(11),
        "it started before the other replica's migrations ended"
    );
    let c = app.client().await;
    register(&c, "after", "started after the wait", "p").await;
    app.stop().await;

    // Past the setting: a clear failure, not a crash loop of unclear errors.
    let holder = release.await.unwrap();
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .unwrap();
    let config = test_config(&url, &[("PHONE_MIGRATION_TIMEOUT_SECS", "2")]);
    let err = phone::store::migrate_with(&config.store)
        .await
        .expect_err("the wait is bounded");
    assert!(
        err.to_string().contains("PHONE_MIGRATION_TIMEOUT_SECS=2"),
        "{err}"
    );
}

/// A transaction a replica leaves open (the replica frozen or paused
/// between its statements) is ended by PostgreSQL after the statement
/// timeout: a refused keyed send's probe, stopped between its insert and
/// its rollback, held its key for every retry on the other replicas (an
/// outsider's attack with SIGSTOP). The pool's connections carry the
/// setting; here one of them stays idle in a transaction past it.
#[tokio::test]
async fn a_transaction_left_open_by_a_stopped_replica_is_ended() {
    let database = fresh_database().await;
    let mut settings = phone::store::Settings::for_url(&database);
    settings.statement_timeout = std::time::Duration::from_millis(300);
    let pool = phone::store::pool::connect(&settings).unwrap();
    let db = pool.get().await.unwrap();
    db.batch_execute("BEGIN; SELECT 1").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let after = db.batch_execute("SELECT 1").await;
    assert!(
        after.is_err(),
        "the transaction is still open after five times the statement timeout"
    );
}
