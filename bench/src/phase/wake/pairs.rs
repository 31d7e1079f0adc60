//! Wake-up pairs: a poll waiting on one replica, a send through another.

use super::{Once, WakeCtx, WakeLatRow, names_of};
use crate::db;
use crate::load::{Agent, long_poll};

/// Wake-up pairs, in parallel, one per waiter (the senders are the
/// s-agents): waiter on replica k+1, sender on replica k. Also returns the
/// number of long polls.
pub(crate) async fn wake_pairs(
    ctx: &WakeCtx<'_>,
    waiters: &[Agent],
    rounds: usize,
    wait_seconds: u64,
    send_when: long_poll::SendWhen,
) -> Result<(WakeLatRow, long_poll::PairsOutcome), String> {
    let ids = db::ids_by_name(&ctx.wdb, &names_of(waiters)).await?;
    let pairs: Vec<long_poll::Pair> = waiters
        .iter()
        .zip(&ctx.senders)
        .zip(&ids)
        .map(|((waiter, sender), &waiter_id)| long_poll::Pair {
            sender: sender.clone(),
            waiter: waiter.clone(),
            waiter_id,
        })
        .collect();
    let plan = long_poll::PairPlan {
        rounds,
        wait_seconds,
        send_when,
        deadline: tokio::time::Instant::now() + ctx.mode.wake_pairs_secs,
    };
    let notified = ctx.notifications.count();
    let out = long_poll::pairs(&ctx.tg, &pairs, ctx.rows.clone(), plan).await;
    let notifications = ctx.notifications.settled_count().await - notified;
    let once = Once::check(
        &out.sent_ids,
        &out.received_ids,
        db::addressed_to(&ctx.wdb, &ids).await?,
    );
    let (case, short) = match pairs.len() {
        1 => (
            "1 pair alone: poll waiting on replica 2, send through replica 1".to_owned(),
            "wake-up across replicas (1 pair alone)".to_owned(),
        ),
        n => (
            format!("{n} pairs in parallel: poll waiting on replica k+1, send through replica k"),
            format!("wake-up across replicas ({n} pairs in parallel)"),
        ),
    };
    let row = WakeLatRow {
        case,
        short,
        send: out.send.summary(),
        from_send: out.from_send.summary(),
        from_send_response: out.from_send_response.summary(),
        answered_first: out.poll_answered_first,
        notifications,
        once,
        errors: out.errors.describe(),
        error_count: out.errors.total(),
    };
    Ok((row, out))
}
