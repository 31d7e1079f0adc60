//! phone-bench: the load generator and benchmark driver behind `make bench`.
//!
//! It expects a running PostgreSQL (bench/run.sh starts one) and the release
//! `phone` binary next to itself. It starts the replicas, drives `/mcp` over
//! HTTP/1.1 keep-alive with real MCP requests, runs the raw-SQL baselines,
//! and writes a Markdown report.
//!
//!   phone-bench run [--quick] [--pg-port 25432] [--pg-dir data/bench-pg]
//!                   [--out bench/RESULTS.md] [--command "make bench"]
//!                   [--pool-size 16] [--base-port 3101] [--only mix,rate,search,growth,fsync]

#[path = "phone-bench/db.rs"]
mod db;
#[path = "phone-bench/load.rs"]
mod load;
#[path = "phone-bench/mcp.rs"]
mod mcp;
#[path = "phone-bench/stats.rs"]
mod stats;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    time::{Duration, Instant},
};

use load::{Agent, SearchQuery};
use mcp::Target;
use stats::{CpuProbe, CpuUse, Mem, Summary};

struct Opts {
    quick: bool,
    pg_port: u16,
    pg_dir: PathBuf,
    pg_bin: PathBuf,
    out: PathBuf,
    command: String,
    pool_size: usize,
    base_port: u16,
    only: Option<BTreeSet<String>>,
}

struct Mode {
    name: &'static str,
    warmup: Duration,
    measure: Duration,
    pgbench_secs: u64,
    search_sizes: Vec<i64>,
    search_secs: Duration,
    growth_small: i64,
    growth_large: i64,
    budget: Duration,
}

impl Mode {
    fn new(quick: bool) -> Self {
        if quick {
            Mode {
                name: "quick",
                warmup: Duration::from_millis(700),
                measure: Duration::from_secs(3),
                pgbench_secs: 3,
                search_sizes: vec![10_000, 100_000],
                search_secs: Duration::from_millis(1000),
                growth_small: 10_000,
                growth_large: 1_000_000,
                budget: Duration::from_secs(115),
            }
        } else {
            Mode {
                name: "full",
                warmup: Duration::from_secs(2),
                measure: Duration::from_secs(10),
                pgbench_secs: 10,
                search_sizes: vec![10_000, 100_000, 1_000_000],
                search_secs: Duration::from_secs(2),
                growth_small: 10_000,
                growth_large: 10_000_000,
                budget: Duration::from_secs(570),
            }
        }
    }
}

