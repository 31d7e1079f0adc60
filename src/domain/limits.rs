//! Rate limits on failed authentication (per client address) and on
//! registration (per client address).
//!
//! Counters live in PostgreSQL (`rate_limits`), so every replica counts
//! against the same limit. Only failures count, and only after the token
//! was looked at: a right token is never refused. Once a counter is over its limit, the replica
//! that saw it remembers the block until the window ends, so a blocked
//! client costs no further queries there; other replicas learn it at their
//! next counted event, so the overshoot is at most one attempt per replica.
//! Successful authentication is never counted and costs nothing here.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::{AgentName, Phone, PhoneError, types::timestamp};
use crate::store;
use crate::telemetry::metrics;

/// What a blocked caller was doing too often, as its error says.
pub(crate) const AUTH_FAILURES: &str = "failed authentication attempts from here";
pub(crate) const REGISTRATIONS: &str = "registrations from here";

pub const AUTH_WINDOW: Duration = Duration::from_secs(300);
pub const REGISTER_WINDOW: Duration = Duration::from_secs(3600);

pub struct Limits {
    pub auth_failures: u32,
    pub registrations: u32,
    blocked: Mutex<HashMap<String, (Instant, String)>>,
    /// Failures over the limit answered late, at most this many at once
    /// (beyond, at once): a slowed guesser must not hold the replica's
    /// connections.
    tarpit: tokio::sync::Semaphore,
}

/// How late a failure over the limit is answered.
pub const OVER_LIMIT_DELAY: Duration = Duration::from_secs(1);
const TARPIT_SLOTS: usize = 64;

impl Limits {
    pub fn new(auth_failures: u32, registrations: u32) -> Self {
        Self {
            auth_failures,
            registrations,
            blocked: Mutex::default(),
            tarpit: tokio::sync::Semaphore::new(TARPIT_SLOTS),
        }
    }

    /// Waits [`OVER_LIMIT_DELAY`] when a slot is free.
    async fn slow_down(&self) {
        if let Ok(_slot) = self.tarpit.try_acquire() {
            tokio::time::sleep(OVER_LIMIT_DELAY).await;
        }
    }

    /// The time a block on `bucket` ends, if this replica knows of one.
    fn blocked_until(&self, bucket: &str) -> Option<String> {
        let mut blocked = self.blocked.lock().expect("limits lock");
        match blocked.get(bucket) {
            Some((until, shown)) if *until > Instant::now() => Some(shown.clone()),
            Some(_) => {
                blocked.remove(bucket);
                None
            }
            None => None,
        }
    }

    fn remember(&self, bucket: String, until: Instant, shown: String) {
        let mut blocked = self.blocked.lock().expect("limits lock");
        // Keep the map bounded: forget expired blocks when it grows.
        if blocked.len() > 10_000 {
            let now = Instant::now();
            blocked.retain(|_, (u, _)| *u > now);
        }
        blocked.insert(bucket, (until, shown));
    }
}

pub fn auth_bucket_for_address(address: &str) -> String {
    format!("auth:addr:{address}")
}

pub fn register_bucket(address: &str) -> String {
    format!("register:addr:{address}")
}

impl Phone {
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Refuses at once when this replica knows `bucket` is blocked.
    pub(crate) fn check_block(&self, bucket: &str, what: &'static str) -> Result<(), PhoneError> {
        match self.limits().blocked_until(bucket) {
            Some(retry_at) => Err(PhoneError::RateLimited { what, retry_at }),
            None => Ok(()),
        }
    }

    /// Counts one event in `bucket`; over `limit` in the window, blocks it.
    pub(crate) async fn count(
        &self,
        bucket: String,
        window: Duration,
        limit: u32,
        what: &'static str,
    ) -> Result<(), PhoneError> {
        if limit == 0 {
            return Ok(());
        }
        let db = self.store.db().await?;
        let count = store::limits::count_hit(&db, &bucket, window).await?;
        if count.hits > i64::from(limit) {
            let retry_at = timestamp(count.resets_at);
            tracing::warn!(bucket = %bucket, hits = count.hits, "rate limit reached");
            self.limits()
                .remember(bucket, Instant::now() + count.left, retry_at.clone());
            return Err(PhoneError::RateLimited { what, retry_at });
        }
        Ok(())
    }

    /// A failed authentication from `client_address`. Called only after the
    /// token was looked at and did not match: the token decides first, so
    /// a right token is served whatever others at its address tried (an
    /// office NAT, a cloud /64, an edge without the client's header). Under
    /// the limit the failure is counted (shared by every replica); over it,
    /// the failure is refused with the time the window ends, not counted
    /// again, and answered late (a guesser is slowed, nobody else is).
    ///
    /// Not per name: tokens carry 256 random bits, so guessing one is
    /// hopeless, and a per-name lock-out would only hand strangers a way to
    /// lock a named agent out. A name that draws failures shows in the
    /// `phone.auth.failures` metric and, per address, in the rate-limit log line.
    pub(crate) async fn auth_failed(
        &self,
        client_address: &str,
        claimed: Option<&AgentName>,
        reason: &'static str,
    ) -> Result<(), PhoneError> {
        metrics::auth_failure(reason, claimed.is_some());
        let bucket = auth_bucket_for_address(client_address);
        let outcome = match self.check_block(&bucket, AUTH_FAILURES) {
            Err(blocked) => Err(blocked),
            Ok(()) => {
                self.count(
                    bucket,
                    AUTH_WINDOW,
                    self.limits().auth_failures,
                    AUTH_FAILURES,
                )
                .await
            }
        };
        if outcome.is_err() {
            self.limits().slow_down().await;
        }
        outcome
    }
}
