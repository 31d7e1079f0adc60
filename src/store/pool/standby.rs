//! `PHONE_REQUIRE_SYNC_STANDBY`: mail acknowledged only once a standby holds
//! it.
//!
//! Synchronous replication makes a commit wait until a standby has flushed
//! it, but only while `synchronous_standby_names` names one. A failover
//! manager that clears the setting turns the primary's commits asynchronous:
//! acknowledged here, then rewound if that primary rejoins as a standby.
//! pg_auto_failover does so in `wait_primary`, which its monitor can assign
//! to the old primary in the middle of a planned failover
//! (hapostgres/pg_auto_failover#774; docs/RELIABILITY.md finding 21).
//!
//! With the setting on, the mail statement is queued as
//!
//! ```text
//! BEGIN; SET LOCAL plan_cache_mode = force_generic_plan
//! <the statement>
//! SELECT phone_require_sync_standby()      -- V24: refuses unless the commit will wait
//! COMMIT
//! SELECT <whether commits still wait>, <where WAL ends now>
//! ```
//!
//! in one round trip. A server whose commit would not wait refuses before
//! COMMIT, and the transaction is rolled back whole: nothing stored, nothing
//! marked read, "retry". A commit that waited and was let go unconfirmed
//! (clearing the setting releases every waiting commit) is caught by the
//! check after it: a backend reloads its settings before each command, and
//! the reload signal reaches every backend before the commits are released.
//! Such a call then waits up to [`CONFIRM_WAIT`] for a standby to report WAL
//! flushed past its commit (an asynchronous standby still streaming does);
//! otherwise it fails as "outcome unknown", and a send's retry with the same
//! idempotency_key stores it once.

use std::{
    sync::atomic::Ordering::Relaxed,
    task::Poll,
    time::{Duration, Instant},
};

use tokio_postgres::{Row, SimpleQueryMessage};

use super::{Client, Params, Prepared, StoreError, db_span, db_spans_enabled, metrics, summarize};
use crate::store::error::{NO_SYNC_STANDBY, STALLED, UNCONFIRMED};

/// Raises SQLSTATE [`REFUSED`] unless this session's commit will wait for a
/// synchronous standby (V24).
const REQUIRE_SQL: &str = "SELECT phone_require_sync_standby()";

/// The SQLSTATE of `phone_require_sync_standby`'s refusal.
const REFUSED: &str = "PHSBY";

/// Whether this session's commits wait for a synchronous standby (`t`).
const WAITS_SQL: &str = "SELECT current_setting('synchronous_standby_names') <> '' \
     AND current_setting('synchronous_commit') NOT IN ('off', 'local')";

/// After COMMIT: [`WAITS_SQL`]'s answer, and an LSN at or past the end of
/// the commit's record (WAL flushed here: a commit flushes its record before
/// it waits for a standby, and a WAL sender streams only what is flushed).
const AFTER_COMMIT_SQL: &str = "SELECT current_setting('synchronous_standby_names') <> '' \
     AND current_setting('synchronous_commit') NOT IN ('off', 'local'), \
     pg_current_wal_flush_lsn()::text";

/// Whether a standby has flushed WAL up to `$1`. (Rows of other roles'
/// WAL senders show no LSN without `pg_read_all_stats`: then never.)
const FLUSHED_SQL: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE flush_lsn >= $1::text::pg_lsn)";

/// How long a call whose commit went out unconfirmed waits for a standby to
/// report it flushed before it fails as "outcome unknown".
pub const CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// For `/health`: Ok while this session's commits wait for a synchronous
/// standby, as `phone_require_sync_standby` asks before each mail commit.
pub(super) async fn commits_wait_for_a_standby(client: &Client) -> Result<(), StoreError> {
    let answer =
        tokio::time::timeout(Duration::from_secs(1), (**client).simple_query(WAITS_SQL)).await;
    match answer {
        Ok(Ok(messages)) => {
            let waits = messages
                .iter()
                .any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.get(0) == Some("t")));
            if waits {
                Ok(())
            } else {
                Err(StoreError::Unavailable(NO_SYNC_STANDBY.into()))
            }
        }
        Ok(Err(e)) => Err(StoreError::from(e)),
        Err(_) => Err(StoreError::Unavailable(STALLED.into())),
    }
}

/// A request's answer: the one its first poll gave, or the rest of it.
async fn answer<F: Future>(first: Poll<F::Output>, rest: std::pin::Pin<&mut F>) -> F::Output {
    match first {
        Poll::Ready(done) => done,
        Poll::Pending => rest.await,
    }
}

