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
//! SELECT <WAL flushed here>, <whether a standby has flushed that far>
//! ```
//!
//! in one round trip. A server whose commit would not wait refuses before
//! COMMIT, and the transaction is rolled back whole: nothing stored, nothing
//! marked read, "retry".
//!
//! A commit that passed that check may still not have waited, so what is
//! acknowledged is decided by where the standbys are, not by settings: the
//! setting cleared while the commit waited (that releases every waiting
//! commit), a cancel during the wait (a pooler's query timeout: COMMIT then
//! succeeds with a warning), or a setting just set that the checkpointer,
//! which decides whether commits wait, has not read yet (it reads its
//! settings only between checkpoints' pages, not during an immediate one).
//! After COMMIT the WAL flushed here is at or past the end of the commit's
//! record; the call is acknowledged once a physical standby reports that
//! far flushed. With synchronous replication working it has, or is a few
//! other commits behind; otherwise the call waits up to [`CONFIRM_WAIT`]
//! and fails as "outcome unknown", and a send's retry with the same
//! idempotency_key stores it once.

use std::{
    sync::atomic::Ordering::Relaxed,
    task::Poll,
    time::{Duration, Instant},
};

use tokio_postgres::{Row, SimpleQueryMessage};

use super::{Client, Params, Prepared, StoreError, metrics, statement_span};
use crate::store::error::{NO_SYNC_STANDBY, STALLED, UNCONFIRMED};

/// Raises SQLSTATE [`REFUSED`] unless this session's commit will wait for a
/// synchronous standby (V24); else whether the transaction wrote anything
/// (`t`: it has a transaction id). One that wrote nothing has nothing to
/// lose, and is not confirmed.
const REQUIRE_SQL: &str =
    "SELECT phone_require_sync_standby(), pg_current_xact_id_if_assigned() IS NOT NULL";

/// [`REQUIRE_SQL`] for a transaction of several statements: whether it
/// wrote (`t`), and the refusal only if it did (a transaction that only
/// read, such as a search's, commits whatever the standbys do).
const REQUIRE_IF_WRITTEN_SQL: &str = "SELECT w, CASE WHEN w THEN phone_require_sync_standby() END \
     FROM (SELECT pg_current_xact_id_if_assigned() IS NOT NULL AS w) x";

/// The SQLSTATE of `phone_require_sync_standby`'s refusal.
const REFUSED: &str = "PHSBY";

/// Whether a synchronous standby (one PostgreSQL itself waits for now:
/// `sync` or `quorum`) reports WAL flushed up to `lsn`. Not an asynchronous
/// one: a node that cannot be promoted (`pg_receivewal`, a pg_auto_failover
/// node outside the quorum) may stream too, and while the primary runs
/// alone every standby is asynchronous. Without `pg_read_all_stats` no row
/// shows a position (checked at startup: [`check_privilege`]).
macro_rules! standby_flushed {
    ($lsn:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM pg_stat_replication \
               WHERE sync_state IN ('sync', 'quorum') AND flush_lsn >= ",
            $lsn,
            ")"
        )
    };
}

/// After COMMIT: the WAL flushed here (at or past the end of the commit's
/// record: a commit flushes its record before it waits, and a WAL sender
/// streams only flushed WAL), and whether a standby has flushed that far.
const AFTER_COMMIT_SQL: &str = concat!(
    "SELECT f.lsn::text, ",
    standby_flushed!("f.lsn"),
    " FROM (SELECT pg_current_wal_flush_lsn() AS lsn) f"
);

/// Whether a standby has flushed WAL up to `$1`.
const FLUSHED_SQL: &str = concat!("SELECT ", standby_flushed!("$1::text::pg_lsn"));

