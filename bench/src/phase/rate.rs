//! `rate`: the mix's requests (a send, then a poll, over the agents of the
//! c=64 mix) at a fixed rate, half of the mix's best calls/s, open loop:
//! each request is due at its time whatever happened before, and its
//! latency runs from then, so queueing is counted (no coordinated
//! omission). Target: p99 ≤ 10 ms. Runs on the mix's replicas, after it.

use std::{fmt::Write as _, time::Instant};

use super::mix::DB_MIX;
use crate::db;
use crate::load::{self, Agent};
use crate::mcp::Target;
use crate::mode::{Mode, SETTLE};
use crate::replicas::{Replica, pids};
use crate::report::{Report, verdict};
use crate::stats::Summary;
use crate::window::sample_window;

pub(crate) struct RateRow {
    pub(crate) replicas: usize,
    pub(crate) peak_calls: f64,
    pub(crate) rate: f64,
    pub(crate) achieved: f64,
    pub(crate) send: Summary,
    pub(crate) inbox: Summary,
    pub(crate) all: Summary,
    pub(crate) service: Summary,
    pub(crate) lag: Summary,
    pub(crate) errors: String,
    pub(crate) error_count: u64,
    pub(crate) other_cores: f64,
}

/// The fixed rate on `replicas` (`r` of them), half of `peak` calls/s.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    mode: &Mode,
    bench_db: &tokio_postgres::Client,
    admin: &tokio_postgres::Client,
    replicas: &[Replica],
    tg: &[Target],
    last_agents: &[Agent],
    (r, peak): (usize, f64),
    postmaster: u32,
    hz: f64,
    t0: Instant,
) -> Result<RateRow, String> {
    let rate = (peak / 2.0).max(10.0);
    db::each(bench_db, &[SETTLE, "CHECKPOINT"]).await?;
    let server_pids = pids(replicas);
    let now = tokio::time::Instant::now();
    let (out, (cpu, _)) = tokio::join!(
        load::open_loop(tg, last_agents, rate, mode.warmup, mode.measure, 64),
        sample_window(
            admin,
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
    Ok(row)
}

/// p99 ≤ 10 ms at half of peak, per replica count.
pub(crate) fn target_rows(w: &mut String, r: &Report) {
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
}

/// Section 3.
pub(crate) fn section(w: &mut String, r: &Report) {
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
