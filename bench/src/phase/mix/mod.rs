//! `mix`: pairs of agents, each sending to its partner and polling its own
//! inbox (sends and polls 1:1), closed loop at 16 and 64 connections, on 1
//! and 3 replicas; each shape against `pgbench` running the same two
//! statements on the same database right after. Ratio = server sends/s ÷
//! pgbench transactions/s, both counted in the database. At 1 replica it
//! also prices the server's fixed cost per request without the database (a
//! JSON-RPC ping, a tool call rejected by validation). With `rate`, each
//! replica count then runs the fixed-rate phase on the same replicas.

mod report;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use super::rate;
use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::{self, Agent};
use crate::mcp::Target;
use crate::mode::{CONCURRENCY, Mode, REPLICAS};
use crate::replicas::{
    QUOTAS_OUT_OF_REACH, Replica, pids, start_replicas_env, stop_replicas, targets,
};
use crate::report::{Report, memory::MemRow};
use crate::stats::{self, CpuUse, Summary};
use crate::window::sample_window;
pub(crate) use report::{section, target_rows};

pub(crate) const DB_MIX: &str = "phone_bench";

pub(crate) struct MixRow {
    pub(crate) replicas: usize,
    concurrency: usize,
    secs: f64,
    sent_db: i64,
    read_db: i64,
    sends_ok: u64,
    polls_ok: u64,
    send: Summary,
    inbox: Summary,
    errors: String,
    error_count: u64,
    error_examples: Vec<String>,
    /// CPU and counters over the measured window only.
    cpu: CpuUse,
    window_calls: u64,
    commits: i64,
    wal_syncs: i64,
    pgbench_tps: f64,
    pgbench_failed: u64,
    pgbench_latency_ms: f64,
    pgbench_rows: i64,
    pgbench_cpu: CpuUse,
    pgbench_commits: i64,
    pgbench_wal_syncs: i64,
    /// pg_stat_statements over the whole mix (warm-up included) and over pgbench.
    statements: Vec<db::StmtStat>,
    calls_total: u64,
    pgbench_statements: Vec<db::StmtStat>,
}

impl MixRow {
    fn sent_per_s(&self) -> f64 {
        self.sent_db as f64 / self.secs
    }
    fn read_per_s(&self) -> f64 {
        self.read_db as f64 / self.secs
    }
    pub(crate) fn calls_per_s(&self) -> f64 {
        (self.sends_ok + self.polls_ok) as f64 / self.secs
    }
    fn ratio(&self) -> f64 {
        if self.pgbench_tps > 0.0 {
            self.sent_per_s() / self.pgbench_tps
        } else {
            0.0
        }
    }
}

pub(crate) struct NoDbRow {
    what: &'static str,
    per_s: f64,
    lat: Summary,
    server_us: f64,
    errors: String,
}

