//! Schema migrations (refinery, embedded at compile time).

use tokio_postgres::NoTls;

use super::StoreError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Any number of replicas may start at once against an empty database; this
/// lock makes them take turns, so each migration runs exactly once.
const MIGRATION_LOCK_KEY: i64 = 0x7068_6f6e_655f_6d69; // "phone_mi"

/// Applies pending migrations under an advisory lock, on a dedicated connection.
pub async fn migrate(database_url: &str) -> Result<(), StoreError> {
    let (mut client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    let outcome = embedded::migrations::runner().run_async(&mut client).await;
    // The lock is released with the session too; unlocking explicitly just
    // lets the next replica in sooner.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await;
    drop(client);
    let _ = driver.await;
    let report = outcome?;
    for m in report.applied_migrations() {
        tracing::info!(migration = %m, "applied migration");
    }
    Ok(())
}
