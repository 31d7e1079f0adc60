//! Two servers side by side, in one run: the send+poll pairs of `mix`
//! (16 agents in 8 pairs, closed loop) against two replicas on one
//! database, alternated over rounds, each run after the same settling;
//! ratio = sends/s of (b) ÷ (a), the median of the rounds' ratios. Each
//! run on a replica started for it.
//!
//! - `quotas`: one replica of this build with every quota off
//!   (`PHONE_SEND_QUOTA_PER_HOUR`, `PHONE_NEW_RECIPIENT_QUOTA_PER_DAY`,
//!   `PHONE_INBOX_UNREAD_MAX`, `PHONE_INBOX_UNREAD_PER_SENDER` = 0), one
//!   with the defaults: what the quotas cost agents within them;
//! - `before` (with `PHONE_BENCH_BEFORE=path/to/an/older/phone`): that
//!   build against this one, both with the defaults, at c=16 and c=64:
//!   a change to the hot path, off against on.

use std::fmt::Write as _;
use std::time::Instant;

use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load;
use crate::mode::Mode;
use crate::replicas::{start_replicas_bin, stop_replicas, targets};
use crate::report::Report;

pub(crate) const DB_QUOTAS: &str = "phone_bench_quotas";
pub(crate) const DB_BEFORE: &str = "phone_bench_before";
/// This build's database in `before`: each build on a schema of its own
/// (a migration that changes what every send writes, such as an index,
/// is part of what is compared).
pub(crate) const DB_AFTER: &str = "phone_bench_after";
/// Every quota the server has, off.
const OFF: [(&str, &str); 4] = [
    ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
    ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "0"),
    ("PHONE_INBOX_UNREAD_MAX", "0"),
    ("PHONE_INBOX_UNREAD_PER_SENDER", "0"),
];

pub(crate) struct QuotaRun {
    /// (b), the second server; (a) the baseline.
    quotas_on: bool,
    agents: usize,
    round: usize,
    sent_per_s: f64,
    send_p50: f64,
    send_p99: f64,
    errors: String,
}

#[derive(Default)]
pub(crate) struct QuotaReport {
    runs: Vec<QuotaRun>,
    /// The older build of `before`.
    before: Option<String>,
    /// `before`'s group sends, each build on its own database.
    teams: Option<crate::phase::teams::TeamsVersus>,
}

impl QuotaReport {
    /// Each round's (b) ÷ (a) at `agents` connections, in round order.
    fn ratios(&self, agents: usize) -> Vec<f64> {
        let rounds = self.runs.iter().map(|r| r.round).max().unwrap_or(0);
        (1..=rounds)
            .filter_map(|round| {
                let rate = |on| {
                    self.runs
                        .iter()
                        .find(|r| r.round == round && r.quotas_on == on && r.agents == agents)
                        .map(|r| r.sent_per_s)
                };
                Some(rate(true)? / rate(false)?.max(1e-9))
            })
            .collect()
    }

    fn median_ratio(&self, agents: usize) -> f64 {
        let mut xs = self.ratios(agents);
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(0.0)
    }

    fn shapes(&self) -> Vec<usize> {
        let mut xs: Vec<usize> = self.runs.iter().map(|r| r.agents).collect();
        xs.sort_unstable();
        xs.dedup();
        xs
    }
}

pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
) -> Result<(), String> {
    report.quotas = Some(versus(opts, mode, admin, t0, None, &[16]).await?);
    Ok(())
}

/// `before`: the build at `PHONE_BENCH_BEFORE` against this one.
pub(crate) async fn run_before(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
) -> Result<(), String> {
    let Ok(before) = std::env::var("PHONE_BENCH_BEFORE") else {
        report
            .skipped
            .push("before: PHONE_BENCH_BEFORE (an older phone binary) not set".into());
        return Ok(());
    };
    let out = versus(
        opts,
        mode,
        admin,
        t0,
        Some(std::path::Path::new(&before)),
        &[16, 64],
    )
    .await?;
    let teams = crate::phase::teams::versus(
        opts,
        mode,
        t0,
        std::path::Path::new(&before),
        [DB_BEFORE, DB_AFTER],
    )
    .await?;
    report.before = Some(QuotaReport {
        teams: Some(teams),
        ..out
    });
    Ok(())
}

