//! `hot`: a popular inbox, the shape of a shared work queue. One recipient
//! written to by c/2 senders and polled by c/2 pollers at once (no pause
//! after an empty poll), in read mode and in lease mode (each poll that
//! returned messages followed by one `phone_ack`, or acknowledged by the
//! worker's next poll), at 1 and 3 replicas and
//! c = 16 and 64; each shape against pgbench running a script of the same
//! shape. Ratio = (sent + delivered)/s of the server ÷ the same of pgbench,
//! both counted in the database. After each run a drain empties the inbox
//! and every message is checked delivered exactly once (`once`). Then a
//! fixed rate at half the read mode's peak (`runs`).

mod once;
mod report;
mod runs;

use std::time::{Duration, Instant};

use super::{names_of, rate::RateRow, seeded_agents};
use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::HotMode;
use crate::mode::{CONCURRENCY, Mode, REPLICAS};
use crate::replicas::{QUOTAS_OUT_OF_REACH, start_replicas_env, stop_replicas, targets};
use crate::report::{Report, memory::MemRow};
use crate::stats::{self, CpuUse, Summary};
use once::HotOnce;
pub(crate) use report::{section, target_rows};
use runs::{hot_baseline, hot_rate, hot_run};

pub(crate) const DB_HOT: &str = "phone_bench_hot";
/// Senders of the popular inbox: half of the largest concurrency.
pub(crate) const HOT_SENDERS: usize = 32;
/// Recipients, one per run (server, pgbench, fixed rate), never reused.
pub(crate) const HOT_RECIPIENTS: usize = 24;
/// The lease mode's `lease_seconds`: longer than any run, so a message
/// handed out twice is a duplicate, not a lease that expired.
pub(crate) const HOT_LEASE_SECS: u32 = 60;
/// Connections of the popular inbox's fixed-rate run (as in `rate`).
pub(crate) const HOT_RATE_CONNECTIONS: usize = 64;
/// Longest the drain after a run may take.
pub(crate) const HOT_DRAIN_SECS: u64 = 30;

/// One popular-inbox run against the server.
pub(crate) struct HotRow {
    hot_mode: crate::load::HotMode,
    replicas: usize,
    concurrency: usize,
    secs: f64,
    /// From the database: messages to the recipient sent, and read (lease
    /// mode: acknowledged), inside the measured window.
    sent_db: i64,
    read_db: i64,
    sends_ok: u64,
    polls_ok: u64,
    acks_ok: u64,
    empty_polls: u64,
    messages_returned: u64,
    send: Summary,
    poll: Summary,
    ack: Summary,
    errors: String,
    error_count: u64,
    error_examples: Vec<String>,
    once: HotOnce,
    /// Statements the database ran per tool call, warm-up included.
    statements_per_call: Option<f64>,
    cpu: CpuUse,
    /// Messages/s of the pgbench run of the same shape (mode, clients).
    baseline: Option<f64>,
}

impl HotRow {
    fn messages_per_s(&self) -> f64 {
        (self.sent_db + self.read_db) as f64 / self.secs
    }
    fn calls_per_s(&self) -> f64 {
        (self.sends_ok + self.polls_ok + self.acks_ok) as f64 / self.secs
    }
    fn ratio(&self) -> f64 {
        match self.baseline {
            Some(b) if b > 0.0 => self.messages_per_s() / b,
            _ => 0.0,
        }
    }
    fn mode(&self) -> &'static str {
        self.hot_mode.describe()
    }
    fn lease(&self) -> bool {
        self.hot_mode.is_lease()
    }
}

/// The pgbench run of one popular-inbox shape.
pub(crate) struct HotBase {
    lease: bool,
    clients: usize,
    secs: f64,
    sent_db: i64,
    read_db: i64,
    tps: f64,
    failed: u64,
    latency_ms: f64,
    cpu: CpuUse,
}

impl HotBase {
    fn messages_per_s(&self) -> f64 {
        (self.sent_db + self.read_db) as f64 / self.secs
    }
}

