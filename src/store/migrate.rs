//! Reaching the database at startup, and schema migrations (refinery,
//! embedded at compile time).

use std::time::{Duration, Instant};

use super::{Settings, StoreError, connect::Connector, pool, tls::Tls};
use crate::telemetry::error_chain;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Any number of replicas may start at once against an empty database; this
/// lock makes them take turns, so each migration runs exactly once.
const MIGRATION_LOCK_KEY: i64 = 0x7068_6f6e_655f_6d69; // "phone_mi"

/// How long a migration may wait for a table lock: a long transaction
/// elsewhere makes the deploy fail clearly instead of stalling every query
/// queued behind the migration's lock request.
const MIGRATION_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until PostgreSQL accepts a connection and answers, retrying with
/// backoff (0.5 s doubling to 5 s) for up to `settings.connect_wait`,
/// logging every attempt. A certificate PostgreSQL presents that fails
/// verification is not retried: waiting cannot fix it.
pub async fn wait_for_database(settings: &Settings) -> Result<(), StoreError> {
    let (config, tls) = pool::connection_config(settings)?;
    let connector = Connector::new(&config, tls)?;
    let started = Instant::now();
    let mut backoff = Duration::from_millis(500);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let outcome = async {
            let (client, connection) = connector.connect().await?;
            let driver = tokio::spawn(connection);
            client.simple_query("SELECT 1").await?;
            drop(client);
            let _ = driver.await;
            Ok::<_, tokio_postgres::Error>(())
        };
        let error = match tokio::time::timeout(Duration::from_secs(10), outcome).await {
            Ok(Ok(())) => {
                if attempt > 1 {
                    tracing::info!(
                        attempt,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "PostgreSQL answers"
                    );
                }
                return Ok(());
            }
            Ok(Err(e)) => error_chain(&e),
            Err(_) => "no answer within 10 s".to_owned(),
        };
        if is_certificate_error(&error) {
            return Err(StoreError::Config(format!(
                "the TLS connection to PostgreSQL was refused: {error} (check sslmode, sslrootcert and the host name in DATABASE_URL)"
            )));
        }
        let waited = started.elapsed();
        if waited + backoff > settings.connect_wait {
            return Err(StoreError::Unavailable(format!(
                "PostgreSQL did not answer within {} s (PHONE_DB_WAIT_SECS), {attempt} attempts; last: {error}",
                settings.connect_wait.as_secs()
            )));
        }
        tracing::warn!(
            attempt,
            retry_in_ms = backoff.as_millis() as u64,
            error = %error,
            "waiting for PostgreSQL"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// rustls' words for a certificate that failed verification.
fn is_certificate_error(text: &str) -> bool {
    text.contains("invalid peer certificate")
}

/// Applies pending migrations with the default limits (tests, tools).
pub async fn migrate(database_url: &str) -> Result<(), StoreError> {
    migrate_with(&Settings::for_url(database_url)).await
}

/// Applies pending migrations under an advisory lock, on a dedicated
/// connection, with a lock timeout and a statement timeout
/// (`settings.migration_timeout`, which also bounds the wait for another
/// replica's migrations).
pub async fn migrate_with(settings: &Settings) -> Result<(), StoreError> {
    let (mut config, tls): (tokio_postgres::Config, Tls) = pool::connection_config(settings)?;
    let statement_ms = settings.migration_timeout.as_millis();
    let lock_ms = MIGRATION_LOCK_TIMEOUT
        .min(settings.migration_timeout)
        .as_millis();
    // Waiting for another replica's migrations may take as long as they
    // may (PHONE_MIGRATION_TIMEOUT_SECS); only the migrations' own table
    // locks get the short lock timeout, set once the turn is ours.
    config.options(format!(
        "-c statement_timeout={statement_ms} -c lock_timeout={statement_ms}"
    ));
    let (mut client, connection) = Connector::new(&config, tls)?.connect().await?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    let locked = client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    let locked = match locked {
        Ok(_) => {
            client
                .batch_execute(&format!("SET lock_timeout = {lock_ms}"))
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = locked {
        drop(client);
        let _ = driver.await;
        return Err(explain(
            e.into(),
            settings,
            "waiting for another replica's migrations",
        ));
    }
    let outcome = embedded::migrations::runner().run_async(&mut client).await;
    // The lock is released with the session too; unlocking explicitly just
    // lets the next replica in sooner.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    drop(client);
    let _ = driver.await;
    let report = outcome.map_err(|e| explain(e.into(), settings, "applying migrations"))?;
    for m in report.applied_migrations() {
        tracing::info!(migration = %m, "applied migration");
    }
    Ok(())
}

/// A migration failure in words an operator can act on.
fn explain(err: StoreError, settings: &Settings, doing: &str) -> StoreError {
    let text = match &err {
        StoreError::Migration(e) => error_chain(e),
        other => error_chain(other),
    };
    let waited = doing.starts_with("waiting");
    let reason = if waited && (text.contains("lock timeout") || text.contains("statement timeout"))
    {
        format!(
            "{doing}: they took longer than PHONE_MIGRATION_TIMEOUT_SECS={} s; raise it for a \
             large database, or see the migration's notes on building indexes first",
            settings.migration_timeout.as_secs()
        )
    } else if text.contains("lock timeout") {
        format!(
            "{doing}: a table stayed locked by another session for {} s (a long transaction?); \
             end it and deploy again",
            MIGRATION_LOCK_TIMEOUT
                .min(settings.migration_timeout)
                .as_secs()
        )
    } else if text.contains("statement timeout") {
        format!(
            "{doing}: took longer than PHONE_MIGRATION_TIMEOUT_SECS={} s; raise it for a large \
             database, or see the migration's notes on building indexes first",
            settings.migration_timeout.as_secs()
        )
    } else {
        return err;
    };
    StoreError::Config(format!("migration failed: {reason} ({text})"))
}