/// (a) and (b) alternated, `rounds` of each at each number of agents:
/// quotas off / on (`before` None), or the older build / this one.
async fn versus(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    t0: Instant,
    before: Option<&std::path::Path>,
    shapes: &[usize],
) -> Result<QuotaReport, String> {
    let (databases, port, names) = match before {
        None => (
            [DB_QUOTAS, DB_QUOTAS],
            opts.base_port + 70,
            ["quotas-off", "quotas-on"],
        ),
        Some(_) => (
            [DB_BEFORE, DB_AFTER],
            opts.base_port + 72,
            ["before", "after"],
        ),
    };
    let shared = databases[0] == databases[1];
    let mut qdbs = Vec::new();
    for (i, database) in databases.iter().enumerate() {
        if i == 0 || !shared {
            db::recreate_database(admin, database).await?;
        }
        qdbs.push(db::connect(&pg_url(opts, database)).await?);
    }
    let (env_a, bin_a): (&[(&str, &str)], _) = match before {
        None => (&OFF, None),
        Some(bin) => (&[], Some(bin)),
    };
    // On one database the older build first: it migrates it to its schema,
    // the newer one then adds its own migrations.
    let mut a = start_replicas_bin(opts, databases[0], 1, port, names[0], env_a, bin_a).await?;
    let mut b = start_replicas_bin(opts, databases[1], 1, port + 1, names[1], &[], None).await?;
    let mut out = QuotaReport {
        before: before.map(|p| p.display().to_string()),
        ..QuotaReport::default()
    };
    for &n in shapes {
        let agent_names: Vec<String> = (0..n)
            .map(|i| format!("{}-c{n}-{i:03}", names[0]))
            .collect();
        let agents_a = load::register(&targets(&a)[0], &agent_names, "bench").await?;
        let agents_b = if shared {
            agents_a.clone()
        } else {
            load::register(&targets(&b)[0], &agent_names, "bench").await?
        };
        for round in 1..=mode.ab_rounds {
            // Alternate which kind goes first, so that neither always runs
            // on the warmer (or busier) side of a round.
            let order = if round % 2 == 1 {
                [false, true]
            } else {
                [true, false]
            };
            for second in order {
                // A fresh replica for each run: one replica can keep a pace
                // of its own, ~20% apart, for its whole life (bench/RESULTS.md,
                // the quota rewrite's addendum), which alternating rounds
                // does not cancel; a new process makes each round a new draw.
                if second {
                    stop_replicas(std::mem::take(&mut b)).await;
                    b = start_replicas_bin(opts, databases[1], 1, port + 1, names[1], &[], None)
                        .await?;
                } else {
                    stop_replicas(std::mem::take(&mut a)).await;
                    a = start_replicas_bin(opts, databases[0], 1, port, names[0], env_a, bin_a)
                        .await?;
                }
                let tg = targets(if second { &b } else { &a });
                let (qdb, agents) = if second {
                    (&qdbs[1], &agents_b)
                } else {
                    (&qdbs[0], &agents_a)
                };
                db::settle(qdb).await?;
                db::each(qdb, &["CHECKPOINT"]).await?;
                let start = tokio::time::Instant::now();
                let wall0 = chrono::Utc::now();
                let o = load::mix(&tg, agents, start, mode.warmup, mode.measure).await;
                let from = wall0 + chrono::Duration::from_std(mode.warmup).unwrap();
                let to = from + chrono::Duration::from_std(mode.measure).unwrap();
                let (sent, _) = db::count_window(qdb, &agent_names, from, to).await?;
                let send = o.send.summary();
                let run = QuotaRun {
                    quotas_on: second,
                    agents: n,
                    round,
                    sent_per_s: sent as f64 / mode.measure.as_secs_f64(),
                    send_p50: send.p50,
                    send_p99: send.p99,
                    errors: o.errors.describe(),
                };
                say!(
                    t0,
                    "{} c={n} round {round}: sent {:.0}/s, send p99 {:.1} ms, errors {}",
                    names[usize::from(second)],
                    run.sent_per_s,
                    run.send_p99,
                    run.errors
                );
                out.runs.push(run);
            }
        }
    }
    stop_replicas(a).await;
    stop_replicas(b).await;
    Ok(out)
}

