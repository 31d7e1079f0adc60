//! The popular inbox in `RESULTS.md`: its rows of the table of targets and
//! section 8.

use std::fmt::Write as _;

use super::{HOT_LEASE_SECS, HOT_RATE_CONNECTIONS, HOT_SENDERS};
use crate::mode::Mode;
use crate::report::{Report, verdict};

/// ≥ 0.8× the baseline of the same shape, 0 errors, exactly once; p99 ≤
/// 10 ms at half of peak.
pub(crate) fn target_rows(w: &mut String, r: &Report) {
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
}

/// Section 8.
pub(crate) fn section(w: &mut String, r: &Report, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 8. A popular inbox: many senders, many pollers, one recipient\n"
    );
    let _ = writeln!(
        w,
        "What it measures: one agent whose inbox everyone writes to and many workers drain at once — the shape of a shared work queue — where the mix (sections 1–2) gives every agent an inbox of its own. Its own database; agents bulk-inserted with known tokens ({HOT_SENDERS} senders, and a fresh recipient for every run, server's or pgbench's, so runs never share an inbox). Closed loop on c connections (one each, replicas round robin): c/2 senders, each `phone_send {{to: recipient}}` one after another, and c/2 pollers, each `phone_inbox {{limit: 10, wait_seconds: 0}}` with the recipient's token, **with no pause after an empty poll**: an idle poller polls again at once, so empty polls are part of the load, as they would be for workers that spin (the `empty polls` column says how many). Read mode marks what a poll returns read; lease mode is `mode: lease, lease_seconds: {HOT_LEASE_SECS}`, run two ways: `lease + phone_ack`, where each poll that returned messages is followed by one `phone_ack` of all their receipts (a poll and an ack per round), and `lease, ack in next poll`, where each poll passes the receipts of the worker's previous poll as `ack` (one call per round; the worker's last receipts are acknowledged by one `phone_ack` when the load stops). Both are compared with the same pgbench script, which polls and acknowledges in two statements. Each run: `VACUUM (ANALYZE)` and `CHECKPOINT` first, as in the mix; {} s warm-up, {} s measured. Sent and delivered counts come from the database (messages to the run's recipient with `sent_at` / `read_at` in the measured window; an acknowledgement sets `read_at` too, so in lease mode delivered = acknowledged), not from responses. `left at the end`: the backlog when the load stopped (what the drain took): pollers that keep up leave a handful; pollers that fall behind the sends leave a backlog that grows with the run, and their polls come back full (`messages per poll` 10).\n",
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
            if x.lease() && x.acks_ok > 0 {
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
                if b.lease {
                    "lease + ack (two statements)"
                } else {
                    "read"
                },
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
