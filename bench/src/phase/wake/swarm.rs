//! The swarm: 1,000 agents in long polls at once; the load while they
//! wait, sends beside them, then one message each.

use std::time::{Duration, Instant};

use super::{
    Once, SendRateRow, WAKE_ARM_EVERY, WAKE_SWARM_WAIT, WakeCtx, WakeLatRow, WakeReport, names_of,
};
use crate::db;
use crate::load::{self, Agent, long_poll};
use crate::report::{Report, memory::MemRow};
use crate::stats;

/// The swarm: `WAKE_SWARM` long polls; the quiet window while they wait;
/// (b), sends to `passive` agents beside them; then one message each, and
/// every poll must end with it. Returns the (b) row.
pub(crate) async fn wake_swarm(
    ctx: &WakeCtx<'_>,
    swarm: &[Agent],
    passive: &[String],
    w: &mut WakeReport,
    report: &mut Report,
    t0: Instant,
) -> Result<SendRateRow, String> {
    use tokio::time::Instant as TInstant;
    let armed = TInstant::now();
    let mut armed_swarm = long_poll::arm_swarm(
        &ctx.tg,
        swarm,
        WAKE_SWARM_WAIT,
        WAKE_ARM_EVERY,
        armed + Duration::from_secs(20),
    )
    .await;
    // One connection attempt per agent: each error is one agent not waiting.
    let mut errors = std::mem::take(&mut armed_swarm.open_errors);
    w.swarm_opened = swarm.len() - errors.total() as usize;
    let waiting = ctx
        .rows
        .until_waiting(
            &ctx.swarm_ids,
            Duration::from_millis(100),
            armed_swarm.armed_by + Duration::from_secs(10),
        )
        .await?;
    w.swarm_armed_secs = armed.elapsed().as_secs_f64();
    say!(
        t0,
        "wake: {waiting} of {} agents waiting after {:.1} s",
        swarm.len(),
        w.swarm_armed_secs
    );
    // Let the arming's statements and stats settle before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loaded = ctx
        .quiet_window(format!(
            "{} agents waiting (wait_seconds {WAKE_SWARM_WAIT})",
            swarm.len()
        ))
        .await;
    say!(
        t0,
        "wake: with {} waiting {:.1} statements/s, PostgreSQL {:.3} cores",
        loaded.waiting.1,
        loaded.statements_per_s(),
        loaded.cores(loaded.cpu.postgres)
    );
    w.quiet.push(loaded);
    for rep in &ctx.replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!(
                "~{} of {} long polls waiting",
                swarm.len() / ctx.replicas.len(),
                swarm.len()
            ),
        });
    }

    let mut with_swarm = ctx
        .send_rate(
            "(b) to agents nobody waits for, while 1,000 others wait",
            passive,
        )
        .await?;
    with_swarm.receivers = format!(
        "{} of the swarm still waiting after",
        ctx.rows.waiting(&ctx.swarm_ids).await?
    );

    let names = names_of(swarm);
    let notified = ctx.notifications.count();
    let (delivered, deliver_errors) = long_poll::deliver(
        &ctx.tg,
        &ctx.senders,
        &names,
        load::BODY,
        TInstant::now() + Duration::from_secs(20),
    )
    .await;
    errors.merge(deliver_errors);
    let ended = armed_swarm
        .finish(TInstant::now() + Duration::from_secs(WAKE_SWARM_WAIT + 5))
        .await;
    let notifications = ctx.notifications.settled_count().await - notified;
    // Each waiter's task owned its connection: all closed by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.rss_after_swarm_kb = ctx.server_rss_kb();

    let mut row = WakeLatRow {
        case: format!(
            "{} agents waiting, one message each ({} senders at once, replicas round robin)",
            swarm.len(),
            ctx.senders.len()
        ),
        short: format!("{} waiting agents sent one message each", swarm.len()),
        notifications,
        ..WakeLatRow::default()
    };
    let mut send = stats::Lat::default();
    let mut from_send = stats::Lat::default();
    let mut from_response = stats::Lat::default();
    let (mut sent_ids, mut received_ids) = (Vec::new(), Vec::new());
    for ((sent, waiter), name) in delivered.iter().zip(&ended).zip(&names) {
        let Some(waiter) = waiter else {
            errors.add("wake", "no_answer", &format!("{name}: no response in time"));
            continue;
        };
        match (&waiter.received, sent) {
            (Err(e), _) => errors.add("phone_inbox", e.kind(), &e.to_string()),
            (Ok(ids), _) if ids.is_empty() => w.swarm_timed_out += 1,
            (Ok(ids), Some(d)) if ids == std::slice::from_ref(&d.id) => {
                w.swarm_with_message += 1;
                send.record(d.answered - d.sent);
                from_send.record(waiter.answered.saturating_duration_since(d.sent));
                from_response.record(waiter.answered.saturating_duration_since(d.answered));
                row.answered_first += u64::from(waiter.answered < d.answered);
            }
            (Ok(ids), _) => errors.add("wake", "wrong_messages", &format!("{name}: {ids:?}")),
        }
        if let Ok(ids) = &waiter.received {
            received_ids.extend(ids.iter().cloned());
        }
        sent_ids.extend(sent.as_ref().map(|d| d.id.clone()));
    }
    row.send = send.summary();
    row.from_send = from_send.summary();
    row.from_send_response = from_response.summary();
    row.once = Once::check(
        &sent_ids,
        &received_ids,
        db::addressed_to(&ctx.wdb, &ctx.swarm_ids).await?,
    );
    w.swarm_errors = errors.describe();
    row.errors = errors.describe();
    row.error_count = errors.total();
    say!(
        t0,
        "wake: swarm: {} of {} polls ended with their message, {} timed out, errors {}",
        w.swarm_with_message,
        swarm.len(),
        w.swarm_timed_out,
        w.swarm_errors
    );
    w.latency.push(row);
    Ok(with_swarm)
}
