//! TLS to PostgreSQL from DATABASE_URL (`sslmode`, `sslrootcert`), for the
//! pool and the LISTEN connection; and startup against a database that is
//! not there yet or busy migrating.
//!
//! `make test` starts its PostgreSQL with TLS on, using a CA it makes
//! (scripts/tls-certs.sh): a server certificate for "localhost" only, and
//! an unrelated CA.

mod common;

use std::time::Duration;

use common::*;
use phone::{Application, startup::StartupError};
use serde_json::json;

fn tls_file(name: &str) -> String {
    let dir = std::env::var("PHONE_TEST_PG_TLS_DIR").expect(
        "PHONE_TEST_PG_TLS_DIR is not set: run the suite with `make test`, which starts PostgreSQL with TLS",
    );
    format!("{dir}/{name}")
}

/// `url` with `host` for the server's and `query` added.
fn with(url: &str, host: &str, query: &str) -> String {
    let url = url.replace("127.0.0.1", host);
    format!("{url}?{query}")
}

async fn build(database_url: &str, extra: &[(&str, &str)]) -> Result<Application, StartupError> {
    let config = test_config(database_url, extra);
    phone::telemetry::init(&config.log_filter, config.log_format);
    Application::build(&config).await
}

/// Whether every connection the server holds is encrypted, and how many.
async fn server_connections_encrypted(database_url: &str) -> (bool, i64) {
    let name = database_url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let row = connect(&admin_url())
        .await
        .query_one(
            "SELECT coalesce(bool_and(s.ssl), false), count(*)
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = $1 AND a.application_name = 'phone'",
            &[&name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn verify_full_with_the_right_ca_and_host_serves_over_tls() {
    let plain = fresh_database().await;
    let url = with(
        &plain,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", tls_file("ca.pem")),
    );
    let app = spawn_app_on(&url, &[]).await;
    let c = app.client().await;
    let a = register(&c, "alice", "A", "p").await;
    let b = register(&c, "bob", "B", "p").await;
    // A long poll (the LISTEN connection wakes it) and a send.
    let waiting = {
        let c = app.client().await;
        let args = b.with(json!({"wait_seconds": 10}));
        tokio::spawn(async move { ok(&c, "phone_inbox", args).await })
    };
    wait_until(
        &connect(&plain).await,
        "bob waits",
        "SELECT EXISTS (SELECT 1 FROM inbox_waiters)",
    )
    .await;
    ok(
        &c,
        "phone_send",
        a.with(json!({"to": "bob", "body": "over TLS"})),
    )
    .await;
    assert_eq!(waiting.await.unwrap()["messages"][0]["body"], "over TLS");
    let (encrypted, connections) = server_connections_encrypted(&plain).await;
    assert!(
        connections >= 2,
        "pool and LISTEN connections: {connections}"
    );
    assert!(encrypted, "a server connection without TLS");
    app.stop().await;
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_host() {
    let plain = fresh_database().await;
    // The certificate names "localhost"; connecting to 127.0.0.1 it must fail.
    let url = with(
        &plain,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", tls_file("ca.pem")),
    );
    let err = build(&url, &[("PHONE_DB_WAIT_SECS", "30")])
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("TLS") && text.contains("certificate"),
        "{text}"
    );
    // verify-ca checks the chain only: the same host is fine.
    let url = with(
        &plain,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={}", tls_file("ca.pem")),
    );
    let app = spawn_app_on(&url, &[]).await;
    register(&app.client().await, "alice", "A", "p").await;
    assert!(server_connections_encrypted(&plain).await.0);
    app.stop().await;
}

#[tokio::test]
async fn verify_ca_refuses_a_certificate_from_another_ca() {
    let plain = fresh_database().await;
    let url = with(
        &plain,
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={}", tls_file("other-ca.pem")),
    );
    let text = build(&url, &[]).await.err().expect("refused").to_string();
    assert!(text.contains("certificate"), "{text}");
}

#[tokio::test]
async fn require_encrypts_and_disable_does_not() {
    let plain = fresh_database().await;
    let app = spawn_app_on(&with(&plain, "127.0.0.1", "sslmode=require"), &[]).await;
    register(&app.client().await, "alice", "A", "p").await;
    assert!(server_connections_encrypted(&plain).await.0);
    app.stop().await;
    let app = spawn_app_on(&with(&plain, "127.0.0.1", "sslmode=disable"), &[]).await;
    register(&app.client().await, "bob", "B", "p").await;
    let (encrypted, connections) = server_connections_encrypted(&plain).await;
    assert!(connections > 0 && !encrypted);
    app.stop().await;
    let text = build(&with(&plain, "127.0.0.1", "sslmode=maybe"), &[])
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        text.contains("DATABASE_URL") && text.contains("sslmode"),
        "{text}"
    );
}

/// A replica that starts before its database waits for it (Railway starts
/// services in no particular order) instead of exiting at once.
#[tokio::test]
async fn startup_waits_for_a_database_that_comes_later() {
    let admin = admin_url();
    let name = format!("phone_t_{:016x}", rand::random::<u64>());
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let starting = {
        let url = url.clone();
        tokio::spawn(async move { build(&url, &[("PHONE_DB_WAIT_SECS", "30")]).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !starting.is_finished(),
        "startup gave up on a missing database at once"
    );
    connect(&admin)
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let app = starting
        .await
        .unwrap()
        .expect("startup succeeds once the database exists");
    drop(app);
    // A bounded wait: it ends with a message naming the setting.
    let gone = format!(
        "{}/phone_t_never_{:08x}",
        admin.rsplit_once('/').unwrap().0,
        rand::random::<u32>()
    );
    let text = build(&gone, &[("PHONE_DB_WAIT_SECS", "1")])
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(text.contains("PHONE_DB_WAIT_SECS"), "{text}");
}

/// Migrations run under a statement timeout: a replica whose migrations
/// cannot start (another session holds the migration lock) fails with a
/// message that says what it waited for, instead of hanging.
#[tokio::test]
async fn migrations_fail_clearly_instead_of_hanging() {
    let url = fresh_database().await;
    let holder = connect(&url).await;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&0x7068_6f6e_655f_6d69_i64])
        .await
        .unwrap();
    let text = build(&url, &[("PHONE_MIGRATION_TIMEOUT_SECS", "2")])
        .await
        .err()
        .expect("startup fails")
        .to_string();
    assert!(
        text.contains("PHONE_MIGRATION_TIMEOUT_SECS") && text.contains("another replica"),
        "{text}"
    );
}