pub(crate) fn target_row(w: &mut String, r: &QuotaReport) {
    for n in r.shapes() {
        let ratio = r.median_ratio(n);
        let rounds: Vec<String> = r.ratios(n).iter().map(|x| format!("{x:.2}×")).collect();
        let _ = match &r.before {
            None => writeln!(
                w,
                "| quotas cost agents within them at most 5% (send+poll pairs, c={n}, quotas on ÷ off) | {ratio:.2}× (median of the rounds: {}) | {} |",
                rounds.join(", "),
                crate::report::verdict(ratio >= 0.95)
            ),
            Some(_) => writeln!(
                w,
                "| this build against the one before (send+poll pairs, c={n}, no target: after ÷ before) | {ratio:.2}× (median of the rounds: {}) | — |",
                rounds.join(", "),
            ),
        };
    }
    if let Some(x) = &r.teams {
        crate::phase::teams::versus_target_row(w, x);
    }
}

pub(crate) fn section(w: &mut String, r: &QuotaReport, mode: &Mode) {
    let (title, a, b) = match &r.before {
        None => (
            "## 11. Quotas on against off".to_string(),
            "off",
            "on (defaults)",
        ),
        Some(bin) => (
            format!("## 12. This build against the one before (`{bin}`)"),
            "before",
            "this build",
        ),
    };
    let _ = writeln!(w, "\n{title}\n");
    let what = match &r.before {
        None => format!(
            "two replicas of the same build on one database (`{DB_QUOTAS}`): one with every quota off (`PHONE_SEND_QUOTA_PER_HOUR`, `PHONE_NEW_RECIPIENT_QUOTA_PER_DAY`, `PHONE_INBOX_UNREAD_MAX`, `PHONE_INBOX_UNREAD_PER_SENDER` = 0), one with the defaults (1,000 sends an hour, 100 new recipients a day, 10,000 unread per inbox, 500 per sender: none reached here)"
        ),
        Some(_) => format!(
            "a replica of the older build (`PHONE_BENCH_BEFORE`) and one of this build, both with the defaults, each on a database of its own migrated by it (`{DB_BEFORE}`, `{DB_AFTER}`: a schema change is part of what is compared)"
        ),
    };
    let _ = writeln!(
        w,
        "The send+poll pairs of section 1 (closed loop, one connection per agent, agents in pairs) against {what}. Alternated, {} rounds, the first kind of each round alternating; each run on a replica started for it, after `VACUUM (ANALYZE)` and `CHECKPOINT`, {:.1} s warm-up, {:.1} s measured; sends/s from the database. Headline: the median of the rounds' ratios.\n",
        mode.ab_rounds,
        mode.warmup.as_secs_f64(),
        mode.measure.as_secs_f64()
    );
    for n in r.shapes() {
        let _ = writeln!(w, "c={n}: {b} ÷ {a}: **{:.2}×**.\n", r.median_ratio(n));
    }
    let _ = writeln!(
        w,
        "| connections | round | server | sent/s (DB) | send p50 / p99 ms | errors |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for x in &r.runs {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.0} | {:.2} / {:.2} | {} |",
            x.agents,
            x.round,
            if x.quotas_on { b } else { a },
            x.sent_per_s,
            x.send_p50,
            x.send_p99,
            x.errors
        );
    }
    if let Some(x) = &r.teams {
        crate::phase::teams::versus_section(w, x);
    }
}
