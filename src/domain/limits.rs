//! Rate limits on failed authentication (per client address) and on
//! registration (per client address).
//!
//! Counters live in PostgreSQL (`rate_limits`), so every replica counts
//! against the same limit. Once a counter is over its limit, the replica
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
pub(crate) const AUTH_FAILURES: &str = "failed authentication attempts";
pub(crate) const REGISTRATIONS: &str = "registrations";

pub const AUTH_WINDOW: Duration = Duration::from_secs(300);
pub const REGISTER_WINDOW: Duration = Duration::from_secs(3600);

pub struct Limits {
    pub auth_failures: u32,
    pub registrations: u32,
    blocked: Mutex<HashMap<String, (Instant, String)>>,
}

impl Limits {
    pub fn new(auth_failures: u32, registrations: u32) -> Self {
        Self {
            auth_failures,
            registrations,
            blocked: Mutex::default(),
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

    /// Refuses at once when this replica knows the caller's address is
    /// blocked for failed authentication.
    pub(crate) fn check_address_block(&self, client_address: &str) -> Result<(), PhoneError> {
        self.check_block(&auth_bucket_for_address(client_address), AUTH_FAILURES)
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

    /// Counts a failed authentication against the client's address;
    /// returns the rate-limit error once it is over the limit.
    ///
    /// Not per name: tokens carry 256 random bits, so guessing one is
    /// hopeless, and a per-name lock-out would only hand strangers a way to
    /// lock a named agent out (the owner's correct token always works). A
    /// name that draws failures shows in the `phone.auth.failures` metric and,
    /// per address, in the rate-limit log line.
    pub(crate) async fn count_auth_failure(
        &self,
        client_address: &str,
        claimed: Option<&AgentName>,
        reason: &'static str,
    ) -> Result<(), PhoneError> {
        metrics::auth_failure(reason, claimed.is_some());
        self.count(
            auth_bucket_for_address(client_address),
            AUTH_WINDOW,
            self.limits().auth_failures,
            AUTH_FAILURES,
        )
        .await
    }
}
