//! What the webhook and the policy phases share: closed-loop runs of
//! `AB_SENDERS` senders against one kind of recipient at a time, (a) the
//! baseline and (b) the feature, alternated over rounds, each run after
//! the same settling; `phone_settings` for many agents; and the comparison
//! of the kinds in `RESULTS.md` (median of the rounds' ratios).

use std::time::{Duration, Instant};

use super::{names_of, policy::RefusalSplit};
use crate::db;
use crate::load::{Agent, hooks};
use crate::mcp::Target;
use crate::mode::{Mode, WAIT_SAMPLE_EVERY};
use crate::replicas::{Replica, pids};
use crate::stats::{CpuUse, Summary};
use crate::window::sample_window;

/// Closed-loop senders of the webhook and policy comparisons (as in the
/// long polls' send rates); each is on every allow list, with the blocks
/// within the 100 names one `phone_settings` call may change.
pub(crate) const AB_SENDERS: usize = 16;
/// Connections setting up webhooks and policies (`phone_settings`).
pub(crate) const SETTINGS_WORKERS: usize = 8;

/// One closed-loop run of the webhook or policy comparison: `AB_SENDERS`
/// senders, each walking over one kind of recipient.
pub(crate) struct AbRun {
    /// 'a' the baseline, 'b' the same sends to the other kind, 'c' (policy
    /// only) half of the senders not on the allow lists.
    pub(crate) key: char,
    case: &'static str,
    round: usize,
    pub(crate) secs: f64,
    /// Stored by the senders, from the database: inside the measured
    /// window, and over the whole run (warm-up and stragglers included).
    sent_db: i64,
    all_sent: i64,
    /// Answers inside the window: stored, refused by the policy.
    pub(crate) ok: u64,
    pub(crate) refused: u64,
    /// Answers over the whole run, and the refusals `refused_sends` counted.
    pub(crate) ok_total: u64,
    pub(crate) refused_total: u64,
    refused_db: i64,
    pub(crate) lat: Summary,
    pub(crate) errors: String,
    pub(crate) error_count: u64,
    pub(crate) error_examples: Vec<String>,
    pub(crate) cpu: CpuUse,
    /// Every statement the database ran (pg_stat_statements) per send
    /// answered, warm-up and webhook deliveries included.
    statements_per_send: Option<f64>,
    pub(crate) hooks: Option<HookWindow>,
    pub(crate) split: Option<RefusalSplit>,
    /// Active backends by wait event, averaged over the window.
    waits: Vec<(String, f64)>,
    /// When the run began (the database's clock is this machine's), and
    /// per sender its (stored, refused) answers.
    pub(crate) started: chrono::DateTime<chrono::Utc>,
    pub(crate) per_sender: Vec<(u64, u64)>,
}

impl AbRun {
    pub(crate) fn per_s(&self) -> f64 {
        self.sent_db as f64 / self.secs
    }
    pub(crate) fn answered_per_s(&self) -> f64 {
        (self.ok + self.refused) as f64 / self.secs
    }
    fn cpu_us(&self, cpu_s: f64) -> f64 {
        cpu_s / (self.ok + self.refused).max(1) as f64 * 1e6
    }
    /// The database holds what the answers said: every stored answer a
    /// message, every refusal counted in `refused_sends`.
    pub(crate) fn consistent(&self) -> bool {
        self.all_sent == self.ok_total as i64 && self.refused_db == self.refused_total as i64
    }
}

/// Mean sends/s (DB) of the runs of one kind.
pub(crate) fn mean_rate(runs: &[AbRun], key: char) -> f64 {
    let xs: Vec<f64> = runs
        .iter()
        .filter(|r| r.key == key)
        .map(AbRun::per_s)
        .collect();
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The webhook queue around a run with webhooks.
pub(crate) struct HookWindow {
    /// Deliveries pending when the run started and when its window ended.
    pub(crate) pending_start: i64,
    pub(crate) pending_end: i64,
    /// Deliveries that ended delivered inside the window (DB), and POSTs
    /// the receiver took meanwhile.
    pub(crate) delivered: i64,
    pub(crate) received: usize,
    /// From the end of the sends to an empty queue; None: not within
    /// `hook_drain` (then `pending_after` were left).
    pub(crate) drain_secs: Option<f64>,
    pub(crate) pending_after: i64,
}

/// What the runs of the webhook and policy comparisons share.
pub(crate) struct AbCtx<'a> {
    pub(crate) mode: &'a Mode,
    pub(crate) admin: &'a tokio_postgres::Client,
    /// The phase's database, for counts.
    pub(crate) db: &'a tokio_postgres::Client,
    pub(crate) database: &'static str,
    pub(crate) replicas: &'a [Replica],
    pub(crate) tg: Vec<Target>,
    pub(crate) senders: Vec<Agent>,
    pub(crate) postmaster: u32,
    pub(crate) hz: f64,
}

