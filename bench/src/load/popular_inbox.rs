//! The popular inbox: many senders and pollers on one recipient, read or
//! lease mode, and the drain that empties it after a run.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Agent, BODY, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::{CallError, Conn, Target};
use crate::stats::{Errors, Lat};

/// How the pollers of the popular inbox take their mail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotMode {
    /// `phone_inbox` marks what it returns read.
    Read,
    /// `mode: lease` for `seconds`; every receipt acknowledged by one
    /// `phone_ack` right after the poll, or (`ack_in_poll`) with the
    /// worker's next poll (`ack`), one call per round instead of two.
    Lease { seconds: u32, ack_in_poll: bool },
}

impl HotMode {
    /// The pollers' `phone_inbox` arguments.
    pub fn poll_args(self, limit: u32) -> Value {
        match self {
            HotMode::Read => json!({"limit": limit, "wait_seconds": 0}),
            HotMode::Lease { seconds, .. } => json!({
                "limit": limit, "wait_seconds": 0, "mode": "lease", "lease_seconds": seconds
            }),
        }
    }

    /// How the report names it.
    pub fn describe(self) -> &'static str {
        match self {
            HotMode::Read => "read",
            HotMode::Lease {
                ack_in_poll: false, ..
            } => "lease + phone_ack",
            HotMode::Lease {
                ack_in_poll: true, ..
            } => "lease, ack in next poll",
        }
    }

    pub fn is_lease(self) -> bool {
        matches!(self, HotMode::Lease { .. })
    }

    fn acks_in_poll(self) -> bool {
        matches!(
            self,
            HotMode::Lease {
                ack_in_poll: true,
                ..
            }
        )
    }
}

/// The ids a poll's `ack` acknowledged; what it did not (stale, not
/// found, pending) are errors of the run.
fn acked_in_poll(v: &Value, errors: &mut Errors) -> Vec<i64> {
    let list = |key: &str| -> Vec<i64> {
        v.get("acks")
            .and_then(|a| a.get(key))
            .and_then(Value::as_array)
            .map(|ids| {
                ids.iter()
                    .filter_map(|x| x.as_str().and_then(message_number))
                    .collect()
            })
            .unwrap_or_default()
    };
    for key in ["stale", "not_found", "pending"] {
        for id in list(key) {
            errors.add("phone_inbox ack", key, &format!("msg_{id}"));
        }
    }
    list("acknowledged")
}

/// The numeric part of a message id (`msg_123`).
pub fn message_number(id: &str) -> Option<i64> {
    id.strip_prefix("msg_").unwrap_or(id).parse().ok()
}

/// One message a poll handed out: its id, and when the response arrived.
#[derive(Clone, Copy, Debug)]
pub struct Handout {
    pub id: i64,
    pub at: Instant,
}

#[derive(Default, Debug)]
pub struct HotOutcome {
    pub send: Lat,
    pub poll: Lat,
    pub ack: Lat,
    pub errors: Errors,
    /// Successful calls inside the measured window (client-side view).
    pub sends_ok: u64,
    pub polls_ok: u64,
    pub acks_ok: u64,
    /// Polls inside the window that returned nothing, and messages returned.
    pub empty_polls: u64,
    pub messages_returned: u64,
    /// Every call, warm-up included (for per-call database counters).
    pub calls_total: u64,
    /// Over the whole run, warm-up included: ids the sends returned, what
    /// the polls handed out, ids the acknowledgements confirmed.
    pub sent_ids: Vec<i64>,
    pub handouts: Vec<Handout>,
    pub acked_ids: Vec<i64>,
}

impl HotOutcome {
    fn merge(&mut self, o: HotOutcome) {
        self.send.merge(o.send);
        self.poll.merge(o.poll);
        self.ack.merge(o.ack);
        self.errors.merge(o.errors);
        self.sends_ok += o.sends_ok;
        self.polls_ok += o.polls_ok;
        self.acks_ok += o.acks_ok;
        self.empty_polls += o.empty_polls;
        self.messages_returned += o.messages_returned;
        self.calls_total += o.calls_total;
        self.sent_ids.extend(o.sent_ids);
        self.handouts.extend(o.handouts);
        self.acked_ids.extend(o.acked_ids);
    }
}

/// The messages of a `phone_inbox` result: (id, receipt).
fn polled(v: &Value) -> Vec<(Option<i64>, Option<String>)> {
    v.get("messages")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m.get("id").and_then(Value::as_str).and_then(message_number),
                        m.get("receipt").and_then(Value::as_str).map(str::to_owned),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `phone_ack` of `receipts`; the ids acknowledged.
async fn ack(conn: &mut Conn, token: &str, receipts: Vec<String>) -> Result<Vec<i64>, CallError> {
    let v = conn
        .call_tool("phone_ack", json!({"ids": receipts}), Some(token))
        .await?;
    Ok(v.get("acknowledged")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(|x| x.as_str().and_then(message_number))
                .collect()
        })
        .unwrap_or_default())
}

