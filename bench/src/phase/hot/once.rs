//! Exactly once in the popular inbox: what the bench saw against what the
//! database holds after the drain.

use std::{collections::HashSet, fmt::Write as _, time::Duration};

use crate::{db, load};

/// Exactly once for one popular-inbox run, from what the bench saw (ids
/// the sends returned, ids the polls handed out, ids the acknowledgements
/// confirmed; the drain after the run included) against every message of
/// the run's recipient in the database after the drain.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HotOnce {
    lease: bool,
    sent: usize,
    stored: usize,
    /// Send responses whose id the database does not hold.
    not_stored: usize,
    handed_out: usize,
    /// Read mode: ids handed out more than once. Lease mode: ids handed
    /// out again while an earlier lease of theirs was live.
    pub(crate) duplicates: usize,
    /// Lease mode: handed out again after the earlier lease expired.
    released: usize,
    acked: usize,
    /// Lease mode: ids acknowledged by more than one `phone_ack`.
    pub(crate) double_acked: usize,
    /// Stored messages never delivered (read: never handed out; lease:
    /// never acknowledged), plus sends that were not stored.
    pub(crate) lost: usize,
    /// The database after the drain: messages still unread (read mode)
    /// or unacknowledged (lease mode), and messages leased more than once.
    undelivered_db: usize,
    redelivered_db: usize,
    /// Messages the drain took after the run (the backlog at its end).
    pub(crate) drained: u64,
}

impl HotOnce {
    pub(crate) fn check(
        lease: Option<u32>,
        out: &load::HotOutcome,
        rows: &[db::InboxRow],
        drained: u64,
    ) -> Self {
        let db_ids: HashSet<i64> = rows.iter().map(|r| r.id).collect();
        let mut handed: Vec<(i64, tokio::time::Instant)> =
            out.handouts.iter().map(|h| (h.id, h.at)).collect();
        handed.sort_unstable();
        let (mut duplicates, mut released) = (0, 0);
        for pair in handed.windows(2) {
            if pair[0].0 != pair[1].0 {
                continue;
            }
            match lease {
                Some(secs) if pair[1].1 - pair[0].1 >= Duration::from_secs(u64::from(secs)) => {
                    released += 1
                }
                _ => duplicates += 1,
            }
        }
        let handed_ids: HashSet<i64> = handed.iter().map(|h| h.0).collect();
        let acked_ids: HashSet<i64> = out.acked_ids.iter().copied().collect();
        let delivered = if lease.is_some() {
            &acked_ids
        } else {
            &handed_ids
        };
        let not_stored = out
            .sent_ids
            .iter()
            .filter(|id| !db_ids.contains(id))
            .count();
        HotOnce {
            lease: lease.is_some(),
            sent: out.sent_ids.len(),
            stored: rows.len(),
            not_stored,
            handed_out: handed.len(),
            duplicates,
            released,
            acked: out.acked_ids.len(),
            double_acked: out.acked_ids.len() - acked_ids.len(),
            lost: db_ids.iter().filter(|id| !delivered.contains(id)).count() + not_stored,
            undelivered_db: rows
                .iter()
                .filter(|r| if lease.is_some() { !r.acked } else { !r.read })
                .count(),
            redelivered_db: rows.iter().filter(|r| r.deliveries > 1).count(),
            drained,
        }
    }

    pub(crate) fn ok(&self) -> bool {
        self.stored > 0
            && self.not_stored == 0
            && self.duplicates == 0
            && self.double_acked == 0
            && self.lost == 0
            && self.undelivered_db == 0
    }

    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            "{} lost, {} duplicated",
            self.lost,
            self.duplicates + self.double_acked
        );
        if self.lease {
            let _ = write!(
                s,
                " ({} sent, {} stored, {} handed out, {} acknowledged, {} acknowledged twice, {} re-leased after expiry, {} unacknowledged in the DB",
                self.sent,
                self.stored,
                self.handed_out,
                self.acked,
                self.double_acked,
                self.released,
                self.undelivered_db
            );
        } else {
            let _ = write!(
                s,
                " ({} sent, {} stored, {} handed out, {} unread in the DB",
                self.sent, self.stored, self.handed_out, self.undelivered_db
            );
        }
        let _ = write!(
            s,
            ", {} leased or read more than once per the DB; {} drained after the run",
            self.redelivered_db, self.drained
        );
        if self.not_stored > 0 {
            let _ = write!(s, "; {} sends answered but not stored", self.not_stored);
        }
        s.push(')');
        s
    }
}