impl AbCtx<'_> {
    fn sender_names(&self) -> Vec<String> {
        names_of(&self.senders)
    }

    /// One closed-loop run from the senders to `recipients`; inboxes
    /// emptied (marked read), `VACUUM (ANALYZE)` and `CHECKPOINT` first.
    /// With `receiver`, the webhook queue is read at the window's edges and
    /// (for a run that queued deliveries) waited for until it is empty.
    pub(crate) async fn run(
        &self,
        key: char,
        case: &'static str,
        round: usize,
        recipients: &[String],
        receiver: Option<&hooks::Receiver>,
    ) -> Result<AbRun, String> {
        let mode = self.mode;
        db::mark_all_read(self.db).await?;
        db::settle(self.db).await?;
        db::each(self.db, &["CHECKPOINT"]).await?;
        let pending_start = match receiver {
            Some(_) => db::webhooks_pending(self.db).await?,
            None => 0,
        };
        let pgss = db::statements_reset(self.admin).await.is_ok();
        let server_pids = pids(self.replicas);
        let start = tokio::time::Instant::now();
        let wall0 = chrono::Utc::now();
        let (from, to) = (
            start + mode.ab_warmup,
            start + mode.ab_warmup + mode.ab_measure,
        );
        let (out, (cpu, _), window, waits) = tokio::join!(
            hooks::spread(
                &self.tg,
                &self.senders,
                recipients,
                start,
                mode.ab_warmup,
                mode.ab_measure
            ),
            sample_window(
                self.admin,
                self.database,
                &server_pids,
                self.postmaster,
                &[],
                from,
                to,
                self.hz
            ),
            hook_window(self.db, receiver, from, to),
            db::wait_events(self.admin, self.database, WAIT_SAMPLE_EVERY, from, to),
        );
        let ended = Instant::now();
        let statements: Option<i64> = if pgss {
            db::statements(self.admin, self.database)
                .await
                .ok()
                .map(|xs| xs.iter().map(|x| x.calls).sum())
        } else {
            None
        };
        let names = self.sender_names();
        let now = chrono::Utc::now();
        let (all_sent, _) = db::count_window(self.db, &names, wall0, now).await?;
        let w_from = wall0 + chrono::Duration::from_std(mode.ab_warmup).unwrap();
        let w_to = w_from + chrono::Duration::from_std(mode.ab_measure).unwrap();
        let (sent_db, _) = db::count_window(self.db, &names, w_from, w_to).await?;
        let refused_db = db::refused_since(self.db, &names, wall0).await?;
        let hooks = match (receiver, window) {
            (Some(_), Some((received, pending_end))) => {
                let delivered = db::webhooks_delivered(self.db, w_from, w_to).await?;
                // Wait for the queue to empty, so that the next run does
                // not share the machine with this one's deliveries.
                let bound = ended + mode.hook_drain;
                let mut pending_after = db::webhooks_pending(self.db).await?;
                while pending_after > 0 && Instant::now() < bound {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    pending_after = db::webhooks_pending(self.db).await?;
                }
                Some(HookWindow {
                    pending_start,
                    pending_end,
                    delivered,
                    received,
                    drain_secs: (pending_after == 0).then(|| ended.elapsed().as_secs_f64()),
                    pending_after,
                })
            }
            _ => None,
        };
        let (ok_total, refused_total) = (out.ok_total(), out.refused_total());
        Ok(AbRun {
            key,
            case,
            round,
            secs: mode.ab_measure.as_secs_f64(),
            sent_db,
            all_sent,
            ok: out.ok,
            refused: out.refused,
            ok_total,
            refused_total,
            refused_db,
            lat: out.lat.summary(),
            errors: out.errors.describe(),
            error_count: out.errors.total(),
            error_examples: out.errors.examples.clone(),
            cpu,
            statements_per_send: statements
                .map(|n| n as f64 / (ok_total + refused_total).max(1) as f64),
            hooks,
            split: None,
            waits,
            started: wall0,
            per_sender: out.per_sender,
        })
    }
}