/// A popular inbox, closed loop: `workers` connections (replicas round
/// robin), the even ones senders (sender k to `recipient`), the odd ones
/// pollers of `recipient`'s inbox (its token), `limit` 10, no wait, and no
/// pause after an empty poll. In lease mode each poll that returned
/// messages is followed by one `phone_ack` of all their receipts, or with
/// `ack_in_poll` the next poll acknowledges them (and a last `phone_ack`
/// those of the worker's last poll). Calls
/// before `warmup` are not recorded.
#[allow(clippy::too_many_arguments)]
pub async fn hot(
    targets: &[Target],
    senders: &[Agent],
    recipient: &Agent,
    workers: usize,
    mode: HotMode,
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> HotOutcome {
    let record_from = start + warmup;
    let stop_at = record_from + measure;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let target = targets[w % targets.len()].clone();
        let poller = w % 2 == 1;
        let token = if poller {
            recipient.token.clone()
        } else {
            senders[(w / 2) % senders.len()].token.clone()
        };
        let send_args = json!({"to": recipient.name, "body": BODY});
        let poll_args = mode.poll_args(10);
        tasks.push(tokio::spawn(async move {
            let mut out = HotOutcome::default();
            let mut conn = match open_until(&target, stop_at, &mut out.errors).await {
                Some(c) => c,
                None => return out,
            };
            // Receipts to acknowledge with the next poll (`ack_in_poll`);
            // kept across a failed poll, whose retry acknowledges them.
            let mut pending: Vec<String> = Vec::new();
            for _ in 0..MAX_CALLS_PER_WORKER {
                if Instant::now() >= stop_at {
                    break;
                }
                let t = Instant::now();
                let counted = t >= record_from && t < stop_at;
                let (tool, mut args) = if poller {
                    ("phone_inbox", poll_args.clone())
                } else {
                    ("phone_send", send_args.clone())
                };
                if !pending.is_empty() {
                    args["ack"] = json!(pending);
                }
                let r = conn.call_tool(tool, args, Some(&token)).await;
                let took = t.elapsed();
                out.calls_total += 1;
                let mut receipts = Vec::new();
                match r {
                    Ok(v) if poller => {
                        let at = Instant::now();
                        if !pending.is_empty() {
                            out.acked_ids.extend(acked_in_poll(&v, &mut out.errors));
                            pending.clear();
                        }
                        let ms = polled(&v);
                        for (id, receipt) in ms.iter().cloned() {
                            match id {
                                Some(id) => out.handouts.push(Handout { id, at }),
                                None => out.errors.add(tool, "bad_response", "message without id"),
                            }
                            if mode.is_lease() {
                                match receipt {
                                    Some(rc) => receipts.push(rc),
                                    None => out.errors.add(
                                        tool,
                                        "bad_response",
                                        "lease without receipt",
                                    ),
                                }
                            }
                        }
                        if counted {
                            out.poll.record(took);
                            out.polls_ok += 1;
                            out.messages_returned += ms.len() as u64;
                            out.empty_polls += u64::from(ms.is_empty());
                        }
                    }
                    Ok(v) => {
                        match v.get("id").and_then(Value::as_str).and_then(message_number) {
                            Some(id) => out.sent_ids.push(id),
                            None => out
                                .errors
                                .add(tool, "bad_response", &format!("no id in {v}")),
                        }
                        if counted {
                            out.send.record(took);
                            out.sends_ok += 1;
                        }
                    }
                    Err(e) => {
                        out.errors.add(tool, e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, stop_at, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => return out,
                            }
                        }
                    }
                }
                if mode.acks_in_poll() {
                    pending.extend(receipts);
                    continue;
                }
                if receipts.is_empty() {
                    continue;
                }
                // Acknowledged whatever the clock says: no lease is left behind.
                let t = Instant::now();
                let r = ack(&mut conn, &token, receipts).await;
                let took = t.elapsed();
                out.calls_total += 1;
                match r {
                    Ok(ids) => {
                        out.acked_ids.extend(ids);
                        if counted {
                            out.ack.record(took);
                            out.acks_ok += 1;
                        }
                    }
                    Err(e) => {
                        out.errors.add("phone_ack", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, stop_at, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => return out,
                            }
                        }
                    }
                }
            }
            // The last poll's receipts: no lease is left behind.
            if !pending.is_empty() {
                match ack(&mut conn, &token, pending).await {
                    Ok(ids) => out.acked_ids.extend(ids),
                    Err(e) => out.errors.add("phone_ack", e.kind(), &e.to_string()),
                }
                out.calls_total += 1;
            }
            out
        }));
    }
    let mut total = HotOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.merge(o);
        }
    }
    total
}

/// After a popular-inbox run: takes what is left in `recipient`'s inbox
/// on one connection (`limit` 100; in lease mode acknowledging each
/// batch), until a poll finds nothing or `deadline`. Adds what it took to
/// `out` (handouts, acknowledgements; not to the windowed counts) and
/// returns how many messages it took.
pub async fn drain(
    target: &Target,
    recipient: &Agent,
    mode: HotMode,
    deadline: Instant,
    out: &mut HotOutcome,
) -> u64 {
    let Some(mut conn) = open_until(target, deadline, &mut out.errors).await else {
        return 0;
    };
    let args = mode.poll_args(100);
    let mut taken = 0;
    for _ in 0..100_000 {
        if Instant::now() >= deadline {
            out.errors
                .add("drain", "deadline", "the inbox was not empty in time");
            break;
        }
        let v = match conn
            .call_tool("phone_inbox", args.clone(), Some(&recipient.token))
            .await
        {
            Ok(v) => v,
            Err(e) => {
                out.errors.add("drain", e.kind(), &e.to_string());
                if e.needs_reconnect() {
                    match open_until(target, deadline, &mut out.errors).await {
                        Some(c) => conn = c,
                        None => break,
                    }
                }
                continue;
            }
        };
        let ms = polled(&v);
        if ms.is_empty() {
            break;
        }
        taken += ms.len() as u64;
        let at = Instant::now();
        let mut receipts = Vec::new();
        for (id, receipt) in ms {
            if let Some(id) = id {
                out.handouts.push(Handout { id, at });
            }
            receipts.extend(receipt);
        }
        if mode.is_lease() {
            match ack(&mut conn, &recipient.token, receipts).await {
                Ok(ids) => out.acked_ids.extend(ids),
                Err(e) => out.errors.add("drain ack", e.kind(), &e.to_string()),
            }
        }
    }
    taken
}
