//! What a measured window cost: CPU of the replicas, PostgreSQL, the load
//! generator and everything else (from /proc), and the database's commits
//! and WAL flushes, read at the window's edges while the load runs.

use crate::db;
use crate::stats::{CpuProbe, CpuUse};

/// CPU use and database counters between two instants.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn sample_window(
    admin: &tokio_postgres::Client,
    database: &str,
    server_pids: &[u32],
    postmaster: u32,
    loadgen: &[u32],
    from: tokio::time::Instant,
    to: tokio::time::Instant,
    hz: f64,
) -> (CpuUse, db::DbCounters) {
    let probe = |server: Vec<u32>, loadgen: Vec<u32>| {
        tokio::task::spawn_blocking(move || CpuProbe::take(&server, postmaster, &loadgen))
    };
    tokio::time::sleep_until(from).await;
    let c0 = db::counters(admin, database).await;
    let p0 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    tokio::time::sleep_until(to).await;
    let p1 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    let c1 = db::counters(admin, database).await;
    (
        p1.since(&p0, hz),
        db::DbCounters {
            commits: c1.commits - c0.commits,
            wal_syncs: c1.wal_syncs - c0.wal_syncs,
        },
    )
}
