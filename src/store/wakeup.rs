//! Wakes long-polling inbox calls when mail arrives, on any replica.
//!
//! One LISTEN connection per replica receives `phone_mail` notifications
//! (payload: the recipient's agent id) and fans them out in-process to the
//! local waiters of that agent. Waiting costs no queries.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::{StreamExt, stream};
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::{connect::Connector, failover::PRIMARY_SQL};

pub const CHANNEL: &str = "phone_mail";

#[derive(Default)]
pub struct Wakeup {
    /// Per agent: a counter bumped on every notification, and how many
    /// local waiters hold it.
    agents: Mutex<HashMap<i64, (watch::Sender<u64>, usize)>>,
    listening: AtomicBool,
    /// Counts the LISTEN connections made (see [`Wakeup::connections`]).
    connections: AtomicU64,
}

/// A local waiter's interest in one agent's mail; unregisters on drop.
pub struct Subscription {
    wakeup: Arc<Wakeup>,
    agent_id: i64,
    pub changes: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut agents = self.wakeup.agents.lock().expect("wakeup lock");
        if let Some((_, holders)) = agents.get_mut(&self.agent_id) {
            *holders -= 1;
            if *holders == 0 {
                agents.remove(&self.agent_id);
            }
        }
    }
}

impl Wakeup {
    pub fn subscribe(self: &Arc<Self>, agent_id: i64) -> Subscription {
        let mut agents = self.agents.lock().expect("wakeup lock");
        let entry = agents
            .entry(agent_id)
            .or_insert_with(|| (watch::channel(0).0, 0));
        entry.1 += 1;
        let changes = entry.0.subscribe();
        Subscription {
            wakeup: self.clone(),
            agent_id,
            changes,
        }
    }

    /// Whether notifications currently arrive; when not, waiters re-check
    /// on a slow timer instead.
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// How many times the LISTEN connection was (re)made. When it changes,
    /// a waiter registers its `inbox_waiters` row again: the server it
    /// registered on may be gone (a failover), and the table is unlogged,
    /// so neither a promoted standby nor a restarted server has the row, and
    /// senders there would not know the waiter waits.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Local waiters right now (for metrics and tests).
    pub fn waiters(&self) -> usize {
        self.agents
            .lock()
            .expect("wakeup lock")
            .values()
            .map(|(_, n)| n)
            .sum()
    }

    /// Wakes this replica's own waiters of `agent_id` (when a NOTIFY could
    /// not go out: they look at once instead of at the end of their wait).
    pub fn wake_here(&self, agent_id: i64) {
        self.wake(agent_id);
    }

    fn wake(&self, agent_id: i64) {
        if let Some((sender, _)) = self.agents.lock().expect("wakeup lock").get(&agent_id) {
            sender.send_modify(|n| *n += 1);
        }
    }

    fn wake_all(&self) {
        for (sender, _) in self.agents.lock().expect("wakeup lock").values() {
            sender.send_modify(|n| *n += 1);
        }
    }

    /// Keeps a LISTEN connection open until `stop`, reconnecting with
    /// backoff. The connection has the pool's TCP keepalive and user
    /// timeout, and answers a heartbeat every [`HEARTBEAT`] within
    /// [`HEARTBEAT_TIMEOUT`]: a path that went silent is noticed within
    /// seconds, not when the kernel gives up; the heartbeat also asks
    /// whether its server still takes writes, so a listener left on a
    /// demoted primary moves to the new one. While it is down, every local
    /// waiter re-checks on its own timer; after a reconnect every local
    /// waiter re-checks at once, since notifications sent meanwhile were lost.
    pub async fn listen(self: Arc<Self>, connector: Connector, stop: CancellationToken) {
        let mut backoff = Duration::from_millis(200);
        loop {
            let outcome = tokio::select! {
                outcome = self.listen_once(&connector) => outcome,
                _ = stop.cancelled() => return,
            };
            let was_listening = self.listening.swap(false, Ordering::Relaxed);
            // Waiters sleeping through their whole wait look again now, and
            // then re-check on the fallback timer.
            self.wake_all();
            match outcome {
                Err(e) => {
                    tracing::warn!(error = %e, "mail notification listener lost; reconnecting")
                }
                Ok(()) => tracing::warn!("mail notification connection closed; reconnecting"),
            }
            if was_listening {
                backoff = Duration::from_millis(200);
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// One LISTEN connection, until it fails, closes, or finds that its
    /// server no longer takes writes (a failover: sends commit, and notify,
    /// on the new primary).
    async fn listen_once(&self, connector: &Connector) -> Result<(), ListenError> {
        let (client, mut connection) =
            tokio::time::timeout(connector.budget(), connector.connect())
                .await
                .map_err(|_| ListenError::Unreachable)??;
        let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
        // The connection is driven by `messages`: every statement on it
        // completes only while they are polled too.
        let statement = format!("LISTEN {CHANNEL}");
        self.drive(&mut messages, client.batch_execute(&statement), None)
            .await?;
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.listening.store(true, Ordering::Relaxed);
        self.wake_all();
        tracing::debug!("listening for mail notifications");
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.tick().await;
        loop {
            tokio::select! {
                msg = messages.next() => match msg {
                    Some(msg) => self.deliver(msg?),
                    None => return Ok(()),
                },
                _ = heartbeat.tick() => {
                    let answer = self
                        .drive(&mut messages, client.simple_query(PRIMARY_SQL), Some(HEARTBEAT_TIMEOUT))
                        .await?;
                    let primary = answer.iter().find_map(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0),
                        _ => None,
                    });
                    if primary != Some("t") {
                        return Err(ListenError::NotPrimary);
                    }
                }
            }
        }
    }

    /// Runs `statement` on the LISTEN connection while delivering what
    /// arrives meanwhile; fails when it takes longer than `within`.
    async fn drive<T>(
        &self,
        messages: &mut (
                 impl futures_util::Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Unpin
             ),
        statement: impl Future<Output = Result<T, tokio_postgres::Error>>,
        within: Option<Duration>,
    ) -> Result<T, ListenError> {
        tokio::pin!(statement);
        let deadline = tokio::time::sleep(within.unwrap_or(Duration::from_secs(86_400)));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                done = &mut statement => return done.map_err(ListenError::from),
                msg = messages.next() => match msg {
                    Some(msg) => self.deliver(msg?),
                    None => return Err(ListenError::Closed),
                },
                _ = &mut deadline => return Err(ListenError::Silent),
            }
        }
    }

    fn deliver(&self, msg: AsyncMessage) {
        if let AsyncMessage::Notification(n) = msg
            && let Ok(agent_id) = n.payload().parse::<i64>()
        {
            self.wake(agent_id);
        }
    }
}

/// How often the LISTEN connection proves it is alive, and how long its
/// answer may take: a silent path is noticed within about 5 s.
const HEARTBEAT: Duration = Duration::from_secs(3);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error("{}", super::error::describe(.0))]
    Database(#[from] tokio_postgres::Error),
    #[error("no host completed a connection in time")]
    Unreachable,
    #[error("its server no longer takes writes (a failover)")]
    NotPrimary,
    #[error("the connection closed")]
    Closed,
    #[error("no answer to the heartbeat within {HEARTBEAT_TIMEOUT:?}")]
    Silent,
}

impl crate::telemetry::metrics::Waiters for Wakeup {
    fn waiters(&self) -> usize {
        Wakeup::waiters(self)
    }
}
