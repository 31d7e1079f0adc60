//! From a send to its POST: sends at a fixed rate to agents with webhooks,
//! each matched with its POST at the receiver.

use std::collections::HashSet;

use super::{HOOK_RATE_CONNECTIONS, HOOK_RATE_MAX, HOOK_RATE_MIN};
use crate::db;
use crate::load::{self, hooks};
use crate::phase::ab::AbCtx;
use crate::stats::{self, Summary};

/// Sends at a fixed rate to agents with webhooks: from each send to its
/// POST at the receiver.
pub(crate) struct HookLatency {
    pub(crate) rate: f64,
    pub(crate) secs: f64,
    /// Sends/s of the first closed-loop run to agents without webhooks, and
    /// deliveries/s during the first with webhooks.
    pub(crate) peak: f64,
    pub(crate) capacity: Option<f64>,
    /// Deliveries pending when the run started.
    pub(crate) pending_start: i64,
    pub(crate) sent: usize,
    /// Sent messages whose POST arrived, and those whose did not in time.
    pub(crate) delivered: usize,
    pub(crate) lost: usize,
    /// POSTs beyond the first per `webhook-id`, and POSTs of messages this
    /// run did not send.
    pub(crate) duplicates: usize,
    pub(crate) foreign: usize,
    pub(crate) from_send: Summary,
    pub(crate) from_response: Summary,
    /// POSTs that arrived before the send's own answer.
    pub(crate) before_response: usize,
    pub(crate) send: Summary,
    pub(crate) lag: Summary,
    /// From the end of the sends (the last answer) to the last POST, ms.
    pub(crate) last_post_ms: f64,
    /// From the database: deliveries of these messages by state (state,
    /// count, of them retried), and messages with no delivery queued.
    pub(crate) states: Vec<(String, i64, i64)>,
    pub(crate) no_delivery: i64,
    pub(crate) pending_end: i64,
    pub(crate) errors: String,
    error_count: u64,
}

impl HookLatency {
    pub(crate) fn ok(&self) -> bool {
        self.sent > 0
            && self.delivered == self.sent
            && self.lost == 0
            && self.duplicates == 0
            && self.no_delivery == 0
            && self.error_count == 0
    }
}

/// Sends at a fixed rate to the agents with webhooks, well below both
/// peaks: a tenth of `peak` (sends/s without webhooks) and a third of
/// `capacity` (deliveries/s during the first run with webhooks), within
/// bounds; then up to `hook_drain` for every POST to arrive.
pub(crate) async fn hook_latency(
    ctx: &AbCtx<'_>,
    receiver: &hooks::Receiver,
    hooked: &[String],
    peak: f64,
    capacity: Option<f64>,
) -> Result<HookLatency, String> {
    let mode = ctx.mode;
    let rate = (peak / 10.0)
        .min(capacity.map_or(f64::MAX, |c| c / 3.0))
        .clamp(HOOK_RATE_MIN, HOOK_RATE_MAX);
    db::mark_all_read(ctx.db).await?;
    db::settle(ctx.db).await?;
    db::each(ctx.db, &["CHECKPOINT"]).await?;
    let pending_start = db::webhooks_pending(ctx.db).await?;
    let before = receiver.count();
    let out = hooks::paced(
        &ctx.tg,
        &ctx.senders,
        hooked,
        rate,
        mode.hook_latency,
        HOOK_RATE_CONNECTIONS,
    )
    .await;
    let sent_at = tokio::time::Instant::now();
    let sent: HashSet<String> = out.sends.iter().map(|s| s.id.clone()).collect();
    let arrived_all = |arrivals: &[hooks::Arrival]| {
        let seen: HashSet<&str> = arrivals[before.min(arrivals.len())..]
            .iter()
            .map(|a| a.message_id.as_str())
            .filter(|id| sent.contains(*id))
            .collect();
        seen.len() >= sent.len()
    };
    receiver.until(sent_at + mode.hook_drain, arrived_all).await;
    let arrivals = receiver.arrivals();
    let arrivals = &arrivals[before.min(arrivals.len())..];
    let last_post_ms = arrivals.iter().map(|a| a.at).max().map_or(0.0, |last| {
        last.saturating_duration_since(sent_at).as_secs_f64() * 1000.0
    });
    let mut first: std::collections::HashMap<&str, tokio::time::Instant> = Default::default();
    let mut by_webhook_id: HashSet<&str> = HashSet::new();
    let (mut duplicates, mut foreign) = (0, 0);
    for a in arrivals {
        if !by_webhook_id.insert(a.webhook_id.as_str()) {
            duplicates += 1;
        }
        if sent.contains(&a.message_id) {
            first.entry(a.message_id.as_str()).or_insert(a.at);
        } else {
            foreign += 1;
        }
    }
    let (mut from_send, mut from_response) = (stats::Lat::default(), stats::Lat::default());
    let mut before_response = 0;
    for s in &out.sends {
        if let Some(&at) = first.get(s.id.as_str()) {
            from_send.record(at.saturating_duration_since(s.sent));
            from_response.record(at.saturating_duration_since(s.answered));
            before_response += usize::from(at < s.answered);
        }
    }
    let ids: Vec<i64> = out
        .sends
        .iter()
        .filter_map(|s| load::message_number(&s.id))
        .collect();
    let (states, no_delivery) = db::webhook_states(ctx.db, &ids).await?;
    Ok(HookLatency {
        rate,
        secs: mode.hook_latency.as_secs_f64(),
        peak,
        capacity,
        pending_start,
        sent: out.sends.len(),
        delivered: first.len(),
        lost: out.sends.len() - first.len(),
        duplicates,
        foreign,
        from_send: from_send.summary(),
        from_response: from_response.summary(),
        before_response,
        send: out.lat.summary(),
        lag: out.lag.summary(),
        last_post_ms,
        states,
        no_delivery,
        pending_end: db::webhooks_pending(ctx.db).await?,
        errors: out.errors.describe(),
        error_count: out.errors.total(),
    })
}
