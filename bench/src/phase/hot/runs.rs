//! The runs of the popular inbox: the pgbench baseline of one shape, one
//! closed-loop run against the server (then its drain and the exactly-once
//! check), and the fixed rate.

use std::{path::Path, sync::Arc, time::Duration};

use super::{
    DB_HOT, HOT_DRAIN_SECS, HOT_RATE_CONNECTIONS, HOT_SENDERS, HotBase, HotOnce, HotRow, RateRow,
};
use crate::cli::Opts;
use crate::db;
use crate::load::{self, Agent};
use crate::mcp::Target;
use crate::mode::Mode;
use crate::replicas::{Replica, pids};
use crate::window::sample_window;

/// The pgbench run of one popular-inbox shape (`db::hot_script`), counted
/// from the database over the same window as the server's runs: pgbench
/// runs warm-up + measured seconds, and the window starts a warm-up after
/// it was started (its clients are connected by then).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn hot_baseline(
    opts: &Opts,
    mode: &Mode,
    hdb: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    postmaster: u32,
    hz: f64,
    (hot, sender_base): (i64, i64),
    lease: Option<u32>,
    clients: usize,
) -> Result<HotBase, String> {
    db::settle(hdb).await?;
    db::each(hdb, &["CHECKPOINT"]).await?;
    let secs = (mode.hot_warmup + mode.hot_measure).as_secs();
    let script = Path::new("data/bench").join(format!(
        "hot-{}-c{clients}.pgbench",
        if lease.is_some() { "lease" } else { "read" }
    ));
    let wall0 = chrono::Utc::now();
    let start = tokio::time::Instant::now();
    let child = db::pgbench_hot_start(
        &opts.pg_bin,
        "127.0.0.1",
        opts.pg_port,
        DB_HOT,
        hot,
        sender_base,
        (clients / 2).min(HOT_SENDERS),
        lease,
        clients,
        secs,
        &script,
    )?;
    let pid = child.id().unwrap_or(0);
    let (cpu, _) = sample_window(
        admin,
        DB_HOT,
        &[],
        postmaster,
        &[pid],
        start + mode.hot_warmup,
        start + mode.hot_warmup + mode.hot_measure,
        hz,
    )
    .await;
    let pg = db::pgbench_finish(child, secs).await?;
    let from = wall0 + chrono::Duration::from_std(mode.hot_warmup).unwrap();
    let to = from + chrono::Duration::from_std(mode.hot_measure).unwrap();
    let (sent_db, read_db) = db::count_inbox_window(hdb, hot, from, to).await?;
    Ok(HotBase {
        lease: lease.is_some(),
        clients,
        secs: mode.hot_measure.as_secs_f64(),
        sent_db,
        read_db,
        tps: pg.tps,
        failed: pg.failed,
        latency_ms: pg.latency_ms,
        cpu,
    })
}

