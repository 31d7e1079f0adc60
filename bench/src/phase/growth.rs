//! `growth`: does an inbox slow down as history piles up? 1,000 agents'
//! history bulk-loaded to 10k messages, then to 1M (quick) or 10M (full);
//! at each size the mix's requests at a fixed rate below saturation, on 16
//! agents whose history is all read. Target: poll latency at 10M ≤ 1.3× at
//! 10k; the mail statement's execution time and pages touched per row (all
//! its shapes; pg_stat_statements) are the evidence free of CPU contention.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::{self, Agent};
use crate::mode::Mode;
use crate::replicas::{QUOTAS_OUT_OF_REACH, pids, start_replicas_env, stop_replicas, targets};
use crate::report::{Report, memory::MemRow, verdict};
use crate::stats::{self, Summary};
use crate::window::sample_window;

const DB_GROWTH: &str = "phone_bench_growth";
const GROWTH_AGENTS: i64 = 1000;
const GROWTH_MEASURED: usize = 16;

pub(crate) struct GrowthRow {
    other_cores: f64,
    /// From pg_stat_statements, the mail statement (all shapes): (exec µs, shared
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

/// Both history sizes, one replica.
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    db::recreate_database(admin, DB_GROWTH).await?;
    let replicas = start_replicas_env(
        opts,
        DB_GROWTH,
        1,
        opts.base_port + 20,
        "growth",
        &QUOTAS_OUT_OF_REACH,
    )
    .await?;
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
            .filter(|x| x.kind().starts_with("mail:"))
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

/// Poll latency at 10M history ≤ 1.3× at 10k.
pub(crate) fn target_rows(w: &mut String, r: &Report) {
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
                "| (same, inside PostgreSQL: contention-free evidence) | mail statement (all shapes) {:.2}× exec time ({:.0} → {:.0} µs per row returned), {:.2}× pages touched ({:.1} → {:.1} per row) | {} |",
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
}

/// Section 5.
pub(crate) fn section(w: &mut String, r: &Report) {
    let _ = writeln!(w, "\n## 5. Inbox growth\n");
    let _ = writeln!(
        w,
        "History bulk-loaded with `generate_series` (not through the API; foreign-key triggers off for the loading sessions; for the large size the plain secondary indexes are dropped during the load and rebuilt from their own definitions, so they come out freshly packed) over {GROWTH_AGENTS} agents: every message of the {GROWTH_MEASURED} measured agents read, 1 in 100 of the others' left unread; then `VACUUM ANALYZE` and `CHECKPOINT`. Measured with the open-loop send+poll schedule below saturation (same rate both times), {GROWTH_MEASURED} connections. Bulk load to the large size took {:.0} s.\n",
        r.growth_seed_secs
    );
    let _ = writeln!(
        w,
        "| history messages | messages table + indexes | rate calls/s | inbox p50 / p90 / p99 ms | send p50 / p99 ms | mail statement (all shapes): exec µs, blocks per row returned | errors | other CPU (cores) |"
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
