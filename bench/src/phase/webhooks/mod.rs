//! `webhooks`: does a webhook slow the send that queues it? Closed-loop
//! sends to (a) agents without webhooks and (b) agents with one, each set
//! over MCP and pointing at a receiver inside phone-bench, alternated over
//! rounds (`ab`), with the delivery queue read around each run; after the
//! first (b), sends at a fixed rate, each matched with its POST (`latency`):
//! send → POST latency, POSTs lost or duplicated.

mod latency;
mod report;

use std::time::{Duration, Instant};

use super::ab::{AB_SENDERS, AbCtx, AbRun, configure, mean_rate};
use super::{names_of, seeded_agents};
use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::{Agent, hooks};
use crate::mode::Mode;
use crate::replicas::{QUOTAS_OUT_OF_REACH, start_replicas_env, stop_replicas, targets};
use crate::report::{Report, memory::MemRow};
use crate::stats;
use latency::{HookLatency, hook_latency};
pub(crate) use report::{section, target_row};

pub(crate) const DB_HOOKS: &str = "phone_bench_webhooks";
/// Connections of the fixed-rate run.
pub(crate) const HOOK_RATE_CONNECTIONS: usize = 8;
/// The fixed rate of the webhook latency run: a tenth of the closed-loop
/// rate to agents without webhooks, within these bounds (sends/s).
pub(crate) const HOOK_RATE_MIN: f64 = 20.0;
pub(crate) const HOOK_RATE_MAX: f64 = 200.0;
/// The server's own limits on deliveries in flight (src/webhooks/mod.rs),
/// for the report.
pub(crate) const HOOK_IN_FLIGHT: usize = 32;
pub(crate) const HOOK_PER_AGENT: usize = 4;

pub(crate) struct HookReport {
    agents: i64,
    settings_secs: f64,
    runs: Vec<AbRun>,
    latency: Option<HookLatency>,
    /// Deliveries pending at the phase's end, and the receiver's malformed
    /// POSTs (with examples).
    pending_final: i64,
    malformed: u64,
    malformed_examples: Vec<String>,
}

/// Webhooks: closed-loop sends to agents without webhooks (a) and with
/// them (b), alternated, 1 replica with `PHONE_WEBHOOK_ALLOW_PRIVATE=true`,
/// every webhook pointing at a receiver in this process; after the first
/// (b) and its drain, sends at a fixed rate to the agents with webhooks,
/// each matched with its POST.
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<(), String> {
    let phase_end = Instant::now() + mode.hook_allowance + Duration::from_secs(20);
    db::recreate_database(admin, DB_HOOKS).await?;
    let receiver = hooks::Receiver::start().await?;
    let replicas = start_replicas_env(
        opts,
        DB_HOOKS,
        1,
        opts.base_port + 50,
        "webhooks",
        &[
            ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
            QUOTAS_OUT_OF_REACH[0],
            QUOTAS_OUT_OF_REACH[1],
            QUOTAS_OUT_OF_REACH[2],
        ],
    )
    .await?;
    let hdb = db::connect(&pg_url(opts, DB_HOOKS)).await?;
    let n = mode.ab_agents;
    // s: senders; n: recipients without webhooks; h: with.
    for (prefix, k) in [('s', AB_SENDERS as i64), ('n', n), ('h', n)] {
        db::seed_agents(&hdb, prefix, "webhooks", k).await?;
    }
    db::each(&hdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
    let tg = targets(&replicas);
    let hooked = seeded_agents('h', n as usize);
    let url_of = |a: &Agent| format!("http://127.0.0.1:{}/hook/{}", receiver.port, a.name);
    let calls = hooked
        .iter()
        .map(|a| (a.clone(), serde_json::json!({"webhook_url": url_of(a)})))
        .collect();
    let settings_secs = configure(&tg, calls, "webhooks", |a, v| {
        let url = v.get("webhook_url").and_then(serde_json::Value::as_str);
        let secret = v.get("webhook_secret").and_then(serde_json::Value::as_str);
        let active = v.get("webhook_active").and_then(serde_json::Value::as_bool);
        if url == Some(url_of(a).as_str())
            && secret.is_some_and(|s| s.starts_with("whsec_"))
            && active == Some(true)
        {
            Ok(())
        } else {
            Err(format!("{}: unexpected answer {v}", a.name))
        }
    })
    .await?;
    say!(
        t0,
        "webhooks: 1 replica up, {n} agents given webhooks (phone_settings) in {settings_secs:.1} s"
    );
    let ctx = AbCtx {
        mode,
        admin,
        db: &hdb,
        database: DB_HOOKS,
        replicas: &replicas,
        tg,
        senders: seeded_agents('s', AB_SENDERS),
        postmaster,
        hz,
    };
    let plain = names_of(&seeded_agents('n', n as usize));
    let hooked_names = names_of(&hooked);
    let mut runs: Vec<AbRun> = Vec::new();
    let mut latency = None;
    for round in 0..mode.ab_rounds {
        for key in ['a', 'b'] {
            let (case, recipients, rx) = if key == 'a' {
                ("(a) to agents without webhooks", &plain, None)
            } else {
                (
                    "(b) to agents with webhooks",
                    &hooked_names,
                    Some(&receiver),
                )
            };
            if Instant::now() >= phase_end {
                report.skipped.push(format!(
                    "webhooks: {case}, round {}: the phase's time ran out",
                    round + 1
                ));
                continue;
            }
            let run = ctx.run(key, case, round, recipients, rx).await?;
            say!(
                t0,
                "webhooks {case} #{}: {:.0} sends/s (DB), p99 {:.1} ms, errors {}{}",
                round + 1,
                run.per_s(),
                run.lat.p99,
                run.errors,
                run.hooks.as_ref().map_or(String::new(), |h| format!(
                    "; {} delivered in the window, {} pending at its end, {}",
                    h.delivered,
                    h.pending_end,
                    h.drain_secs.map_or(
                        format!(
                            "{} still pending after {} s",
                            h.pending_after,
                            mode.hook_drain.as_secs()
                        ),
                        |s| format!("drained {s:.1} s after the sends")
                    )
                ))
            );
            let capacity = run.hooks.as_ref().map(|h| h.delivered as f64 / run.secs);
            runs.push(run);
            if round == 0 && key == 'b' && Instant::now() < phase_end {
                let peak = mean_rate(&runs, 'a');
                let row = hook_latency(&ctx, &receiver, &hooked_names, peak, capacity).await?;
                say!(
                    t0,
                    "webhooks fixed rate {:.0}/s: send -> POST p50 {:.1} ms p99 {:.1} ms; {} sent, {} delivered, {} lost, {} duplicates",
                    row.rate,
                    row.from_send.p50,
                    row.from_send.p99,
                    row.sent,
                    row.delivered,
                    row.lost,
                    row.duplicates
                );
                latency = Some(row);
            }
        }
    }
    let pending_final = db::webhooks_pending(&hdb).await?;
    let (malformed, malformed_examples) = receiver.malformed();
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!("sends to {n} agents with webhooks and {n} without"),
        });
    }
    report.webhooks = Some(HookReport {
        agents: n,
        settings_secs,
        runs,
        latency,
        pending_final,
        malformed,
        malformed_examples,
    });
    drop(ctx);
    stop_replicas(replicas).await;
    Ok(())
}