/// How long a call whose commit went out unconfirmed waits for a standby to
/// report it flushed before it fails as "outcome unknown".
pub const CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// At startup, with the guard on: whether this role sees the standbys'
/// positions. Without `pg_read_all_stats` every position reads as NULL, so
/// every call would commit and then hear "outcome unknown".
pub async fn check_privilege(pool: &super::Pool) -> Result<(), StoreError> {
    let client = pool.get().await?;
    let row = client
        .query_one(
            "SELECT current_user::text, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')",
            &[],
        )
        .await?;
    let (role, sees): (String, bool) = (row.get(0), row.get(1));
    if sees {
        return Ok(());
    }
    Err(StoreError::Setup(format!(
        "PHONE_REQUIRE_SYNC_STANDBY=true, but role {role} cannot see the standbys' positions \
         (pg_stat_replication); GRANT pg_read_all_stats (or pg_monitor) TO {role}"
    )))
}

/// For `/health`: Ok while this session's commits wait for a synchronous
/// standby: `phone_require_sync_standby`, the very check before each mail
/// commit.
pub(super) async fn commits_wait_for_a_standby(client: &Client) -> Result<(), StoreError> {
    let answer = tokio::time::timeout(
        Duration::from_secs(1),
        (**client).batch_execute("SELECT phone_require_sync_standby()"),
    )
    .await;
    match answer {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.code().is_some_and(|c| c.code() == REFUSED) => {
            Err(StoreError::Unavailable(NO_SYNC_STANDBY.into()))
        }
        Ok(Err(e)) => {
            let e = StoreError::from(e);
            client.noticed(&e);
            Err(e)
        }
        Err(_) => {
            let e = StoreError::Unavailable(STALLED.into());
            client.noticed(&e);
            Err(e)
        }
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
        let span = statement_span(stmt.sql.as_deref());
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
        self.record(&span, stmt.sql.as_deref(), started, &outcome);
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
        let mut require = std::pin::pin!(client.simple_query(REQUIRE_SQL));
        let mut commit = std::pin::pin!(client.batch_execute("COMMIT"));
        let mut after = std::pin::pin!(client.simple_query(AFTER_COMMIT_SQL));
        let begun = futures_util::poll!(begin.as_mut());
        let first = futures_util::poll!(query.as_mut());
        let required = futures_util::poll!(require.as_mut());
        let committed = futures_util::poll!(commit.as_mut());
        let checked = futures_util::poll!(after.as_mut());
        // A future already answered (a closed connection fails at once)
        // must not be polled again.
        let answers = super::by_deadline(self.deadline, async {
            (
                answer(begun, begin).await,
                answer(first, query).await,
                answer(required, require).await,
                answer(committed, commit).await,
                answer(checked, after).await,
            )
        })
        .await;
        let Some((begun, rows, required, committed, after)) = answers else {
            // The connection is in an unknown state: `noticed` closes it.
            return Err(StoreError::Unavailable(STALLED.into()));
        };
        // COMMIT answered (a COMMIT of a failed transaction rolls back).
        self.transaction.store(false, Relaxed);
        begun?;
        let rows = rows?;
        let wrote = match required {
            Err(e) if e.code().is_some_and(|c| c.code() == REFUSED) => {
                return Err(StoreError::Unavailable(NO_SYNC_STANDBY.into()));
            }
            other => other?
                .iter()
                .any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.get(1) == Some("t"))),
        };
        committed?;
        if !wrote {
            return Ok(rows);
        }
        // Committed. From here on an error leaves the outcome unknown.
        self.confirm_after(after).await?;
        Ok(rows)
    }

    /// In a transaction, just before COMMIT: whether it wrote anything, and
    /// if it did, [`REFUSED`] unless its commit will wait for a synchronous
    /// standby (the transaction is then rolled back: nothing was done). One
    /// that only read commits whatever the standbys do.
    pub(super) async fn require_sync_standby_if_written(&self) -> Result<bool, StoreError> {
        let asked =
            super::by_deadline(self.deadline, (**self).simple_query(REQUIRE_IF_WRITTEN_SQL))
                .await
                .ok_or(());
        let messages = match asked {
            Ok(Ok(messages)) => messages,
            Ok(Err(e)) if e.code().is_some_and(|c| c.code() == REFUSED) => {
                return Err(StoreError::Unavailable(NO_SYNC_STANDBY.into()));
            }
            Ok(Err(e)) => {
                let e = StoreError::from(e);
                self.noticed(&e);
                return Err(e);
            }
            Err(_) => {
                let e = StoreError::Unavailable(STALLED.into());
                self.noticed(&e);
                return Err(e);
            }
        };
        Ok(messages
            .iter()
            .any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.get(0) == Some("t"))))
    }

    /// After the COMMIT of a transaction that wrote: returns once a
    /// synchronous standby reports the commit flushed; else the outcome is
    /// unknown.
    pub(super) async fn confirm_on_standby(&self) -> Result<(), StoreError> {
        match super::by_deadline(self.deadline, (**self).simple_query(AFTER_COMMIT_SQL))
            .await
            .ok_or(())
        {
            Ok(after) => self.confirm_after(after).await,
            Err(_) => {
                tracing::warn!(
                    "committed, but the check after COMMIT stalled: the outcome is unknown"
                );
                self.noticed(&StoreError::Unavailable(STALLED.into()));
                Err(StoreError::Unavailable(UNCONFIRMED.into()))
            }
        }
    }

    /// What [`AFTER_COMMIT_SQL`] answered, then, unless a standby already
    /// holds the commit, [`Client::flushed_on_standby`].
    async fn confirm_after(
        &self,
        after: Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>,
    ) -> Result<(), StoreError> {
        let (lsn, held) = match after {
            Ok(messages) => messages
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(row) => Some((
                        row.get(0).unwrap_or_default().to_owned(),
                        row.get(1) == Some("t"),
                    )),
                    _ => None,
                })
                .unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %super::super::error::describe(&e),
                    "committed, but the check after COMMIT failed: the outcome is unknown");
                // A lost connection still retires the pool's older ones.
                self.noticed(&StoreError::from(e));
                return Err(StoreError::Unavailable(UNCONFIRMED.into()));
            }
        };
        if !held {
            self.flushed_on_standby(&lsn).await?;
        }
        Ok(())
    }

    /// Waits up to [`CONFIRM_WAIT`] for a standby to report WAL flushed up
    /// to `lsn`: a few milliseconds behind other commits, first.
    async fn flushed_on_standby(&self, lsn: &str) -> Result<(), StoreError> {
        let client: &tokio_postgres::Client = self;
        let started = Instant::now();
        // First at once (a standby's next report is usually well under a
        // millisecond away), then less and less often.
        let mut pause = Duration::ZERO;
        loop {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            pause = (pause * 2).clamp(Duration::from_millis(1), Duration::from_millis(20));
            let flushed = tokio::time::timeout(Duration::from_secs(1), async {
                let asked = (**self).prepare_cached(FLUSHED_SQL).await?;
                client.query_one(&asked, &[&lsn]).await
            })
            .await;
            let held = match flushed {
                Ok(Ok(row)) => row.get::<_, bool>(0),
                Ok(Err(e)) => {
                    self.noticed(&StoreError::from(e));
                    return Err(StoreError::Unavailable(UNCONFIRMED.into()));
                }
                // The query may still run: the connection is not reused.
                Err(_) => {
                    self.noticed(&StoreError::Unavailable(STALLED.into()));
                    return Err(StoreError::Unavailable(UNCONFIRMED.into()));
                }
            };
            if held {
                tracing::debug!(
                    lsn,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "a standby confirmed the mail's commit"
                );
                return Ok(());
            }
            if started.elapsed() >= CONFIRM_WAIT {
                tracing::warn!(
                    lsn,
                    "mail committed, and no standby confirmed it within {CONFIRM_WAIT:?}: the \
                     callers hear that its outcome is unknown"
                );
                return Err(StoreError::Unavailable(UNCONFIRMED.into()));
            }
        }
    }
}
