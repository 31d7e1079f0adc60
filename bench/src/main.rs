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
//!                   [--only mix,rate,hot,wake,webhooks,policy,quotas,search,growth,teams,fsync]
//!
//! The code: this file parses the options (`cli`), runs the chosen phases in
//! their order and writes the report (`report`). Each phase is a module of
//! `phase`, holding what it measures, its results and its section of
//! `RESULTS.md`. What the phases share lives beside them: `mode` (quick and
//! full sizes), `replicas` (starting and stopping the `phone` servers),
//! `window` (CPU and database counters over a measured window), `db`
//! (PostgreSQL: set-up, bulk seeding, pgbench and pg_test_fsync baselines,
//! what the server stored), `load` (the load generators), `mcp` (the MCP
//! client) and `stats` (latencies, errors, /proc readings).

/// Progress on stderr, with the time since start.
macro_rules! say {
    ($t0:expr, $($arg:tt)*) => {
        eprintln!("[{:>6.1}s] {}", $t0.elapsed().as_secs_f64(), format!($($arg)*))
    };
}

mod cli;
mod db;
mod load;
mod mcp;
mod mode;
mod phase;
mod replicas;
mod report;
mod stats;
mod window;

use std::{process::ExitCode, time::Instant};

use cli::{Opts, pg_url};
use mode::Mode;
use phase::{fsync, growth, hot, mix, policy, quotas, search, wake, webhooks};
use report::Report;

fn main() -> ExitCode {
    let opts = match cli::parse_args() {
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

/// The phases in their order (`--only` picks some), then the report.
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
    if wants("quotas") {
        mode.budget += mode.quota_allowance;
    }
    if opts.only.as_ref().is_some_and(|s| s.contains("before")) {
        mode.budget += mode.quota_allowance * 2;
    }
    let hz = stats::clock_ticks_per_sec();
    let started_at = chrono::Utc::now();
    let loadavg_start = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // The binaries were just built from the working tree: name it now, not
    // at the end, when other commits may have landed.
    let revision = report::git_revision();
    std::fs::create_dir_all("data/bench").map_err(|e| e.to_string())?;

    let admin = db::connect(&pg_url(&opts, "postgres")).await?;
    let db::Cluster {
        version: pg_version,
        settings,
        postmaster,
    } = db::Cluster::prepare(&admin, &opts.pg_dir).await?;
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
        fsync::run(&opts, &mut report, t0).await;
    }

    if wants("mix") || wants("rate") {
        let with_rate = wants("rate");
        mix::run(
            &opts,
            &mode,
            &admin,
            &mut report,
            t0,
            postmaster,
            hz,
            with_rate,
        )
        .await?;
    }

    if wants("hot") {
        hot::run(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("wake") {
        wake::run(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("webhooks") {
        webhooks::run(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("policy") {
        policy::run(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("quotas") {
        quotas::run(&opts, &mode, &admin, &mut report, t0).await?;
    }

    // Only when asked for by name (it needs PHONE_BENCH_BEFORE).
    if opts.only.as_ref().is_some_and(|s| s.contains("before")) {
        quotas::run_before(&opts, &mode, &admin, &mut report, t0).await?;
    }

    // 10k and 100k agents always; 1M (full mode only) after the growth
    // phase, whose 10M is required, if the time budget still allows.
    let (small, big): (Vec<i64>, Vec<i64>) = mode.search_sizes.iter().partition(|&&n| n <= 100_000);
    if wants("search") {
        search::run(
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
        growth::run(&opts, &mode, &admin, &mut report, t0, postmaster, hz).await?;
    }

    if wants("teams") {
        report.teams = Some(phase::teams::run(&opts, &mode, &admin, t0, postmaster, hz).await?);
    }

    if wants("search") && !big.is_empty() {
        search::run_large(&opts, &mode, &admin, &mut report, t0, &big).await?;
    }

    let elapsed = t0.elapsed();
    say!(t0, "done in {:.0} s", elapsed.as_secs_f64());
    let md = report::render(
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