/// One popular-inbox run against the server, then the drain and the
/// exactly-once check.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn hot_run(
    mode: &Mode,
    hdb: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    replicas: &[Replica],
    tg: &[Target],
    postmaster: u32,
    hz: f64,
    (senders, recipient): (&[Agent], &Agent),
    hot_mode: load::HotMode,
    r: usize,
    c: usize,
) -> Result<HotRow, String> {
    let hot = db::ids_by_name(hdb, std::slice::from_ref(&recipient.name)).await?[0];
    let lease = match hot_mode {
        load::HotMode::Lease { seconds, .. } => Some(seconds),
        load::HotMode::Read => None,
    };
    db::settle(hdb).await?;
    db::each(hdb, &["CHECKPOINT"]).await?;
    let pgss = db::statements_reset(admin).await.is_ok();
    let server_pids = pids(replicas);
    let start = tokio::time::Instant::now();
    let wall0 = chrono::Utc::now();
    let (mut out, (cpu, _)) = tokio::join!(
        load::hot(
            tg,
            &senders[..(c / 2).min(senders.len())],
            recipient,
            c,
            hot_mode,
            start,
            mode.hot_warmup,
            mode.hot_measure
        ),
        sample_window(
            admin,
            DB_HOT,
            &server_pids,
            postmaster,
            &[],
            start + mode.hot_warmup,
            start + mode.hot_warmup + mode.hot_measure,
            hz
        ),
    );
    let statements_per_call = if pgss {
        db::statements(admin, DB_HOT).await.ok().map(|xs| {
            xs.iter().map(|x| x.calls).sum::<i64>() as f64 / out.calls_total.max(1) as f64
        })
    } else {
        None
    };
    let from = wall0 + chrono::Duration::from_std(mode.hot_warmup).unwrap();
    let to = from + chrono::Duration::from_std(mode.hot_measure).unwrap();
    let (sent_db, read_db) = db::count_inbox_window(hdb, hot, from, to).await?;
    // What the load's errors were, before the drain adds its own.
    let (errors, error_count) = (out.errors.describe(), out.errors.total());
    let error_examples = out.errors.examples.clone();
    let drained = load::drain(
        &tg[0],
        recipient,
        hot_mode,
        tokio::time::Instant::now() + Duration::from_secs(HOT_DRAIN_SECS),
        &mut out,
    )
    .await;
    let rows = db::inbox_rows(hdb, hot).await?;
    let once = HotOnce::check(lease, &out, &rows, drained);
    let drain_errors = out.errors.total() - error_count;
    let (errors, error_count) = if drain_errors > 0 {
        (
            format!(
                "{} + {drain_errors} in the drain ({})",
                errors,
                out.errors.describe()
            ),
            error_count + drain_errors,
        )
    } else {
        (errors, error_count)
    };
    Ok(HotRow {
        hot_mode,
        replicas: r,
        concurrency: c,
        secs: mode.hot_measure.as_secs_f64(),
        sent_db,
        read_db,
        sends_ok: out.sends_ok,
        polls_ok: out.polls_ok,
        acks_ok: out.acks_ok,
        empty_polls: out.empty_polls,
        messages_returned: out.messages_returned,
        send: out.send.summary(),
        poll: out.poll.summary(),
        ack: out.ack.summary(),
        errors,
        error_count,
        error_examples,
        once,
        statements_per_call,
        cpu,
        baseline: None,
    })
}

/// Open loop at half the read mode's peak (calls/s): requests alternate a
/// send (the senders in turn) to the popular recipient and a read-mode
/// poll of its inbox.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn hot_rate(
    mode: &Mode,
    hdb: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    replicas: &[Replica],
    tg: &[Target],
    postmaster: u32,
    hz: f64,
    senders: &[Agent],
    recipient: &Agent,
    peak: f64,
) -> Result<RateRow, String> {
    let rate = (peak / 2.0).max(10.0);
    db::settle(hdb).await?;
    db::each(hdb, &["CHECKPOINT"]).await?;
    let tokens: Vec<Arc<str>> = senders
        .iter()
        .map(|a| Arc::from(a.token.as_str()))
        .collect();
    let me: Arc<str> = Arc::from(recipient.token.as_str());
    let send_args = serde_json::json!({"to": recipient.name, "body": load::BODY});
    let poll_args = load::HotMode::Read.poll_args(10);
    let plan: load::Plan = Arc::new(move |n| {
        let poll = n % 2 == 1;
        load::Planned {
            poll,
            args: if poll {
                poll_args.clone()
            } else {
                send_args.clone()
            },
            token: if poll {
                me.clone()
            } else {
                tokens[((n / 2) as usize) % tokens.len()].clone()
            },
        }
    });
    let server_pids = pids(replicas);
    let now = tokio::time::Instant::now();
    let (out, (cpu, _)) = tokio::join!(
        load::open_loop_plan(
            tg,
            plan,
            rate,
            mode.hot_warmup,
            mode.hot_measure,
            HOT_RATE_CONNECTIONS
        ),
        sample_window(
            admin,
            DB_HOT,
            &server_pids,
            postmaster,
            &[],
            now + mode.hot_warmup,
            now + mode.hot_warmup + mode.hot_measure,
            hz
        ),
    );
    Ok(RateRow {
        replicas: replicas.len(),
        peak_calls: peak,
        rate,
        achieved: out.completed as f64 / out.measured_secs,
        send: out.send.summary(),
        inbox: out.inbox.summary(),
        all: out.all.summary(),
        service: out.service.summary(),
        lag: out.dispatch_lag.summary(),
        errors: out.errors.describe(),
        error_count: out.errors.total(),
        other_cores: cpu.other() / cpu.wall.max(1e-9),
    })
}
