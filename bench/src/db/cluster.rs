//! The bench's PostgreSQL: settings the bench makes to its private cluster,
//! the ones the report names, and the postmaster (whose process tree is
//! PostgreSQL's CPU).

use std::path::Path;

use tokio_postgres::Client;

use super::{pg_err, show};

/// What the report and the CPU readings need to know of the cluster.
pub struct Cluster {
    pub version: String,
    /// The settings that bear on durability and speed, for the report.
    pub settings: String,
    pub postmaster: u32,
}

impl Cluster {
    /// Sets what the bench needs (`ALTER SYSTEM`, reloaded) and reads the
    /// rest; `pg_dir` is the cluster's data directory.
    pub async fn prepare(admin: &Client, pg_dir: &Path) -> Result<Self, String> {
        let pg_version = show(admin, "server_version").await;
        // Checkpoints spread over bulk loads of millions of rows; the setting is
        // of this private cluster only.
        for sql in [
            "ALTER SYSTEM SET max_wal_size = '8GB'",
            // Planning time per statement (pg_stat_statements), when loaded.
            "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
            "SELECT pg_reload_conf()",
        ] {
            admin
                .batch_execute(sql)
                .await
                .map_err(|e| format!("configure cluster: {}", pg_err(&e)))?;
        }
        let settings = format!(
            "synchronous_commit={}, fsync={}, wal_sync_method={}, shared_buffers={}, max_wal_size=8GB and pg_stat_statements.track_planning=on (set by the bench), max_connections={}",
            show(admin, "synchronous_commit").await,
            show(admin, "fsync").await,
            show(admin, "wal_sync_method").await,
            show(admin, "shared_buffers").await,
            show(admin, "max_connections").await,
        );
        let postmaster: u32 = std::fs::read_to_string(pg_dir.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
            .ok_or_else(|| {
                format!(
                    "no postmaster.pid in {}: is the bench PostgreSQL running?",
                    pg_dir.display()
                )
            })?;
        Ok(Self {
            version: pg_version,
            settings,
            postmaster,
        })
    }
}
