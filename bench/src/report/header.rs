//! The head of `RESULTS.md`: when, how, on what machine and database, with
//! which build, and what was skipped.

use std::{fmt::Write as _, time::Duration};

use super::Report;
use crate::cli::Opts;
use crate::mode::Mode;

/// The lines above the table of targets.
#[allow(clippy::too_many_arguments)]
pub(super) fn write(
    w: &mut String,
    opts: &Opts,
    mode: &Mode,
    r: &Report,
    pg_version: &str,
    settings: &str,
    started_at: chrono::DateTime<chrono::Utc>,
    elapsed: Duration,
    loadavg: &str,
) {
    let (cores, mem_gib, cpu, kernel) = machine();
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
        "- Server: release build, revision {}, PHONE_POOL_SIZE={} per replica, PHONE_WORKER_THREADS=1 (and TOKIO_WORKER_THREADS=1 for older builds: the replicas share the cores with PostgreSQL), RUST_LOG=warn, PHONE_REGISTER_LIMIT=0 (all bench agents register from 127.0.0.1); in the load phases (all but teams, which turns them off, and quotas, which compares on with off) PHONE_SEND_QUOTA_PER_HOUR, PHONE_NEW_RECIPIENT_QUOTA_PER_DAY and PHONE_INBOX_UNREAD_PER_SENDER=1000000 (out of reach: every quota check runs, none refuses); replicas on 127.0.0.1:{}+",
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

pub(crate) fn git_revision() -> String {
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
