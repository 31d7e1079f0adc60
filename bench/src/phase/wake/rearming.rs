//! Sends to agents that wait in long polls and re-arm: each send wakes one.

use std::time::Duration;

use super::{Once, REARM_WAIT, SendRateRow, WakeCtx, names_of};
use crate::db;
use crate::load::{Agent, long_poll};

/// (c): sends to agents that wait in long polls on the next replica and
/// re-arm as soon as a poll returns; then a last message each stops them.
pub(crate) async fn wake_rearming(
    ctx: &WakeCtx<'_>,
    waiters: &[Agent],
) -> Result<SendRateRow, String> {
    use tokio::time::Instant as TInstant;
    let names = names_of(waiters);
    let ids = db::ids_by_name(&ctx.wdb, &names).await?;
    let mode = ctx.mode;
    let hard_stop = TInstant::now()
        + mode.wake_warmup
        + mode.wake_window
        + Duration::from_secs(REARM_WAIT + 20);
    let tasks = long_poll::rearming(&ctx.tg, waiters, REARM_WAIT, hard_stop);
    ctx.rows
        .until_waiting(
            &ids,
            Duration::from_millis(10),
            TInstant::now() + Duration::from_secs(5),
        )
        .await?;
    let mut row = ctx
        .send_rate(
            "(c) to agents waiting in long polls (each send wakes one; it re-arms)",
            &names,
        )
        .await?;
    // Every send was answered: a last message each ends their current
    // wait; they then drain what is left and stop.
    let (last, last_errors) = long_poll::deliver(
        &ctx.tg,
        &ctx.senders,
        &names,
        long_poll::LAST_BODY,
        TInstant::now() + Duration::from_secs(10),
    )
    .await;
    let end_by = TInstant::now() + Duration::from_secs(REARM_WAIT + 10);
    let mut out = long_poll::join_rearming(tasks, end_by).await;
    out.errors.merge(last_errors);
    // The closed loop keeps no sent ids: exactly once is what the polls
    // returned (no duplicates) against the database's count, none unread.
    let once = Once::check(
        &out.received_ids,
        &out.received_ids,
        db::addressed_to(&ctx.wdb, &ids).await?,
    );
    row.receivers = format!(
        "{} long polls, {} of them missed a wake-up (waited {REARM_WAIT} s, returned nothing); {} stored, {} returned, {} duplicates, {} unread (incl. {} last messages); waiter errors {}",
        out.long_polls,
        out.empty_long_polls,
        once.stored,
        once.received,
        once.duplicates,
        once.unread,
        last.iter().flatten().count(),
        out.errors.describe()
    );
    if !once.ok() {
        row.error_count += 1;
        row.errors = format!("{} + not delivered exactly once", row.errors);
    }
    if out.empty_long_polls > 0 {
        row.error_count += out.empty_long_polls;
        row.errors = format!("{} + {} missed wake-ups", row.errors, out.empty_long_polls);
    }
    row.error_count += out.errors.total();
    Ok(row)
}
