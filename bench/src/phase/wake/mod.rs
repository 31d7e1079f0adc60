//! `wake`: long polls (`phone_inbox {wait_seconds}`) on 3 replicas. How soon
//! a waiting poll answers a send made through another replica (one pair,
//! 16 pairs, 1,000 waiting agents; every message checked delivered exactly
//! once), whether sends racing a poll's registration are missed, the send
//! rate to agents nobody waits for (alone, beside 1,000 waiters) and to
//! agents that wait and re-arm, and what 1,000 waiting agents cost the
//! database and the server against an idle window (the README's "a
//! waiting agent costs no queries").

mod channel;
mod ctx;
mod pairs;
mod rearming;
mod report;
mod rows;
mod swarm;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::{names_of, seeded_agents};
use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::long_poll;
use crate::mode::Mode;
use crate::replicas::{QUOTAS_OUT_OF_REACH, start_replicas_env, stop_replicas, targets};
use crate::report::Report;
use crate::stats;
use channel::wake_channel;
use ctx::WakeCtx;
use pairs::wake_pairs;
use rearming::wake_rearming;
pub(crate) use report::{section, target_rows};
use rows::{Once, QuietRow, RaceResult, SendRateRow, WakeLatRow};
use swarm::wake_swarm;

const DB_WAKE: &str = "phone_bench_wake";
const WAKE_REPLICAS: usize = 3;
/// Wake-up pairs, closed-loop senders, passive and re-arming recipients.
const WAKE_PAIRS: usize = 16;
/// Agents in long polls at once for the database-load and send-rate tests.
const WAKE_SWARM: usize = 1000;
/// The pairs' `wait_seconds`: a missed wake-up shows as a 10 s sample.
const WAKE_PAIR_WAIT: u64 = 10;
/// The swarm's `wait_seconds`: the server's maximum.
const WAKE_SWARM_WAIT: u64 = 25;
/// After a pair's waiter row appears, before the send: the poll's own
/// re-check (one statement) is then over and it sleeps on its wake-up.
const WAKE_GRACE: Duration = Duration::from_millis(3);
/// Racing pairs: the send goes out at a random moment this soon after the
/// poll, so it may land while the poll registers; their wait is short, as a
/// missed wake-up costs the whole of it.
const RACE_WITHIN: Duration = Duration::from_millis(15);
const RACE_WAIT: u64 = 1;
/// The re-arming waiters' `wait_seconds`: woken every few milliseconds
/// while the sends run, so it only bounds a missed last wake-up.
const REARM_WAIT: u64 = 5;
/// One swarm poll goes out every so often: 1,000 in 2 s.
const WAKE_ARM_EVERY: Duration = Duration::from_millis(2);
/// The server's notification channel (`CHANNEL` in src/store/wakeup.rs).
const MAIL_CHANNEL: &str = "phone_mail";

#[derive(Default)]
pub(crate) struct WakeReport {
    latency: Vec<WakeLatRow>,
    race: Option<RaceResult>,
    rates: Vec<SendRateRow>,
    quiet: Vec<QuietRow>,
    /// The swarm: connections opened, seconds from the first poll to all
    /// rows seen, polls that ended with their message, that timed out, errors.
    swarm_opened: usize,
    swarm_armed_secs: f64,
    swarm_with_message: usize,
    swarm_timed_out: usize,
    swarm_errors: String,
    /// VmRSS summed over the replicas once the swarm's connections closed.
    rss_after_swarm_kb: u64,
}

/// The phase, unless this process may not hold the swarm's connections.
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    // The swarm holds 1,000 client connections in this one process.
    match stats::open_files_limit() {
        Some(n) if n < WAKE_SWARM as u64 + 256 => report.skipped.push(format!(
            "long polls: {WAKE_SWARM} waiting agents need ~{} open files here, the limit is {n} (raise it: ulimit -n)",
            WAKE_SWARM + 256
        )),
        _ => wake_phase(opts, mode, admin, report, t0, postmaster, hz).await?,
    }
    Ok(())
}

