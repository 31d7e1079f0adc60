//! The connection pool, and pooled connections whose statements are traced,
//! timed and bounded by a client-side deadline.

use std::{
    ops::{Deref, DerefMut},
    sync::Arc,
    time::{Duration, Instant},
};

use deadpool_postgres::{Manager, ManagerConfig, PoolError, RecyclingMethod, Runtime, Timeouts};
use tokio_postgres::{Row, Statement, types::ToSql};

use super::connect::Connector;
use super::error::{READ_ONLY, STALLED, UNCONFIRMED};
use super::failover::{NO_WAL_MESSAGES, Stale, WRITABLE_SQL, WRITABLE_SQL_NO_WAL};
use super::tls::Tls;
use super::{Settings, StoreError};
use crate::telemetry::metrics;

mod standby;

pub use standby::check_privilege as check_standby_privilege;

/// The connection pool. Derefs to deadpool's pool (status, close, …);
/// `get` hands out a [`Client`] whose statements are traced and timed.
#[derive(Clone)]
pub struct Pool(deadpool_postgres::Pool, Duration, Arc<Stale>, Guard);

/// `PHONE_REQUIRE_SYNC_STANDBY`: whether a [`Client`]'s transactions commit
/// only where a synchronous standby confirms them (`standby.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    Off,
    SyncStandby,
}

impl Pool {
    /// How long a caller waits for a connection before hearing "busy".
    pub fn wait_timeout(&self) -> Duration {
        self.0.timeouts().wait.unwrap_or(Duration::from_secs(2))
    }

    /// A pooled connection; waits at most the pool timeout. Connections
    /// made before a failover was noticed are closed, not handed out.
    pub async fn get(&self) -> Result<Client, PoolError> {
        let started = Instant::now();
        let object = loop {
            let object = self.0.get().await;
            match object {
                Ok(o)
                    if self
                        .2
                        .is_stale(deadpool_postgres::Object::metrics(&o).created) =>
                {
                    drop(deadpool_postgres::Object::take(o));
                }
                other => break other,
            }
        };
        metrics::pool_wait(started.elapsed());
        Ok(Client {
            object: Some(object?),
            deadline: self.1,
            discard: Default::default(),
            transaction: Default::default(),
            retried_whole: Default::default(),
            stale: self.2.clone(),
            guard: self.3,
        })
    }
}

impl Deref for Pool {
    type Target = deadpool_postgres::Pool;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// A pooled connection. Its query methods shadow tokio-postgres' own: each
/// statement runs in a `db` span (OpenTelemetry client span: operation,
/// table and the parameterised SQL text, never the parameters) and is timed
/// for `db.client.operation.duration`. Anything else derefs to the
/// underlying client. Both cost nothing while telemetry export is off.
///
/// Each statement also has a client-side deadline (a little over the
/// server's `statement_timeout`): a database or network that stalls without
/// closing anything cannot hold a request until its HTTP timeout. A
/// connection whose statement missed the deadline is in an unknown state, so
/// it is closed instead of going back to the pool; so is one whose server
/// turned out not to be the primary (`failover.rs`).
pub struct Client {
    object: Option<deadpool_postgres::Object>,
    deadline: Duration,
    /// Closed on drop rather than returned to the pool.
    discard: std::sync::atomic::AtomicBool,
    /// The pool's record of when its connections went stale.
    stale: Arc<Stale>,
    /// Inside `BEGIN` … `COMMIT`: a failed statement aborts the whole
    /// transaction, so it is not retried alone.
    transaction: std::sync::atomic::AtomicBool,
    /// A statement of [`Client::query_generic`] in flight: `traced!` leaves
    /// a conflict to it, which retries `SET`, statement and `RESET`
    /// together (alone, the statement would run after the `RESET`).
    retried_whole: std::sync::atomic::AtomicBool,
    /// What [`Client::transaction`] and [`Client::acknowledged`] make sure
    /// of before a caller hears that its change is done.
    guard: Guard,
}

impl Deref for Client {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        self.object.as_ref().expect("present until drop")
    }
}

impl DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.object.as_mut().expect("present until drop")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // A connection left inside a transaction (its future dropped
        // between BEGIN and COMMIT) must not serve anyone else.
        if (*self.discard.get_mut() || *self.transaction.get_mut())
            && let Some(object) = self.object.take()
        {
            // Detached from the pool; dropping it closes the connection.
            drop(deadpool_postgres::Object::take(object));
        }
    }
}

