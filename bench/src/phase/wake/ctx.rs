//! What the parts of the long-poll phase share, and the two measurements
//! they repeat: a closed-loop send rate, and a quiet window.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{DB_WAKE, QuietRow, SendRateRow, names_of};
use crate::db;
use crate::load::{Agent, long_poll};
use crate::mcp::Target;
use crate::mode::{Mode, WAIT_SAMPLE_EVERY};
use crate::replicas::{Replica, pids};
use crate::report::shorten;
use crate::stats;
use crate::window::sample_window;

/// What the parts of the wake phase share.
pub(crate) struct WakeCtx<'a> {
    pub(crate) mode: &'a Mode,
    pub(crate) admin: &'a tokio_postgres::Client,
    /// The bench database, for counts (never used inside a quiet window).
    pub(crate) wdb: tokio_postgres::Client,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) tg: Vec<Target>,
    pub(crate) rows: Arc<db::WaiterRows>,
    pub(crate) notifications: db::NotifyCounter,
    /// The closed-loop senders (s-agents), also the swarm's deliverers.
    pub(crate) senders: Vec<Agent>,
    pub(crate) swarm_ids: Vec<i64>,
    pub(crate) postmaster: u32,
    pub(crate) hz: f64,
}

impl WakeCtx<'_> {
    /// VmRSS summed over the replicas, now.
    pub(crate) fn server_rss_kb(&self) -> u64 {
        self.replicas
            .iter()
            .filter_map(|r| stats::mem(r.pid))
            .map(|m| m.rss_kb)
            .sum()
    }

    /// Closed-loop sends from the s-agents to `recipients`; counted from
    /// the database, with PostgreSQL's wait events sampled alongside.
    pub(crate) async fn send_rate(
        &self,
        case: &'static str,
        recipients: &[String],
    ) -> Result<SendRateRow, String> {
        let mode = self.mode;
        let pgss = db::statements_reset(self.admin).await.is_ok();
        let notified = self.notifications.count();
        let start = tokio::time::Instant::now();
        let wall0 = chrono::Utc::now();
        let from = start + mode.wake_warmup;
        let (out, waits) = tokio::join!(
            long_poll::sends(
                &self.tg,
                &self.senders,
                recipients,
                start,
                mode.wake_warmup,
                mode.wake_window
            ),
            db::wait_events(
                self.admin,
                DB_WAKE,
                WAIT_SAMPLE_EVERY,
                from,
                from + mode.wake_window
            ),
        );
        let statements: Option<i64> = if pgss {
            db::statements(self.admin, DB_WAKE)
                .await
                .ok()
                .map(|xs| xs.iter().map(|x| x.calls).sum())
        } else {
            None
        };
        let notifications = self.notifications.settled_count().await - notified;
        let senders = names_of(&self.senders);
        let (all_sent, _) =
            db::count_window(&self.wdb, &senders, wall0, chrono::Utc::now()).await?;
        let from = wall0 + chrono::Duration::from_std(mode.wake_warmup).unwrap();
        let to = from + chrono::Duration::from_std(mode.wake_window).unwrap();
        let (sent_db, _) = db::count_window(&self.wdb, &senders, from, to).await?;
        Ok(SendRateRow {
            case,
            secs: mode.wake_window.as_secs_f64(),
            sent_db,
            sends_ok: out.ok,
            lat: out.lat.summary(),
            errors: out.errors.describe(),
            error_count: out.errors.total(),
            receivers: String::new(),
            waits,
            statements_per_send: statements.map(|n| n as f64 / all_sent.max(1) as f64),
            notifications,
            all_sent,
        })
    }

    /// Statements, commits, CPU and memory over a window in which nothing
    /// happens but the long polls that may be waiting.
    pub(crate) async fn quiet_window(&self, case: String) -> QuietRow {
        let waiting = || async { self.rows.waiting(&self.swarm_ids).await.unwrap_or(-1) };
        let before = waiting().await;
        let pgss = db::statements_reset(self.admin).await.is_ok();
        let reset_at = Instant::now();
        let from = tokio::time::Instant::now() + Duration::from_millis(20);
        let (cpu, counters) = sample_window(
            self.admin,
            DB_WAKE,
            &pids(&self.replicas),
            self.postmaster,
            &[],
            from,
            from + self.mode.wake_window,
            self.hz,
        )
        .await;
        let stmt_secs = reset_at.elapsed().as_secs_f64();
        let mut stmts = if pgss {
            db::statements(self.admin, DB_WAKE)
                .await
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let rss_kb = self.server_rss_kb();
        let after = waiting().await;
        stmts.sort_by_key(|x| std::cmp::Reverse(x.calls));
        QuietRow {
            case,
            waiting: (before, after),
            stmt_secs,
            statements: stmts.iter().map(|x| x.calls).sum(),
            timers: stmts
                .iter()
                .filter(|x| x.from_a_timer())
                .map(|x| x.calls)
                .sum(),
            top: stmts
                .iter()
                .take(3)
                .map(|x| (x.kind(), shorten(&x.query, 80), x.calls))
                .collect(),
            commits: counters.commits,
            cpu,
            rss_kb,
        }
    }
}
