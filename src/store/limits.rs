//! Rate-limit counters (`rate_limits`), shared by every replica: fixed
//! windows per bucket.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Client, StoreError};

/// Counts one hit in bucket `$1`, whose window is `$2` seconds: a window
/// that has ended starts again at this hit. Each hit also removes up to 10
/// buckets whose window ended more than `$3` seconds ago (longer than any
/// window), so the table stays as large as the last hours' distinct
/// buckets, however many addresses come and go. Primary key; the pruning
/// reads the table in physical order and stops after 10.
const COUNT_HIT: &str = "WITH pruned AS (
         DELETE FROM rate_limits WHERE ctid = ANY (ARRAY(
             SELECT ctid FROM rate_limits
             WHERE window_start < now() - make_interval(secs => $3) AND bucket <> $1
             LIMIT 10)))
     INSERT INTO rate_limits AS r (bucket, window_start, hits) VALUES ($1, now(), 1)
     ON CONFLICT (bucket) DO UPDATE SET
         hits = CASE WHEN r.window_start <= now() - make_interval(secs => $2) THEN 1 ELSE r.hits + 1 END,
         window_start = CASE WHEN r.window_start <= now() - make_interval(secs => $2) THEN now() ELSE r.window_start END
     RETURNING hits, window_start + make_interval(secs => $2) AS resets_at,
               extract(epoch FROM window_start + make_interval(secs => $2) - now())::float8 AS seconds_left";

/// A bucket's count after a hit.
#[derive(Debug, Clone, Copy)]
pub struct Hits {
    pub hits: i64,
    pub resets_at: DateTime<Utc>,
    /// Until the window ends, by the database's clock.
    pub left: Duration,
}

/// Buckets older than this are removed: twice the longest window.
pub const PRUNE_AFTER: Duration = Duration::from_secs(2 * 3600);

pub async fn count_hit(db: &Client, bucket: &str, window: Duration) -> Result<Hits, StoreError> {
    let stmt = db.prepare_cached(COUNT_HIT).await?;
    let prune_after = PRUNE_AFTER.max(window * 2).as_secs_f64();
    let row = db
        .query_one(&stmt, &[&bucket, &window.as_secs_f64(), &prune_after])
        .await?;
    Ok(Hits {
        hits: i64::from(row.get::<_, i32>("hits")),
        resets_at: row.get("resets_at"),
        left: Duration::from_secs_f64(row.get::<_, f64>("seconds_left").max(0.0)),
    })
}
