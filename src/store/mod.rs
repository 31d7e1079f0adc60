//! PostgreSQL access: the connection pool, migrations, and error classification.

use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, Timeouts,
};
use tokio_postgres::NoTls;

use crate::config::Config;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Any number of replicas may start at once against an empty database; this
/// lock makes them take turns, so each migration runs exactly once.
const MIGRATION_LOCK_KEY: i64 = 0x7068_6f6e_655f_6d69; // "phone_mi"

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection became free in time, or none could be made: the caller
    /// may retry shortly.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
    #[error("bad DATABASE_URL: {0}")]
    Config(String),
}

impl From<PoolError> for StoreError {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Timeout(_) => Self::Unavailable("all database connections are busy".into()),
            PoolError::Backend(e) => Self::from(e),
            other => Self::Unavailable(other.to_string()),
        }
    }
}

impl StoreError {
    /// A closed connection or a server shutting down is an outage, not a bug.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable(_) => true,
            Self::Query(e) => {
                e.is_closed()
                    || e.code().is_some_and(|c| {
                        let c = c.code();
                        c.starts_with("08") || c.starts_with("57P") || c == "53300"
                    })
                    || e.as_db_error().is_none() && e.code().is_none()
            }
            _ => false,
        }
    }

    pub fn unique_violation(&self) -> bool {
        matches!(self, Self::Query(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION))
    }
}

pub fn connect_pool(config: &Config) -> Result<Pool, StoreError> {
    let pg: tokio_postgres::Config =
        config.database_url.parse().map_err(|e: tokio_postgres::Error| StoreError::Config(e.to_string()))?;
    let mut pg = pg;
    pg.application_name("phone");
    pg.connect_timeout(config.pool_timeout.max(Duration::from_secs(1)));
    // Closing a socket to a dead server must not take the kernel's minutes.
    pg.keepalives_idle(Duration::from_secs(10));
    let manager = Manager::from_config(
        pg,
        NoTls,
        // A closed connection is noticed by the client itself (its socket task
        // ends), so checking `is_closed` is enough after a database restart.
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager)
        .max_size(config.pool_size)
        .runtime(Runtime::Tokio1)
        .timeouts(Timeouts {
            wait: Some(config.pool_timeout),
            create: Some(config.pool_timeout),
            recycle: Some(config.pool_timeout),
        })
        .build()
        .map_err(|e| StoreError::Config(e.to_string()))
}

/// Applies pending migrations under an advisory lock, on a dedicated connection.
pub async fn migrate(database_url: &str) -> Result<(), StoreError> {
    let (mut client, connection) = tokio_postgres::connect(database_url, NoTls).await?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "migration connection ended");
        }
    });
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
    let outcome = embedded::migrations::runner().run_async(&mut client).await;
    // The lock is released with the session too; unlocking explicitly just
    // lets the next replica in sooner.
    let _ = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY]).await;
    drop(client);
    let _ = driver.await;
    let report = outcome?;
    for m in report.applied_migrations() {
        tracing::info!(migration = %m, "applied migration");
    }
    Ok(())
}

/// True when a pooled connection answers a trivial query.
pub async fn ping(pool: &Pool) -> Result<(), StoreError> {
    let client = pool.get().await?;
    client.simple_query("SELECT 1").await?;
    Ok(())
}
