//! `policy`: do contact policies slow sends? Closed-loop sends to (a) open
//! agents and (b) agents with policy `contacts` that allow every sender and
//! block 50 others, alternated over rounds (`ab`); then once (c) to agents
//! that allow only half of the senders: every send of the other half must
//! be refused, none of the contacts', and the database must hold exactly
//! the answered sends and every refusal counted in `refused_sends`.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use super::ab::{
    AB_COLUMNS, AB_SENDERS, AbCtx, AbRun, SETTINGS_WORKERS, ab_ratios, ab_row, configure,
    mean_rate, median_ratio,
};
use super::{names_of, seeded_agents};
use crate::cli::{Opts, pg_url};
use crate::db;
use crate::mode::Mode;
use crate::replicas::{QUOTAS_OUT_OF_REACH, start_replicas_env, stop_replicas, targets};
use crate::report::{Report, memory::MemRow, verdict};
use crate::stats;

const DB_POLICY: &str = "phone_bench_policy";
/// Other agents each policy recipient blocks.
const POLICY_BLOCKS: usize = 50;

/// The half-refused policy run, by sender: contacts (allowed) and the
/// others, each (stored, refused) answers; from the database, what the
/// others had stored and refused.
pub(crate) struct RefusalSplit {
    contacts: (u64, u64),
    others: (u64, u64),
    others_stored_db: i64,
    others_refused_db: i64,
    contacts_refused_db: i64,
}

impl RefusalSplit {
    pub(crate) fn ok(&self) -> bool {
        self.contacts.1 == 0
            && self.others.0 == 0
            && self.others.1 > 0
            && self.others_stored_db == 0
            && self.contacts_refused_db == 0
            && self.others_refused_db == self.others.1 as i64
    }
}

pub(crate) struct PolicyReport {
    agents: i64,
    settings_secs: f64,
    runs: Vec<AbRun>,
}

