//! The mix in `RESULTS.md`: its rows of the table of targets, and sections
//! 1–2 (throughput against pgbench, cross-checks, CPU per call, the cost of
//! a request without the database, the statements the database ran).

use std::fmt::Write as _;

use crate::db;
use crate::mode::Mode;
use crate::report::{Report, excerpt, verdict};

/// Throughput ≥ 0.8× the raw-SQL baseline, per shape.
pub(crate) fn target_rows(w: &mut String, r: &Report) {
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
}

/// Sections 1–2 (with the fsync rate, when measured).
pub(crate) fn section(w: &mut String, r: &Report, mode: &Mode) {
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
        for x in m.statements.iter().take(8) {
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