/// A prepared (cached) statement that remembers its SQL while statements
/// are traced. Derefs to the tokio-postgres `Statement`.
pub struct Prepared {
    statement: Statement,
    sql: Option<Box<str>>,
}

impl Deref for Prepared {
    type Target = Statement;
    fn deref(&self) -> &Statement {
        &self.statement
    }
}

/// What [`Client`]'s query methods accept: a [`Prepared`] statement, a
/// tokio-postgres `Statement`, or SQL text.
pub trait Sql: Send + Sync {
    fn statement(&self) -> StatementRef<'_>;
    /// The SQL text, when known (for the span).
    fn text(&self) -> Option<&str>;
}

pub enum StatementRef<'a> {
    Prepared(&'a Statement),
    Text(&'a str),
}

impl Sql for Prepared {
    fn statement(&self) -> StatementRef<'_> {
        StatementRef::Prepared(&self.statement)
    }
    fn text(&self) -> Option<&str> {
        self.sql.as_deref()
    }
}

impl Sql for Statement {
    fn statement(&self) -> StatementRef<'_> {
        StatementRef::Prepared(self)
    }
    fn text(&self) -> Option<&str> {
        None
    }
}

impl Sql for str {
    fn statement(&self) -> StatementRef<'_> {
        StatementRef::Text(self)
    }
    fn text(&self) -> Option<&str> {
        Some(self)
    }
}

impl Sql for String {
    fn statement(&self) -> StatementRef<'_> {
        StatementRef::Text(self)
    }
    fn text(&self) -> Option<&str> {
        Some(self)
    }
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Statement spans: `db` spans at DEBUG under `phone::store`, exported by
/// the OpenTelemetry layer and invisible to the log at the default level.
fn db_spans_enabled() -> bool {
    tracing::span_enabled!(target: "phone::store", tracing::Level::DEBUG)
}

/// A statement's `db` span, or none while spans are off.
fn statement_span(sql: Option<&str>) -> tracing::Span {
    if db_spans_enabled() {
        db_span(sql)
    } else {
        tracing::Span::none()
    }
}

macro_rules! traced {
    ($self:ident, $stmt:ident, $call:ident, $params:ident) => {{
        let span = statement_span($stmt.text());
        let started = metrics::enabled().then(Instant::now);
        let mut attempts = 0;
        let outcome = loop {
            use tracing::Instrument as _;
            attempts += 1;
            let client: &tokio_postgres::Client = &$self;
            let call = async {
                match $stmt.statement() {
                    StatementRef::Prepared(s) => client.$call(s, $params).await,
                    StatementRef::Text(s) => client.$call(s, $params).await,
                }
            };
            let outcome = match by_deadline($self.deadline, call.instrument(span.clone())).await {
                Some(outcome) => outcome.map_err(StoreError::from),
                None => Err(StoreError::Unavailable(STALLED.into())),
            };
            // A statement of its own transaction that lost a deadlock or a
            // serialization conflict was rolled back whole: running it again
            // is safe, once (then the caller hears "retry").
            match &outcome {
                Err(e) if e.is_conflict()
                    && attempts == 1
                    && !$self.in_transaction()
                    && !$self.retried_whole.load(std::sync::atomic::Ordering::Relaxed) =>
                {
                    tracing::debug!(error = %e, "statement conflicted with a concurrent one; retrying once");
                }
                _ => break outcome,
            }
        };
        $self.record(&span, $stmt.text(), started, &outcome);
        outcome
    }};
}

impl Client {
    /// After a statement: a failure noticed (`noticed`) and marked on its
    /// span; its duration, when metrics are on.
    fn record<T>(
        &self,
        span: &tracing::Span,
        sql: Option<&str>,
        started: Option<Instant>,
        outcome: &Result<T, StoreError>,
    ) {
        if let Err(e) = outcome {
            self.noticed(e);
            span.record("otel.status_code", "error");
            let kind = match e {
                StoreError::Query(e) => e.code().map_or("connection", |c| c.code()),
                _ => "timeout",
            };
            span.record("error.type", kind);
        }
        if let Some(started) = started {
            let (operation, collection) = summarize(sql.unwrap_or(""));
            metrics::db_operation(operation, collection, outcome.is_ok(), started.elapsed());
        }
    }