/// The popular inbox: one recipient, written to by many senders and
/// polled by many pollers at once (read mode, then lease mode with one
/// `phone_ack` per poll, then with the acknowledgements in the next poll), at 1 and 3 replicas and 16 and 64 connections,
/// each shape against a pgbench run of the same shape on the same
/// database (at 1 replica, right before the server's run); then a fixed
/// rate at half the read mode's peak on 1 replica. Every run has a
/// recipient of its own, and after each server run a drain empties its
/// inbox so that exactly once can be checked against the database.
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    let phase_end = Instant::now() + mode.hot_allowance + Duration::from_secs(30);
    db::recreate_database(admin, DB_HOT).await?;
    let url = pg_url(opts, DB_HOT);
    let senders = seeded_agents('k', HOT_SENDERS);
    let recipients = seeded_agents('h', HOT_RECIPIENTS);
    let mut recipients = recipients.into_iter();
    let mut hdb: Option<tokio_postgres::Client> = None;
    let mut sender_base = 0;
    for &r in &REPLICAS {
        let replicas = start_replicas_env(
            opts,
            DB_HOT,
            r,
            opts.base_port + 40,
            &format!("hot-{r}r"),
            &QUOTAS_OUT_OF_REACH,
        )
        .await?;
        let tg = targets(&replicas);
        // The schema is the server's: seed once its migrations have run.
        let hdb = match &mut hdb {
            Some(c) => &*c,
            None => {
                let c = db::connect(&url).await?;
                db::seed_agents(&c, 'k', "hot", HOT_SENDERS as i64).await?;
                db::seed_agents(&c, 'h', "hot", HOT_RECIPIENTS as i64).await?;
                db::each(&c, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
                sender_base = db::consecutive_ids(&c, &names_of(&senders)).await?;
                &*hdb.insert(c)
            }
        };
        say!(t0, "hot: {r} replica(s) up");
        let mut peak = 0.0f64;
        let hot_modes = [
            HotMode::Read,
            HotMode::Lease {
                seconds: HOT_LEASE_SECS,
                ack_in_poll: false,
            },
            HotMode::Lease {
                seconds: HOT_LEASE_SECS,
                ack_in_poll: true,
            },
        ];
        for hot_mode in hot_modes {
            let lease = hot_mode.is_lease();
            for &c in &CONCURRENCY {
                let shape = format!(
                    "popular inbox, {} mode, {r} replica{}, c={c}",
                    hot_mode.describe(),
                    if r > 1 { "s" } else { "" }
                );
                if opts.quick && lease && r == 3 && c == 64 {
                    report.skipped.push(format!(
                        "{shape}: not run in quick mode (keeps the phase near {} s)",
                        mode.hot_allowance.as_secs()
                    ));
                    continue;
                }
                if Instant::now() >= phase_end {
                    report
                        .skipped
                        .push(format!("{shape}: the phase's time ran out"));
                    continue;
                }
                let lease_secs = lease.then_some(HOT_LEASE_SECS);
                // One pgbench run per mode of the database: both ways of
                // acknowledging are compared with the same raw SQL.
                let measured = report
                    .hot_base
                    .iter()
                    .any(|b| b.lease == lease && b.clients == c);
                if r == 1 && !measured {
                    let recipient = recipients.next().ok_or("out of hot recipients")?;
                    let hot = db::ids_by_name(hdb, std::slice::from_ref(&recipient.name)).await?[0];
                    let base = hot_baseline(
                        opts,
                        mode,
                        hdb,
                        admin,
                        postmaster,
                        hz,
                        (hot, sender_base),
                        lease_secs,
                        c,
                    )
                    .await?;
                    say!(
                        t0,
                        "hot pgbench {} c={c}: sent {:.0}/s read {:.0}/s ({:.0} tps, {} failed)",
                        if lease { "lease" } else { "read" },
                        base.sent_db as f64 / base.secs,
                        base.read_db as f64 / base.secs,
                        base.tps,
                        base.failed
                    );
                    report.hot_base.push(base);
                }
                let recipient = recipients.next().ok_or("out of hot recipients")?;
                let mut row = hot_run(
                    mode,
                    hdb,
                    admin,
                    &replicas,
                    &tg,
                    postmaster,
                    hz,
                    (&senders, &recipient),
                    hot_mode,
                    r,
                    c,
                )
                .await?;
                row.baseline = report
                    .hot_base
                    .iter()
                    .find(|b| b.lease == lease && b.clients == c)
                    .map(HotBase::messages_per_s);
                say!(
                    t0,
                    "hot {} r={r} c={c}: sent {:.0}/s delivered {:.0}/s, send p99 {:.1} ms, poll p99 {:.1} ms, errors {}; {:.2}x the baseline; {}",
                    row.mode(),
                    row.sent_db as f64 / row.secs,
                    row.read_db as f64 / row.secs,
                    row.send.p99,
                    row.poll.p99,
                    row.errors,
                    row.ratio(),
                    row.once.describe()
                );
                if !lease {
                    peak = peak.max(row.calls_per_s());
                }
                report.hot.push(row);
            }
        }
        if r == 1 && peak > 0.0 && Instant::now() < phase_end {
            let recipient = recipients.next().ok_or("out of hot recipients")?;
            let row = hot_rate(
                mode, hdb, admin, &replicas, &tg, postmaster, hz, &senders, &recipient, peak,
            )
            .await?;
            say!(
                t0,
                "hot fixed rate r=1: {:.0} calls/s (half of {peak:.0}): p50 {:.2} ms p99 {:.2} ms, errors {}",
                row.rate,
                row.all.p50,
                row.all.p99,
                row.errors
            );
            report.hot_rate = Some(row);
        }
        for rep in &replicas {
            report.mem.push(MemRow {
                role: rep.role.clone(),
                idle: rep.idle,
                loaded: stats::mem(rep.pid).unwrap_or_default(),
                phase: "popular inbox, read and lease, c=16,64".into(),
            });
        }
        stop_replicas(replicas).await;
    }
    Ok(())
}