/// Long polls (issue 7): wake-up latency across replicas, send rates with
/// and without waiters, and what 1,000 waiting agents cost the database.
/// Order: idle baseline, the swarm of waiters (load window, sends beside
/// it, one message each), sends without waiters, sends to re-arming
/// waiters, the wake-up pairs. The quiet windows come first, before any
/// message exists, so no autovacuum of `messages` lands in them.
async fn wake_phase(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    db::recreate_database(admin, DB_WAKE).await?;
    let replicas = start_replicas_env(
        opts,
        DB_WAKE,
        WAKE_REPLICAS,
        opts.base_port + 30,
        "wake",
        &QUOTAS_OUT_OF_REACH,
    )
    .await?;
    let url = pg_url(opts, DB_WAKE);
    let wdb = db::connect(&url).await?;
    // s: senders; p: the pairs' waiters; q: recipients nobody waits for;
    // r: re-arming waiters; w: the swarm.
    for (prefix, n) in [
        ('s', WAKE_PAIRS),
        ('p', 2 * WAKE_PAIRS + 1),
        ('q', WAKE_PAIRS),
        ('r', WAKE_PAIRS),
        ('w', WAKE_SWARM),
        ('c', 1),
    ] {
        db::seed_agents(&wdb, prefix, "wake", n as i64).await?;
    }
    db::each(&wdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
    let swarm = seeded_agents('w', WAKE_SWARM);
    let ctx = WakeCtx {
        mode,
        admin,
        tg: targets(&replicas),
        rows: Arc::new(db::WaiterRows::connect(&url).await?),
        notifications: db::NotifyCounter::listen(&url, MAIL_CHANNEL).await?,
        swarm_ids: db::ids_by_name(&wdb, &names_of(&swarm)).await?,
        wdb,
        replicas,
        senders: seeded_agents('s', WAKE_PAIRS),
        postmaster,
        hz,
    };
    say!(
        t0,
        "wake: {WAKE_REPLICAS} replicas up, {} agents seeded",
        5 * WAKE_PAIRS + 1 + WAKE_SWARM
    );
    let mut w = WakeReport::default();

    // Idle baseline: replicas up and idle (since their start-up 1 s or
    // more ago), nobody waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = ctx.quiet_window("idle: nobody waiting".into()).await;
    say!(
        t0,
        "wake: idle {:.1} statements/s, PostgreSQL {:.3} cores",
        idle.statements_per_s(),
        idle.cores(idle.cpu.postgres)
    );
    w.quiet.push(idle);

    let passive = names_of(&seeded_agents('q', WAKE_PAIRS));
    let with_swarm = wake_swarm(&ctx, &swarm, &passive, &mut w, report, t0).await?;
    let alone = ctx
        .send_rate("(a) to agents nobody waits for, nobody waiting", &passive)
        .await?;
    let waking = wake_rearming(&ctx, &seeded_agents('r', WAKE_PAIRS)).await?;
    for row in [&alone, &with_swarm, &waking] {
        say!(
            t0,
            "wake: {}: {:.0} sends/s (DB), errors {}",
            row.case,
            row.per_s(),
            row.errors
        );
    }
    w.rates = vec![alone, with_swarm, waking];

    // Wake-up pairs: one alone (the path's own latency), then
    // WAKE_PAIRS at once; each pair has a waiter of its own.
    let waiters = seeded_agents('p', 2 * WAKE_PAIRS + 1);
    let waiting = long_poll::SendWhen::Waiting { grace: WAKE_GRACE };
    let mut pair_rows = Vec::new();
    for (waiters, rounds) in [
        (&waiters[2 * WAKE_PAIRS..], mode.wake_rounds * 4),
        (&waiters[..WAKE_PAIRS], mode.wake_rounds),
    ] {
        let (row, _) = wake_pairs(&ctx, waiters, rounds, WAKE_PAIR_WAIT, waiting).await?;
        say!(
            t0,
            "wake: {}: {} samples, p50 {:.2} ms p99 {:.2} ms from the send; {}; errors {}",
            row.short,
            row.from_send.count,
            row.from_send.p50,
            row.from_send.p99,
            row.once.describe(),
            row.errors
        );
        pair_rows.push(row);
    }
    w.latency.splice(0..0, pair_rows);

    // The same wake-up through `phone channel`, as an idle Claude Code
    // session hears it.
    let channel_waiter = seeded_agents('c', 1).remove(0);
    match wake_channel(&ctx, &channel_waiter, mode.wake_rounds / 2).await {
        Ok(row) => {
            say!(
                t0,
                "wake: {}: {} samples, p50 {:.2} ms p99 {:.2} ms from the send; {}; errors {}",
                row.short,
                row.from_send.count,
                row.from_send.p50,
                row.from_send.p99,
                row.once.describe(),
                row.errors
            );
            w.latency.push(row);
        }
        Err(e) => report
            .skipped
            .push(format!("wake-up through phone channel: {e}")),
    }

    // Racing pairs: sends that may land while the poll registers.
    let racing = long_poll::SendWhen::Racing {
        within: RACE_WITHIN,
    };
    let racers = &waiters[WAKE_PAIRS..2 * WAKE_PAIRS];
    let (row, out) = wake_pairs(&ctx, racers, mode.wake_rounds / 4, RACE_WAIT, racing).await?;
    say!(
        t0,
        "wake: racing sends: {} of {} long polls missed their wake-up; {}; errors {}",
        out.missed_wakeups,
        out.long_polls,
        row.once.describe(),
        row.errors
    );
    w.race = Some(RaceResult {
        long_polls: out.long_polls,
        missed: out.missed_wakeups,
        stored_by: out.missed_stored_by,
        once: row.once,
        errors: row.errors,
    });

    report.wake = Some(w);
    stop_replicas(ctx.replicas).await;
    Ok(())
}