/// Both replica counts, each with its own replicas: the no-database
/// requests (1 replica), the mix at each concurrency, then (`with_rate`)
/// the fixed rate at half of the best calls/s.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
    with_rate: bool,
) -> Result<(), String> {
    db::recreate_database(admin, DB_MIX).await?;
    let bench_db = db::connect(&pg_url(opts, DB_MIX)).await?;
    for &r in &REPLICAS {
        let replicas = start_replicas_env(
            opts,
            DB_MIX,
            r,
            opts.base_port,
            &format!("mix-{r}r"),
            &QUOTAS_OUT_OF_REACH,
        )
        .await?;
        let tg = targets(&replicas);
        say!(
            t0,
            "{r} replica(s) up on ports {:?}",
            replicas.iter().map(|x| x.port).collect::<Vec<_>>()
        );
        let mut peak = 0.0f64;
        let mut last_agents: Vec<Agent> = Vec::new();
        if r == 1 {
            let nodb_secs = mode.measure / 3;
            for (what, label) in [
                (load::NoDb::Ping, "JSON-RPC ping"),
                (
                    load::NoDb::InvalidToolCall,
                    "tools/call rejected by validation",
                ),
            ] {
                let start = tokio::time::Instant::now();
                let server_pids = pids(&replicas);
                let ((lat, errors), (cpu, _)) = tokio::join!(
                    load::no_db(&tg, 16, what, start, mode.warmup, nodb_secs),
                    sample_window(
                        admin,
                        DB_MIX,
                        &server_pids,
                        postmaster,
                        &[],
                        start + mode.warmup,
                        start + mode.warmup + nodb_secs,
                        hz
                    ),
                );
                let n = lat.len().max(1) as f64;
                let row = NoDbRow {
                    what: label,
                    per_s: lat.len() as f64 / nodb_secs.as_secs_f64(),
                    lat: lat.summary(),
                    server_us: cpu.server / n * 1e6,
                    errors: errors.describe(),
                };
                say!(
                    t0,
                    "no-db {label}: {:.0}/s, server {:.0} µs CPU each",
                    row.per_s,
                    row.server_us
                );
                report.no_db.push(row);
            }
        }
        for &c in &CONCURRENCY {
            let row = mix_phase(
                opts,
                mode,
                &bench_db,
                admin,
                &replicas,
                &tg,
                r,
                c,
                postmaster,
                hz,
                &mut last_agents,
            )
            .await?;
            say!(
                t0,
                "mix r={r} c={c}: sent {:.0}/s read {:.0}/s, send p99 {:.1} ms, inbox p99 {:.1} ms, errors {}; pgbench {:.0} tps -> {:.2}x",
                row.sent_per_s(),
                row.read_per_s(),
                row.send.p99,
                row.inbox.p99,
                row.errors,
                row.pgbench_tps,
                row.ratio()
            );
            peak = peak.max(row.calls_per_s());
            report.mix.push(row);
        }
        if with_rate && peak > 0.0 {
            let row = rate::run(
                mode,
                &bench_db,
                admin,
                &replicas,
                &tg,
                &last_agents,
                (r, peak),
                postmaster,
                hz,
                t0,
            )
            .await?;
            report.rate.push(row);
        }
        for rep in &replicas {
            report.mem.push(MemRow {
                role: rep.role.clone(),
                idle: rep.idle,
                loaded: stats::mem(rep.pid).unwrap_or_default(),
                phase: "send+poll mix c=16,64 + fixed rate".into(),
            });
        }
        stop_replicas(replicas).await;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn mix_phase(
    opts: &Opts,
    mode: &Mode,
    bench_db: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    replicas: &[Replica],
    tg: &[Target],
    r: usize,
    c: usize,
    postmaster: u32,
    hz: f64,
    last_agents: &mut Vec<Agent>,
) -> Result<MixRow, String> {
    let names: Vec<String> = (0..c).map(|i| format!("mix-r{r}-c{c}-{i:03}")).collect();
    let agents = load::register(&tg[0], &names, "bench").await?;
    let base = db::consecutive_ids(bench_db, &names).await?;
    // Both runs start alike: the last run's dead row versions vacuumed
    // away (left behind, they cost the next run's polls heap visits) and
    // statistics up to date, rather than autovacuum landing in the middle
    // of one of them.
    db::settle(bench_db).await?;
    let server_pids = pids(replicas);

    // CPU and database counters are read inside the measured window, while
    // the load runs: pg_stat_* lag up to a second behind a busy backend and
    // much longer behind one that went idle, so end-of-run readings are low.
    let _ = bench_db.batch_execute("CHECKPOINT").await;
    let pgss = db::statements_reset(admin).await.is_ok();
    let start = tokio::time::Instant::now();
    let wall0 = chrono::Utc::now();
    let profiler = profile(r, c, mode, &server_pids, postmaster);
    let (out, (cpu, window_counters)) = tokio::join!(
        load::mix(tg, &agents, start, mode.warmup, mode.measure),
        sample_window(
            admin,
            DB_MIX,
            &server_pids,
            postmaster,
            &[],
            start + mode.warmup,
            start + mode.warmup + mode.measure,
            hz
        ),
    );
    if let Some(mut child) = profiler {
        let _ = child.wait().await;
    }
    let from = wall0 + chrono::Duration::from_std(mode.warmup).unwrap();
    let to = from + chrono::Duration::from_std(mode.measure).unwrap();
    let statements = if pgss {
        db::statements(admin, DB_MIX).await.unwrap_or_default()
    } else {
        Vec::new()
    };
    let (sent_db, read_db) = db::count_window(bench_db, &names, from, to).await?;

    db::settle(bench_db).await?;
    let _ = bench_db.batch_execute("CHECKPOINT").await;
    if pgss {
        let _ = db::statements_reset(admin).await;
    }
    let script = Path::new("data/bench").join(format!("mix-c{c}.pgbench"));
    let pg_from = chrono::Utc::now();
    let child = db::pgbench_start(
        &opts.pg_bin,
        "127.0.0.1",
        opts.pg_port,
        DB_MIX,
        base,
        c,
        mode.pgbench_secs,
        &script,
    )?;
    let pgbench_pid = child.id().unwrap_or(0);
    let pstart = tokio::time::Instant::now();
    let (pgbench_cpu, pgbench_counters) = sample_window(
        admin,
        DB_MIX,
        &[],
        postmaster,
        &[pgbench_pid],
        pstart + Duration::from_millis((mode.pgbench_secs * 250).min(1000)),
        pstart + Duration::from_millis(mode.pgbench_secs * 1000 - 500),
        hz,
    )
    .await;
    let pg = db::pgbench_finish(child, mode.pgbench_secs).await?;
    let pgbench_statements = if pgss {
        db::statements(admin, DB_MIX).await.unwrap_or_default()
    } else {
        Vec::new()
    };
    let pg_to = chrono::Utc::now();
    let (pgbench_rows, _) = db::count_window(bench_db, &names, pg_from, pg_to).await?;

    *last_agents = agents;
    Ok(MixRow {
        replicas: r,
        concurrency: c,
        secs: mode.measure.as_secs_f64(),
        sent_db,
        read_db,
        sends_ok: out.sends_ok,
        polls_ok: out.polls_ok,
        send: out.send.summary(),
        inbox: out.inbox.summary(),
        errors: out.errors.describe(),
        error_count: out.errors.total(),
        error_examples: out.errors.examples.clone(),
        cpu,
        window_calls: out.sends_ok + out.polls_ok + out.errors.total(),
        commits: window_counters.commits,
        wal_syncs: window_counters.wal_syncs,
        pgbench_tps: pg.tps,
        pgbench_failed: pg.failed,
        pgbench_latency_ms: pg.latency_ms,
        pgbench_rows,
        pgbench_cpu,
        pgbench_commits: pgbench_counters.commits,
        pgbench_wal_syncs: pgbench_counters.wal_syncs,
        statements,
        calls_total: out.calls_total,
        pgbench_statements,
    })
}

/// `bench/profile.sh` (PHONE_BENCH_PROFILE=DIR): `perf record` of the
/// replica and of the bench cluster's processes (not the rest of a shared
/// machine) over the measured window of the 1-replica, c=16 mix: flat at
/// 4,999 Hz into DIR/mix-r1-c16.flat.data (self time per symbol), and
/// with DWARF call graphs at 199 Hz into DIR/mix-r1-c16.perf.data (time
/// including callees: the binary has no frame pointers); the pids go to
/// DIR/mix-r1-c16.pids (`server` and `postgres` lines) for `perf report
/// --pid`. Started after the warm-up by a shell `sleep`, so the
/// generator's own timing is not disturbed (perf's sampling costs the
/// machine a few percent: a profiled run's ratios are not the headline
/// ones).
fn profile(
    r: usize,
    c: usize,
    mode: &Mode,
    server_pids: &[u32],
    postmaster: u32,
) -> Option<tokio::process::Child> {
    let dir = std::env::var("PHONE_BENCH_PROFILE").ok()?;
    if r != 1 || c != 16 {
        return None;
    }
    // The cluster's processes (the postmaster's children, listed when the
    // window starts: a pid gone by then would make perf refuse them all).
    let server = server_pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let base = Path::new(&dir).join(format!("mix-r{r}-c{c}"));
    let script = format!(
        "sleep {:.3}; pg=$(pgrep -d, -P {postmaster}); \
         printf 'server {server}\\npostgres %s\\n' \"$pg\" > {pids}; \
         perf record -q -F 4999 -p {server},$pg -o {flat} -- sleep {secs:.3} & \
         perf record -q --call-graph dwarf,16384 -F 199 -p {server},$pg -o {graph} -- sleep {secs:.3}; \
         wait",
        mode.warmup.as_secs_f64(),
        secs = mode.measure.as_secs_f64(),
        pids = base.with_extension("pids").display(),
        flat = base.with_extension("flat.data").display(),
        graph = base.with_extension("perf.data").display(),
    );
    tokio::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()
}
