//! Following the primary: when a connection learns that its server is not
//! (or no longer) the one that takes writes, it and every connection made
//! before it are dropped, and new ones go wherever `DATABASE_URL`'s hosts
//! now accept writes (`connect.rs`).
//!
//! Nothing is checked on the way to each statement: the first statement
//! that meets a standby (SQLSTATE 25006), a server shutting down (57P01, as
//! a failover stops the old primary) or a dead connection tells the pool,
//! and connections older than that moment are not handed out again. So a
//! pool full of connections to a demoted primary costs one failed call per
//! replica (which hears "retry"), not one per connection.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Instant,
};

/// The moment before which this pool's connections are stale.
pub struct Stale {
    /// A fixed origin, so the moment fits in an atomic.
    origin: Instant,
    /// Nanoseconds after `origin`; 0: none is stale.
    before: AtomicU64,
}

impl Default for Stale {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            before: AtomicU64::new(0),
        }
    }
}

impl Stale {
    /// Every connection made until now is stale.
    pub fn mark(&self) {
        let now = self.origin.elapsed().as_nanos() as u64;
        self.before.fetch_max(now.max(1), Ordering::Relaxed);
    }

    /// Whether a connection made at `created` is stale.
    pub fn is_stale(&self, created: Instant) -> bool {
        let before = self.before.load(Ordering::Relaxed);
        before != 0 && (created.saturating_duration_since(self.origin).as_nanos() as u64) < before
    }
}

/// One statement, one round trip: whether the server takes writes now. A
/// standby, or a server made read-only, answers false. Otherwise it writes
/// a tiny transactional WAL record (a logical decoding message, prefix
/// `phone.health`, which no table sees), so that the commit is a real one
/// that waits for the synchronous standby as every send's does: a primary
/// whose commits hang answers late, not "ok". (A transaction that only
/// takes an id, `txid_current()`, writes no WAL and does not wait. CASE
/// runs the write only on a server that can take it.)
pub const WRITABLE_SQL: &str = "SELECT CASE
     WHEN pg_is_in_recovery() OR current_setting('transaction_read_only')::bool THEN false
     ELSE pg_logical_emit_message(true, 'phone.health', '') IS NOT NULL END";

/// The same without the write, for a role that may not emit WAL messages
/// (a managed service that revoked the function): a hung commit goes
/// unnoticed then, a standby or a read-only server does not.
pub const WRITABLE_SQL_NO_WAL: &str = "SELECT NOT (pg_is_in_recovery()
     OR current_setting('transaction_read_only')::bool)";

/// Set once the server refused `WRITABLE_SQL`'s function.
pub static NO_WAL_MESSAGES: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether this replica's LISTEN connection is still on a server that takes
/// writes (notifications are sent where sends commit).
pub const PRIMARY_SQL: &str = WRITABLE_SQL_NO_WAL;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn connections_made_before_the_mark_are_stale() {
        let stale = Stale::default();
        let old = Instant::now();
        assert!(!stale.is_stale(old), "nothing is stale before a mark");
        std::thread::sleep(Duration::from_millis(2));
        stale.mark();
        std::thread::sleep(Duration::from_millis(2));
        let new = Instant::now();
        assert!(stale.is_stale(old));
        assert!(!stale.is_stale(new));
    }
}