    fn in_transaction(&self) -> bool {
        self.transaction.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reacts to a failed statement: a connection whose server is not the
    /// primary, or is gone, is closed, and so is every older one of the
    /// pool (they reached the same server). Logged once per connection.
    fn noticed(&self, e: &StoreError) {
        if !e.is_wrong_server() {
            return;
        }
        if !self
            .discard
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(error = %e, "database connection lost or not on the primary; reconnecting");
        }
        self.stale.mark();
        if let Some(pool) = deadpool_postgres::Object::pool(self) {
            let stale = self.stale.clone();
            pool.retain(|_, metrics| !stale.is_stale(metrics.created));
        }
    }

    /// Runs `work` between `BEGIN` and `COMMIT` (`ROLLBACK` when it fails).
    /// Its statements are not retried one by one: a conflict fails the
    /// transaction, which the caller hears as "retry".
    ///
    /// With [`Guard::SyncStandby`], a transaction that wrote commits only
    /// where its commit will wait for a synchronous standby (else it is
    /// rolled back: "nothing was done"), and returns only once a standby
    /// reports it flushed (else "outcome unknown"), as the mail statement
    /// does (`standby.rs`).
    pub async fn transaction<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&Client) -> Result<T, E>,
        E: From<StoreError>,
    {
        self.transaction_as(self.guard, work).await
    }

    /// [`Client::transaction`] without the guard, for a transaction whose
    /// only write is bookkeeping no caller is told about (a search's
    /// presence write): a read must go on while no standby is there.
    pub async fn read_transaction<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&Client) -> Result<T, E>,
        E: From<StoreError>,
    {
        self.transaction_as(Guard::Off, work).await
    }

    async fn transaction_as<T, E, F>(&self, guard: Guard, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&Client) -> Result<T, E>,
        E: From<StoreError>,
    {
        // Marked before BEGIN is sent: a future dropped while it waits for
        // BEGIN's answer must not hand the connection back in a transaction.
        self.transaction
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.simple("BEGIN").await?;
        let mut outcome = work(self).await;
        let mut wrote = false;
        if outcome.is_ok() && guard == Guard::SyncStandby {
            match self.require_sync_standby_if_written().await {
                Ok(written) => wrote = written,
                Err(e) => outcome = Err(e.into()),
            }
        }
        let end = if outcome.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        // A connection already given up on (it stalled) is closed, which
        // rolls back; waiting a second deadline for ROLLBACK would not.
        let ended = if outcome.is_err() && self.discard.load(std::sync::atomic::Ordering::Relaxed) {
            Ok(())
        } else {
            self.simple(end).await
        };
        self.transaction
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let value = outcome?;
        if let Err(e) = ended {
            // A COMMIT sent whose answer never came may have committed.
            return Err(if wrote {
                StoreError::Unavailable(UNCONFIRMED.into())
            } else {
                e
            }
            .into());
        }
        if wrote {
            self.confirm_on_standby().await?;
        }
        Ok(value)
    }

    /// Runs `work` between `BEGIN` and `ROLLBACK`, whatever it returns: for
    /// a probe whose effect is only what it waited for (an insert that
    /// waits on a concurrent insert of the same unique key).
    pub async fn rolled_back<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&Client) -> Result<T, StoreError>,
    {
        self.transaction
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.simple("BEGIN").await?;
        let outcome = work(self).await;
        // A connection already given up on is closed, which rolls back.
        if !self.discard.load(std::sync::atomic::Ordering::Relaxed) {
            self.simple("ROLLBACK").await?;
        }
        self.transaction
            .store(false, std::sync::atomic::Ordering::Relaxed);
        outcome
    }

    /// Runs `work`, a change the caller is told is done: in a
    /// [`Client::transaction`] where the pool is guarded (so that it is
    /// acknowledged only where a standby holds it), else as it is (each
    /// statement its own transaction, no extra round trips).
    /// (Guarded, a conflict fails the transaction and the caller hears
    /// "retry": it is not run again alone, as a statement of its own is.)
    pub async fn acknowledged<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&Client) -> Result<T, E>,
        E: From<StoreError>,
    {
        if self.guard == Guard::SyncStandby && !self.in_transaction() {
            self.transaction(work).await
        } else {
            work(self).await
        }
    }

    /// This connection without the guard, for bookkeeping no caller is told
    /// about (a webhook's delivery record: at worst a delivery is made
    /// again), which must go on while the guard refuses callers' changes.
    pub fn unguarded(mut self) -> Self {
        self.guard = Guard::Off;
        self
    }

    /// A statement without parameters in one round trip (simple protocol),
    /// under the same deadline as the others.
    async fn simple(&self, sql: &str) -> Result<(), StoreError> {
        let outcome = match by_deadline(self.deadline, (**self).batch_execute(sql)).await {
            Some(done) => done.map_err(StoreError::from),
            None => Err(StoreError::Unavailable(STALLED.into())),
        };
        if let Err(e) = &outcome {
            self.noticed(e);
        }
        outcome
    }

    /// Prepares through deadpool's per-connection statement cache.
    pub async fn prepare_cached(&self, sql: &str) -> Result<Prepared, StoreError> {
        self.prepare_typed_cached(sql, &[]).await
    }

    /// [`Client::prepare_cached`] with the parameters' types declared (for
    /// a statement that leaves some of its parameters unused; the others
    /// may be left out of `types`).
    pub async fn prepare_typed_cached(
        &self,
        sql: &str,
        types: &[tokio_postgres::types::Type],
    ) -> Result<Prepared, StoreError> {
        let statement =
            match by_deadline(self.deadline, (**self).prepare_typed_cached(sql, types)).await {
                Some(Ok(prepared)) => Ok(prepared),
                Some(Err(e)) => Err(StoreError::from(e)),
                None => Err(StoreError::Unavailable(STALLED.into())),
            }
            .inspect_err(|e| self.noticed(e))?;
        let sql = (db_spans_enabled() || metrics::enabled()).then(|| sql.into());
        Ok(Prepared { statement, sql })
    }

    pub async fn query<T: Sql + ?Sized>(
        &self,
        stmt: &T,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        traced!(self, stmt, query, params)
    }

    /// [`Client::query`] on the statement's generic plan, whatever the
    /// connection planned before. PostgreSQL weighs a new generic plan
    /// (after any ANALYZE of a table the statement reads) against the
    /// average cost of the custom plans this connection made, however
    /// long ago: made while the tables were small, or while no inbox held a
    /// backlog, that average stays below the new plan's cost, and the
    /// statement is planned again on every execution (~3 ms for the mail
    /// statement, more than it runs), until enough custom plans have raised
    /// the average. Meant for statements whose plan should not depend on
    /// their parameters' values (arrays of a batch's calls, quotas): such a
    /// statement may use its parameters bare, as no plan it runs knows them.
    ///
    /// `SET` and `RESET` of `plan_cache_mode` are queued with the statement,
    /// in order: no round trip of their own, and the batch does not wait
    /// for the `RESET`'s answer (whoever uses the connection next is queued
    /// behind it). A conflict retries the three together, once, as
    /// [`Client::query`] retries a statement alone.
    pub async fn query_generic(
        &self,
        stmt: &Prepared,
        params: Params<'_>,
    ) -> Result<Vec<Row>, StoreError> {
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        use std::task::Poll;
        /// Clears the flag when the statement is done, or dropped.
        struct InFlight<'a>(&'a AtomicBool);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.store(false, Relaxed);
            }
        }
        // Inside BEGIN a failed statement would fail the RESET too (and
        // ROLLBACK would undo the SET anyway).
        debug_assert!(!self.in_transaction(), "query_generic inside a transaction");
        let client: &tokio_postgres::Client = self;
        // Queues a simple statement (its messages go out on the first
        // poll) and drops its answer unread: the connection task discards
        // it, and no answer waits in a channel while the statement runs.
        let queue = |sql: &'static str| {
            let request = std::pin::pin!(client.batch_execute(sql));
            let _ = request.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        };
        let mut attempts = 0;
        loop {
            attempts += 1;
            self.retried_whole.store(true, Relaxed);
            let _in_flight = InFlight(&self.retried_whole);
            // In this order, with no await in between: whoever uses the
            // connection next is queued behind the RESET. A failed SET or
            // RESET (the connection lost) fails the statement or the next
            // user's, and is noticed there.
            let mut query = std::pin::pin!(self.query(stmt, params));
            queue("SET plan_cache_mode = force_generic_plan");
            let first = futures_util::poll!(query.as_mut());
            queue("RESET plan_cache_mode");
            let rows = match first {
                Poll::Ready(rows) => rows,
                Poll::Pending => query.await,
            };
            match rows {
                Err(e) if e.is_conflict() && attempts == 1 => {
                    tracing::debug!(error = %e, "statement conflicted with a concurrent one; retrying once");
                }
                rows => return rows,
            }
        }
    }

    pub async fn query_one<T: Sql + ?Sized>(
        &self,
        stmt: &T,
        params: Params<'_>,
    ) -> Result<Row, StoreError> {
        traced!(self, stmt, query_one, params)
    }

    pub async fn query_opt<T: Sql + ?Sized>(
        &self,
        stmt: &T,
        params: Params<'_>,
    ) -> Result<Option<Row>, StoreError> {
        traced!(self, stmt, query_opt, params)
    }

    pub async fn execute<T: Sql + ?Sized>(
        &self,
        stmt: &T,
        params: Params<'_>,
    ) -> Result<u64, StoreError> {
        traced!(self, stmt, execute, params)
    }
}

