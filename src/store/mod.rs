//! Storage: the connection pool, migrations, and every SQL statement of the
//! service, each named beside the indexes it relies on. The layers above
//! call these functions with plain values and get plain records back
//! (`rows`); no SQL text lives anywhere else.
//!
//! - `pool`: pooled connections whose statements are traced, timed and
//!   bounded by a client-side deadline.
//! - `fragments`: the SQL pieces several statements share, written once.
//! - `agents`, `search`, `messages`, `limits`: the statements, by table.
//! - `batch`: group commit, concurrent sends and read polls of this replica
//!   in one statement and one commit.
//! - `wakeup`: the LISTEN connection that wakes long polls.
//! - `database_url`, `connect`, `failover`: every host of an HA PostgreSQL,
//!   and following its primary.

pub mod admin;
pub mod agents;
mod batch;
mod connect;
pub mod console;
mod database_url;
mod error;
mod failover;
pub mod fragments;
pub mod limits;
pub mod mail_search;
pub mod messages;
mod migrate;
pub mod pool;
pub mod prune;
pub mod rows;
pub mod search;
pub mod settings;
mod tls;
pub use tls::https_client_config;
pub mod wakeup;
pub mod webhooks;

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

pub use batch::{
    mail::{Quotas, every_mail_statement},
    poll::{Lease, QueuedPoll},
    send::{
        Addressee, CopyOutcome, KEYED_INSERT, QueuedSend, SendOutcome, Stored, copy_key,
        other_copy_key,
    },
};
pub use error::{NO_SYNC_STANDBY, POOL_BUSY, READ_ONLY, STALLED, StoreError};
pub use messages::Polled;
pub use migrate::{migrate, migrate_with, wait_for_database};
pub use pool::{Client, Pool};
use wakeup::Wakeup;

use crate::telemetry::metrics;

/// How this replica reaches PostgreSQL.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database_url: String,
    /// Largest connection count this replica opens (plus one LISTEN
    /// connection).
    pub pool_size: usize,
    /// How long a request waits for a free connection (or its group-commit
    /// batch) before a retryable "busy" error.
    pub pool_timeout: Duration,
    /// Server-side limit on one statement, and on waiting for a lock.
    pub statement_timeout: Duration,
    /// How long startup waits for PostgreSQL to answer.
    pub connect_wait: Duration,
    /// Statement timeout of the migrations (and of waiting for another
    /// replica's).
    pub migration_timeout: Duration,
    /// Mail is acknowledged only once a synchronous standby holds it
    /// (`PHONE_REQUIRE_SYNC_STANDBY`; `pool::standby`), and `/health` says
    /// 503 while the primary has none.
    pub require_sync_standby: bool,
}

impl Settings {
    /// The defaults for `database_url` (tests, tools).
    pub fn for_url(database_url: &str) -> Self {
        Self {
            database_url: database_url.to_owned(),
            pool_size: 10,
            pool_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(10),
            connect_wait: Duration::from_secs(60),
            migration_timeout: Duration::from_secs(300),
            require_sync_standby: false,
        }
    }
}

/// The database as the domain sees it: cheap to clone, shared by every
/// request of this replica.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// `Settings::require_sync_standby`, for `/health`.
    require_sync_standby: bool,
    wakeup: Arc<Wakeup>,
    /// Sends and read polls in flight on this replica, written together.
    mail: batch::Batcher<batch::mail::MailWrite>,
    /// Notified when this replica queued webhook deliveries.
    webhooks_due: Arc<tokio::sync::Notify>,
    /// Group-commit drains and give-backs: shutdown waits for them before
    /// the pool closes.
    tasks: tokio_util::task::TaskTracker,
}