impl Client {
    /// [`Client::query_generic`] in a transaction that commits only where a
    /// synchronous standby confirms the commit (see the module's notes).
    /// A conflict retries the whole transaction, once.
    pub async fn query_generic_on_standby(
        &self,
        stmt: &Prepared,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let span = if db_spans_enabled() {
            db_span(stmt.sql.as_deref())
        } else {
            tracing::Span::none()
        };
        let started = metrics::enabled().then(Instant::now);
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let outcome = {
                use tracing::Instrument as _;
                self.commit_on_standby(stmt, params)
                    .instrument(span.clone())
                    .await
            };
            match outcome {
                Err(e) if e.is_conflict() && attempts == 1 => {
                    tracing::debug!(error = %e, "transaction conflicted with a concurrent one; retrying once");
                }
                outcome => break outcome,
            }
        };
        if let Err(e) = &outcome {
            self.noticed(e);
            span.record("otel.status_code", "error");
        }
        if let Some(started) = started {
            let (operation, collection) = summarize(stmt.sql.as_deref().unwrap_or(""));
            metrics::db_operation(operation, collection, outcome.is_ok(), started.elapsed());
        }
        outcome
    }

    /// One attempt: the five requests queued in order, then their answers.
    async fn commit_on_standby(
        &self,
        stmt: &Prepared,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        let client: &tokio_postgres::Client = self;
        // Marked before BEGIN goes out: a future dropped mid-way must not
        // hand the connection back inside a transaction.
        self.transaction.store(true, Relaxed);
        // Each request goes out when its future is first polled; polled
        // once each, in order, with no await in between.
        let mut begin = std::pin::pin!(
            client.batch_execute("BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
        );
        let mut query = std::pin::pin!(client.query(&stmt.statement, params));
        let mut require = std::pin::pin!(client.batch_execute(REQUIRE_SQL));
        let mut commit = std::pin::pin!(client.batch_execute("COMMIT"));
        let mut after = std::pin::pin!(client.simple_query(AFTER_COMMIT_SQL));
        let begun = futures_util::poll!(begin.as_mut());
        let first = futures_util::poll!(query.as_mut());
        let required = futures_util::poll!(require.as_mut());
        let committed = futures_util::poll!(commit.as_mut());
        let checked = futures_util::poll!(after.as_mut());
        // A future already answered (a closed connection fails at once)
        // must not be polled again.
        let answers = tokio::time::timeout(self.deadline, async {
            (
                answer(begun, begin).await,
                answer(first, query).await,
                answer(required, require).await,
                answer(committed, commit).await,
                answer(checked, after).await,
            )
        })
        .await;
        let Ok((begun, rows, required, committed, after)) = answers else {
            // The connection is in an unknown state: `noticed` closes it.
            return Err(StoreError::Unavailable(STALLED.into()));
        };
        // COMMIT answered (a COMMIT of a failed transaction rolls back).
        self.transaction.store(false, Relaxed);
        begun?;
        let rows = rows?;
        match required {
            Err(e) if e.code().is_some_and(|c| c.code() == REFUSED) => {
                return Err(StoreError::Unavailable(NO_SYNC_STANDBY.into()));
            }
            other => other?,
        }
        committed?;
        // Committed. From here on an error leaves the outcome unknown.
        let (waits, lsn) = match after {
            Ok(messages) => messages
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some((
                        row.get(0) == Some("t"),
                        row.get(1).unwrap_or_default().to_owned(),
                    )),
                    _ => None,
                })
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %super::super::error::describe(&e),
                    "mail committed, but the check after COMMIT failed: its outcome is unknown");
                // A connection lost or on a demoted server still retires the pool's.
                self.noticed(&StoreError::from(e));
                return Err(StoreError::Unavailable(UNCONFIRMED.into()));
            }
        };
        if waits {
            return Ok(rows);
        }
        // The setting was cleared while the commit waited (or just before
        // it): the commit may have been let go without a standby.
        self.flushed_on_standby(&lsn).await?;
        Ok(rows)
    }

    /// Waits up to [`CONFIRM_WAIT`] for a standby to report WAL flushed up
    /// to `lsn`.
    async fn flushed_on_standby(&self, lsn: &str) -> Result<(), StoreError> {
        let client: &tokio_postgres::Client = self;
        let started = Instant::now();
        loop {
            let flushed = tokio::time::timeout(
                Duration::from_secs(1),
                client.query_one(FLUSHED_SQL, &[&lsn]),
            )
            .await;
            if let Ok(Ok(row)) = &flushed
                && row.get::<_, bool>(0)
            {
                tracing::info!(
                    lsn,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "mail committed while the primary had no synchronous standby; a standby confirmed it"
                );
                return Ok(());
            }
            let asked = matches!(flushed, Ok(Ok(_)));
            if let Ok(Err(e)) = flushed {
                self.noticed(&StoreError::from(e));
            }
            if started.elapsed() >= CONFIRM_WAIT || !asked {
                tracing::warn!(
                    lsn,
                    "mail committed while the primary had no synchronous standby, and no standby \
                     confirmed it: the callers hear that its outcome is unknown"
                );
                return Err(StoreError::Unavailable(UNCONFIRMED.into()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