fn db_span(sql: Option<&str>) -> tracing::Span {
    let sql = sql.unwrap_or("");
    let (operation, collection) = summarize(sql);
    let name = match collection {
        Some(table) => format!("{operation} {table}"),
        None => operation.to_owned(),
    };
    tracing::debug_span!(
        target: "phone::store",
        "db",
        otel.name = %name,
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        db.system.name = "postgresql",
        db.operation.name = operation,
        db.collection.name = collection,
        db.query.text = %collapse_whitespace(sql),
        error.type = tracing::field::Empty,
    )
}

/// The operation and main table of a statement, for span names and metric
/// attributes. A statement that writes (also inside `WITH`) is named by its
/// write, INSERT before UPDATE before DELETE (`WITH expired AS (DELETE …)
/// INSERT …` is an INSERT); otherwise by the first table it reads.
pub fn summarize(sql: &str) -> (&'static str, Option<&str>) {
    let words: Vec<&str> = sql
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter(|w| !w.is_empty())
        .collect();
    let is = |w: &str, k: &str| w.eq_ignore_ascii_case(k);
    let table = |i: usize| {
        words.get(i).copied().filter(|w| {
            !["select", "with", "only", "lateral"]
                .iter()
                .any(|k| is(w, k))
                && w.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        })
    };
    let find = |keyword: &str, next: Option<&str>| {
        words.iter().enumerate().find_map(|(i, w)| {
            if !is(w, keyword) {
                return None;
            }
            // Not a row lock (`FOR [NO KEY] UPDATE`) nor `ON CONFLICT DO UPDATE`.
            if i > 0 && ["for", "key", "do"].iter().any(|k| is(words[i - 1], k)) {
                return None;
            }
            match next {
                Some(n) => words.get(i + 1).filter(|w| is(w, n)).map(|_| table(i + 2)),
                None => Some(table(i + 1)),
            }
        })
    };
    for (operation, keyword, next) in [
        ("INSERT", "insert", Some("into")),
        ("UPDATE", "update", None),
        ("DELETE", "delete", Some("from")),
    ] {
        if let Some(collection) = find(keyword, next) {
            return (operation, collection);
        }
    }
    let first = words.first().copied().unwrap_or("");
    let operation = if is(first, "select") || is(first, "with") {
        "SELECT"
    } else if is(first, "listen") {
        "LISTEN"
    } else {
        "OTHER"
    };
    let collection = words
        .iter()
        .enumerate()
        .filter(|(_, w)| is(w, "from"))
        .find_map(|(i, _)| table(i + 1));
    (operation, collection)
}

