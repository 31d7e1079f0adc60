//! Rate limits on failed authentication and on registration.
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

use chrono::{DateTime, Utc};

use super::{
    Phone, PhoneError,
    agents::{AUTH_FAILURES, timestamp},
};

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

pub fn auth_bucket_for_name(name: &str) -> String {
    format!("auth:name:{name}")
}

pub fn register_bucket(address: &str) -> String {
    format!("register:addr:{address}")
}

impl Phone {
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
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO rate_limits AS r (bucket, window_start, hits) VALUES ($1, now(), 1)
                 ON CONFLICT (bucket) DO UPDATE SET
                     hits = CASE WHEN r.window_start <= now() - make_interval(secs => $2) THEN 1 ELSE r.hits + 1 END,
                     window_start = CASE WHEN r.window_start <= now() - make_interval(secs => $2) THEN now() ELSE r.window_start END
                 RETURNING hits, window_start + make_interval(secs => $2) AS resets_at,
                           extract(epoch FROM window_start + make_interval(secs => $2) - now())::float8 AS seconds_left",
            )
            .await?;
        let row = client
            .query_one(&stmt, &[&bucket, &window.as_secs_f64()])
            .await?;
        let hits: i32 = row.get("hits");
        if hits as i64 > i64::from(limit) {
            let retry_at = timestamp(row.get::<_, DateTime<Utc>>("resets_at"));
            let left = Duration::from_secs_f64(row.get::<_, f64>("seconds_left").max(0.0));
            tracing::warn!(bucket = %bucket, hits, "rate limit reached");
            self.limits()
                .remember(bucket, Instant::now() + left, retry_at.clone());
            return Err(PhoneError::RateLimited { what, retry_at });
        }
        Ok(())
    }
}
