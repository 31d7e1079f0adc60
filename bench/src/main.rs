//! phone-bench: the load generator and benchmark driver behind `make bench`.
//!
//! It expects a running PostgreSQL (bench/run.sh starts one) and the release
//! `phone` binary next to itself. It starts the replicas, drives `/mcp` over
//! HTTP/1.1 keep-alive with real MCP requests, runs the raw-SQL baselines,
//! and writes a Markdown report.
//!
//!   phone-bench run [--quick] [--pg-port 25432] [--pg-dir data/bench-pg]
//!                   [--out bench/RESULTS.md] [--command "make bench"]
//!                   [--pool-size 16] [--base-port 3101]
//!                   [--only mix,rate,hot,wake,webhooks,policy,search,growth,fsync]

mod db;
mod load;
mod mcp;
mod stats;

use std::{
    collections::{BTreeSet, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use load::{Agent, SearchQuery, hooks, long_poll};
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
    /// Long polls: each quiet window and each send-rate measurement.
    wake_window: Duration,
    wake_warmup: Duration,
    /// Rounds per wake-up pair, and the most time they may take.
    wake_rounds: usize,
    wake_pairs_secs: Duration,
    /// The popular inbox: each closed-loop run (server or pgbench) and the
    /// fixed-rate run, and the time the phase may take.
    hot_warmup: Duration,
    hot_measure: Duration,
    hot_allowance: Duration,
    /// Webhooks and contact policies: recipients per kind, each closed-loop
    /// run's warm-up and measured window, rounds of the comparison (each
    /// kind once per round), the webhook fixed-rate run, the longest wait
    /// for the webhook queue to drain, and the time each phase may take.
    ab_agents: i64,
    ab_warmup: Duration,
    ab_measure: Duration,
    ab_rounds: usize,
    hook_latency: Duration,
    hook_drain: Duration,
    hook_allowance: Duration,
    policy_allowance: Duration,
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
                wake_window: Duration::from_millis(1500),
                wake_warmup: Duration::from_millis(300),
                wake_rounds: 16,
                wake_pairs_secs: Duration::from_secs(8),
                hot_warmup: Duration::from_secs(1),
                hot_measure: Duration::from_secs(4),
                hot_allowance: Duration::from_secs(60),
                ab_agents: 200,
                ab_warmup: Duration::from_millis(300),
                ab_measure: Duration::from_millis(1200),
                ab_rounds: 3,
                hook_latency: Duration::from_secs(3),
                hook_drain: Duration::from_secs(8),
                hook_allowance: Duration::from_secs(18),
                policy_allowance: Duration::from_secs(16),
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
                wake_window: Duration::from_secs(4),
                wake_warmup: Duration::from_secs(1),
                wake_rounds: 40,
                wake_pairs_secs: Duration::from_secs(20),
                hot_warmup: Duration::from_secs(2),
                hot_measure: Duration::from_secs(8),
                hot_allowance: Duration::from_secs(150),
                ab_agents: 1000,
                ab_warmup: Duration::from_secs(1),
                ab_measure: Duration::from_secs(4),
                ab_rounds: 3,
                hook_latency: Duration::from_secs(8),
                hook_drain: Duration::from_secs(20),
                hook_allowance: Duration::from_secs(50),
                policy_allowance: Duration::from_secs(50),
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
/// Run before each measured run of the mix database (server or pgbench).
const SETTLE: &str = "VACUUM (ANALYZE) messages, agents";
const DB_SEARCH: &str = "phone_bench_search";
const DB_GROWTH: &str = "phone_bench_growth";
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
/// pg_stat_activity sampling during the send-rate windows.
const WAIT_SAMPLE_EVERY: Duration = Duration::from_millis(50);
const DB_HOT: &str = "phone_bench_hot";
/// Senders of the popular inbox: half of the largest concurrency.
const HOT_SENDERS: usize = 32;
/// Recipients, one per run (server, pgbench, fixed rate), never reused.
const HOT_RECIPIENTS: usize = 16;
/// The lease mode's `lease_seconds`: longer than any run, so a message
/// handed out twice is a duplicate, not a lease that expired.
const HOT_LEASE_SECS: u32 = 60;
/// Connections of the popular inbox's fixed-rate run (as in `rate`).
const HOT_RATE_CONNECTIONS: usize = 64;
/// Longest the drain after a run may take.
const HOT_DRAIN_SECS: u64 = 30;
const DB_HOOKS: &str = "phone_bench_webhooks";
const DB_POLICY: &str = "phone_bench_policy";
/// Closed-loop senders of the webhook and policy comparisons (as in the
/// long polls' send rates); each is on every allow list, with the blocks
/// within the 100 names one `phone_settings` call may change.
const AB_SENDERS: usize = 16;
/// Other agents each policy recipient blocks.
const POLICY_BLOCKS: usize = 50;
/// Connections setting up webhooks and policies, and of the fixed rate.
const SETTINGS_WORKERS: usize = 8;
const HOOK_RATE_CONNECTIONS: usize = 8;
/// The fixed rate of the webhook latency run: a tenth of the closed-loop
/// rate to agents without webhooks, within these bounds (sends/s).
const HOOK_RATE_MIN: f64 = 20.0;
const HOOK_RATE_MAX: f64 = 200.0;
/// The server's own limits on deliveries in flight (src/webhooks/mod.rs),
/// for the report.
const HOOK_IN_FLIGHT: usize = 32;
const HOOK_PER_AGENT: usize = 4;

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
    start_replicas_env(opts, database, n, first_port, role, &[]).await
}

/// `start_replicas` with more environment variables for the replicas.
async fn start_replicas_env(
    opts: &Opts,
    database: &str,
    n: usize,
    first_port: u16,
    role: &str,
    env: &[(&str, &str)],
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
            .envs(env.iter().copied())
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
    /// From pg_stat_statements, the send+poll statement: (exec µs, shared
    /// blocks) per row it returned (one per send, one per message a poll
    /// took or per empty poll: about one per tool call here).
    mail_db: Option<(f64, f64)>,
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

/// Wake-up latency: from a send to the waiting poll's response.
#[derive(Default)]
struct WakeLatRow {
    case: String,
    /// The case in a few words, for the targets table.
    short: String,
    /// The send itself, request to response.
    send: Summary,
    from_send: Summary,
    from_send_response: Summary,
    /// Polls answered before the send's own response arrived.
    answered_first: u64,
    /// Notifications on the mail channel while the case ran.
    notifications: u64,
    once: Once,
    errors: String,
    error_count: u64,
}

/// Closed-loop sends to one kind of recipient.
struct SendRateRow {
    case: &'static str,
    secs: f64,
    sent_db: i64,
    sends_ok: u64,
    lat: Summary,
    errors: String,
    error_count: u64,
    /// What the recipients' side did, when someone waited for the mail.
    receivers: String,
    /// Active backends by wait event, averaged over the window.
    waits: Vec<(String, f64)>,
    /// Every statement the database ran (the recipients' polls included)
    /// per send, warm-up included (pg_stat_statements).
    statements_per_send: Option<f64>,
    /// Notifications on the mail channel meanwhile, and sends stored.
    notifications: u64,
    all_sent: i64,
}

impl SendRateRow {
    fn per_s(&self) -> f64 {
        self.sent_db as f64 / self.secs
    }
}

/// Load while nothing happens but (maybe) waiting.
struct QuietRow {
    case: String,
    /// Rows in `inbox_waiters` of the swarm, before and after the window.
    waiting: (i64, i64),
    /// pg_stat_statements of the database, from reset to read.
    stmt_secs: f64,
    statements: i64,
    /// The most frequent: (kind, excerpt, calls).
    top: Vec<(&'static str, String, i64)>,
    commits: i64,
    cpu: CpuUse,
    /// VmRSS summed over the replicas, after the window.
    rss_kb: u64,
}

impl QuietRow {
    fn statements_per_s(&self) -> f64 {
        self.statements as f64 / self.stmt_secs.max(1e-9)
    }
    fn cores(&self, cpu_s: f64) -> f64 {
        cpu_s / self.cpu.wall.max(1e-9)
    }
}

/// Sends racing a long poll's registration.
struct RaceResult {
    long_polls: u64,
    missed: u64,
    /// The latest a missed poll's message was stored after the poll began.
    stored_by: Duration,
    once: Once,
    errors: String,
}

impl RaceResult {
    fn describe(&self) -> String {
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
struct Once {
    sent: usize,
    stored: i64,
    unread: i64,
    received: usize,
    duplicates: usize,
    /// Sent ids no poll returned.
    missing: usize,
}

impl Once {
    fn check(sent: &[String], received: &[String], (stored, unread): (i64, i64)) -> Self {
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
    fn ok(&self) -> bool {
        self.stored == self.sent as i64
            && self.received == self.sent
            && self.duplicates == 0
            && self.missing == 0
            && self.unread == 0
    }
    fn describe(&self) -> String {
        format!(
            "{} sent, {} stored, {} returned, {} duplicates, {} missing, {} unread",
            self.sent, self.stored, self.received, self.duplicates, self.missing, self.unread
        )
    }
}

/// Exactly once for one popular-inbox run, from what the bench saw (ids
/// the sends returned, ids the polls handed out, ids the acknowledgements
/// confirmed; the drain after the run included) against every message of
/// the run's recipient in the database after the drain.
#[derive(Clone, Copy, Debug, Default)]
struct HotOnce {
    lease: bool,
    sent: usize,
    stored: usize,
    /// Send responses whose id the database does not hold.
    not_stored: usize,
    handed_out: usize,
    /// Read mode: ids handed out more than once. Lease mode: ids handed
    /// out again while an earlier lease of theirs was live.
    duplicates: usize,
    /// Lease mode: handed out again after the earlier lease expired.
    released: usize,
    acked: usize,
    /// Lease mode: ids acknowledged by more than one `phone_ack`.
    double_acked: usize,
    /// Stored messages never delivered (read: never handed out; lease:
    /// never acknowledged), plus sends that were not stored.
    lost: usize,
    /// The database after the drain: messages still unread (read mode)
    /// or unacknowledged (lease mode), and messages leased more than once.
    undelivered_db: usize,
    redelivered_db: usize,
    /// Messages the drain took after the run (the backlog at its end).
    drained: u64,
}

impl HotOnce {
    fn check(
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

    fn ok(&self) -> bool {
        self.stored > 0
            && self.not_stored == 0
            && self.duplicates == 0
            && self.double_acked == 0
            && self.lost == 0
            && self.undelivered_db == 0
    }

    fn describe(&self) -> String {
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

/// One popular-inbox run against the server.
struct HotRow {
    lease: bool,
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
        if self.lease { "lease + ack" } else { "read" }
    }
}

/// The pgbench run of one popular-inbox shape.
struct HotBase {
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

#[derive(Default)]
struct WakeReport {
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

/// One closed-loop run of the webhook or policy comparison: `AB_SENDERS`
/// senders, each walking over one kind of recipient.
struct AbRun {
    /// 'a' the baseline, 'b' the same sends to the other kind, 'c' (policy
    /// only) half of the senders not on the allow lists.
    key: char,
    case: &'static str,
    round: usize,
    secs: f64,
    /// Stored by the senders, from the database: inside the measured
    /// window, and over the whole run (warm-up and stragglers included).
    sent_db: i64,
    all_sent: i64,
    /// Answers inside the window: stored, refused by the policy.
    ok: u64,
    refused: u64,
    /// Answers over the whole run, and `refused_sends` rows of the run.
    ok_total: u64,
    refused_total: u64,
    refused_db: i64,
    lat: Summary,
    errors: String,
    error_count: u64,
    error_examples: Vec<String>,
    cpu: CpuUse,
    /// Every statement the database ran (pg_stat_statements) per send
    /// answered, warm-up and webhook deliveries included.
    statements_per_send: Option<f64>,
    hooks: Option<HookWindow>,
    split: Option<RefusalSplit>,
    /// Active backends by wait event, averaged over the window.
    waits: Vec<(String, f64)>,
    /// When the run began (the database's clock is this machine's), and
    /// per sender its (stored, refused) answers.
    started: chrono::DateTime<chrono::Utc>,
    per_sender: Vec<(u64, u64)>,
}

impl AbRun {
    fn per_s(&self) -> f64 {
        self.sent_db as f64 / self.secs
    }
    fn answered_per_s(&self) -> f64 {
        (self.ok + self.refused) as f64 / self.secs
    }
    fn cpu_us(&self, cpu_s: f64) -> f64 {
        cpu_s / (self.ok + self.refused).max(1) as f64 * 1e6
    }
    /// The database holds what the answers said: every stored answer a
    /// message, every refusal a `refused_sends` row.
    fn consistent(&self) -> bool {
        self.all_sent == self.ok_total as i64 && self.refused_db == self.refused_total as i64
    }
}

/// Mean sends/s (DB) of the runs of one kind.
fn mean_rate(runs: &[AbRun], key: char) -> f64 {
    let xs: Vec<f64> = runs
        .iter()
        .filter(|r| r.key == key)
        .map(AbRun::per_s)
        .collect();
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The webhook queue around a run with webhooks.
struct HookWindow {
    /// Deliveries pending when the run started and when its window ended.
    pending_start: i64,
    pending_end: i64,
    /// Deliveries that ended delivered inside the window (DB), and POSTs
    /// the receiver took meanwhile.
    delivered: i64,
    received: usize,
    /// From the end of the sends to an empty queue; None: not within
    /// `hook_drain` (then `pending_after` were left).
    drain_secs: Option<f64>,
    pending_after: i64,
}

/// The half-refused policy run, by sender: contacts (allowed) and the
/// others, each (stored, refused) answers; from the database, what the
/// others had stored and refused.
struct RefusalSplit {
    contacts: (u64, u64),
    others: (u64, u64),
    others_stored_db: i64,
    others_refused_db: i64,
    contacts_refused_db: i64,
}

impl RefusalSplit {
    fn ok(&self) -> bool {
        self.contacts.1 == 0
            && self.others.0 == 0
            && self.others.1 > 0
            && self.others_stored_db == 0
            && self.contacts_refused_db == 0
            && self.others_refused_db == self.others.1 as i64
    }
}

/// Sends at a fixed rate to agents with webhooks: from each send to its
/// POST at the receiver.
struct HookLatency {
    rate: f64,
    secs: f64,
    /// Sends/s of the first closed-loop run to agents without webhooks, and
    /// deliveries/s during the first with webhooks.
    peak: f64,
    capacity: Option<f64>,
    /// Deliveries pending when the run started.
    pending_start: i64,
    sent: usize,
    /// Sent messages whose POST arrived, and those whose did not in time.
    delivered: usize,
    lost: usize,
    /// POSTs beyond the first per `webhook-id`, and POSTs of messages this
    /// run did not send.
    duplicates: usize,
    foreign: usize,
    from_send: Summary,
    from_response: Summary,
    /// POSTs that arrived before the send's own answer.
    before_response: usize,
    send: Summary,
    lag: Summary,
    /// From the end of the sends (the last answer) to the last POST, ms.
    last_post_ms: f64,
    /// From the database: deliveries of these messages by state (state,
    /// count, of them retried), and messages with no delivery queued.
    states: Vec<(String, i64, i64)>,
    no_delivery: i64,
    pending_end: i64,
    errors: String,
    error_count: u64,
}

impl HookLatency {
    fn ok(&self) -> bool {
        self.sent > 0
            && self.delivered == self.sent
            && self.lost == 0
            && self.duplicates == 0
            && self.no_delivery == 0
            && self.error_count == 0
    }
}

struct HookReport {
    agents: i64,
    settings_secs: f64,
    runs: Vec<AbRun>,
    latency: Option<HookLatency>,
    /// Deliveries pending at the phase's end, and the receiver's malformed
    /// POSTs (with examples).
    pending_final: i64,
    malformed: u64,
    malformed_examples: Vec<String>,
}

struct PolicyReport {
    agents: i64,
    settings_secs: f64,
    runs: Vec<AbRun>,
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
    wake: Option<WakeReport>,
    hot: Vec<HotRow>,
    hot_base: Vec<HotBase>,
    hot_rate: Option<RateRow>,
    webhooks: Option<HookReport>,
    policy: Option<PolicyReport>,
    mem: Vec<MemRow>,
    skipped: Vec<String>,
}

// ---------------------------------------------------------------------------

async fn run(opts: Opts) -> Result<(), String> {
    let t0 = Instant::now();
    let mut mode = Mode::new(opts.quick);
    let wants = |phase: &str| opts.only.as_ref().is_none_or(|s| s.contains(phase));
    // The popular inbox brings its own time: the later phases keep theirs.
    if wants("hot") {
        mode.budget += mode.hot_allowance;
    }
    // So do webhooks and contact policies.
    if wants("webhooks") {
        mode.budget += mode.hook_allowance;
    }
    if wants("policy") {
        mode.budget += mode.policy_allowance;
    }
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
                db::each(&bench_db, &[SETTLE, "CHECKPOINT"]).await?;
                let server_pids = pids(&replicas);
                let now = tokio::time::Instant::now();
                let (out, (cpu, _)) = tokio::join!(
                    load::open_loop(&tg, &last_agents, rate, mode.warmup, mode.measure, 64),
                    sample_window(
                        &admin,
                        DB_MIX,
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

    if wants("hot") {
        hot_phase(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("wake") {
        // The swarm holds 1,000 client connections in this one process.
        match stats::open_files_limit() {
            Some(n) if n < WAKE_SWARM as u64 + 256 => report.skipped.push(format!(
                "long polls: {WAKE_SWARM} waiting agents need ~{} open files here, the limit is {n} (raise it: ulimit -n)",
                WAKE_SWARM + 256
            )),
            _ => wake_phase(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?,
        }
    }

    if wants("webhooks") {
        webhook_phase(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("policy") {
        policy_phase(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
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
    // Both runs start alike: the last run's dead row versions vacuumed
    // away (left behind, they cost the next run's polls heap visits) and
    // statistics up to date, rather than autovacuum landing in the middle
    // of one of them.
    db::each(bench_db, &[SETTLE]).await?;
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
            DB_MIX,
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

    db::each(bench_db, &[SETTLE]).await?;
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

/// CPU use and database counters between two instants.
#[allow(clippy::too_many_arguments)]
async fn sample_window(
    admin: &tokio_postgres::Client,
    database: &str,
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
    let c0 = db::counters(admin, database).await;
    let p0 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    tokio::time::sleep_until(to).await;
    let p1 = probe(server_pids.to_vec(), loadgen.to_vec())
        .await
        .expect("probe");
    let c1 = db::counters(admin, database).await;
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
                DB_GROWTH,
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
        let (rows, ms, blocks) = stmts
            .iter()
            .filter(|x| x.kind() == "send+poll")
            .fold((0i64, 0.0f64, 0i64), |(r, m, b), x| {
                (r + x.rows, m + x.total_ms, b + x.blocks)
            });
        let row = GrowthRow {
            mail_db: (rows > 0).then(|| (ms * 1000.0 / rows as f64, blocks as f64 / rows as f64)),
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

/// Seeded agents `{prefix}-1` … `{prefix}-n` (see `db::seed_agents`).
fn seeded_agents(prefix: char, n: usize) -> Vec<Agent> {
    (1..=n as i64)
        .map(|g| Agent {
            name: format!("{prefix}-{g}"),
            token: db::seeded_token(prefix, g),
        })
        .collect()
}

fn names_of(agents: &[Agent]) -> Vec<String> {
    agents.iter().map(|a| a.name.clone()).collect()
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
    let replicas =
        start_replicas(opts, DB_WAKE, WAKE_REPLICAS, opts.base_port + 30, "wake").await?;
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

/// What the parts of the wake phase share.
struct WakeCtx<'a> {
    mode: &'a Mode,
    admin: &'a tokio_postgres::Client,
    /// The bench database, for counts (never used inside a quiet window).
    wdb: tokio_postgres::Client,
    replicas: Vec<Replica>,
    tg: Vec<Target>,
    rows: Arc<db::WaiterRows>,
    notifications: db::NotifyCounter,
    /// The closed-loop senders (s-agents), also the swarm's deliverers.
    senders: Vec<Agent>,
    swarm_ids: Vec<i64>,
    postmaster: u32,
    hz: f64,
}

impl WakeCtx<'_> {
    /// VmRSS summed over the replicas, now.
    fn server_rss_kb(&self) -> u64 {
        self.replicas
            .iter()
            .filter_map(|r| stats::mem(r.pid))
            .map(|m| m.rss_kb)
            .sum()
    }

    /// Closed-loop sends from the s-agents to `recipients`; counted from
    /// the database, with PostgreSQL's wait events sampled alongside.
    async fn send_rate(
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
    async fn quiet_window(&self, case: String) -> QuietRow {
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

/// The swarm: `WAKE_SWARM` long polls; the quiet window while they wait;
/// (b), sends to `passive` agents beside them; then one message each, and
/// every poll must end with it. Returns the (b) row.
async fn wake_swarm(
    ctx: &WakeCtx<'_>,
    swarm: &[Agent],
    passive: &[String],
    w: &mut WakeReport,
    report: &mut Report,
    t0: Instant,
) -> Result<SendRateRow, String> {
    use tokio::time::Instant as TInstant;
    let armed = TInstant::now();
    let mut armed_swarm = long_poll::arm_swarm(
        &ctx.tg,
        swarm,
        WAKE_SWARM_WAIT,
        WAKE_ARM_EVERY,
        armed + Duration::from_secs(20),
    )
    .await;
    // One connection attempt per agent: each error is one agent not waiting.
    let mut errors = std::mem::take(&mut armed_swarm.open_errors);
    w.swarm_opened = swarm.len() - errors.total() as usize;
    let waiting = ctx
        .rows
        .until_waiting(
            &ctx.swarm_ids,
            Duration::from_millis(100),
            armed_swarm.armed_by + Duration::from_secs(10),
        )
        .await?;
    w.swarm_armed_secs = armed.elapsed().as_secs_f64();
    say!(
        t0,
        "wake: {waiting} of {} agents waiting after {:.1} s",
        swarm.len(),
        w.swarm_armed_secs
    );
    // Let the arming's statements and stats settle before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = ctx
        .quiet_window(format!(
            "{} agents waiting (wait_seconds {WAKE_SWARM_WAIT})",
            swarm.len()
        ))
        .await;
    say!(
        t0,
        "wake: with {} waiting {:.1} statements/s, PostgreSQL {:.3} cores",
        loaded.waiting.1,
        loaded.statements_per_s(),
        loaded.cores(loaded.cpu.postgres)
    );
    w.quiet.push(loaded);
    for rep in &ctx.replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!(
                "~{} of {} long polls waiting",
                swarm.len() / ctx.replicas.len(),
                swarm.len()
            ),
        });
    }

    let mut with_swarm = ctx
        .send_rate(
            "(b) to agents nobody waits for, while 1,000 others wait",
            passive,
        )
        .await?;
    with_swarm.receivers = format!(
        "{} of the swarm still waiting after",
        ctx.rows.waiting(&ctx.swarm_ids).await?
    );

    let names = names_of(swarm);
    let notified = ctx.notifications.count();
    let (delivered, deliver_errors) = long_poll::deliver(
        &ctx.tg,
        &ctx.senders,
        &names,
        load::BODY,
        TInstant::now() + Duration::from_secs(20),
    )
    .await;
    errors.merge(deliver_errors);
    let ended = armed_swarm
        .finish(TInstant::now() + Duration::from_secs(WAKE_SWARM_WAIT + 5))
        .await;
    let notifications = ctx.notifications.settled_count().await - notified;
    // Each waiter's task owned its connection: all closed by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.rss_after_swarm_kb = ctx.server_rss_kb();

    let mut row = WakeLatRow {
        case: format!(
            "{} agents waiting, one message each ({} senders at once, replicas round robin)",
            swarm.len(),
            ctx.senders.len()
        ),
        short: format!("{} waiting agents sent one message each", swarm.len()),
        notifications,
        ..WakeLatRow::default()
    };
    let mut send = stats::Lat::default();
    let mut from_send = stats::Lat::default();
    let mut from_response = stats::Lat::default();
    let (mut sent_ids, mut received_ids) = (Vec::new(), Vec::new());
    for ((sent, waiter), name) in delivered.iter().zip(&ended).zip(&names) {
        let Some(waiter) = waiter else {
            errors.add("wake", "no_answer", &format!("{name}: no response in time"));
            continue;
        };
        match (&waiter.received, sent) {
            (Err(e), _) => errors.add("phone_inbox", e.kind(), &e.to_string()),
            (Ok(ids), _) if ids.is_empty() => w.swarm_timed_out += 1,
            (Ok(ids), Some(d)) if ids == std::slice::from_ref(&d.id) => {
                w.swarm_with_message += 1;
                send.record(d.answered - d.sent);
                from_send.record(waiter.answered.saturating_duration_since(d.sent));
                from_response.record(waiter.answered.saturating_duration_since(d.answered));
                row.answered_first += u64::from(waiter.answered < d.answered);
            }
            (Ok(ids), _) => errors.add("wake", "wrong_messages", &format!("{name}: {ids:?}")),
        }
        if let Ok(ids) = &waiter.received {
            received_ids.extend(ids.iter().cloned());
        }
        sent_ids.extend(sent.as_ref().map(|d| d.id.clone()));
    }
    row.send = send.summary();
    row.from_send = from_send.summary();
    row.from_send_response = from_response.summary();
    row.once = Once::check(
        &sent_ids,
        &received_ids,
        db::addressed_to(&ctx.wdb, &ctx.swarm_ids).await?,
    );
    w.swarm_errors = errors.describe();
    row.errors = errors.describe();
    row.error_count = errors.total();
    say!(
        t0,
        "wake: swarm: {} of {} polls ended with their message, {} timed out, errors {}",
        w.swarm_with_message,
        swarm.len(),
        w.swarm_timed_out,
        w.swarm_errors
    );
    w.latency.push(row);
    Ok(with_swarm)
}

/// (c): sends to agents that wait in long polls on the next replica and
/// re-arm as soon as a poll returns; then a last message each stops them.
async fn wake_rearming(ctx: &WakeCtx<'_>, waiters: &[Agent]) -> Result<SendRateRow, String> {
    use tokio::time::Instant as TInstant;
    let names = names_of(waiters);
    let ids = db::ids_by_name(&ctx.wdb, &names).await?;
    let mode = ctx.mode;
    let hard_stop = TInstant::now()
        + mode.wake_warmup
        + mode.wake_window
        + Duration::from_secs(REARM_WAIT + 20);
    let tasks = long_poll::rearming(&ctx.tg, waiters, REARM_WAIT, hard_stop);
    ctx.rows
        .until_waiting(
            &ids,
            Duration::from_millis(10),
            TInstant::now() + Duration::from_secs(5),
        )
        .await?;
    let mut row = ctx
        .send_rate(
            "(c) to agents waiting in long polls (each send wakes one; it re-arms)",
            &names,
        )
        .await?;
    // Every send was answered: a last message each ends their current
    // wait; they then drain what is left and stop.
    let (last, last_errors) = long_poll::deliver(
        &ctx.tg,
        &ctx.senders,
        &names,
        long_poll::LAST_BODY,
        TInstant::now() + Duration::from_secs(10),
    )
    .await;
    let end_by = TInstant::now() + Duration::from_secs(REARM_WAIT + 10);
    let mut out = long_poll::join_rearming(tasks, end_by).await;
    out.errors.merge(last_errors);
    // The closed loop keeps no sent ids: exactly once is what the polls
    // returned (no duplicates) against the database's count, none unread.
    let once = Once::check(
        &out.received_ids,
        &out.received_ids,
        db::addressed_to(&ctx.wdb, &ids).await?,
    );
    row.receivers = format!(
        "{} long polls, {} of them missed a wake-up (waited {REARM_WAIT} s, returned nothing); {} stored, {} returned, {} duplicates, {} unread (incl. {} last messages); waiter errors {}",
        out.long_polls,
        out.empty_long_polls,
        once.stored,
        once.received,
        once.duplicates,
        once.unread,
        last.iter().flatten().count(),
        out.errors.describe()
    );
    if !once.ok() {
        row.error_count += 1;
        row.errors = format!("{} + not delivered exactly once", row.errors);
    }
    if out.empty_long_polls > 0 {
        row.error_count += out.empty_long_polls;
        row.errors = format!("{} + {} missed wake-ups", row.errors, out.empty_long_polls);
    }
    row.error_count += out.errors.total();
    Ok(row)
}

/// Wake-up pairs, in parallel, one per waiter (the senders are the
/// s-agents): waiter on replica k+1, sender on replica k. Also returns the
/// number of long polls.
async fn wake_pairs(
    ctx: &WakeCtx<'_>,
    waiters: &[Agent],
    rounds: usize,
    wait_seconds: u64,
    send_when: long_poll::SendWhen,
) -> Result<(WakeLatRow, long_poll::PairsOutcome), String> {
    let ids = db::ids_by_name(&ctx.wdb, &names_of(waiters)).await?;
    let pairs: Vec<long_poll::Pair> = waiters
        .iter()
        .zip(&ctx.senders)
        .zip(&ids)
        .map(|((waiter, sender), &waiter_id)| long_poll::Pair {
            sender: sender.clone(),
            waiter: waiter.clone(),
            waiter_id,
        })
        .collect();
    let plan = long_poll::PairPlan {
        rounds,
        wait_seconds,
        send_when,
        deadline: tokio::time::Instant::now() + ctx.mode.wake_pairs_secs,
    };
    let notified = ctx.notifications.count();
    let out = long_poll::pairs(&ctx.tg, &pairs, ctx.rows.clone(), plan).await;
    let notifications = ctx.notifications.settled_count().await - notified;
    let once = Once::check(
        &out.sent_ids,
        &out.received_ids,
        db::addressed_to(&ctx.wdb, &ids).await?,
    );
    let (case, short) = match pairs.len() {
        1 => (
            "1 pair alone: poll waiting on replica 2, send through replica 1".to_owned(),
            "wake-up across replicas (1 pair alone)".to_owned(),
        ),
        n => (
            format!("{n} pairs in parallel: poll waiting on replica k+1, send through replica k"),
            format!("wake-up across replicas ({n} pairs in parallel)"),
        ),
    };
    let row = WakeLatRow {
        case,
        short,
        send: out.send.summary(),
        from_send: out.from_send.summary(),
        from_send_response: out.from_send_response.summary(),
        answered_first: out.poll_answered_first,
        notifications,
        once,
        errors: out.errors.describe(),
        error_count: out.errors.total(),
    };
    Ok((row, out))
}

/// The popular inbox: one recipient, written to by many senders and
/// polled by many pollers at once (read mode, then lease mode with one
/// `phone_ack` per poll), at 1 and 3 replicas and 16 and 64 connections,
/// each shape against a pgbench run of the same shape on the same
/// database (at 1 replica, right before the server's run); then a fixed
/// rate at half the read mode's peak on 1 replica. Every run has a
/// recipient of its own, and after each server run a drain empties its
/// inbox so that exactly once can be checked against the database.
async fn hot_phase(
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
        let replicas =
            start_replicas(opts, DB_HOT, r, opts.base_port + 40, &format!("hot-{r}r")).await?;
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
        for lease in [false, true] {
            for &c in &CONCURRENCY {
                let shape = format!(
                    "popular inbox, {} mode, {r} replica{}, c={c}",
                    if lease { "lease" } else { "read" },
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
                if r == 1 {
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
                    lease_secs,
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

/// The pgbench run of one popular-inbox shape (`db::hot_script`), counted
/// from the database over the same window as the server's runs: pgbench
/// runs warm-up + measured seconds, and the window starts a warm-up after
/// it was started (its clients are connected by then).
#[allow(clippy::too_many_arguments)]
async fn hot_baseline(
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
    db::each(hdb, &[SETTLE, "CHECKPOINT"]).await?;
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
async fn hot_run(
    mode: &Mode,
    hdb: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    replicas: &[Replica],
    tg: &[Target],
    postmaster: u32,
    hz: f64,
    (senders, recipient): (&[Agent], &Agent),
    lease: Option<u32>,
    r: usize,
    c: usize,
) -> Result<HotRow, String> {
    let hot = db::ids_by_name(hdb, std::slice::from_ref(&recipient.name)).await?[0];
    let hot_mode = match lease {
        Some(seconds) => load::HotMode::Lease { seconds },
        None => load::HotMode::Read,
    };
    db::each(hdb, &[SETTLE, "CHECKPOINT"]).await?;
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
        lease: lease.is_some(),
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
async fn hot_rate(
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
    db::each(hdb, &[SETTLE, "CHECKPOINT"]).await?;
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

/// What the runs of the webhook and policy comparisons share.
struct AbCtx<'a> {
    mode: &'a Mode,
    admin: &'a tokio_postgres::Client,
    /// The phase's database, for counts.
    db: &'a tokio_postgres::Client,
    database: &'static str,
    replicas: &'a [Replica],
    tg: Vec<Target>,
    senders: Vec<Agent>,
    postmaster: u32,
    hz: f64,
}

impl AbCtx<'_> {
    fn sender_names(&self) -> Vec<String> {
        names_of(&self.senders)
    }

    /// One closed-loop run from the senders to `recipients`; inboxes
    /// emptied (marked read), `VACUUM (ANALYZE)` and `CHECKPOINT` first.
    /// With `receiver`, the webhook queue is read at the window's edges and
    /// (for a run that queued deliveries) waited for until it is empty.
    async fn run(
        &self,
        key: char,
        case: &'static str,
        round: usize,
        recipients: &[String],
        receiver: Option<&hooks::Receiver>,
    ) -> Result<AbRun, String> {
        let mode = self.mode;
        db::mark_all_read(self.db).await?;
        db::each(self.db, &[SETTLE, "CHECKPOINT"]).await?;
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
async fn configure(
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

/// Webhooks: closed-loop sends to agents without webhooks (a) and with
/// them (b), alternated, 1 replica with `PHONE_WEBHOOK_ALLOW_PRIVATE=true`,
/// every webhook pointing at a receiver in this process; after the first
/// (b) and its drain, sends at a fixed rate to the agents with webhooks,
/// each matched with its POST.
async fn webhook_phase(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    let phase_end = Instant::now() + mode.hook_allowance + Duration::from_secs(20);
    db::recreate_database(admin, DB_HOOKS).await?;
    let receiver = hooks::Receiver::start().await?;
    let replicas = start_replicas_env(
        opts,
        DB_HOOKS,
        1,
        opts.base_port + 50,
        "webhooks",
        &[("PHONE_WEBHOOK_ALLOW_PRIVATE", "true")],
    )
    .await?;
    let hdb = db::connect(&pg_url(opts, DB_HOOKS)).await?;
    let n = mode.ab_agents;
    // s: senders; n: recipients without webhooks; h: with.
    for (prefix, k) in [('s', AB_SENDERS as i64), ('n', n), ('h', n)] {
        db::seed_agents(&hdb, prefix, "webhooks", k).await?;
    }
    db::each(&hdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
    let tg = targets(&replicas);
    let hooked = seeded_agents('h', n as usize);
    let url_of = |a: &Agent| format!("http://127.0.0.1:{}/hook/{}", receiver.port, a.name);
    let calls = hooked
        .iter()
        .map(|a| (a.clone(), serde_json::json!({"webhook_url": url_of(a)})))
        .collect();
    let settings_secs = configure(&tg, calls, "webhooks", |a, v| {
        let url = v.get("webhook_url").and_then(serde_json::Value::as_str);
        let secret = v.get("webhook_secret").and_then(serde_json::Value::as_str);
        let active = v.get("webhook_active").and_then(serde_json::Value::as_bool);
        if url == Some(url_of(a).as_str())
            && secret.is_some_and(|s| s.starts_with("whsec_"))
            && active == Some(true)
        {
            Ok(())
        } else {
            Err(format!("{}: unexpected answer {v}", a.name))
        }
    })
    .await?;
    say!(
        t0,
        "webhooks: 1 replica up, {n} agents given webhooks (phone_settings) in {settings_secs:.1} s"
    );
    let ctx = AbCtx {
        mode,
        admin,
        db: &hdb,
        database: DB_HOOKS,
        replicas: &replicas,
        tg,
        senders: seeded_agents('s', AB_SENDERS),
        postmaster,
        hz,
    };
    let plain = names_of(&seeded_agents('n', n as usize));
    let hooked_names = names_of(&hooked);
    let mut runs: Vec<AbRun> = Vec::new();
    let mut latency = None;
    for round in 0..mode.ab_rounds {
        for key in ['a', 'b'] {
            let (case, recipients, rx) = if key == 'a' {
                ("(a) to agents without webhooks", &plain, None)
            } else {
                (
                    "(b) to agents with webhooks",
                    &hooked_names,
                    Some(&receiver),
                )
            };
            if Instant::now() >= phase_end {
                report.skipped.push(format!(
                    "webhooks: {case}, round {}: the phase's time ran out",
                    round + 1
                ));
                continue;
            }
            let run = ctx.run(key, case, round, recipients, rx).await?;
            say!(
                t0,
                "webhooks {case} #{}: {:.0} sends/s (DB), p99 {:.1} ms, errors {}{}",
                round + 1,
                run.per_s(),
                run.lat.p99,
                run.errors,
                run.hooks.as_ref().map_or(String::new(), |h| format!(
                    "; {} delivered in the window, {} pending at its end, {}",
                    h.delivered,
                    h.pending_end,
                    h.drain_secs.map_or(
                        format!(
                            "{} still pending after {} s",
                            h.pending_after,
                            mode.hook_drain.as_secs()
                        ),
                        |s| format!("drained {s:.1} s after the sends")
                    )
                ))
            );
            let capacity = run.hooks.as_ref().map(|h| h.delivered as f64 / run.secs);
            runs.push(run);
            if round == 0 && key == 'b' && Instant::now() < phase_end {
                let peak = mean_rate(&runs, 'a');
                let row = hook_latency(&ctx, &receiver, &hooked_names, peak, capacity).await?;
                say!(
                    t0,
                    "webhooks fixed rate {:.0}/s: send -> POST p50 {:.1} ms p99 {:.1} ms; {} sent, {} delivered, {} lost, {} duplicates",
                    row.rate,
                    row.from_send.p50,
                    row.from_send.p99,
                    row.sent,
                    row.delivered,
                    row.lost,
                    row.duplicates
                );
                latency = Some(row);
            }
        }
    }
    let pending_final = db::webhooks_pending(&hdb).await?;
    let (malformed, malformed_examples) = receiver.malformed();
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!("sends to {n} agents with webhooks and {n} without"),
        });
    }
    report.webhooks = Some(HookReport {
        agents: n,
        settings_secs,
        runs,
        latency,
        pending_final,
        malformed,
        malformed_examples,
    });
    drop(ctx);
    stop_replicas(replicas).await;
    Ok(())
}

/// Sends at a fixed rate to the agents with webhooks, well below both
/// peaks: a tenth of `peak` (sends/s without webhooks) and a third of
/// `capacity` (deliveries/s during the first run with webhooks), within
/// bounds; then up to `hook_drain` for every POST to arrive.
async fn hook_latency(
    ctx: &AbCtx<'_>,
    receiver: &hooks::Receiver,
    hooked: &[String],
    peak: f64,
    capacity: Option<f64>,
) -> Result<HookLatency, String> {
    let mode = ctx.mode;
    let rate = (peak / 10.0)
        .min(capacity.map_or(f64::MAX, |c| c / 3.0))
        .clamp(HOOK_RATE_MIN, HOOK_RATE_MAX);
    db::mark_all_read(ctx.db).await?;
    db::each(ctx.db, &[SETTLE, "CHECKPOINT"]).await?;
    let pending_start = db::webhooks_pending(ctx.db).await?;
    let before = receiver.count();
    let out = hooks::paced(
        &ctx.tg,
        &ctx.senders,
        hooked,
        rate,
        mode.hook_latency,
        HOOK_RATE_CONNECTIONS,
    )
    .await;
    let sent_at = tokio::time::Instant::now();
    let sent: HashSet<String> = out.sends.iter().map(|s| s.id.clone()).collect();
    let arrived_all = |arrivals: &[hooks::Arrival]| {
        let seen: HashSet<&str> = arrivals[before.min(arrivals.len())..]
            .iter()
            .map(|a| a.message_id.as_str())
            .filter(|id| sent.contains(*id))
            .collect();
        seen.len() >= sent.len()
    };
    receiver.until(sent_at + mode.hook_drain, arrived_all).await;
    let arrivals = receiver.arrivals();
    let arrivals = &arrivals[before.min(arrivals.len())..];
    let last_post_ms = arrivals.iter().map(|a| a.at).max().map_or(0.0, |last| {
        last.saturating_duration_since(sent_at).as_secs_f64() * 1000.0
    });
    let mut first: std::collections::HashMap<&str, tokio::time::Instant> = Default::default();
    let mut by_webhook_id: HashSet<&str> = HashSet::new();
    let (mut duplicates, mut foreign) = (0, 0);
    for a in arrivals {
        if !by_webhook_id.insert(a.webhook_id.as_str()) {
            duplicates += 1;
        }
        if sent.contains(&a.message_id) {
            first.entry(a.message_id.as_str()).or_insert(a.at);
        } else {
            foreign += 1;
        }
    }
    let (mut from_send, mut from_response) = (stats::Lat::default(), stats::Lat::default());
    let mut before_response = 0;
    for s in &out.sends {
        if let Some(&at) = first.get(s.id.as_str()) {
            from_send.record(at.saturating_duration_since(s.sent));
            from_response.record(at.saturating_duration_since(s.answered));
            before_response += usize::from(at < s.answered);
        }
    }
    let ids: Vec<i64> = out
        .sends
        .iter()
        .filter_map(|s| load::message_number(&s.id))
        .collect();
    let (states, no_delivery) = db::webhook_states(ctx.db, &ids).await?;
    Ok(HookLatency {
        rate,
        secs: mode.hook_latency.as_secs_f64(),
        peak,
        capacity,
        pending_start,
        sent: out.sends.len(),
        delivered: first.len(),
        lost: out.sends.len() - first.len(),
        duplicates,
        foreign,
        from_send: from_send.summary(),
        from_response: from_response.summary(),
        before_response,
        send: out.lat.summary(),
        lag: out.lag.summary(),
        last_post_ms,
        states,
        no_delivery,
        pending_end: db::webhooks_pending(ctx.db).await?,
        errors: out.errors.describe(),
        error_count: out.errors.total(),
    })
}

/// Contact policies: closed-loop sends to `open` agents (a) and to agents
/// with policy `contacts` whose allow lists hold every sender and whose
/// block lists `POLICY_BLOCKS` others (b), alternated, 1 replica; then
/// once (c) to agents whose allow lists hold half of the senders.
async fn policy_phase(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    let phase_end = Instant::now() + mode.policy_allowance + Duration::from_secs(20);
    db::recreate_database(admin, DB_POLICY).await?;
    let replicas = start_replicas(opts, DB_POLICY, 1, opts.base_port + 60, "policy").await?;
    let pdb = db::connect(&pg_url(opts, DB_POLICY)).await?;
    let n = mode.ab_agents;
    // s: senders; o: open recipients; c: contacts, every sender allowed;
    // x: contacts, half of the senders allowed; b: the blocked.
    for (prefix, k) in [
        ('s', AB_SENDERS as i64),
        ('o', n),
        ('c', n),
        ('x', n),
        ('b', POLICY_BLOCKS as i64),
    ] {
        db::seed_agents(&pdb, prefix, "policy", k).await?;
    }
    db::each(&pdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
    let tg = targets(&replicas);
    let senders = seeded_agents('s', AB_SENDERS);
    let sender_names = names_of(&senders);
    // Contacts of the x-agents: the senders at even positions.
    let (contacts, others): (Vec<String>, Vec<String>) = {
        let (even, odd): (Vec<_>, Vec<_>) = sender_names
            .iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        (
            even.into_iter().map(|(_, s)| s.clone()).collect(),
            odd.into_iter().map(|(_, s)| s.clone()).collect(),
        )
    };
    let blocked = names_of(&seeded_agents('b', POLICY_BLOCKS));
    let mut calls = Vec::new();
    for (prefix, allow) in [('c', &sender_names), ('x', &contacts)] {
        for a in seeded_agents(prefix, n as usize) {
            calls.push((
                a,
                serde_json::json!({"contact_policy": "contacts", "allow": allow, "block": blocked}),
            ));
        }
    }
    let settings_secs = configure(&tg, calls, "contact policies", |a, v| {
        let allowed = if a.name.starts_with('c') {
            sender_names.len()
        } else {
            contacts.len()
        };
        let int = |k: &str| v.get(k).and_then(serde_json::Value::as_i64);
        if v.get("contact_policy").and_then(serde_json::Value::as_str) == Some("contacts")
            && int("contacts_total") == Some(allowed as i64)
            && int("blocked_total") == Some(POLICY_BLOCKS as i64)
            && v.get("unknown").is_none()
        {
            Ok(())
        } else {
            Err(format!("{}: unexpected answer {v}", a.name))
        }
    })
    .await?;
    say!(
        t0,
        "policy: 1 replica up, {} agents given policy contacts ({} allowed + {POLICY_BLOCKS} blocked each) in {settings_secs:.1} s",
        2 * n,
        AB_SENDERS
    );
    let ctx = AbCtx {
        mode,
        admin,
        db: &pdb,
        database: DB_POLICY,
        replicas: &replicas,
        tg,
        senders,
        postmaster,
        hz,
    };
    let open = names_of(&seeded_agents('o', n as usize));
    let closed = names_of(&seeded_agents('c', n as usize));
    let half = names_of(&seeded_agents('x', n as usize));
    let mut plan: Vec<(char, &'static str, usize, &[String])> = Vec::new();
    for round in 0..mode.ab_rounds {
        plan.push(('a', "(a) to open agents", round, &open));
        plan.push((
            'b',
            "(b) to agents with policy contacts, every sender allowed",
            round,
            &closed,
        ));
    }
    plan.push((
        'c',
        "(c) to agents with policy contacts, half of the senders allowed",
        0,
        &half,
    ));
    let mut runs = Vec::new();
    for (key, case, round, recipients) in plan {
        if Instant::now() >= phase_end {
            report.skipped.push(format!(
                "policy: {case}, round {}: the phase's time ran out",
                round + 1
            ));
            continue;
        }
        let mut run = ctx.run(key, case, round, recipients, None).await?;
        if key == 'c' {
            let since = run.started;
            // Answers by the senders at even (contacts) or odd positions.
            let by = |odd: bool| {
                run.per_sender
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| (i % 2 == 1) == odd)
                    .fold((0, 0), |(s, r), (_, x)| (s + x.0, r + x.1))
            };
            let (others_stored_db, _) =
                db::count_window(&pdb, &others, since, chrono::Utc::now()).await?;
            run.split = Some(RefusalSplit {
                contacts: by(false),
                others: by(true),
                others_stored_db,
                others_refused_db: db::refused_since(&pdb, &others, since).await?,
                contacts_refused_db: db::refused_since(&pdb, &contacts, since).await?,
            });
        }
        say!(
            t0,
            "policy {case} #{}: {:.0} sends/s stored (DB), {:.0} answered/s, {} refused, p99 {:.1} ms, errors {}",
            round + 1,
            run.per_s(),
            run.answered_per_s(),
            run.refused_total,
            run.lat.p99,
            run.errors
        );
        runs.push(run);
    }
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: "sends to open and contacts-only agents".into(),
        });
    }
    report.policy = Some(PolicyReport {
        agents: n,
        settings_secs,
        runs,
    });
    drop(ctx);
    stop_replicas(replicas).await;
    Ok(())
}

// ---------------------------------------------------------------------------
// The report

/// The distinguishing part of a statement: from what its kind does on.
fn excerpt(q: &str, kind: &str) -> String {
    let key = match kind {
        "send" | "send+poll" => "INSERT INTO messages",
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
        "- Phase lengths: mix {} s measured after {:.1} s warm-up; pgbench {} s; search {:.1} s per category; long polls: {:.1} s windows and sends ({:.1} s warm-up), up to {} rounds per wake-up pair; popular inbox {} s measured after {} s warm-up, its pgbench runs as long; webhooks and contact policies {:.1} s measured after {:.1} s warm-up per run, {} rounds, the webhook fixed rate {} s.",
        mode.measure.as_secs(),
        mode.warmup.as_secs_f64(),
        mode.pgbench_secs,
        mode.search_secs.as_secs_f64(),
        mode.wake_window.as_secs_f64(),
        mode.wake_warmup.as_secs_f64(),
        mode.wake_rounds,
        mode.hot_measure.as_secs(),
        mode.hot_warmup.as_secs(),
        mode.ab_measure.as_secs_f64(),
        mode.ab_warmup.as_secs_f64(),
        mode.ab_rounds,
        mode.hook_latency.as_secs()
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
    for x in &r.hot {
        let _ = writeln!(
            w,
            "| popular inbox ≥ 0.8× raw-SQL baseline of the same shape, 0 errors, exactly once ({}, {} replica{}, c={}: {} senders + {} pollers) | {:.2}× ({:.0} vs {:.0} messages/s, sent + delivered), {} errors, {} | {} |",
            x.mode(),
            x.replicas,
            if x.replicas > 1 { "s" } else { "" },
            x.concurrency,
            x.concurrency / 2,
            x.concurrency / 2,
            x.ratio(),
            x.messages_per_s(),
            x.baseline.unwrap_or(0.0),
            x.error_count,
            if x.once.ok() {
                "0 lost, 0 duplicated".to_owned()
            } else {
                format!(
                    "**{} lost, {} duplicated**",
                    x.once.lost,
                    x.once.duplicates + x.once.double_acked
                )
            },
            verdict(x.ratio() >= 0.8 && x.error_count == 0 && x.once.ok())
        );
    }
    if let Some(x) = &r.hot_rate {
        let worst = x.send.p99.max(x.inbox.p99);
        let _ = writeln!(
            w,
            "| popular inbox p99 ≤ 10 ms at half of peak ({} replica, {:.0} calls/s) | p99 {:.1} ms (send {:.1}, poll {:.1}), {} errors | {} |",
            x.replicas,
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
        if let (Some(pa), Some(pb)) = (a.mail_db, b.mail_db) {
            let _ = writeln!(
                w,
                "| (same, inside PostgreSQL: contention-free evidence) | send+poll statement {:.2}× exec time ({:.0} → {:.0} µs per row returned), {:.2}× pages touched ({:.1} → {:.1} per row) | {} |",
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
    if let Some(wk) = &r.wake {
        for x in &wk.latency {
            let _ = writeln!(
                w,
                "| long polls, {}: every message delivered exactly once, 0 errors (no latency target set) | {} samples, p50 {:.1} ms, p99 {:.1} ms from the send going out; {}; {} errors | {} |",
                x.short,
                x.from_send.count,
                x.from_send.p50,
                x.from_send.p99,
                x.once.describe(),
                x.error_count,
                verdict(x.once.ok() && x.error_count == 0 && x.from_send.count > 0)
            );
        }
        if let Some(race) = &wk.race {
            let _ = writeln!(
                w,
                "| long polls wake for mail sent while they register (README: \"waits until a message for this agent arrives\") | {}; {}; errors {} | {} |",
                race.describe(),
                race.once.describe(),
                race.errors,
                verdict(race.missed == 0 && race.once.ok() && race.long_polls > 0)
            );
        }
        if let [idle, waiting] = &wk.quiet[..] {
            let all_waiting =
                waiting.waiting.0 == WAKE_SWARM as i64 && waiting.waiting.1 == WAKE_SWARM as i64;
            let _ = writeln!(
                w,
                "| {WAKE_SWARM} waiting agents cost no queries (README: \"a waiting agent costs no queries\") | {:.1} statements/s with {} of {WAKE_SWARM} waiting vs {:.1} idle; PostgreSQL {:.3} vs {:.3} cores | {} |",
                waiting.statements_per_s(),
                waiting.waiting.1,
                idle.statements_per_s(),
                waiting.cores(waiting.cpu.postgres),
                idle.cores(idle.cpu.postgres),
                // Half a statement a second of slack: the two windows' edges.
                verdict(all_waiting && waiting.statements_per_s() <= idle.statements_per_s() + 0.5)
            );
        }
        if let [alone, beside, ..] = &wk.rates[..] {
            // Judged on notifications, not on the rate: the rate is as noisy
            // as the machine (±30% between runs here), the count is not.
            let errors = alone.error_count + beside.error_count;
            let _ = writeln!(
                w,
                "| sends to agents nobody waits for do not notify while {WAKE_SWARM} others wait (README: a send notifies only when its recipient is waiting) | {} notifications for {} sends; rate {:.2}× of the rate with nobody waiting ({:.0} vs {:.0} sends/s); {errors} errors | {} |",
                beside.notifications,
                beside.all_sent,
                beside.per_s() / alone.per_s().max(1e-9),
                beside.per_s(),
                alone.per_s(),
                verdict(beside.notifications == 0 && beside.all_sent > 0 && errors == 0)
            );
        }
    }
    if let Some(x) = &r.webhooks {
        let _ = writeln!(w, "{}", webhook_target(x));
    }
    if let Some(x) = &r.policy {
        let _ = writeln!(w, "{}", policy_target(x));
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
            "Agents in pairs; each worker sends to its partner, then polls its own inbox (`limit` 10): sends and polls 1:1, closed loop. Sent and read counts come from the database afterwards (messages of this phase's agents with `sent_at` / `read_at` inside the measured window), not from responses. The baseline is `pgbench -M prepared` at the same concurrency on the same database right after (each run, server's or pgbench's, starts after `VACUUM (ANALYZE)` of the tables and a `CHECKPOINT`): per transaction one `INSERT` (a send) and one `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING` (a poll), each its own autocommit transaction like the server's, same agent pairs, same body, same synchronous_commit. Ratio = server sends/s ÷ pgbench transactions/s.\n"
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
            "| history messages | messages table + indexes | rate calls/s | inbox p50 / p90 / p99 ms | send p50 / p99 ms | send+poll statement: exec µs, blocks per row returned | errors | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
        for g in &r.growth {
            let _ = writeln!(
                w,
                "| {} | {:.0} MB | {:.0} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} | {} | {} | {:.2} |",
                g.history,
                g.table_mb,
                g.rate,
                g.inbox.p50,
                g.inbox.p90,
                g.inbox.p99,
                g.send.p50,
                g.send.p99,
                g.mail_db
                    .map_or("—".into(), |(us, b)| format!("{us:.0} µs, {b:.1}")),
                g.errors,
                g.other_cores
            );
        }
    }

    if let Some(wk) = &r.wake {
        render_wake(w, wk, opts, mode);
    }

    if !r.mem.is_empty() {
        let _ = writeln!(w, "\n## 7. Memory per replica\n");
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
    if !r.hot.is_empty() || !r.hot_base.is_empty() {
        render_hot(w, r, mode);
    }
    if let Some(x) = &r.webhooks {
        render_webhooks(w, x, opts, mode);
    }
    if let Some(x) = &r.policy {
        render_policy(w, x, opts, mode);
    }
    s
}

fn render_hot(w: &mut String, r: &Report, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 8. A popular inbox: many senders, many pollers, one recipient\n"
    );
    let _ = writeln!(
        w,
        "What it measures: one agent whose inbox everyone writes to and many workers drain at once — the shape of a shared work queue — where the mix (sections 1–2) gives every agent an inbox of its own. Its own database; agents bulk-inserted with known tokens ({HOT_SENDERS} senders, and a fresh recipient for every run, server's or pgbench's, so runs never share an inbox). Closed loop on c connections (one each, replicas round robin): c/2 senders, each `phone_send {{to: recipient}}` one after another, and c/2 pollers, each `phone_inbox {{limit: 10, wait_seconds: 0}}` with the recipient's token, **with no pause after an empty poll**: an idle poller polls again at once, so empty polls are part of the load, as they would be for workers that spin (the `empty polls` column says how many). Read mode marks what a poll returns read; lease mode is `mode: lease, lease_seconds: {HOT_LEASE_SECS}`, and each poll that returned messages is followed by one `phone_ack` of all their receipts, so each delivery costs a poll and an ack. Each run: `VACUUM (ANALYZE)` and `CHECKPOINT` first, as in the mix; {} s warm-up, {} s measured. Sent and delivered counts come from the database (messages to the run's recipient with `sent_at` / `read_at` in the measured window; an acknowledgement sets `read_at` too, so in lease mode delivered = acknowledged), not from responses. `left at the end`: the backlog when the load stopped (what the drain took): pollers that keep up leave a handful; pollers that fall behind the sends leave a backlog that grows with the run, and their polls come back full (`messages per poll` 10).\n",
        mode.hot_warmup.as_secs(),
        mode.hot_measure.as_secs()
    );
    let _ = writeln!(
        w,
        "The baseline: `pgbench -M prepared` on the same database, at the same client count, with one script of the same shape: even clients send (the mix baseline's `INSERT`, to the one recipient), odd clients poll it (the mix baseline's `UPDATE … WHERE id IN (SELECT … WHERE recipient_id = <hot> AND read_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING …`; in lease mode the poll sets `leased_until` and `delivery_count` instead, skipping leased and dead messages, and when it took any a second statement acknowledges them by id: `acked_at`, `read_at`, `leased_until = NULL`), each statement its own autocommit transaction; no pause after an empty poll either. It runs at 1 replica right before the server's run of the same shape (the replica idle meanwhile), for warm-up + measured seconds, counted from the database over the same window a warm-up after its start; the 3-replica runs are compared with it too. **messages/s = (sent + delivered) ÷ measured seconds, for both**; ratio = server messages/s ÷ baseline messages/s. Targets: popular inbox ≥ 0.8× the raw-SQL baseline of the same shape; p99 ≤ 10 ms at half of peak.\n"
    );
    let _ = writeln!(
        w,
        "| mode | replicas | conc. (senders + pollers) | sent/s (DB) | delivered/s (DB) | messages/s | send p50 / p99 ms | poll p50 / p99 ms | ack p50 / p99 ms | polls | empty polls | messages per poll | left at the end | errors | baseline messages/s | ratio | exactly once |"
    );
    let _ = writeln!(
        w,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.hot {
        let _ = writeln!(
            w,
            "| {} | {} | {} ({} + {}) | {:.0} | {:.0} | {:.0} | {:.2} / {:.2} | {:.2} / {:.2} | {} | {} | {} | {:.2} | {} | {} | {} | **{:.2}×** | {} |",
            x.mode(),
            x.replicas,
            x.concurrency,
            x.concurrency / 2,
            x.concurrency / 2,
            x.sent_db as f64 / x.secs,
            x.read_db as f64 / x.secs,
            x.messages_per_s(),
            x.send.p50,
            x.send.p99,
            x.poll.p50,
            x.poll.p99,
            if x.lease {
                format!("{:.2} / {:.2}", x.ack.p50, x.ack.p99)
            } else {
                "—".into()
            },
            x.polls_ok,
            x.empty_polls,
            x.messages_returned as f64 / x.polls_ok.max(1) as f64,
            x.once.drained,
            x.errors,
            x.baseline.map_or("—".into(), |b| format!("{b:.0}")),
            x.ratio(),
            if x.once.ok() { "yes" } else { "**no**" }
        );
    }
    if !r.hot_base.is_empty() {
        let _ = writeln!(w, "\nThe pgbench runs (`data/bench/hot-*.pgbench`):\n");
        let _ = writeln!(
            w,
            "| mode | clients (senders + pollers) | sent/s (DB) | delivered/s (DB) | messages/s | pgbench tps (sends and polls) | failed | latency avg ms | PostgreSQL CPU (cores) | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
        for b in &r.hot_base {
            let _ = writeln!(
                w,
                "| {} | {} ({} + {}) | {:.0} | {:.0} | {:.0} | {:.0} | {} | {:.2} | {:.2} | {:.2} |",
                if b.lease { "lease + ack" } else { "read" },
                b.clients,
                b.clients / 2,
                b.clients / 2,
                b.sent_db as f64 / b.secs,
                b.read_db as f64 / b.secs,
                b.messages_per_s(),
                b.tps,
                b.failed,
                b.latency_ms,
                b.cpu.postgres / b.cpu.wall.max(1e-9),
                b.cpu.other() / b.cpu.wall.max(1e-9)
            );
        }
    }
    let _ = writeln!(
        w,
        "\nExactly once, per server run, after a drain (one connection taking what was left, `limit` 100, in lease mode acknowledging each batch): ids the sends returned, ids the polls (and the drain) handed out, ids `phone_ack` confirmed, against every message of the run's recipient in the database. Read mode: a message handed out more than once is a duplicate, one never handed out is lost. Lease mode: a message handed out again while an earlier lease of it was live, or acknowledged by two acks, is a duplicate (one handed out again after its lease expired would not be, but with {HOT_LEASE_SECS} s leases and runs this short there should be none), one never acknowledged is lost. Also from the database: messages left unread / unacknowledged, and messages with `delivery_count` > 1. Where the time goes: statements the database ran per tool call (pg_stat_statements, warm-up included; below 1 when the server writes several calls in one statement), and CPU in cores over the measured window.\n"
    );
    let _ = writeln!(
        w,
        "| mode | replicas | conc. | exactly once | statements per tool call | server CPU (cores) | PostgreSQL CPU (cores) | other CPU (cores) |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|");
    for x in &r.hot {
        let wall = x.cpu.wall.max(1e-9);
        let _ = writeln!(
            w,
            "| {} | {} | {} | {}: {} | {} | {:.2} | {:.2} | {:.2} |",
            x.mode(),
            x.replicas,
            x.concurrency,
            if x.once.ok() { "yes" } else { "**no**" },
            x.once.describe(),
            x.statements_per_call
                .map_or("—".into(), |n| format!("{n:.2}")),
            x.cpu.server / wall,
            x.cpu.postgres / wall,
            x.cpu.other() / wall
        );
    }
    if let Some(x) = &r.hot_rate {
        let _ = writeln!(
            w,
            "\nFixed rate at half of the read mode's peak, 1 replica (open loop, as in section 3, {HOT_RATE_CONNECTIONS} connections): requests alternate a send to the popular recipient (the {HOT_SENDERS} senders in turn) and a read-mode poll of its inbox (`limit` 10, `wait_seconds` 0). Peak = best calls/s (sends + polls) of the read-mode runs at 1 replica. {} s warm-up, {} s measured; latency from the due time. Peak counts sends and polls alike: a server whose sends to the inbox keep up but whose polls of it do not has a peak made mostly of sends, and at half of it its polls queue for the whole run (their latency is then the queue, growing, and `service` stays short).\n",
            mode.hot_warmup.as_secs(),
            mode.hot_measure.as_secs()
        );
        let _ = writeln!(
            w,
            "| replicas | peak calls/s | target rate | achieved | all p50 / p90 / p99 / p99.9 / max ms | send p50 / p99 | poll p50 / p99 | service p50 / p99 | dispatch lag p50 / p99 | errors | other CPU (cores) |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
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
    let examples: Vec<&String> = r
        .hot
        .iter()
        .flat_map(|x| x.error_examples.iter())
        .take(5)
        .collect();
    if !examples.is_empty() {
        let _ = writeln!(w, "\nFirst errors:\n");
        for e in examples {
            let _ = writeln!(w, "- `{e}`");
        }
    }
}

fn render_wake(w: &mut String, wk: &WakeReport, opts: &Opts, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 6. Long polls: wake-ups across replicas, sends beside waiters, the cost of waiting\n"
    );
    let _ = writeln!(
        w,
        "{WAKE_REPLICAS} replicas (PHONE_POOL_SIZE={} each, one LISTEN connection each), their own database; agents bulk-inserted with known tokens (not through the API). A long poll is `phone_inbox {{wait_seconds, limit: 100}}`; the server adds a row to `inbox_waiters` once its first poll found nothing, polls once more, then sleeps until its replica's LISTEN connection relays a `pg_notify` for it. The bench listens on the same channel from a connection of its own, to count notifications (one more listener for PostgreSQL to signal).\n",
        opts.pool_size
    );

    let _ = writeln!(w, "### Wake-up latency\n");
    let _ = writeln!(
        w,
        "Pairs: the waiter calls `phone_inbox {{wait_seconds: {WAKE_PAIR_WAIT}}}` on replica k+1 (its own keep-alive connection); the sender's side checks `inbox_waiters` over SQL every {} ms until the waiter's row is there, waits {} ms more (the poll's re-check after adding its row is then over), then calls `phone_send` on replica k. Latency runs from the send request going out (or from its response arriving) to the waiting poll's response, holding that message, arriving; both clocks are the load generator's. A poll answered before its send's own response counts 0 in the second column. `the send itself`: every send here notifies, and PostgreSQL serialises notifying commits (NOTIFY takes one database-wide lock at commit and holds it through the commit's WAL flush), so sends that wake someone at the same time queue behind each other: compare the pair alone with the pairs in parallel. Each of the {WAKE_PAIRS} pairs in parallel does {} rounds, the pair alone 4 times as many, each within {} s at most. `notifications per send`: what a LISTEN connection of the bench on the server's channel received while the case ran, ÷ its sends: 1.00 means every send saw its recipient's waiter row and notified. The swarm row: the {WAKE_SWARM} agents of the load test below, each sent one message by {WAKE_PAIRS} senders at once (replicas round robin, so two thirds cross replicas). Exactly once: ids the sends returned against ids the polls returned, and the database's count of messages to these agents, none left unread.\n",
        long_poll::ROW_POLL.as_millis(),
        WAKE_GRACE.as_millis(),
        mode.wake_rounds,
        mode.wake_pairs_secs.as_secs()
    );
    let _ = writeln!(
        w,
        "| case | samples | from send out: p50 / p90 / p99 / max ms | from send response: p50 / p90 / p99 / max ms | the send itself: p50 / p99 ms | polls answered before the send's response | notifications per send | exactly once | errors |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for x in &wk.latency {
        let (a, b) = (&x.from_send, &x.from_send_response);
        let _ = writeln!(
            w,
            "| {} | {} | {:.2} / {:.2} / {:.2} / {:.1} | {:.2} / {:.2} / {:.2} / {:.1} | {:.2} / {:.2} | {} | {:.2} | {}: {} | {} |",
            x.case,
            a.count,
            a.p50,
            a.p90,
            a.p99,
            a.max,
            b.p50,
            b.p90,
            b.p99,
            b.max,
            x.send.p50,
            x.send.p99,
            x.answered_first,
            x.notifications as f64 / x.once.sent.max(1) as f64,
            if x.once.ok() { "yes" } else { "**no**" },
            x.once.describe(),
            x.errors
        );
    }

    if let Some(race) = &wk.race {
        let _ = writeln!(
            w,
            "\nSends racing the poll's registration: {WAKE_PAIRS} other pairs, the same way but with `wait_seconds: {RACE_WAIT}`, and each send going out at a random moment 0–{} ms after its poll, without looking at `inbox_waiters` (a long poll polls, adds its row, polls again, then sleeps; a send notifies only if its statement sees the row). A round whose poll did not return its message ends by taking it with a poll that does not wait. **{}**. Exactly once: {}; errors: {}.",
            RACE_WITHIN.as_millis(),
            race.describe(),
            race.once.describe(),
            race.errors
        );
    }

    let _ = writeln!(w, "\n### Send rate with and without waiters\n");
    let _ = writeln!(
        w,
        "{WAKE_PAIRS} closed-loop senders, each on its own connection (replicas round robin), each to its own recipient, one send after another. Sends per second from the database (messages of these senders with `sent_at` in the measured window), not from responses. `statements per send`: every statement the database ran (pg_stat_statements, the recipients' polls included) over the warm-up and the window, ÷ the sends stored meanwhile (below 1 when the server writes several sends in one statement). `notifications per send`: what a LISTEN connection of the bench on the server's channel received over the same time, ÷ the same sends. `PostgreSQL backends by wait`: pg_stat_activity of the bench database sampled every {} ms over the window, active backends per wait event on average (`CPU`: none, running or runnable; `Lock:object` is the lock NOTIFY takes at commit, held until the commit is flushed). (b) runs while the {WAKE_SWARM} agents of the next table wait (their recipients are others, so no send notifies); (a) right after, once they got their messages; (c) to {WAKE_PAIRS} agents that wait in long polls on the next replica and start the next one as soon as one returns: a send that finds its recipient's waiter row notifies and wakes it; one that arrives while the recipient is between polls is taken by its next poll without waiting.\n",
        WAIT_SAMPLE_EVERY.as_millis()
    );
    let _ = writeln!(
        w,
        "| sends | sends/s (DB) | × (a) | send p50 / p90 / p99 ms | send responses (window) | errors | statements per send | notifications per send | PostgreSQL backends by wait | receiving side |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|");
    let base = wk
        .rates
        .iter()
        .find(|x| x.case.starts_with("(a)"))
        .map_or(0.0, SendRateRow::per_s);
    let mut rows: Vec<&SendRateRow> = wk.rates.iter().collect();
    rows.sort_by_key(|x| x.case);
    for x in rows {
        let waits: Vec<String> = x
            .waits
            .iter()
            .filter(|(_, n)| *n >= 0.05)
            .take(4)
            .map(|(what, n)| format!("{what} {n:.1}"))
            .collect();
        let _ = writeln!(
            w,
            "| {} | {:.0} | {:.2}× | {:.2} / {:.2} / {:.2} | {} | {} | {} | {:.2} | {} | {} |",
            x.case,
            x.per_s(),
            x.per_s() / base.max(1e-9),
            x.lat.p50,
            x.lat.p90,
            x.lat.p99,
            x.sends_ok,
            x.errors,
            x.statements_per_send
                .map_or("—".into(), |n| format!("{n:.2}")),
            x.notifications as f64 / x.all_sent.max(1) as f64,
            waits.join(", "),
            if x.receivers.is_empty() {
                "—"
            } else {
                &x.receivers
            }
        );
    }

    let _ = writeln!(w, "\n### What {WAKE_SWARM} waiting agents cost\n");
    let _ = writeln!(
        w,
        "{WAKE_SWARM} agents, each on its own HTTP/1.1 keep-alive connection with its own `initialize` (replicas round robin, ~{} per replica), each in `phone_inbox {{wait_seconds: {WAKE_SWARM_WAIT}}}`; polls started one every {} ms. {} connections opened; all rows in `inbox_waiters` {:.1} s after the first poll. Then, after 1 s to settle, a window of the same length as the idle one measured before the swarm (replicas up, nobody waiting): statements from pg_stat_statements of the bench database (reset at the window's start, read at its end, no bench queries in between), commits from pg_stat_database (backends report them lazily, up to seconds late, so commits of the arming may show up), CPU from /proc (PostgreSQL: the postmaster and all its backends; server: the {WAKE_REPLICAS} replicas), RSS summed over the replicas at the end of the window. Afterwards each waiting agent was sent one message: {} polls ended with their message, {} timed out, errors: {}.\n",
        WAKE_SWARM / WAKE_REPLICAS,
        WAKE_ARM_EVERY.as_millis(),
        wk.swarm_opened,
        wk.swarm_armed_secs,
        wk.swarm_with_message,
        wk.swarm_timed_out,
        wk.swarm_errors
    );
    let _ = writeln!(
        w,
        "| window | waiting (start → end) | statements/s | commits/s | PostgreSQL CPU (cores) | server CPU (cores) | server RSS MB | other CPU (cores) | statements seen |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|");
    for q in &wk.quiet {
        let top: Vec<String> = q
            .top
            .iter()
            .map(|(kind, text, calls)| format!("{calls}× {kind} `{text}`"))
            .collect();
        let _ = writeln!(
            w,
            "| {} ({:.1} s) | {} → {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} | {:.2} | {} |",
            q.case,
            q.cpu.wall,
            q.waiting.0,
            q.waiting.1,
            q.statements_per_s(),
            q.commits as f64 / q.cpu.wall.max(1e-9),
            q.cores(q.cpu.postgres),
            q.cores(q.cpu.server),
            mb(q.rss_kb),
            q.cores(q.cpu.other()),
            if top.is_empty() {
                "none".into()
            } else {
                top.join("; ")
            }
        );
    }
    if let [idle, waiting] = &wk.quiet[..] {
        let per_waiter = (waiting.rss_kb as f64 - idle.rss_kb as f64) / WAKE_SWARM as f64;
        let _ = writeln!(
            w,
            "\nServer memory per waiting agent (its connection, its session and the waiting call): **{per_waiter:.1} KB** (RSS with the swarm − idle RSS, ÷ {WAKE_SWARM}). Once the swarm had its messages and its connections were closed, the replicas' RSS was {:.1} MB (idle: {:.1} MB).",
            mb(wk.rss_after_swarm_kb),
            mb(idle.rss_kb)
        );
    }
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
fn median_ratio(runs: &[AbRun], key: char) -> f64 {
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
fn ab_ratios(runs: &[AbRun], key: char) -> String {
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
fn ab_row(x: &AbRun, base: f64) -> String {
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
                "**no**: {} stored, {} answered; {} refusal rows, {} refused answers",
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

const AB_COLUMNS: &str = "sends/s (DB) | × the mean (a) | send p50 / p90 / p99 ms | errors | stored = answered | statements per send | server µs/send | PostgreSQL µs/send | loadgen µs/send | other CPU (cores) | PostgreSQL backends by wait";

fn webhook_target(x: &HookReport) -> String {
    let errors: u64 = x.runs.iter().map(|r| r.error_count).sum();
    let consistent = x.runs.iter().all(AbRun::consistent);
    match &x.latency {
        Some(l) => format!(
            "| webhooks: every message's POST arrives, once (delivery is at least once, `webhook-id` de-duplicates; no rate or latency target set) | {} sent at {:.0}/s: {} POSTs arrived, {} lost, {} duplicates; send → POST p50 {:.1} ms, p99 {:.1} ms; closed loop to {} agents with webhooks {:.2}× the sends/s to agents without (median of the rounds); {} deliveries pending at the end; {errors} errors | {} |",
            l.sent,
            l.rate,
            l.delivered,
            l.lost,
            l.duplicates,
            l.from_send.p50,
            l.from_send.p99,
            x.agents,
            median_ratio(&x.runs, 'b'),
            x.pending_final,
            verdict(
                l.ok() && x.pending_final == 0 && errors == 0 && consistent && x.malformed == 0
            )
        ),
        None => "| webhooks: every message's POST arrives, once | not measured (the phase's time ran out) | — |".into(),
    }
}

fn policy_target(x: &PolicyReport) -> String {
    let allowed: Vec<&AbRun> = x.runs.iter().filter(|r| r.key != 'c').collect();
    let refused: u64 = allowed.iter().map(|r| r.refused_total).sum();
    let answered: u64 = allowed.iter().map(|r| r.ok_total + r.refused_total).sum();
    let errors: u64 = x.runs.iter().map(|r| r.error_count).sum();
    let consistent = x.runs.iter().all(AbRun::consistent);
    let split = x.runs.iter().find_map(|r| r.split.as_ref());
    format!(
        "| contact policies refuse exactly what they should, 0 errors (issue: policies should not slow sends; no threshold set) | sends to agents with policy contacts (all senders allowed, {POLICY_BLOCKS} others blocked) {:.2}× those to open agents (median of the rounds); {refused} of {answered} allowed sends refused; {}; {errors} errors | {} |",
        median_ratio(&x.runs, 'b'),
        split.map_or("half-refused run not measured".into(), |s| format!(
            "half allowed: {} of {} sends by non-contacts refused, {} of {} by contacts",
            s.others.1,
            s.others.0 + s.others.1,
            s.contacts.1,
            s.contacts.0 + s.contacts.1
        )),
        verdict(refused == 0 && errors == 0 && consistent && split.is_some_and(RefusalSplit::ok))
    )
}

fn render_webhooks(w: &mut String, x: &HookReport, opts: &Opts, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 9. Webhooks: sends to agents with webhooks, and the time to the POST\n"
    );
    let _ = writeln!(
        w,
        "1 replica (PHONE_POOL_SIZE={}, `PHONE_WEBHOOK_ALLOW_PRIVATE=true` so that http to 127.0.0.1 is allowed; otherwise the server's defaults: at most {HOOK_IN_FLIGHT} deliveries in flight per replica, {HOOK_PER_AGENT} per agent), its own database; {AB_SENDERS} senders and {} + {} recipients bulk-inserted with known tokens, then each of {} recipients given a webhook with `phone_settings {{webhook_url: \"http://127.0.0.1:PORT/hook/NAME\"}}` over MCP ({} connections, {:.1} s; each answer checked for the URL, `webhook_active` and a `whsec_` secret). The receiver runs inside phone-bench (an HTTP/1.1 server on a port of the kernel's choosing, on the load generator's one tokio thread): it answers every POST 200 with an empty body and logs its `webhook-id`, the body's `data.id` and the time the body had arrived; a POST without `webhook-timestamp` or a `v1,` signature, of another `type`, or whose `webhook-id` is not `data.id`, counts as malformed ({} so far). Signatures are not verified (no HMAC in the bench).\n",
        opts.pool_size,
        x.agents,
        x.agents,
        x.agents,
        SETTINGS_WORKERS,
        x.settings_secs,
        x.malformed
    );
    let _ = writeln!(
        w,
        "### Send rate with webhooks and without\n\n{AB_SENDERS} closed-loop senders, each on its own connection, one `phone_send` after another, each to the next of the {} recipients of its kind (the senders start at different offsets): (a) agents without webhooks, (b) agents with webhooks, alternated, {} rounds. Each run: every unread message marked read (so that the unread-backlog check of each send costs every run the same), `VACUUM (ANALYZE)`, `CHECKPOINT`, {:.1} s warm-up, {:.1} s measured. Sends/s from the database (messages of the senders with `sent_at` in the window). `stored = answered`: messages stored over the whole run = sends answered with an id. `statements per send`: every statement the database ran (pg_stat_statements; the webhook worker's claims and results included) ÷ sends answered. CPU from /proc over the window, per send answered in it (loadgen includes the receiver). `PostgreSQL backends by wait`: pg_stat_activity of the phase's database sampled every {} ms over the window, active backends per wait event on average (`CPU`: none, running or runnable; `IO:WALSync`, `LWLock:WALWrite`: commits waiting for the disk). `× the mean (a)`: the run's sends/s ÷ the mean of the (a) runs; the headline ratio is the median of each round's (b) ÷ that round's (a), which one run slowed by the rest of the machine moves less. After each (b) run the bench waits up to {} s for the queue (`webhook_deliveries` in state `pending`) to empty before the next run starts.\n",
        x.agents,
        mode.ab_rounds,
        mode.ab_warmup.as_secs_f64(),
        mode.ab_measure.as_secs_f64(),
        WAIT_SAMPLE_EVERY.as_millis(),
        mode.hook_drain.as_secs()
    );
    let _ = writeln!(
        w,
        "Sends to agents with webhooks ÷ without: {}.\n",
        ab_ratios(&x.runs, 'b')
    );
    let _ = writeln!(
        w,
        "| run | {AB_COLUMNS} | queue: pending at start → at the window's end | delivered in the window (DB) / POSTs received | deliveries/s | queue empty after |"
    );
    let _ = writeln!(
        w,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let base = mean_rate(&x.runs, 'a');
    for r in &x.runs {
        let hooks = match &r.hooks {
            Some(h) => format!(
                "{} → {} | {} / {} | {:.0} | {}",
                h.pending_start,
                h.pending_end,
                h.delivered,
                h.received,
                h.delivered as f64 / r.secs,
                h.drain_secs.map_or(
                    format!(
                        "**not within {} s: {} left**",
                        mode.hook_drain.as_secs(),
                        h.pending_after
                    ),
                    |s| format!("{s:.1} s")
                )
            ),
            None => "— | — | — | —".into(),
        };
        let _ = writeln!(w, "| {} | {hooks} |", ab_row(r, base));
    }
    // What a delivery costs beyond its send: CPU of the (b) runs above
    // what their sends would have cost at the (a) runs' rate per send.
    let per_send = |key: char, f: fn(&CpuUse) -> f64| {
        let xs: Vec<&AbRun> = x.runs.iter().filter(|r| r.key == key).collect();
        let cpu: f64 = xs.iter().map(|r| f(&r.cpu)).sum();
        let sends: u64 = xs.iter().map(|r| r.ok + r.refused).sum();
        (cpu, sends)
    };
    let delivered: i64 = x
        .runs
        .iter()
        .filter_map(|r| r.hooks.as_ref().map(|h| h.delivered))
        .sum();
    if delivered > 0 {
        let extra = |f: fn(&CpuUse) -> f64| {
            let (a_cpu, a_sends) = per_send('a', f);
            let (b_cpu, b_sends) = per_send('b', f);
            (b_cpu - a_cpu / a_sends.max(1) as f64 * b_sends as f64) / delivered as f64 * 1e6
        };
        let _ = writeln!(
            w,
            "\nWhat a delivery costs beyond its send (CPU of the (b) windows minus what as many sends cost per send in the (a) windows, ÷ deliveries that ended in the (b) windows): server **{:.0} µs**, PostgreSQL {:.0} µs per delivery.",
            extra(|c| c.server),
            extra(|c| c.postgres)
        );
    }
    if let Some(l) = &x.latency {
        let _ = writeln!(w, "\n### From a send to its POST\n");
        let _ = writeln!(
            w,
            "Right after the first (b) run and its drain ({} deliveries pending at the start): sends at a fixed rate well below both peaks, the lower of a tenth of the first (a) run's sends/s ({:.0}) and a third of the deliveries/s during the first (b) run ({}), within {HOOK_RATE_MIN:.0}–{HOOK_RATE_MAX:.0}/s, for {:.0} s, open loop on {HOOK_RATE_CONNECTIONS} connections (send n due at t0 + n/rate, senders and recipients with webhooks in turn), each send's id and times kept; then up to {} s for every POST to arrive. Latency runs from the send request going out (or from its answer arriving) to its message's first POST arriving at the receiver, both on the load generator's clock. Delivered: sent messages with a POST; lost: without one when the wait ended; duplicates: POSTs beyond the first per `webhook-id`. From the database afterwards: the deliveries of these messages by state (retried: more than one attempt), and messages with none queued.\n",
            l.pending_start,
            l.peak,
            l.capacity.map_or("—".into(), |c| format!("{c:.0}")),
            l.secs,
            mode.hook_drain.as_secs()
        );
        let _ = writeln!(
            w,
            "| rate | sent | delivered | lost | duplicates | send → POST p50 / p90 / p99 / max ms | send's answer → POST p50 / p99 ms | POSTs before the send's answer | send p50 / p99 ms | dispatch lag p99 ms | last POST after the sends ended | deliveries (DB) | errors |"
        );
        let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        let states: Vec<String> = l
            .states
            .iter()
            .map(|(state, n, retried)| format!("{n} {state} ({retried} retried)"))
            .collect();
        let _ = writeln!(
            w,
            "| {:.0}/s | {} | {} | {} | {} | {:.1} / {:.1} / {:.1} / {:.1} | {:.1} / {:.1} | {} | {:.2} / {:.2} | {:.2} | {:.0} ms | {}{}{} | {} |",
            l.rate,
            l.sent,
            l.delivered,
            l.lost,
            l.duplicates,
            l.from_send.p50,
            l.from_send.p90,
            l.from_send.p99,
            l.from_send.max,
            l.from_response.p50,
            l.from_response.p99,
            l.before_response,
            l.send.p50,
            l.send.p99,
            l.lag.p99,
            l.last_post_ms,
            states.join(", "),
            if l.no_delivery > 0 {
                format!("; **{} messages with none**", l.no_delivery)
            } else {
                String::new()
            },
            if l.foreign > 0 {
                format!("; {} POSTs of other messages", l.foreign)
            } else {
                String::new()
            },
            l.errors
        );
        let _ = writeln!(
            w,
            "\nQueue at the end of the phase: {} deliveries pending (0: drained); {} pending right after the fixed-rate run's wait.",
            x.pending_final, l.pending_end
        );
    }
    let examples: Vec<&String> = x
        .runs
        .iter()
        .flat_map(|r| r.error_examples.iter())
        .chain(x.malformed_examples.iter())
        .take(5)
        .collect();
    if !examples.is_empty() {
        let _ = writeln!(w, "\nFirst errors:\n");
        for e in examples {
            let _ = writeln!(w, "- `{e}`");
        }
    }
}

fn render_policy(w: &mut String, x: &PolicyReport, opts: &Opts, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 10. Contact policies: sends to agents that choose who may write\n"
    );
    let _ = writeln!(
        w,
        "1 replica (PHONE_POOL_SIZE={}, the server's defaults otherwise), its own database; {AB_SENDERS} senders, {} open recipients, {} + {} recipients with policies and {POLICY_BLOCKS} agents to block, bulk-inserted with known tokens; then each policy recipient set up with one `phone_settings {{contact_policy: \"contacts\", allow: [...], block: [the {POLICY_BLOCKS}]}}` over MCP ({} connections, {:.1} s; each answer checked for the policy and the counts): for (b) all {AB_SENDERS} senders allowed, for (c) the 8 at even positions. The policy, the block list and the contact are decided inside the send's group-commit statement (one `contacts` probe per send, for every recipient, open or not). Same closed loop as the webhook comparison ({AB_SENDERS} senders, each to the next recipient of its kind; each run after marking all mail read, `VACUUM (ANALYZE)`, `CHECKPOINT`; {:.1} s warm-up, {:.1} s measured): (a) and (b) alternated, {} rounds, then (c) once. A refused send is a tool error (the same words for a block and a policy); it is counted apart, not as an error. `stored = answered`: messages stored = sends answered with an id, and `refused_sends` rows = refused answers, over the whole run. The other columns and the headline ratio as in section 9.\n",
        opts.pool_size,
        x.agents,
        x.agents,
        x.agents,
        SETTINGS_WORKERS,
        x.settings_secs,
        mode.ab_warmup.as_secs_f64(),
        mode.ab_measure.as_secs_f64(),
        mode.ab_rounds
    );
    let _ = writeln!(
        w,
        "Sends to agents with policy contacts (every sender allowed, {POLICY_BLOCKS} others blocked) ÷ to open agents: {}.\n",
        ab_ratios(&x.runs, 'b')
    );
    let _ = writeln!(
        w,
        "| run | {AB_COLUMNS} | answered/s (stored + refused) | refused in the window |"
    );
    let _ = writeln!(
        w,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let base = mean_rate(&x.runs, 'a');
    for r in &x.runs {
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} |",
            ab_row(r, base),
            r.answered_per_s(),
            r.refused
        );
    }
    if let Some(s) = x.runs.iter().find_map(|r| r.split.as_ref()) {
        let _ = writeln!(
            w,
            "\n(c), by sender over the whole run: the contacts had {} sends stored and {} refused (expected 0); the others {} stored (expected 0) and {} refused. The database: {} messages from the others, {} `refused_sends` rows of theirs (expected = their refused answers), {} of the contacts'. **{}**.",
            s.contacts.0,
            s.contacts.1,
            s.others.0,
            s.others.1,
            s.others_stored_db,
            s.others_refused_db,
            s.contacts_refused_db,
            if s.ok() {
                "As expected"
            } else {
                "Not as expected"
            }
        );
    }
    let examples: Vec<&String> = x
        .runs
        .iter()
        .flat_map(|r| r.error_examples.iter())
        .take(5)
        .collect();
    if !examples.is_empty() {
        let _ = writeln!(w, "\nFirst errors:\n");
        for e in examples {
            let _ = writeln!(w, "- `{e}`");
        }
    }
}