/// Contact policies: closed-loop sends to `open` agents (a) and to agents
/// with policy `contacts` whose allow lists hold every sender and whose
/// block lists `POLICY_BLOCKS` others (b), alternated, 1 replica; then
/// once (c) to agents whose allow lists hold half of the senders.
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    let phase_end = Instant::now() + mode.policy_allowance + Duration::from_secs(20);
    db::recreate_database(admin, DB_POLICY).await?;
    let replicas = start_replicas_env(
        opts,
        DB_POLICY,
        1,
        opts.base_port + 60,
        "policy",
        &QUOTAS_OUT_OF_REACH,
    )
    .await?;
    let pdb = db::connect(&pg_url(opts, DB_POLICY)).await?;
    let n = mode.ab_agents;
    // s: senders; o: open recipients; c: contacts, every sender allowed;
    // x: contacts, half of the senders allowed; b: the blocked.
    for (prefix, k) in [
        ('s', AB_SENDERS as i64),
        ('o', n),
        ('c', n),
        ('x', n),
        ('b', POLICY_BLOCKS as i64),
    ] {
        db::seed_agents(&pdb, prefix, "policy", k).await?;
    }
    db::each(&pdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
    let tg = targets(&replicas);
    let senders = seeded_agents('s', AB_SENDERS);
    let sender_names = names_of(&senders);
    // Contacts of the x-agents: the senders at even positions.
    let (contacts, others): (Vec<String>, Vec<String>) = {
        let (even, odd): (Vec<_>, Vec<_>) = sender_names
            .iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        (
            even.into_iter().map(|(_, s)| s.clone()).collect(),
            odd.into_iter().map(|(_, s)| s.clone()).collect(),
        )
    };
    let blocked = names_of(&seeded_agents('b', POLICY_BLOCKS));
    let mut calls = Vec::new();
    for (prefix, allow) in [('c', &sender_names), ('x', &contacts)] {
        for a in seeded_agents(prefix, n as usize) {
            calls.push((
                a,
                serde_json::json!({"contact_policy": "contacts", "allow": allow, "block": blocked}),
            ));
        }
    }
    let settings_secs = configure(&tg, calls, "contact policies", |a, v| {
        let allowed = if a.name.starts_with('c') {
            sender_names.len()
        } else {
            contacts.len()
        };
        let int = |k: &str| v.get(k).and_then(serde_json::Value::as_i64);
        if v.get("contact_policy").and_then(serde_json::Value::as_str) == Some("contacts")
            && int("contacts_total") == Some(allowed as i64)
            && int("blocked_total") == Some(POLICY_BLOCKS as i64)
            && v.get("unknown").is_none()
        {
            Ok(())
        } else {
            Err(format!("{}: unexpected answer {v}", a.name))
        }
    })
    .await?;
    say!(
        t0,
        "policy: 1 replica up, {} agents given policy contacts ({} allowed + {POLICY_BLOCKS} blocked each) in {settings_secs:.1} s",
        2 * n,
        AB_SENDERS
    );
    let ctx = AbCtx {
        mode,
        admin,
        db: &pdb,
        database: DB_POLICY,
        replicas: &replicas,
        tg,
        senders,
        postmaster,
        hz,
    };
    let open = names_of(&seeded_agents('o', n as usize));
    let closed = names_of(&seeded_agents('c', n as usize));
    let half = names_of(&seeded_agents('x', n as usize));
    let mut plan: Vec<(char, &'static str, usize, &[String])> = Vec::new();
    for round in 0..mode.ab_rounds {
        plan.push(('a', "(a) to open agents", round, &open));
        plan.push((
            'b',
            "(b) to agents with policy contacts, every sender allowed",
            round,
            &closed,
        ));
    }
    plan.push((
        'c',
        "(c) to agents with policy contacts, half of the senders allowed",
        0,
        &half,
    ));
    let mut runs = Vec::new();
    for (key, case, round, recipients) in plan {
        if Instant::now() >= phase_end {
            report.skipped.push(format!(
                "policy: {case}, round {}: the phase's time ran out",
                round + 1
            ));
            continue;
        }
        let mut run = ctx.run(key, case, round, recipients, None).await?;
        if key == 'c' {
            let since = run.started;
            // Answers by the senders at even (contacts) or odd positions.
            let by = |odd: bool| {
                run.per_sender
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| (i % 2 == 1) == odd)
                    .fold((0, 0), |(s, r), (_, x)| (s + x.0, r + x.1))
            };
            let (others_stored_db, _) =
                db::count_window(&pdb, &others, since, chrono::Utc::now()).await?;
            run.split = Some(RefusalSplit {
                contacts: by(false),
                others: by(true),
                others_stored_db,
                others_refused_db: db::refused_since(&pdb, &others, since).await?,
                contacts_refused_db: db::refused_since(&pdb, &contacts, since).await?,
            });
        }
        say!(
            t0,
            "policy {case} #{}: {:.0} sends/s stored (DB), {:.0} answered/s, {} refused, p99 {:.1} ms, errors {}",
            round + 1,
            run.per_s(),
            run.answered_per_s(),
            run.refused_total,
            run.lat.p99,
            run.errors
        );
        runs.push(run);
    }
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: "sends to open and contacts-only agents".into(),
        });
    }
    report.policy = Some(PolicyReport {
        agents: n,
        settings_secs,
        runs,
    });
    drop(ctx);
    stop_replicas(replicas).await;
    Ok(())
}

/// Policies refuse exactly what they should.
pub(crate) fn target_row(x: &PolicyReport) -> String {
    let allowed: Vec<&AbRun> = x.runs.iter().filter(|r| r.key != 'c').collect();
    let refused: u64 = allowed.iter().map(|r| r.refused_total).sum();
    let answered: u64 = allowed.iter().map(|r| r.ok_total + r.refused_total).sum();
    let errors: u64 = x.runs.iter().map(|r| r.error_count).sum();
    let consistent = x.runs.iter().all(AbRun::consistent);
    let split = x.runs.iter().find_map(|r| r.split.as_ref());
    format!(
        "| contact policies refuse exactly what they should, 0 errors (issue: policies should not slow sends; no threshold set) | sends to agents with policy contacts (all senders allowed, {POLICY_BLOCKS} others blocked) {:.2}× those to open agents (median of the rounds); {refused} of {answered} allowed sends refused; {}; {errors} errors | {} |",
        median_ratio(&x.runs, 'b'),
        split.map_or("half-refused run not measured".into(), |s| format!(
            "half allowed: {} of {} sends by non-contacts refused, {} of {} by contacts",
            s.others.1,
            s.others.0 + s.others.1,
            s.contacts.1,
            s.contacts.0 + s.contacts.1
        )),
        verdict(refused == 0 && errors == 0 && consistent && split.is_some_and(RefusalSplit::ok))
    )
}

