//! The long polls in `RESULTS.md`: their rows of the table of targets and
//! section 6.

use std::fmt::Write as _;

use super::{
    RACE_WAIT, RACE_WITHIN, SendRateRow, WAKE_ARM_EVERY, WAKE_GRACE, WAKE_PAIR_WAIT, WAKE_PAIRS,
    WAKE_REPLICAS, WAKE_SWARM, WAKE_SWARM_WAIT, WakeReport,
};
use crate::cli::Opts;
use crate::load::long_poll;
use crate::mode::{Mode, WAIT_SAMPLE_EVERY};
use crate::report::{mb, verdict};

/// Exactly once per wake-up case, no missed wake-ups, no queries while
/// waiting, no notifications for agents nobody waits for.
pub(crate) fn target_rows(w: &mut String, wk: &WakeReport) {
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
            "| {WAKE_SWARM} waiting agents cost no queries (README: \"a waiting agent costs no queries\") | {:.1} statements/s with {} of {WAKE_SWARM} waiting vs {:.1} idle, besides the replicas' own timers (LISTEN heartbeat, webhook look, pruning: {:.1} and {:.1}/s); PostgreSQL {:.3} vs {:.3} cores | {} |",
            waiting.untimed_per_s(),
            waiting.waiting.1,
            idle.untimed_per_s(),
            waiting.statements_per_s() - waiting.untimed_per_s(),
            idle.statements_per_s() - idle.untimed_per_s(),
            waiting.cores(waiting.cpu.postgres),
            idle.cores(idle.cpu.postgres),
            // The timers run whoever waits, at their own pace: a 1.5 s
            // window catches a heartbeat of each replica or not. Half a
            // statement a second of slack for the windows' edges.
            verdict(all_waiting && waiting.untimed_per_s() <= idle.untimed_per_s() + 0.5)
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

/// Section 6.
pub(crate) fn section(w: &mut String, wk: &WakeReport, opts: &Opts, mode: &Mode) {
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