/// POSTs the receiver took inside the window, and deliveries pending at
/// its end; None without a receiver.
async fn hook_window(
    db: &tokio_postgres::Client,
    receiver: Option<&hooks::Receiver>,
    from: tokio::time::Instant,
    to: tokio::time::Instant,
) -> Option<(usize, i64)> {
    let receiver = receiver?;
    tokio::time::sleep_until(from).await;
    let before = receiver.count();
    tokio::time::sleep_until(to).await;
    let received = receiver.count() - before;
    let pending = db::webhooks_pending(db).await.unwrap_or(-1);
    Some((received, pending))
}

/// `phone_settings` for each agent; every answer must pass `check`.
pub(crate) async fn configure(
    tg: &[Target],
    calls: Vec<(Agent, serde_json::Value)>,
    what: &str,
    check: impl Fn(&Agent, &serde_json::Value) -> Result<(), String>,
) -> Result<f64, String> {
    let started = Instant::now();
    let agents: Vec<Agent> = calls.iter().map(|(a, _)| a.clone()).collect();
    let answers = hooks::settings_each(
        tg,
        calls,
        SETTINGS_WORKERS,
        tokio::time::Instant::now() + Duration::from_secs(120),
    )
    .await;
    let mut failed = 0;
    let mut first = None;
    for (agent, answer) in agents.iter().zip(&answers) {
        if let Err(e) = answer
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|v| check(agent, v))
        {
            failed += 1;
            first.get_or_insert(e);
        }
    }
    if let Some(e) = first {
        return Err(format!(
            "{what}: {failed} of {} phone_settings calls failed, first: {e}",
            agents.len()
        ));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Per round, the sends/s of the run of `key` ÷ those of that round's (a).
fn round_ratios(runs: &[AbRun], key: char) -> Vec<f64> {
    runs.iter()
        .filter(|x| x.key == key)
        .filter_map(|x| {
            runs.iter()
                .find(|a| a.key == 'a' && a.round == x.round)
                .map(|a| x.per_s() / a.per_s().max(1e-9))
        })
        .collect()
}

/// The median of the rounds' ratios: one run stalled by the machine (a
/// compiler's fsyncs, say) moves it less than it moves the means.
pub(crate) fn median_ratio(runs: &[AbRun], key: char) -> f64 {
    let mut v = round_ratios(runs, key);
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs of one kind against the baseline (a): the median of the rounds'
/// ratios, each round's, and the means of each kind.
pub(crate) fn ab_ratios(runs: &[AbRun], key: char) -> String {
    let rounds: Vec<String> = round_ratios(runs, key)
        .iter()
        .map(|r| format!("{r:.2}×"))
        .collect();
    format!(
        "**{:.2}×**, the median of the rounds' ratios (round by round {}; the means of each kind's runs: {:.0} vs {:.0} sends/s, {:.2}×)",
        median_ratio(runs, key),
        if rounds.is_empty() {
            "—".into()
        } else {
            rounds.join(", ")
        },
        mean_rate(runs, key),
        mean_rate(runs, 'a'),
        mean_rate(runs, key) / mean_rate(runs, 'a').max(1e-9)
    )
}

/// The columns every closed-loop run of the two phases shares.
pub(crate) fn ab_row(x: &AbRun, base: f64) -> String {
    let wall = x.cpu.wall.max(1e-9);
    let waits: Vec<String> = x
        .waits
        .iter()
        .filter(|(_, n)| *n >= 0.05)
        .take(3)
        .map(|(what, n)| format!("{what} {n:.1}"))
        .collect();
    format!(
        "{} #{} | {:.0} | {:.2}× | {:.2} / {:.2} / {:.2} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {}",
        x.case,
        x.round + 1,
        x.per_s(),
        x.per_s() / base.max(1e-9),
        x.lat.p50,
        x.lat.p90,
        x.lat.p99,
        x.errors,
        if x.consistent() {
            format!("yes ({} + {} refused)", x.all_sent, x.refused_db)
        } else {
            format!(
                "**no**: {} stored, {} answered; {} refusals counted, {} refused answers",
                x.all_sent, x.ok_total, x.refused_db, x.refused_total
            )
        },
        x.statements_per_send
            .map_or("—".into(), |n| format!("{n:.2}")),
        x.cpu_us(x.cpu.server),
        x.cpu_us(x.cpu.postgres),
        x.cpu_us(x.cpu.loadgen),
        x.cpu.other() / wall,
        waits.join(", ")
    )
}

pub(crate) const AB_COLUMNS: &str = "sends/s (DB) | × the mean (a) | send p50 / p90 / p99 ms | errors | stored = answered | statements per send | server µs/send | PostgreSQL µs/send | loadgen µs/send | other CPU (cores) | PostgreSQL backends by wait";
