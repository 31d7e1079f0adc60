//! The long-poll phase's results: wake-up latencies, send rates, quiet
//! windows, racing sends, and the exactly-once check they share.

use std::{collections::HashSet, time::Duration};

use super::RACE_WAIT;
use crate::stats::{CpuUse, Summary};

/// Wake-up latency: from a send to the waiting poll's response.
#[derive(Default)]
pub(crate) struct WakeLatRow {
    pub(crate) case: String,
    /// The case in a few words, for the targets table.
    pub(crate) short: String,
    /// The send itself, request to response.
    pub(crate) send: Summary,
    pub(crate) from_send: Summary,
    pub(crate) from_send_response: Summary,
    /// Polls answered before the send's own response arrived.
    pub(crate) answered_first: u64,
    /// Notifications on the mail channel while the case ran.
    pub(crate) notifications: u64,
    pub(crate) once: Once,
    pub(crate) errors: String,
    pub(crate) error_count: u64,
}

/// Closed-loop sends to one kind of recipient.
pub(crate) struct SendRateRow {
    pub(crate) case: &'static str,
    pub(crate) secs: f64,
    pub(crate) sent_db: i64,
    pub(crate) sends_ok: u64,
    pub(crate) lat: Summary,
    pub(crate) errors: String,
    pub(crate) error_count: u64,
    /// What the recipients' side did, when someone waited for the mail.
    pub(crate) receivers: String,
    /// Active backends by wait event, averaged over the window.
    pub(crate) waits: Vec<(String, f64)>,
    /// Every statement the database ran (the recipients' polls included)
    /// per send, warm-up included (pg_stat_statements).
    pub(crate) statements_per_send: Option<f64>,
    /// Notifications on the mail channel meanwhile, and sends stored.
    pub(crate) notifications: u64,
    pub(crate) all_sent: i64,
}

impl SendRateRow {
    pub(crate) fn per_s(&self) -> f64 {
        self.sent_db as f64 / self.secs
    }
}

/// Load while nothing happens but (maybe) waiting.
pub(crate) struct QuietRow {
    pub(crate) case: String,
    /// Rows in `inbox_waiters` of the swarm, before and after the window.
    pub(crate) waiting: (i64, i64),
    /// pg_stat_statements of the database, from reset to read.
    pub(crate) stmt_secs: f64,
    pub(crate) statements: i64,
    /// Of them, run by the replicas' own timers (`StmtStat::from_a_timer`).
    pub(crate) timers: i64,
    /// The most frequent: (kind, excerpt, calls).
    pub(crate) top: Vec<(&'static str, String, i64)>,
    pub(crate) commits: i64,
    pub(crate) cpu: CpuUse,
    /// VmRSS summed over the replicas, after the window.
    pub(crate) rss_kb: u64,
}

impl QuietRow {
    pub(crate) fn statements_per_s(&self) -> f64 {
        self.statements as f64 / self.stmt_secs.max(1e-9)
    }
    /// Statements per second other than the replicas' timers': what
    /// waiting (or calls) cost.
    pub(crate) fn untimed_per_s(&self) -> f64 {
        (self.statements - self.timers) as f64 / self.stmt_secs.max(1e-9)
    }
    pub(crate) fn cores(&self, cpu_s: f64) -> f64 {
        cpu_s / self.cpu.wall.max(1e-9)
    }
}

/// Sends racing a long poll's registration.
pub(crate) struct RaceResult {
    pub(crate) long_polls: u64,
    pub(crate) missed: u64,
    /// The latest a missed poll's message was stored after the poll began.
    pub(crate) stored_by: Duration,
    pub(crate) once: Once,
    pub(crate) errors: String,
}

impl RaceResult {
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} of {} long polls missed their wake-up: waited the full {RACE_WAIT} s and returned nothing, though their message had been stored at most {:.0} ms after they began",
            self.missed,
            self.long_polls,
            self.stored_by.as_secs_f64() * 1000.0
        )
    }
}

/// Exactly-once delivery: what the database holds against what was sent
/// and what the polls returned.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Once {
    pub(crate) sent: usize,
    pub(crate) stored: i64,
    pub(crate) unread: i64,
    pub(crate) received: usize,
    pub(crate) duplicates: usize,
    /// Sent ids no poll returned.
    missing: usize,
}

impl Once {
    pub(crate) fn check(
        sent: &[String],
        received: &[String],
        (stored, unread): (i64, i64),
    ) -> Self {
        let unique: HashSet<&String> = received.iter().collect();
        Once {
            sent: sent.len(),
            stored,
            unread,
            received: received.len(),
            duplicates: received.len() - unique.len(),
            missing: sent.iter().filter(|id| !unique.contains(id)).count(),
        }
    }
    /// Every stored message was sent once, returned once, none left unread.
    pub(crate) fn ok(&self) -> bool {
        self.stored == self.sent as i64
            && self.received == self.sent
            && self.duplicates == 0
            && self.missing == 0
            && self.unread == 0
    }
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} sent, {} stored, {} returned, {} duplicates, {} missing, {} unread",
            self.sent, self.stored, self.received, self.duplicates, self.missing, self.unread
        )
    }
}