/// Section 10.
pub(crate) fn section(w: &mut String, x: &PolicyReport, opts: &Opts, mode: &Mode) {
    let _ = writeln!(
        w,
        "\n## 10. Contact policies: sends to agents that choose who may write\n"
    );
    let _ = writeln!(
        w,
        "1 replica (PHONE_POOL_SIZE={}, the server's defaults otherwise), its own database; {AB_SENDERS} senders, {} open recipients, {} + {} recipients with policies and {POLICY_BLOCKS} agents to block, bulk-inserted with known tokens; then each policy recipient set up with one `phone_settings {{contact_policy: \"contacts\", allow: [...], block: [the {POLICY_BLOCKS}]}}` over MCP ({} connections, {:.1} s; each answer checked for the policy and the counts): for (b) all {AB_SENDERS} senders allowed, for (c) the 8 at even positions. The policy, the block list and the contact are decided inside the send's group-commit statement (one `contacts` probe per send to a recipient that keeps contacts; none for one that never marked anyone, migration V14). Same closed loop as the webhook comparison ({AB_SENDERS} senders, each to the next recipient of its kind; each run after marking all mail read, `VACUUM (ANALYZE)`, `CHECKPOINT`; {:.1} s warm-up, {:.1} s measured): (a) and (b) alternated, {} rounds, then (c) once. A refused send is a tool error (the same words for a block and a policy); it is counted apart, not as an error. `stored = answered`: messages stored = sends answered with an id, and the refusals `refused_sends` counts (its `hits`) = refused answers, over the whole run. The other columns and the headline ratio as in section 9.\n",
        opts.pool_size,
        x.agents,
        x.agents,
        x.agents,
        SETTINGS_WORKERS,
        x.settings_secs,
        mode.ab_warmup.as_secs_f64(),
        mode.ab_measure.as_secs_f64(),
        mode.ab_rounds
    );
    let _ = writeln!(
        w,
        "Sends to agents with policy contacts (every sender allowed, {POLICY_BLOCKS} others blocked) ÷ to open agents: {}.\n",
        ab_ratios(&x.runs, 'b')
    );
    let _ = writeln!(
        w,
        "| run | {AB_COLUMNS} | answered/s (stored + refused) | refused in the window |"
    );
    let _ = writeln!(
        w,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let base = mean_rate(&x.runs, 'a');
    for r in &x.runs {
        let _ = writeln!(
            w,
            "| {} | {:.0} | {} |",
            ab_row(r, base),
            r.answered_per_s(),
            r.refused
        );
    }
    if let Some(s) = x.runs.iter().find_map(|r| r.split.as_ref()) {
        let _ = writeln!(
            w,
            "\n(c), by sender over the whole run: the contacts had {} sends stored and {} refused (expected 0); the others {} stored (expected 0) and {} refused. The database: {} messages from the others, {} refusals of theirs counted in `refused_sends` (expected = their refused answers), {} of the contacts'. **{}**.",
            s.contacts.0,
            s.contacts.1,
            s.others.0,
            s.others.1,
            s.others_stored_db,
            s.others_refused_db,
            s.contacts_refused_db,
            if s.ok() {
                "As expected"
            } else {
                "Not as expected"
            }
        );
    }
    let examples: Vec<&String> = x
        .runs
        .iter()
        .flat_map(|r| r.error_examples.iter())
        .take(5)
        .collect();
    if !examples.is_empty() {
        let _ = writeln!(w, "\nFirst errors:\n");
        for e in examples {
            let _ = writeln!(w, "- `{e}`");
        }
    }
}