const CONCURRENCY: [usize; 2] = [16, 64];
const REPLICAS: [usize; 2] = [1, 3];
const SEARCH_WORKERS: usize = 2;
const GROWTH_AGENTS: i64 = 1000;
const GROWTH_MEASURED: usize = 16;
const DB_MIX: &str = "phone_bench";
const DB_SEARCH: &str = "phone_bench_search";
const DB_GROWTH: &str = "phone_bench_growth";

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("phone-bench: {e}");
            eprintln!(
                "usage: phone-bench run [--quick] [--pg-port N] [--pg-dir DIR] [--out FILE] [--command TEXT] [--pool-size N] [--base-port N] [--only LIST]"
            );
            return ExitCode::from(2);
        }
    };
    // One worker thread: the generator should take as little of the two
    // cores as possible from the server and Postgres it measures.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // On SIGTERM (bench/run.sh's timeout) or Ctrl-C the run future is
    // dropped, and with it the replicas and pgbench (kill_on_drop).
    let outcome = rt.block_on(async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => return Err(format!("signal handler: {e}")),
        };
        tokio::select! {
            r = run(opts) => r,
            _ = term.recv() => Err("terminated (SIGTERM): replicas stopped, no report written".into()),
            _ = tokio::signal::ctrl_c() => Err("interrupted: replicas stopped, no report written".into()),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("phone-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("run") => {}
        other => return Err(format!("expected the `run` command, got {other:?}")),
    }
    let mut o = Opts {
        quick: false,
        pg_port: 25432,
        pg_dir: PathBuf::from("data/bench-pg"),
        pg_bin: find_pg_bin().unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin")),
        out: PathBuf::from("bench/RESULTS.md"),
        command: "phone-bench run".into(),
        pool_size: 16,
        base_port: 3101,
        only: None,
    };
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--pg-port" => o.pg_port = value()?.parse().map_err(|e| format!("--pg-port: {e}"))?,
            "--pg-dir" => o.pg_dir = PathBuf::from(value()?),
            "--pg-bin" => o.pg_bin = PathBuf::from(value()?),
            "--out" => o.out = PathBuf::from(value()?),
            "--command" => o.command = value()?.trim().to_owned(),
            "--pool-size" => {
                o.pool_size = value()?.parse().map_err(|e| format!("--pool-size: {e}"))?
            }
            "--base-port" => {
                o.base_port = value()?.parse().map_err(|e| format!("--base-port: {e}"))?
            }
            "--only" => o.only = Some(value()?.split(',').map(|s| s.trim().to_owned()).collect()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

fn find_pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pgbench").exists().then_some((v, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, p)| p)
}

/// Progress on stderr, with the time since start.
macro_rules! say {
    ($t0:expr, $($arg:tt)*) => {
        eprintln!("[{:>6.1}s] {}", $t0.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

// ---------------------------------------------------------------------------
// Replicas

struct Replica {
    child: tokio::process::Child,
    pid: u32,
    port: u16,
    role: String,
    idle: Mem,
}

async fn start_replicas(
    opts: &Opts,
    database: &str,
    n: usize,
    first_port: u16,
    role: &str,
) -> Result<Vec<Replica>, String> {
    let bin = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .parent()
        .ok_or("no exe dir")?
        .join("phone");
    if !bin.exists() {
        return Err(format!(
            "{} not found: build it with cargo build --release",
            bin.display()
        ));
    }
    let url = pg_url(opts, database);
    let log_dir = Path::new("data/bench/logs");
    std::fs::create_dir_all(log_dir).map_err(|e| e.to_string())?;
    let mut replicas = Vec::new();
    for i in 0..n {
        let port = first_port + i as u16;
        let log = std::fs::File::create(log_dir.join(format!("{role}-{}.log", i + 1)))
            .map_err(|e| e.to_string())?;
        let child = tokio::process::Command::new(&bin)
            .env("DATABASE_URL", &url)
            .env("PORT", port.to_string())
            .env("PHONE_BIND", "127.0.0.1")
            .env("PHONE_POOL_SIZE", opts.pool_size.to_string())
            .env("RUST_LOG", "warn")
            // Every bench agent registers from 127.0.0.1: lift the per-address limit.
            .env("PHONE_REGISTER_LIMIT", "0")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let pid = child.id().ok_or("replica exited at once")?;
        replicas.push(Replica {
            child,
            pid,
            port,
            role: format!("{role} #{}", i + 1),
            idle: Mem::default(),
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for r in &mut replicas {
        loop {
            if let Ok(Some(status)) = r.child.try_wait() {
                return Err(format!(
                    "replica on port {} exited ({status}) during startup; see data/bench/logs/ (port in use?)",
                    r.port
                ));
            }
            if mcp::health(&Target::local(r.port)).await {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replica on port {} not healthy within 60 s",
                    r.port
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Idle: started, migrated, answered /health and one MCP handshake.
    for r in &replicas {
        let _ = mcp::Conn::open(&Target::local(r.port)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for r in &mut replicas {
        r.idle = stats::mem(r.pid).unwrap_or_default();
    }
    Ok(replicas)
}

async fn stop_replicas(replicas: Vec<Replica>) {
    for mut r in replicas {
        // SIGTERM for a graceful stop; SIGKILL if it lingers.
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(r.pid.to_string())
            .status();
        if tokio::time::timeout(Duration::from_secs(10), r.child.wait())
            .await
            .is_err()
        {
            let _ = r.child.kill().await;
        }
    }
}

fn targets(replicas: &[Replica]) -> Vec<Target> {
    replicas.iter().map(|r| Target::local(r.port)).collect()
}

fn pids(replicas: &[Replica]) -> Vec<u32> {
    replicas.iter().map(|r| r.pid).collect()
}

fn pg_url(opts: &Opts, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{database}", opts.pg_port)
}

// ---------------------------------------------------------------------------
// Results

struct MixRow {
    replicas: usize,
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
    fn calls_per_s(&self) -> f64 {
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

struct NoDbRow {
    what: &'static str,
    per_s: f64,
    lat: Summary,
    server_us: f64,
    errors: String,
}

struct RateRow {
    replicas: usize,
    peak_calls: f64,
    rate: f64,
    achieved: f64,
    send: Summary,
    inbox: Summary,
    all: Summary,
    service: Summary,
    lag: Summary,
    errors: String,
    error_count: u64,
    other_cores: f64,
}

struct SearchRow {
    size: i64,
    category: &'static str,
    example: String,
    lat: Summary,
    avg_results: f64,
    empty: u64,
    errors: String,
}

struct GrowthRow {
    other_cores: f64,
    /// From pg_stat_statements: (mean exec µs, shared blocks per call).
    poll_db: Option<(f64, f64)>,
    send_db: Option<(f64, f64)>,
    history: i64,
    table_mb: f64,
    rate: f64,
    inbox: Summary,
    send: Summary,
    errors: String,
}

struct MemRow {
    role: String,
    idle: Mem,
    loaded: Mem,
    phase: String,
}

#[derive(Default)]
struct Report {
    revision: String,
    notes: Vec<String>,
    fsync: Option<f64>,
    mix: Vec<MixRow>,
    no_db: Vec<NoDbRow>,
    rate: Vec<RateRow>,
    search: Vec<SearchRow>,
    /// (size, seconds to seed up to it, indexes rebuilt after the load)
    search_seed: Vec<(i64, f64, bool)>,
    search_seeded: i64,
    growth: Vec<GrowthRow>,
    growth_seed_secs: f64,
    mem: Vec<MemRow>,
    skipped: Vec<String>,
}

// ---------------------------------------------------------------------------

async fn run(opts: Opts) -> Result<(), String> {
    let t0 = Instant::now();
    let mode = Mode::new(opts.quick);
    let wants = |phase: &str| opts.only.as_ref().is_none_or(|s| s.contains(phase));
    let hz = stats::clock_ticks_per_sec();
    let started_at = chrono::Utc::now();
    let loadavg_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // The binaries were just built from the working tree: name it now, not
    // at the end, when other commits may have landed.
    let revision = git_revision();
    std::fs::create_dir_all("data/bench").map_err(|e| e.to_string())?;

    let admin = db::connect(&pg_url(&opts, "postgres")).await?;
    let pg_version = db::show(&admin, "server_version").await;
    // Checkpoints spread over bulk loads of millions of rows; the setting is
    // of this private cluster only.
    for sql in [
        "ALTER SYSTEM SET max_wal_size = '8GB'",
        // Planning time per statement (pg_stat_statements), when loaded.
        "ALTER SYSTEM SET pg_stat_statements.track_planning = on",
        "SELECT pg_reload_conf()",
    ] {
        admin
            .batch_execute(sql)
            .await
            .map_err(|e| format!("configure cluster: {}", db::pg_err(&e)))?;
    }
    let settings = format!(
        "synchronous_commit={}, fsync={}, wal_sync_method={}, shared_buffers={}, max_wal_size=8GB and pg_stat_statements.track_planning=on (set by the bench), max_connections={}",
        db::show(&admin, "synchronous_commit").await,
        db::show(&admin, "fsync").await,
        db::show(&admin, "wal_sync_method").await,
        db::show(&admin, "shared_buffers").await,
        db::show(&admin, "max_connections").await,
    );
    let postmaster: u32 = std::fs::read_to_string(opts.pg_dir.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
        .ok_or_else(|| {
            format!(
                "no postmaster.pid in {}: is the bench PostgreSQL running?",
                opts.pg_dir.display()
            )
        })?;
    say!(
        t0,
        "PostgreSQL {pg_version} on port {} ({settings}); mode {}",
        opts.pg_port,
        mode.name
    );

    let mut report = Report {
        revision,
        ..Report::default()
    };

    if wants("fsync") {
        match db::fdatasync_rate(&opts.pg_bin, &opts.pg_dir.with_extension("fsync-test")).await {
            Ok(rate) => {
                say!(t0, "pg_test_fsync: fdatasync {rate:.0}/s");
                report.fsync = Some(rate);
            }
            Err(e) => report.notes.push(format!("pg_test_fsync failed: {e}")),
        }
    }

    if wants("mix") || wants("rate") {
        db::recreate_database(&admin, DB_MIX).await?;
        let bench_db = db::connect(&pg_url(&opts, DB_MIX)).await?;
        for &r in &REPLICAS {
            let replicas =
                start_replicas(&opts, DB_MIX, r, opts.base_port, &format!("mix-{r}r")).await?;
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
                            &admin,
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
                    &opts,
                    &mode,
                    &bench_db,
                    &admin,
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
            if wants("rate") && peak > 0.0 {
                let rate = (peak / 2.0).max(10.0);
                let _ = bench_db.batch_execute("CHECKPOINT").await;
                let server_pids = pids(&replicas);
                let now = tokio::time::Instant::now();
                let (out, (cpu, _)) = tokio::join!(
                    load::open_loop(&tg, &last_agents, rate, mode.warmup, mode.measure, 64),
                    sample_window(
                        &admin,
                        &server_pids,
                        postmaster,
                        &[],
                        now + mode.warmup,
                        now + mode.warmup + mode.measure,
                        hz
                    ),
                );
                let row = RateRow {
                    replicas: r,
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
                };
                say!(
                    t0,
                    "fixed rate r={r}: {rate:.0} calls/s (half of {peak:.0}): p50 {:.2} ms p99 {:.2} ms, errors {}",
                    row.all.p50,
                    row.all.p99,
                    row.errors
                );
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
    }

    // 10k and 100k agents always; 1M (full mode only) after the growth
    // phase, whose 10M is required, if the time budget still allows.
    let (small, big): (Vec<i64>, Vec<i64>) = mode.search_sizes.iter().partition(|&&n| n <= 100_000);
    if wants("search") {
        search_phase(
            &opts,
            &mode,
            &admin,
            &mut report,
            t0,
            &small,
            t0 + mode.budget,
        )
        .await?;
    }

    if wants("growth") {
        growth_phase(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("search") && !big.is_empty() {
        // Seeding rate so far, to judge whether 1M fits: seeding plus ~60 s of queries.
        let rate = report
            .search_seed
            .last()
            .map_or(5_000.0, |&(n, secs, _)| (n as f64 / secs.max(0.1)).max(1.0));
        let need = (big[big.len() - 1] - report.search_seeded) as f64 / rate * 0.8 + 60.0;
        let left = mode.budget.as_secs_f64() - t0.elapsed().as_secs_f64();
        if need > left {
            report.skipped.push(format!(
                "search at {} agents: needs ~{need:.0} s (seeding at the rate measured so far, plus queries), {left:.0} s left of the budget",
                big[big.len() - 1]
            ));
        } else {
            let deadline = t0 + mode.budget - Duration::from_secs(50);
            search_phase(&opts, &mode, &admin, &mut report, t0, &big, deadline).await?;
        }
    }

    let elapsed = t0.elapsed();
    say!(t0, "done in {:.0} s", elapsed.as_secs_f64());
    let md = render(
        &opts,
        &mode,
        &report,
        &pg_version,
        &settings,
        started_at,
        elapsed,
        &loadavg_start,
    );
    if let Some(dir) = opts.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&opts.out, &md).map_err(|e| format!("write {}: {e}", opts.out.display()))?;
    println!("{md}");
    eprintln!("phone-bench: written to {}", opts.out.display());
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
    // Up-to-date statistics for the server and for pgbench alike, rather
    // than an autovacuum ANALYZE landing in the middle of one of them.
    db::each(bench_db, &["ANALYZE"]).await?;
    let server_pids = pids(replicas);

    // CPU and database counters are read inside the measured window, while
    // the load runs: pg_stat_* lag up to a second behind a busy backend and
    // much longer behind one that went idle, so end-of-run readings are low.
    let _ = bench_db.batch_execute("CHECKPOINT").await;
    let pgss = db::statements_reset(admin).await.is_ok();
    let start = tokio::time::Instant::now();
    let wall0 = chrono::Utc::now();
    let (out, (cpu, window_counters)) = tokio::join!(
        load::mix(tg, &agents, start, mode.warmup, mode.measure),
        sample_window(
            admin,
            &server_pids,
            postmaster,
            &[],
            start + mode.warmup,
            start + mode.warmup + mode.measure,
            hz
        ),
    );
    let from = wall0 + chrono::Duration::from_std(mode.warmup).unwrap();
    let to = from + chrono::Duration::from_std(mode.measure).unwrap();
    let statements = if pgss {
        db::statements(admin, DB_MIX).await.unwrap_or_default()
    } else {
        Vec::new()
    };
    let (sent_db, read_db) = db::count_window(bench_db, &names, from, to).await?;

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

/// CPU use and database counters between two instants.
async fn sample_window(
    admin: &tokio_postgres::Client,
    server_pids: &[u32],
    postmaster: u32,
    loadgen: &[u32],
    from: tokio::time::Instant,
    to: tokio::time::Instant,
    hz: f64,
) -> (CpuUse, db::DbCounters) {
    let probe = |server: Vec<u32>, loadgen: Vec<u32>| {
        tokio::task::spawn_blocking(move || CpuProbe::take(&server, postmaster, &loadgen))
    };
    tokio::time::sleep_until(from).await;
    let c0 = db::counters(admin, DB_MIX).await;
    let p0 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    tokio::time::sleep_until(to).await;
    let p1 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    let c1 = db::counters(admin, DB_MIX).await;
    (
        p1.since(&p0, hz),
        db::DbCounters {
            commits: c1.commits - c0.commits,
            wal_syncs: c1.wal_syncs - c0.wal_syncs,
        },
    )
}

fn search_categories(sample_names: &[String]) -> Vec<(&'static str, Vec<SearchQuery>)> {
    let q = |query: &str, project: Option<&str>| SearchQuery {
        query: (!query.is_empty()).then(|| query.to_owned()),
        project: project.map(str::to_owned),
    };
    vec![
        (
            "common word",
            [
                "email", "invoices", "reports", "data", "customer", "meetings",
            ]
            .iter()
            .map(|w| q(w, None))
            .collect(),
        ),
        (
            "two common words",
            [
                "invoice email",
                "support tickets",
                "sales data",
                "meeting notes",
            ]
            .iter()
            .map(|w| q(w, None))
            .collect(),
        ),
        (
            "rare word",
            db::RARE[..8].iter().map(|w| q(w, None)).collect(),
        ),
        (
            "prefix",
            ["inv", "sched", "kube", "transl", "reconc", "calli"]
                .iter()
                .map(|w| q(w, None))
                .collect(),
        ),
        (
            "word + project",
            [
                ("reports", "atlas"),
                ("invoices", "kepler"),
                ("kubernetes", "orion"),
                ("email", "zenith"),
            ]
            .iter()
            .map(|(w, p)| q(w, Some(p)))
            .collect(),
        ),
        (
            "exact name",
            sample_names.iter().map(|n| q(n, None)).collect(),
        ),
        (
            "project listing",
            ["atlas", "kepler", "zenith", "krusty"]
                .iter()
                .map(|p| q("", Some(p)))
                .collect(),
        ),
    ]
}

/// The directory at each of `sizes` (cumulative: the database and what it
/// holds persist between calls, in `report.search_seeded`).
async fn search_phase(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    sizes: &[i64],
    deadline: Instant,
) -> Result<(), String> {
    if report.search_seeded == 0 {
        db::recreate_database(admin, DB_SEARCH).await?;
    }
    let replicas = start_replicas(opts, DB_SEARCH, 1, opts.base_port + 10, "search").await?;
    let target = Target::local(replicas[0].port);
    let sdb = db::connect(&pg_url(opts, DB_SEARCH)).await?;
    for &size in sizes {
        let seeded = report.search_seeded;
        if Instant::now() >= deadline {
            report.skipped.push(format!(
                "search at {size} agents: no time left in the budget"
            ));
            break;
        }
        let started = Instant::now();
        // Big loads rebuild the directory's plain indexes (GIN, project,
        // name) once at the end instead of maintaining them row by row.
        let deferred = if size - seeded >= 500_000 {
            db::drop_secondary_indexes(&sdb, "agents").await?
        } else {
            Vec::new()
        };
        let reached = db::seed_parallel(
            &pg_url(opts, DB_SEARCH),
            db::Seed::Directory,
            seeded + 1,
            size,
            50_000,
            2,
            deadline,
        )
        .await?;
        db::recreate_indexes(&sdb, &deferred).await?;
        db::each(&sdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
        let took = started.elapsed().as_secs_f64();
        if reached < size {
            report.skipped.push(format!("search at {size} agents: the time budget ran out after seeding {reached}; measured there"));
        }
        let size = reached;
        report.search_seed.push((size, took, !deferred.is_empty()));
        report.search_seeded = size;
        say!(t0, "directory seeded to {size} agents in {took:.1} s");

        let names: Vec<String> = sdb
            .query(
                "SELECT name FROM agents TABLESAMPLE SYSTEM (1) LIMIT 8",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for (category, queries) in search_categories(&names) {
            if queries.is_empty() {
                continue;
            }
            let out = load::search(
                &target,
                &queries,
                SEARCH_WORKERS,
                mode.search_secs,
                10,
                mode.search_secs * 3,
            )
            .await;
            let calls = out.lat.len().max(1) as f64;
            report.search.push(SearchRow {
                size,
                category,
                example: describe_query(&queries[0]),
                lat: out.lat.summary(),
                avg_results: out.results as f64 / calls,
                empty: out.empty,
                errors: out.errors.describe(),
            });
        }
        let worst = report
            .search
            .iter()
            .filter(|s| s.size == size)
            .map(|s| s.lat.p99)
            .fold(0.0, f64::max);
        say!(t0, "search at {size}: worst category p99 {worst:.1} ms");
    }
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!("search up to {} agents", report.search_seeded),
        });
    }
    stop_replicas(replicas).await;
    Ok(())
}

fn describe_query(q: &SearchQuery) -> String {
    match (&q.query, &q.project) {
        (Some(w), Some(p)) => format!("\"{w}\" in {p}"),
        (Some(w), None) => format!("\"{w}\""),
        (None, Some(p)) => format!("project={p}"),
        (None, None) => "(all)".into(),
    }
}

async fn growth_phase(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    db::recreate_database(admin, DB_GROWTH).await?;
    let replicas = start_replicas(opts, DB_GROWTH, 1, opts.base_port + 20, "growth").await?;
    let tg = targets(&replicas);
    let gdb = db::connect(&pg_url(opts, DB_GROWTH)).await?;
    let base = db::seed_mailbox_agents(&gdb, GROWTH_AGENTS).await?;
    // Fresh statistics before the first measurement: an autovacuum ANALYZE
    // of agents landing between the two measurements would change the
    // poll's plan (its joins to agents) and confound the comparison.
    db::each(&gdb, &["ANALYZE agents"]).await?;
    let agents: Vec<Agent> = (1..=GROWTH_MEASURED as i64)
        .map(|g| Agent {
            name: format!("g-{g}"),
            token: db::seeded_token('g', g),
        })
        .collect();
    // Below saturation, so the comparison is of work per poll, not of queueing.
    let rate = report
        .mix
        .iter()
        .find(|m| m.replicas == 1)
        .map_or(1000.0, |m| (m.calls_per_s() / 4.0).clamp(100.0, 1000.0));
    let mut seeded = 0i64;
    // Leave time for VACUUM, the last measurement and the report.
    // Quick mode's large size is small enough to always load unless the
    // machine is far too busy; the full 10M must fit the 10-minute budget,
    // leaving time for the index rebuild, VACUUM and the last measurement.
    let deadline = if opts.quick {
        t0 + mode.budget + Duration::from_secs(20)
    } else {
        t0 + mode.budget - (mode.warmup + mode.measure) - Duration::from_secs(90)
    };
    let seed = db::Seed::History {
        base,
        agents: GROWTH_AGENTS,
        all_read_slots: GROWTH_MEASURED as i64,
    };
    let mut deferred: Vec<String> = Vec::new();
    for (i, &size) in [mode.growth_small, mode.growth_large].iter().enumerate() {
        let started = Instant::now();
        let reached = if i == 0 {
            // The small history always loads in full.
            db::seed_parallel(
                &pg_url(opts, DB_GROWTH),
                seed,
                1,
                size,
                size,
                1,
                Instant::now() + Duration::from_secs(60),
            )
            .await?
        } else {
            // Rebuild the plain indexes once at the end instead of row by row.
            deferred = db::drop_secondary_indexes(&gdb, "messages").await?;
            let mut reached = seeded;
            let step = 1_000_000.min(size);
            while reached < size && Instant::now() < deadline {
                reached = db::seed_parallel(
                    &pg_url(opts, DB_GROWTH),
                    seed,
                    reached + 1,
                    (reached + step).min(size),
                    250_000,
                    2,
                    deadline,
                )
                .await?;
                say!(t0, "history: {reached} messages");
            }
            reached
        };
        if reached < size {
            report.skipped.push(format!("growth at {size} messages: the time budget ran out after loading {reached}; measured there"));
        }
        let size = reached;
        if !deferred.is_empty() {
            let t = Instant::now();
            db::recreate_indexes(&gdb, &deferred).await?;
            say!(t0, "indexes rebuilt in {:.1} s", t.elapsed().as_secs_f64());
        }
        db::each(&gdb, &["VACUUM (ANALYZE) messages", "CHECKPOINT"]).await?;
        if i == 1 {
            report.growth_seed_secs = started.elapsed().as_secs_f64();
        }
        seeded = size;
        let table_mb = db::scalar_i64(&gdb, "SELECT pg_total_relation_size('messages')").await?
            as f64
            / 1048576.0;
        let server_pids = pids(&replicas);
        let pgss = db::statements_reset(admin).await.is_ok();
        let now = tokio::time::Instant::now();
        let (out, (cpu, _)) = tokio::join!(
            load::open_loop(
                &tg,
                &agents,
                rate,
                mode.warmup,
                mode.measure,
                GROWTH_MEASURED
            ),
            sample_window(
                admin,
                &server_pids,
                postmaster,
                &[],
                now + mode.warmup,
                now + mode.warmup + mode.measure,
                hz
            ),
        );
        let stmts = if pgss {
            db::statements(admin, DB_GROWTH).await.unwrap_or_default()
        } else {
            Vec::new()
        };
        let per_call = |kind: &str| {
            let (calls, ms, blocks) = stmts
                .iter()
                .filter(|x| x.kind() == kind)
                .fold((0i64, 0.0f64, 0i64), |(c, m, b), x| {
                    (c + x.calls, m + x.total_ms, b + x.blocks)
                });
            (calls > 0).then(|| (ms * 1000.0 / calls as f64, blocks as f64 / calls as f64))
        };
        let row = GrowthRow {
            poll_db: per_call("poll"),
            send_db: per_call("send"),
            other_cores: cpu.other() / cpu.wall.max(1e-9),
            history: size,
            table_mb,
            rate,
            inbox: out.inbox.summary(),
            send: out.send.summary(),
            errors: out.errors.describe(),
        };
        say!(
            t0,
            "growth {size} messages ({table_mb:.0} MB): inbox p50 {:.2} ms p99 {:.2} ms",
            row.inbox.p50,
            row.inbox.p99
        );
        report.growth.push(row);
    }
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!("growth, {seeded} messages"),
        });
    }
    stop_replicas(replicas).await;
    Ok(())
}

// ---------------------------------------------------------------------------
// The report

/// The distinguishing part of a statement: from what its kind does on.
fn excerpt(q: &str, kind: &str) -> String {
    let key = match kind {
        "send" => "INSERT INTO messages",
        "poll" => "UPDATE messages",
        _ => "",
    };
    let at = if key.is_empty() {
        0
    } else {
        q.find(key).unwrap_or(0)
    };
    let body = shorten(&q[at..], 140);
    if at > 0 { format!("…{body}") } else { body }
}

fn shorten(q: &str, n: usize) -> String {
    let q = q.replace('|', "\\|").replace('`', "'");
    if q.chars().count() > n {
        format!("{}…", q.chars().take(n).collect::<String>())
    } else {
        q
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

fn machine() -> (usize, f64, String, String) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1048576.0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    (cores, mem_gib, cpu, kernel)
}

fn git_revision() -> String {
    let out = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let rev = out(&["rev-parse", "--short", "HEAD"]);
    let dirty = !out(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    if rev.is_empty() {
        "?".into()
    } else if dirty {
        format!("{rev} + uncommitted changes")
    } else {
        rev
    }
}

#[allow(clippy::too_many_arguments)]
fn render(
    opts: &Opts,
    mode: &Mode,
    r: &Report,
    pg_version: &str,
    settings: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    elapsed: Duration,
    loadavg: &str,
) -> String {
    let (cores, mem_gib, cpu, kernel) = machine();
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "# phone benchmark results\n");
    let _ = writeln!(
        w,
        "- Date: {} (took {:.0} s after the build)",
        started_at.format("%Y-%m-%d %H:%M UTC"),
        elapsed.as_secs_f64()
    );
    let _ = writeln!(w, "- Command: `{}` (mode: {})", opts.command, mode.name);
    let _ = writeln!(
        w,
        "- Machine: {cores} cores ({cpu}), {mem_gib:.1} GiB memory, Linux {kernel}; load average at start: {}",
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(w, "- PostgreSQL {pg_version}, local, durable: {settings}");
    let _ = writeln!(
        w,
        "- Server: release build, revision {}, PHONE_POOL_SIZE={} per replica, RUST_LOG=warn, PHONE_REGISTER_LIMIT=0 (all bench agents register from 127.0.0.1); replicas on 127.0.0.1:{}+",
        r.revision, opts.pool_size, opts.base_port
    );
    let _ = writeln!(
        w,
        "- Load generator: `phone-bench` (in-repo), one tokio thread, HTTP/1.1 keep-alive, one connection per worker; each connection does `initialize` + `notifications/initialized`, then JSON-RPC `tools/call` POSTs to /mcp with Bearer tokens. With 3 replicas the connections are spread round-robin over the replicas' ports directly (no proxy in front)."
    );
    let _ = writeln!(
        w,
        "- Phase lengths: mix {} s measured after {:.1} s warm-up; pgbench {} s; search {:.1} s per category.",
        mode.measure.as_secs(),
        mode.warmup.as_secs_f64(),
        mode.pgbench_secs,
        mode.search_secs.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "- Everything (load generator, replicas, PostgreSQL) shares the same {cores} cores, and other work on the machine (e.g. compilers) competes too: absolute numbers are noisy; the ratio to the pgbench baseline measured minutes apart in the same run is the comparable figure. The `other CPU` column below shows how much CPU went to processes outside the benchmark."
    );
    if !r.skipped.is_empty() {
        for sk in &r.skipped {
            let _ = writeln!(w, "- Skipped: {sk}");
        }
    }
    for n in &r.notes {
        let _ = writeln!(w, "- Note: {n}");
    }

    // Targets first.
    let _ = writeln!(w, "\n## Against the targets\n");
    let _ = writeln!(w, "| target | measured | verdict |");
    let _ = writeln!(w, "|---|---|---|");
    for m in &r.mix {
        let _ = writeln!(
            w,
            "| throughput ≥ 0.8× raw-SQL baseline, 0 errors ({} replica{}, c={}) | {:.2}× ({:.0} vs {:.0} sends/s), {} errors | {} |",
            m.replicas,
            if m.replicas > 1 { "s" } else { "" },
            m.concurrency,
            m.ratio(),
            m.sent_per_s(),
            m.pgbench_tps,
            m.error_count,
            verdict(m.ratio() >= 0.8 && m.error_count == 0)
        );
    }
    for x in &r.rate {
        let worst = x.send.p99.max(x.inbox.p99);
        let _ = writeln!(
            w,
            "| p99 ≤ 10 ms at half of peak ({} replica{}, {:.0} calls/s) | p99 {:.1} ms (send {:.1}, inbox {:.1}), {} errors | {} |",
            x.replicas,
            if x.replicas > 1 { "s" } else { "" },
            x.rate,
            x.all.p99,
            x.send.p99,
            x.inbox.p99,
            x.error_count,
            verdict(worst <= 10.0 && x.error_count == 0)
        );
    }
    if let Some(max_size) = r.search.iter().map(|s| s.size).max() {
        let worst = r
            .search
            .iter()
            .filter(|s| s.size == max_size)
            .max_by(|a, b| a.lat.p99.total_cmp(&b.lat.p99));
        if let Some(worst) = worst {
            let scope = if max_size >= 1_000_000 {
                "".to_string()
            } else {
                format!(" — measured at {max_size} only, 1M not run in this mode")
            };
            let _ = writeln!(
                w,
                "| search p99 ≤ 20 ms at 1M agents{scope} | worst p99 {:.1} ms ({} at {}) | {} |",
                worst.lat.p99,
                worst.category,
                max_size,
                if max_size >= 1_000_000 {
                    verdict(worst.lat.p99 <= 20.0)
                } else if worst.lat.p99 > 20.0 {
                    "FAIL (already at a smaller size)"
                } else {
                    "not measured at 1M"
                }
            );
        }
    }
    if r.growth.len() == 2 {
        let (a, b) = (&r.growth[0], &r.growth[1]);
        let p50 = b.inbox.p50 / a.inbox.p50.max(1e-9);
        let p99 = b.inbox.p99 / a.inbox.p99.max(1e-9);
        let scope = if b.history >= 10_000_000 {
            String::new()
        } else {
            format!(" — large size here is {} (quick mode), not 10M", b.history)
        };
        let _ = writeln!(
            w,
            "| poll latency at 10M history ≤ 1.3× at 10k{scope} | p50 {:.2}× ({:.2} → {:.2} ms), p99 {:.2}× ({:.2} → {:.2} ms) | {} |",
            p50,
            a.inbox.p50,
            b.inbox.p50,
            p99,
            a.inbox.p99,
            b.inbox.p99,
            verdict(p50 <= 1.3 && p99 <= 1.3)
        );
        if let (Some(pa), Some(pb)) = (a.poll_db, b.poll_db) {
            let _ = writeln!(
                w,
                "| (same, inside PostgreSQL: contention-free evidence) | poll statement {:.2}× exec time ({:.0} → {:.0} µs), {:.2}× pages touched ({:.1} → {:.1} per poll) | {} |",
                pb.0 / pa.0.max(1e-9),
                pa.0,
                pb.0,
                pb.1 / pa.1.max(1e-9),
                pa.1,
                pb.1,
                verdict(pb.0 / pa.0.max(1e-9) <= 1.3)
            );
        }
    }
    if !r.mem.is_empty() {
        let idle = r.mem.iter().map(|m| m.idle.rss_kb).max().unwrap_or(0);
        let loaded = r.mem.iter().map(|m| m.loaded.hwm_kb).max().unwrap_or(0);
        let _ = writeln!(
            w,
            "| RSS ≤ 20 MB idle | max idle VmRSS {:.1} MB | {} |",
            mb(idle),
            verdict(mb(idle) <= 20.0)
        );
        let _ = writeln!(
            w,
            "| RSS ≤ 60 MB loaded | max VmHWM {:.1} MB | {} |",
            mb(loaded),
            verdict(mb(loaded) <= 60.0)
        );
    }

    if !r.mix.is_empty() || r.fsync.is_some() {
        let _ = writeln!(w, "\n## 1–2. Send+poll mix vs the raw-SQL limit\n");
        let _ = writeln!(
            w,
            "Agents in pairs; each worker sends to its partner, then polls its own inbox (`limit` 10): sends and polls 1:1, closed loop. Sent and read counts come from the database afterwards (messages of this phase's agents with `sent_at` / `read_at` inside the measured window), not from responses. The baseline is `pgbench -M prepared` at the same concurrency on the same database right after: per transaction one `INSERT` (a send) and one `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING` (a poll), each its own autocommit transaction like the server's, same agent pairs, same body, same synchronous_commit. Ratio = server sends/s ÷ pgbench transactions/s.\n"
        );
        if let Some(f) = r.fsync {
            let _ = writeln!(
                w,
                "pg_test_fsync (one 8 kB write, fdatasync, on the cluster's disk): **{f:.0} ops/s**.\n"
            );
        }
        let _ = writeln!(
            w,
            "| replicas | conc. | sent/s (DB) | read/s (DB) | calls/s | send p50 / p90 / p99 ms | inbox p50 / p90 / p99 ms | errors | pgbench tps | ratio |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
        for m in &r.mix {
            let _ = writeln!(
                w,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {} | {:.0} | **{:.2}×** |",
                m.replicas,
                m.concurrency,
                m.sent_per_s(),
                m.read_per_s(),
                m.calls_per_s(),
                m.send.p50,
                m.send.p90,
                m.send.p99,
                m.inbox.p50,
                m.inbox.p90,
                m.inbox.p99,
                m.errors,
                m.pgbench_tps,
                m.ratio()
            );
        }
        let _ = writeln!(
            w,
            "\nCross-checks: successful responses vs database rows, and the baseline's own rows.\n"
        );
        let _ = writeln!(
            w,
            "| replicas | conc. | send responses | sent rows (DB) | poll responses | read rows (DB) | pgbench failed | pgbench rows/s (DB) | pgbench latency avg ms |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
        for m in &r.mix {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2} |",
                m.replicas,
                m.concurrency,
                m.sends_ok,
                m.sent_db,
                m.polls_ok,
                m.read_db,
                m.pgbench_failed,
                m.pgbench_rows as f64 / mode.pgbench_secs as f64,
                m.pgbench_latency_ms
            );
        }
        let _ = writeln!(
            w,
            "\nWhere the time goes: CPU per call (one call = one send or one poll; for pgbench one statement), from /proc, over the measured window (pgbench: from 1 s after its start, or a quarter of its run if shorter, to 0.5 s before its end). `other` is machine CPU used by none of server, PostgreSQL or load generator, in cores. Commits and WAL flushes from pg_stat_database / pg_stat_wal over the same window.\n"
        );
        let _ = writeln!(
            w,
            "| replicas | conc. | server µs/call | PostgreSQL µs/call | loadgen µs/call | other CPU (cores) | commits/call | WAL flushes/s | pgbench: PostgreSQL µs/stmt | pgbench µs/stmt | commits/stmt | WAL flushes/s | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for m in &r.mix {
            let calls = m.window_calls.max(1) as f64;
            let stmts = (m.pgbench_tps * 2.0 * m.pgbench_cpu.wall).max(1.0);
            let _ = writeln!(
                w,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} |",
                m.replicas,
                m.concurrency,
                m.cpu.server / calls * 1e6,
                m.cpu.postgres / calls * 1e6,
                m.cpu.loadgen / calls * 1e6,
                m.cpu.other() / m.cpu.wall.max(1e-9),
                m.commits as f64 / calls,
                m.wal_syncs as f64 / m.cpu.wall.max(1e-9),
                m.pgbench_cpu.postgres / stmts * 1e6,
                m.pgbench_cpu.loadgen / stmts * 1e6,
                m.pgbench_commits as f64 / stmts,
                m.pgbench_wal_syncs as f64 / m.pgbench_cpu.wall.max(1e-9),
                m.pgbench_cpu.other() / m.pgbench_cpu.wall.max(1e-9),
            );
        }
        if !r.no_db.is_empty() {
            let _ = writeln!(
                w,
                "\nThe server's fixed cost per request, without the database (1 replica, 16 connections, closed loop): what HTTP, the JSON-RPC checks, rmcp and the tool dispatch cost before any SQL.\n"
            );
            let _ = writeln!(
                w,
                "| request | per s | p50 / p99 ms | server CPU µs/request | errors |"
            );
            let _ = writeln!(w, "|---|---|---|---|---|");
            for x in &r.no_db {
                let _ = writeln!(
                    w,
                    "| {} | {:.0} | {:.2} / {:.2} | {:.0} | {} |",
                    x.what, x.per_s, x.lat.p50, x.lat.p99, x.server_us, x.errors
                );
            }
        }
        for m in r
            .mix
            .iter()
            .filter(|m| m.replicas == 1 && !m.statements.is_empty())
        {
            let calls = m.calls_total.max(1) as f64;
            let server_ms: f64 = m.statements.iter().map(|x| x.total_ms).sum();
            let server_stmts: i64 = m.statements.iter().map(|x| x.calls).sum();
            let pg_ms: f64 = m.pgbench_statements.iter().map(|x| x.total_ms).sum();
            let pg_stmts: i64 = m.pgbench_statements.iter().map(|x| x.calls).sum();
            let _ = writeln!(
                w,
                "\nStatements the database executed (pg_stat_statements), 1 replica, c={}: the server ran **{:.2} statements per tool call**, {:.0} µs of execution per send+poll pair; pgbench ran 2 per pair, {:.0} µs per pair. Execution time excludes planning, parse/bind, network and commit waits; `planned per execution` near 1 means the prepared statement is re-planned on every call (custom plans).\n",
                m.concurrency,
                server_stmts as f64 / calls,
                server_ms * 1000.0 / (calls / 2.0),
                pg_ms * 1000.0 / (pg_stmts as f64 / 2.0).max(1.0),
            );
            let _ = writeln!(
                w,
                "| by | kind | statement | per tool call | mean exec µs | planned per execution | mean plan µs | rows/call | blocks/call | share of exec time |"
            );
            let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
            for x in m.statements.iter().take(6) {
                let _ = writeln!(
                    w,
                    "| server | {} | `{}` | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.1} | {:.0}% |",
                    x.kind(),
                    excerpt(&x.query, x.kind()),
                    x.calls as f64 / calls,
                    x.total_ms * 1000.0 / x.calls as f64,
                    x.plans as f64 / x.calls as f64,
                    x.plan_ms * 1000.0 / x.plans.max(1) as f64,
                    x.rows as f64 / x.calls as f64,
                    x.blocks as f64 / x.calls as f64,
                    100.0 * x.total_ms / server_ms.max(1e-9)
                );
            }
            // pgbench runs two statements; group by kind in case the
            // statistics hold more than one entry per text.
            for kind in ["send", "poll"] {
                let xs: Vec<&db::StmtStat> = m
                    .pgbench_statements
                    .iter()
                    .filter(|x| x.kind() == kind)
                    .collect();
                let Some(first) = xs.first() else { continue };
                let calls: i64 = xs.iter().map(|x| x.calls).sum::<i64>().max(1);
                let ms: f64 = xs.iter().map(|x| x.total_ms).sum();
                let rows: i64 = xs.iter().map(|x| x.rows).sum();
                let blocks: i64 = xs.iter().map(|x| x.blocks).sum();
                let plans: i64 = xs.iter().map(|x| x.plans).sum();
                let plan_ms: f64 = xs.iter().map(|x| x.plan_ms).sum();
                let _ = writeln!(
                    w,
                    "| pgbench | {kind} | `{}` | — | {:.0} | {:.2} | {:.0} | {:.2} | {:.1} | {:.0}% |",
                    excerpt(&first.query, kind),
                    ms * 1000.0 / calls as f64,
                    plans as f64 / calls as f64,
                    plan_ms * 1000.0 / plans.max(1) as f64,
                    rows as f64 / calls as f64,
                    blocks as f64 / calls as f64,
                    100.0 * ms / pg_ms.max(1e-9)
                );
            }
        }
        let examples: Vec<&String> = r
            .mix
            .iter()
            .flat_map(|m| m.error_examples.iter())
            .take(5)
            .collect();
        if !examples.is_empty() {
            let _ = writeln!(w, "\nFirst errors:\n");
            for e in examples {
                let _ = writeln!(w, "- `{e}`");
            }
        }
    }

    if !r.rate.is_empty() {
        let _ = writeln!(w, "\n## 3. Fixed rate at half of the peak (open loop)\n");
        let _ = writeln!(
            w,
            "Request n is due at t0 + n/rate whatever happened before; 64 connections take the next due request when free; latency runs from the due time, so queueing behind a slow call is counted (no coordinated omission). Requests alternate send and poll over the 64 agents of the c=64 mix. Peak = best calls/s of the mix at this replica count. `service` is from the moment the request went out; `dispatch lag` is how late it went out (tokio's timer has 1 ms resolution, so up to ~1 ms of lag is the generator's own).\n"
        );
        let _ = writeln!(
            w,
            "| replicas | peak calls/s | target rate | achieved | all p50 / p90 / p99 / p99.9 / max ms | send p50 / p99 | inbox p50 / p99 | service p50 / p99 | dispatch lag p50 / p99 | errors | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
        for x in &r.rate {
            let _ = writeln!(
                w,
                "| {} | {:.0} | {:.0} | {:.0} | {:.2} / {:.2} / {:.2} / {:.2} / {:.1} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {} | {:.2} |",
                x.replicas,
                x.peak_calls,
                x.rate,
                x.achieved,
                x.all.p50,
                x.all.p90,
                x.all.p99,
                x.all.p999,
                x.all.max,
                x.send.p50,
                x.send.p99,
                x.inbox.p50,
                x.inbox.p99,
                x.service.p50,
                x.service.p99,
                x.lag.p50,
                x.lag.p99,
                x.errors,
                x.other_cores
            );
        }
    }

    if !r.search.is_empty() {
        let _ = writeln!(w, "\n## 4. Search\n");
        let seeds: Vec<String> = r
            .search_seed
            .iter()
            .map(|(n, t, rebuilt)| format!("{n} in {t:.0} s{}", if *rebuilt { " (plain indexes dropped for the load and rebuilt from their own definitions)" } else { "" }))
            .collect();
        let _ = writeln!(
            w,
            "Directory bulk-loaded with `generate_series` (not through the API): names like `invoice-assistant-123`, descriptions composed from 20 roles, 20 teams, 40 capabilities, 20 tools and extra sentences, 60 projects with a skewed distribution; 20 rare words, each in ~1 of 10,000 descriptions. Then `VACUUM ANALYZE`. {SEARCH_WORKERS} closed-loop connections, one replica, queries rotated within a category, `limit` 10. Seeding (cumulative): {}.\n",
            seeds.join(", ")
        );
        let _ = writeln!(
            w,
            "| agents | category | e.g. | p50 ms | p90 ms | p99 ms | max ms | calls | avg results | empty | errors |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
        for x in &r.search {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.1} | {} | {} |",
                x.size,
                x.category,
                x.example,
                x.lat.p50,
                x.lat.p90,
                x.lat.p99,
                x.lat.max,
                x.lat.count,
                x.avg_results,
                x.empty,
                x.errors
            );
        }
    }

    if !r.growth.is_empty() {
        let _ = writeln!(w, "\n## 5. Inbox growth\n");
        let _ = writeln!(
            w,
            "History bulk-loaded with `generate_series` (not through the API; foreign-key triggers off for the loading sessions; for the large size the plain secondary indexes are dropped during the load and rebuilt from their own definitions, so they come out freshly packed) over {GROWTH_AGENTS} agents: every message of the {GROWTH_MEASURED} measured agents read, 1 in 100 of the others' left unread; then `VACUUM ANALYZE` and `CHECKPOINT`. Measured with the open-loop send+poll schedule below saturation (same rate both times), {GROWTH_MEASURED} connections. Bulk load to the large size took {:.0} s.\n",
            r.growth_seed_secs
        );
        let _ = writeln!(
            w,
            "| history messages | messages table + indexes | rate calls/s | inbox p50 / p90 / p99 ms | send p50 / p99 ms | poll statement: mean µs, blocks/call | send statement: mean µs, blocks/call | errors | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
        for g in &r.growth {
            let _ = writeln!(
                w,
                "| {} | {:.0} MB | {:.0} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {} | {} | {} | {:.2} |",
                g.history,
                g.table_mb,
                g.rate,
                g.inbox.p50,
                g.inbox.p90,
                g.inbox.p99,
                g.send.p50,
                g.send.p99,
                g.poll_db
                    .map_or("—".into(), |(us, b)| format!("{us:.0} µs, {b:.1}")),
                g.send_db
                    .map_or("—".into(), |(us, b)| format!("{us:.0} µs, {b:.1}")),
                g.errors,
                g.other_cores
            );
        }
    }

    if !r.mem.is_empty() {
        let _ = writeln!(w, "\n## 6. Memory per replica\n");
        let _ = writeln!(
            w,
            "From /proc/PID/status. Idle: after start-up (migrations), `/health` and one MCP handshake, 1 s later. Loaded: at the end of the phases named, VmHWM is the peak.\n"
        );
        let _ = writeln!(
            w,
            "| replica | idle VmRSS MB | after load VmRSS MB | peak VmHWM MB | load |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|");
        for m in &r.mem {
            let _ = writeln!(
                w,
                "| {} | {:.1} | {:.1} | {:.1} | {} |",
                m.role,
                mb(m.idle.rss_kb),
                mb(m.loaded.rss_kb),
                mb(m.loaded.hwm_kb),
                m.phase
            );
        }
    }
    s
}