fn collapse_whitespace(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How every connection of this replica reaches PostgreSQL: the pool's and
/// the LISTEN connection's alike, so a dead path is noticed by both.
pub(super) fn connection_config(
    config: &Settings,
) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let (mut pg, tls) = super::database_url::parse(&config.database_url)?;
    pg.application_name("phone");
    // Per host (`connect.rs`), unless DATABASE_URL says (libpq's
    // `connect_timeout`; 0 or absent: this default, never "forever").
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(config.pool_timeout.max(Duration::from_secs(1)));
    }
    // Closing a socket to a dead server must not take the kernel's minutes.
    pg.keepalives_idle(Duration::from_secs(10));
    pg.keepalives_interval(Duration::from_secs(2));
    pg.keepalives_retries(3);
    // Unacknowledged writes to a silent peer fail after this, not minutes.
    pg.tcp_user_timeout(Duration::from_secs(10));
    Ok((pg, tls))
}

pub fn connect(config: &Settings) -> Result<Pool, StoreError> {
    let (mut pg, tls) = connection_config(config)?;
    // A statement stuck behind a lock or a slow plan frees its connection
    // before the request times out, and the caller gets a retryable error.
    let limit_ms = config.statement_timeout.as_millis();
    // JIT off: with skewed statistics (one inbox holding most unread mail) a
    // generic plan's estimated cost passed jit_above_cost and every poll
    // compiled itself first: ~80 ms of LLVM for a statement of ~1 ms.
    // Sequential scans off: every statement here finds its rows by key, and
    // a connection keeps its plans until the statistics change. Planned
    // while `messages` was nearly empty, the polls' UPDATE kept scanning the
    // whole table as it grew to thousands of rows (in `make bench`: 750
    // pages a poll after 10 s, half the throughput). Where no index serves a
    // query, PostgreSQL still scans.
    // A transaction left open by a replica that stopped (frozen, paused
    // by its platform) is ended by the server: a refused keyed send's
    // probe, stopped between its insert and its rollback, held that key
    // for every retry on the other replicas (an outsider's attack).
    pg.options(format!(
        "-c statement_timeout={limit_ms} -c lock_timeout={limit_ms} \
         -c idle_in_transaction_session_timeout={limit_ms} -c jit=off -c enable_seqscan=off"
    ));
    let connector = Connector::new(&pg, tls)?;
    // Time to try every host once (a silent one costs its connect timeout).
    let create = connector.budget().max(config.pool_timeout);
    let manager = Manager::from_connect(
        pg,
        connector,
        // A closed connection is noticed by the client itself (its socket task
        // ends), so checking `is_closed` is enough after a database restart;
        // one on a server that stopped taking writes is dropped when a
        // statement finds out (`Client::noticed`), without a check per use.
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    deadpool_postgres::Pool::builder(manager)
        .max_size(config.pool_size)
        .runtime(Runtime::Tokio1)
        .timeouts(Timeouts {
            wait: Some(config.pool_timeout),
            create: Some(create),
            recycle: Some(config.pool_timeout),
        })
        .build()
        // The server cancels a statement at statement_timeout; a second more
        // and the database, or the path to it, is not answering at all.
        .map(|pool| {
            Pool(
                pool,
                config.statement_timeout + Duration::from_secs(1),
                Arc::default(),
                if config.require_sync_standby {
                    Guard::SyncStandby
                } else {
                    Guard::Off
                },
            )
        })
        .map_err(|e| StoreError::Config(e.to_string()))
}

/// Ok when a pooled connection's server takes writes now, within a second
/// (`failover::WRITABLE_SQL`, one round trip). A server that does not, or
/// does not answer, also retires the pool's connections to it.
pub async fn ping(pool: &Pool, require_sync_standby: bool) -> Result<(), StoreError> {
    // Its own statement: the first connection goes back (or is closed)
    // before the second is asked for, so a pool of one can answer too.
    let first = ping_on(&pool.get().await?, require_sync_standby).await;
    match first {
        // A pooled connection found dead (its session ended from outside, a
        // restart, a cut path) says nothing of the database: `noticed` has
        // retired it and every older one, so ask once more on a fresh one.
        // Not after a stall (the second has used the budget) nor a server
        // that refuses writes (that is the answer).
        Err(StoreError::Query(e)) if StoreError::is_connection_lost(&e) => {
            ping_on(&pool.get().await?, require_sync_standby).await
        }
        other => other,
    }
}

async fn ping_on(client: &Client, require_sync_standby: bool) -> Result<(), StoreError> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut sql = if NO_WAL_MESSAGES.load(Relaxed) {
        WRITABLE_SQL_NO_WAL
    } else {
        WRITABLE_SQL
    };
    let outcome = loop {
        let answer = tokio::time::timeout(Duration::from_secs(1), client.simple_query(sql));
        match answer.await {
            Ok(Ok(messages)) => {
                let writable = messages.iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
                    _ => None,
                });
                break if writable == Some("t") {
                    Ok(())
                } else {
                    Err(StoreError::Unavailable(READ_ONLY.into()))
                };
            }
            // Not allowed to emit WAL messages here: ask without, from now on.
            Ok(Err(e))
                if sql == WRITABLE_SQL
                    && e.code()
                        .is_some_and(|c| ["42501", "42883", "0A000"].contains(&c.code())) =>
            {
                NO_WAL_MESSAGES.store(true, Relaxed);
                tracing::warn!(
                    error = %super::error::describe(&e),
                    "health check: pg_logical_emit_message is not allowed; /health notices \
                     read-only servers, but no longer commits that wait for a synchronous standby"
                );
                sql = WRITABLE_SQL_NO_WAL;
            }
            Ok(Err(e)) => break Err(StoreError::from(e)),
            Err(_) => break Err(StoreError::Unavailable(STALLED.into())),
        }
    };
    if let Err(e) = &outcome {
        client.noticed(e);
    }
    if outcome.is_ok() && require_sync_standby {
        return standby::commits_wait_for_a_standby(client).await;
    }
    outcome
}