impl Store {
    /// The pool (connections open lazily) and this replica's LISTEN
    /// connection, which runs until `stopping`. `unread_cap` bounds the
    /// unread counts polls report, `answer_bytes` the text a poll takes.
    pub fn open(
        settings: &Settings,
        unread_cap: i64,
        answer_bytes: i64,
        quotas: Quotas,
        stopping: CancellationToken,
    ) -> Result<Self, StoreError> {
        let pool = pool::connect(settings)?;
        let wakeup = Arc::new(Wakeup::default());
        let (listen_config, tls) = pool::connection_config(settings)?;
        let listen = connect::Connector::new(&listen_config, tls)?;
        tokio::spawn(wakeup.clone().listen(listen, stopping));
        let webhooks_due = Arc::new(tokio::sync::Notify::new());
        let tasks = tokio_util::task::TaskTracker::new();
        let mail = batch::Batcher::new(
            batch::mail::MailWrite {
                pool: pool.clone(),
                cap: unread_cap,
                answer_bytes,
                wakes: batch::PendingWakes::default(),
                wakeup: wakeup.clone(),
                quotas,
                webhooks_due: webhooks_due.clone(),
                tasks: tasks.clone(),
                require_sync_standby: settings.require_sync_standby,
            },
            pool.wait_timeout(),
            pool.status().max_size,
            tasks.clone(),
        );
        let waiters = Arc::downgrade(&wakeup);
        let waiters: std::sync::Weak<dyn metrics::Waiters> = waiters;
        metrics::watch(pool.weak(), waiters);
        Ok(Self {
            pool,
            require_sync_standby: settings.require_sync_standby,
            wakeup,
            mail,
            webhooks_due,
            tasks,
        })
    }

    /// A pooled connection, for the statements of `agents`, `messages`, ….
    pub async fn db(&self) -> Result<Client, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// With `PHONE_REQUIRE_SYNC_STANDBY`: whether this role can see the
    /// standbys' positions, which the guard needs (at startup).
    pub async fn check_sync_standby_guard(&self) -> Result<(), StoreError> {
        if !self.require_sync_standby {
            return Ok(());
        }
        pool::check_standby_privilege(&self.pool).await
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn wakeup(&self) -> &Arc<Wakeup> {
        &self.wakeup
    }

    /// Notified when this replica queued webhook deliveries.
    pub fn webhooks_due(&self) -> &Arc<tokio::sync::Notify> {
        &self.webhooks_due
    }

    /// Stores one message, together with the other sends and read polls in
    /// flight on this replica (one statement, one commit).
    /// `gone`: cancelled when the caller can no longer hear the answer (a
    /// send whose caller left before its statement began is not stored).
    pub async fn send(
        &self,
        send: QueuedSend,
        gone: CancellationToken,
    ) -> Result<SendOutcome, StoreError> {
        self.mail.send(send, gone).await
    }

    /// Takes the oldest available messages of one inbox (read or lease),
    /// together with the other calls in flight, the same inbox's included.
    /// A poll whose caller left before its statement began takes nothing;
    /// one whose request was dropped while it ran gives its messages back.
    pub async fn poll(
        &self,
        poll: QueuedPoll,
        gone: CancellationToken,
    ) -> Result<Polled, StoreError> {
        self.mail.poll(poll, gone).await
    }

    /// Puts back what a poll took, when its caller turned out to be gone:
    /// off the caller's path, retried until it lands (a busy pool, a
    /// database that blinked), and waited for at shutdown.
    pub fn give_back(&self, polled: Polled) {
        if polled.messages.is_empty() {
            return;
        }
        let pool = self.pool.clone();
        let wakeup = self.wakeup.clone();
        self.tasks
            .spawn(async move { batch::mail::give_back(&pool, &wakeup, &polled).await });
    }

    /// Runs `work` to its end off the caller's path (a caller that goes
    /// away does not cancel it), waited for at shutdown; its outcome.
    pub async fn run_detached<T, F>(&self, work: F) -> Option<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.tasks.spawn(work).await.ok()
    }

    /// Whether a pooled connection's server takes writes, within a second.
    pub async fn ping(&self) -> Result<(), StoreError> {
        pool::ping(&self.pool, self.require_sync_standby).await
    }

    /// Waits, for up to `within`, for the statements in flight and what
    /// they leave to do (give-backs of polls whose callers left), then
    /// stops handing out connections and closes the idle ones.
    pub async fn close(&self, within: Duration) {
        self.tasks.close();
        if tokio::time::timeout(within, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::error!(
                tasks = self.tasks.len(),
                "shutting down with statements or give-backs still unfinished"
            );
        }
        self.pool.close();
    }
}
