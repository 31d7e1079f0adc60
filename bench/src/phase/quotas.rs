//! `quotas`: what the sending quotas cost agents that stay within them.
//! The send+poll pairs of `mix` (16 agents in 8 pairs, closed loop) against
//! two replicas of the same build on one database, one with every quota
//! off (`PHONE_SEND_QUOTA_PER_HOUR`, `PHONE_NEW_RECIPIENT_QUOTA_PER_DAY`,
//! `PHONE_INBOX_UNREAD_MAX`, `PHONE_INBOX_UNREAD_PER_SENDER` = 0) and one
//! with the defaults (on), alternated over rounds, each run after the same
//! settling. Ratio = sends/s with quotas ÷ without, the median of the
//! rounds' ratios.

use std::fmt::Write as _;
use std::time::Instant;

use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load;
use crate::mode::Mode;
use crate::replicas::{start_replicas_env, stop_replicas, targets};
use crate::report::Report;

pub(crate) const DB_QUOTAS: &str = "phone_bench_quotas";
/// Agents of the pairs (8 pairs), as in the mix at c=16.
const AGENTS: usize = 16;
/// Every quota the server has, off.
const OFF: [(&str, &str); 4] = [
    ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
    ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "0"),
    ("PHONE_INBOX_UNREAD_MAX", "0"),
    ("PHONE_INBOX_UNREAD_PER_SENDER", "0"),
];

pub(crate) struct QuotaRun {
    quotas_on: bool,
    round: usize,
    sent_per_s: f64,
    send_p50: f64,
    send_p99: f64,
    errors: String,
}

#[derive(Default)]
pub(crate) struct QuotaReport {
    runs: Vec<QuotaRun>,
}

impl QuotaReport {
    /// Each round's on ÷ off, in round order.
    fn ratios(&self) -> Vec<f64> {
        let rounds = self.runs.iter().map(|r| r.round).max().unwrap_or(0);
        (1..=rounds)
            .filter_map(|round| {
                let rate = |on| {
                    self.runs
                        .iter()
                        .find(|r| r.round == round && r.quotas_on == on)
                        .map(|r| r.sent_per_s)
                };
                Some(rate(true)? / rate(false)?.max(1e-9))
            })
            .collect()
    }

    fn median_ratio(&self) -> f64 {
        let mut xs = self.ratios();
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(0.0)
    }
}

pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
) -> Result<(), String> {
    db::recreate_database(admin, DB_QUOTAS).await?;
    let qdb = db::connect(&pg_url(opts, DB_QUOTAS)).await?;
    let off = start_replicas_env(opts, DB_QUOTAS, 1, opts.base_port + 70, "quotas-off", &OFF).await?;
    let on = start_replicas_env(opts, DB_QUOTAS, 1, opts.base_port + 71, "quotas-on", &[]).await?;
    let names: Vec<String> = (0..AGENTS).map(|i| format!("quota-{i:03}")).collect();
    let agents = load::register(&targets(&off)[0], &names, "bench").await?;
    let mut out = QuotaReport::default();
    for round in 1..=mode.ab_rounds {
        // Alternate which kind goes first, so that neither always runs on
        // the warmer (or busier) side of a round.
        let order = if round % 2 == 1 { [false, true] } else { [true, false] };
        for quotas_on in order {
            let tg = targets(if quotas_on { &on } else { &off });
            db::settle(&qdb).await?;
            db::each(&qdb, &["CHECKPOINT"]).await?;
            let start = tokio::time::Instant::now();
            let wall0 = chrono::Utc::now();
            let o = load::mix(&tg, &agents, start, mode.warmup, mode.measure).await;
            let from = wall0 + chrono::Duration::from_std(mode.warmup).unwrap();
            let to = from + chrono::Duration::from_std(mode.measure).unwrap();
            let (sent, _) = db::count_window(&qdb, &names, from, to).await?;
            let send = o.send.summary();
            let run = QuotaRun {
                quotas_on,
                round,
                sent_per_s: sent as f64 / mode.measure.as_secs_f64(),
                send_p50: send.p50,
                send_p99: send.p99,
                errors: o.errors.describe(),
            };
            say!(
                t0,
                "quotas {} round {round}: sent {:.0}/s, send p99 {:.1} ms, errors {}",
                if quotas_on { "on" } else { "off" },
                run.sent_per_s,
                run.send_p99,
                run.errors
            );
            out.runs.push(run);
        }
    }
    stop_replicas(off).await;
    stop_replicas(on).await;
    report.quotas = Some(out);
    Ok(())
}

pub(crate) fn target_row(w: &mut String, r: &QuotaReport) {
    let ratio = r.median_ratio();
    let rounds: Vec<String> = r.ratios().iter().map(|x| format!("{x:.2}×")).collect();
    let _ = writeln!(
        w,
        "| quotas cost agents within them at most 5% (issue 27: send+poll pairs, c=16, quotas on ÷ off) | {ratio:.2}× (median of the rounds: {}) | {} |",
        rounds.join(", "),
        crate::report::verdict(ratio >= 0.95)
    );
}

pub(crate) fn section(w: &mut String, r: &QuotaReport, mode: &Mode) {
    let _ = writeln!(w, "\n## 11. Quotas on against off\n");
    let _ = writeln!(
        w,
        "The send+poll pairs of section 1 ({AGENTS} agents, 8 pairs, closed loop, one connection each) against two replicas of the same build on one database (`{DB_QUOTAS}`): one with every quota off (`PHONE_SEND_QUOTA_PER_HOUR`, `PHONE_NEW_RECIPIENT_QUOTA_PER_DAY`, `PHONE_INBOX_UNREAD_MAX`, `PHONE_INBOX_UNREAD_PER_SENDER` = 0), one with the defaults (1,000 sends an hour, 100 new recipients a day, 10,000 unread per inbox, 500 per sender: none reached here). Alternated, {} rounds, the first kind of each round alternating; each run after `VACUUM (ANALYZE)` and `CHECKPOINT`, {:.1} s warm-up, {:.1} s measured; sends/s from the database. Headline: the median of the rounds' on ÷ off.\n",
        mode.ab_rounds,
        mode.warmup.as_secs_f64(),
        mode.measure.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Sends with quotas ÷ without: **{:.2}×**.\n",
        r.median_ratio()
    );
    let _ = writeln!(w, "| round | quotas | sent/s (DB) | send p50 / p99 ms | errors |");
    let _ = writeln!(w, "|---|---|---|---|---|");
    for x in &r.runs {
        let _ = writeln!(
            w,
            "| {} | {} | {:.0} | {:.2} / {:.2} | {} |",
            x.round,
            if x.quotas_on { "on (defaults)" } else { "off" },
            x.sent_per_s,
            x.send_p50,
            x.send_p99,
            x.errors
        );
    }
}
