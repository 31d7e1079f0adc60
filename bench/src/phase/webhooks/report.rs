//! Webhooks in `RESULTS.md`: the row of the table of targets and section 9.

use std::fmt::Write as _;

use super::{
    HOOK_IN_FLIGHT, HOOK_PER_AGENT, HOOK_RATE_CONNECTIONS, HOOK_RATE_MAX, HOOK_RATE_MIN, HookReport,
};
use crate::cli::Opts;
use crate::mode::{Mode, WAIT_SAMPLE_EVERY};
use crate::phase::ab::{
    AB_COLUMNS, AB_SENDERS, AbRun, SETTINGS_WORKERS, ab_ratios, ab_row, mean_rate, median_ratio,
};
use crate::report::verdict;
use crate::stats::CpuUse;

/// Every message's POST arrives, once.
pub(crate) fn target_row(x: &HookReport) -> String {
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

/// Section 9.
pub(crate) fn section(w: &mut String, x: &HookReport, opts: &Opts, mode: &Mode) {
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