/// How long an answer may come after its deadline and still be taken.
const DEADLINE_GRACE: Duration = Duration::from_millis(100);

/// `work`'s outcome, or `None` once `deadline` has passed and a short grace
/// after it. A process frozen past the deadline (SIGSTOP, a paused VM)
/// wakes to the timer and to the answer at once, and the timer was seen
/// first: mail PostgreSQL had committed was answered "did not answer in
/// time" (a poll's marked read, a lease's taken for its whole lease, an
/// outsider's attack). The connection's task delivers an answer waiting
/// on its socket within the grace.
async fn by_deadline<T>(deadline: Duration, work: impl Future<Output = T>) -> Option<T> {
    let mut work = std::pin::pin!(work);
    match tokio::time::timeout(deadline, work.as_mut()).await {
        Ok(outcome) => Some(outcome),
        Err(_) => tokio::time::timeout(DEADLINE_GRACE, work).await.ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::{DEADLINE_GRACE, by_deadline, summarize};

    /// An answer that became ready just after the deadline's timer (a
    /// frozen process woken) is taken; one that never comes is not.
    #[tokio::test]
    async fn an_answer_ready_with_the_deadline_is_taken() {
        use std::time::Duration;
        let deadline = Duration::from_millis(50);
        let woken = tokio::time::sleep(deadline + DEADLINE_GRACE / 4);
        assert_eq!(
            by_deadline(deadline, async {
                woken.await;
                "committed"
            })
            .await,
            Some("committed")
        );
        assert_eq!(
            by_deadline(deadline, std::future::pending::<()>()).await,
            None
        );
    }

    #[test]
    fn statements_are_named_by_what_they_do() {
        assert_eq!(summarize("SELECT 1"), ("SELECT", None));
        assert_eq!(
            summarize("SELECT id FROM agents WHERE token_hash = $1"),
            ("SELECT", Some("agents"))
        );
        assert_eq!(
            summarize("SELECT count(*) FROM (SELECT 1 FROM messages m WHERE x) w"),
            ("SELECT", Some("messages"))
        );
        assert_eq!(
            summarize(
                "WITH picked AS (SELECT m.id FROM messages m ORDER BY m.id LIMIT $2 FOR UPDATE SKIP LOCKED),
                 taken AS (UPDATE messages m SET read_at = now() FROM picked WHERE m.id = picked.id RETURNING m.*)
                 SELECT * FROM taken"
            ),
            ("UPDATE", Some("messages"))
        );
        assert_eq!(
            summarize(
                "WITH expired AS (DELETE FROM inbox_waiters WHERE a) INSERT INTO inbox_waiters (a) VALUES ($1)"
            ),
            ("INSERT", Some("inbox_waiters"))
        );
        assert_eq!(
            summarize(
                "INSERT INTO rate_limits AS r VALUES ($1) ON CONFLICT (bucket) DO UPDATE SET hits = 1"
            ),
            ("INSERT", Some("rate_limits"))
        );
        assert_eq!(
            summarize("DELETE FROM inbox_waiters WHERE id = $1"),
            ("DELETE", Some("inbox_waiters"))
        );
    }
}
