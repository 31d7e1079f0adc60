//! Wake-up pairs: a waiter in a long poll on one replica, a sender sending
//! it a message through another.

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use tokio::time::Instant;

use super::{
    ROW_POLL, ROW_WAIT, inbox_args, message_ids, poll_timeout, recover, send_args, sent_id,
};
use crate::db::WaiterRows;
use crate::load::{Agent, BODY, open_until};
use crate::mcp::{CallError, Target};
use crate::stats::{Errors, Lat};

/// A sender and the agent it wakes.
#[derive(Clone, Debug)]
pub struct Pair {
    pub sender: Agent,
    pub waiter: Agent,
    pub waiter_id: i64,
}

#[derive(Default, Debug)]
pub struct PairsOutcome {
    /// The sends themselves, request to response.
    pub send: Lat,
    /// From the moment the send request went out to the waiting poll's
    /// response (with the message) arriving.
    pub from_send: Lat,
    /// From the send's response to the poll's response; a poll answered
    /// before the send's own response counts as 0.
    pub from_send_response: Lat,
    pub poll_answered_first: u64,
    pub long_polls: u64,
    /// Long polls that waited their full `wait_seconds` and returned
    /// nothing although the round's message had been stored meanwhile.
    pub missed_wakeups: u64,
    /// The latest, over those, that the send was answered (so its message
    /// stored) after the poll went out.
    pub missed_stored_by: Duration,
    pub sent_ids: Vec<String>,
    pub received_ids: Vec<String>,
    pub errors: Errors,
}

impl PairsOutcome {
    fn merge(&mut self, o: PairsOutcome) {
        self.send.merge(o.send);
        self.from_send.merge(o.from_send);
        self.from_send_response.merge(o.from_send_response);
        self.poll_answered_first += o.poll_answered_first;
        self.long_polls += o.long_polls;
        self.missed_wakeups += o.missed_wakeups;
        self.missed_stored_by = self.missed_stored_by.max(o.missed_stored_by);
        self.sent_ids.extend(o.sent_ids);
        self.received_ids.extend(o.received_ids);
        self.errors.merge(o.errors);
    }
}

/// What the sending side of one round saw.
enum SendSide {
    /// The waiter's row never showed up: its poll did not wait.
    NotWaiting(i64),
    Probe(String),
    Sent(Result<Value, CallError>, Instant, Instant),
}

/// When a pair's sender sends, relative to its waiter's long poll.
#[derive(Clone, Copy, Debug)]
pub enum SendWhen {
    /// Once the waiter's row is in `inbox_waiters`, and `grace` later (its
    /// own re-check is then over and it sleeps on its wake-up).
    Waiting { grace: Duration },
    /// At a random moment up to `within` after the poll went out, without
    /// looking: the send may land while the poll registers.
    Racing { within: Duration },
}

/// How the pairs run: rounds per pair, the waiters' `wait_seconds`, when
/// the sender sends, and the time bound.
#[derive(Clone, Copy, Debug)]
pub struct PairPlan {
    pub rounds: usize,
    pub wait_seconds: u64,
    pub send_when: SendWhen,
    pub deadline: Instant,
}

/// Each pair, in parallel, for up to `plan.rounds` rounds: the waiter
/// starts a long poll on replica k+1 and the sender sends it a message
/// through replica k (when: `plan.send_when`). A round whose poll did not
/// return its message ends by draining the inbox, so that every round
/// starts empty. Needs two replicas or more.
pub async fn pairs(
    targets: &[Target],
    pairs: &[Pair],
    rows: Arc<WaiterRows>,
    plan: PairPlan,
) -> PairsOutcome {
    let mut tasks = Vec::new();
    for (k, pair) in pairs.iter().enumerate() {
        let send_target = targets[k % targets.len()].clone();
        let wait_target = targets[(k + 1) % targets.len()].clone();
        let (pair, rows) = (pair.clone(), rows.clone());
        tasks.push(tokio::spawn(async move {
            pair_rounds(&send_target, &wait_target, &pair, &rows, plan).await
        }));
    }
    let mut total = PairsOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.merge(o);
        }
    }
    total
}

async fn pair_rounds(
    send_target: &Target,
    wait_target: &Target,
    pair: &Pair,
    rows: &WaiterRows,
    plan: PairPlan,
) -> PairsOutcome {
    let mut out = PairsOutcome::default();
    let deadline = plan.deadline;
    let poll_limit = poll_timeout(plan.wait_seconds);
    let Some(mut sender) = open_until(send_target, deadline, &mut out.errors).await else {
        return out;
    };
    let Some(mut waiter) = open_until(wait_target, deadline, &mut out.errors).await else {
        return out;
    };
    waiter.set_timeout(poll_limit);
    let (poll_args, send_args) = (
        inbox_args(plan.wait_seconds),
        send_args(&pair.waiter.name, BODY),
    );
    let who = &pair.waiter.name;
    for _ in 0..plan.rounds {
        if Instant::now() >= deadline {
            break;
        }
        let polled_at = Instant::now();
        let poll = async {
            let r = waiter
                .call_tool("phone_inbox", poll_args.clone(), Some(&pair.waiter.token))
                .await;
            (r, Instant::now())
        };
        let send = async {
            match plan.send_when {
                SendWhen::Waiting { grace } => {
                    let seen = rows
                        .until_waiting(&[pair.waiter_id], ROW_POLL, Instant::now() + ROW_WAIT)
                        .await;
                    match seen {
                        Ok(1) => {}
                        Ok(n) => return SendSide::NotWaiting(n),
                        Err(e) => return SendSide::Probe(e),
                    }
                    tokio::time::sleep(grace).await;
                }
                SendWhen::Racing { within } => {
                    let us = within.as_micros().max(1) as u64;
                    tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % us)).await;
                }
            }
            let t0 = Instant::now();
            let r = sender
                .call_tool("phone_send", send_args.clone(), Some(&pair.sender.token))
                .await;
            SendSide::Sent(r, t0, Instant::now())
        };
        let ((polled, answered), sent) = tokio::join!(poll, send);
        out.long_polls += 1;
        let received = match polled {
            Ok(v) => Some(message_ids(&v)),
            Err(e) => {
                out.errors.add("phone_inbox", e.kind(), &e.to_string());
                let timeout = Some(poll_limit);
                if !recover(
                    &mut waiter,
                    &e,
                    wait_target,
                    deadline,
                    timeout,
                    &mut out.errors,
                )
                .await
                {
                    break;
                }
                None
            }
        };
        let mut id = None;
        match sent {
            SendSide::NotWaiting(n) => {
                let detail =
                    format!("{who}: {n} waiter rows after {ROW_WAIT:?}; poll got {received:?}");
                out.errors.add("wake", "not_waiting", &detail);
            }
            SendSide::Probe(e) => out.errors.add("wake", "probe", &e),
            SendSide::Sent(Ok(v), t0, t1) => {
                out.send.record(t1 - t0);
                id = sent_id(&v);
                let got = received.as_deref().unwrap_or_default();
                if id.as_ref().is_some_and(|id| got.contains(id)) {
                    out.from_send.record(answered.saturating_duration_since(t0));
                    out.from_send_response
                        .record(answered.saturating_duration_since(t1));
                    out.poll_answered_first += u64::from(answered < t1);
                } else if received.as_ref().is_some_and(Vec::is_empty)
                    && answered - polled_at >= Duration::from_secs(plan.wait_seconds)
                {
                    // The server answers empty only at the end of the wait.
                    out.missed_wakeups += 1;
                    out.missed_stored_by = out.missed_stored_by.max(t1 - polled_at);
                } else if received.is_some() {
                    let detail = format!("{who}: poll returned {got:?}, not {id:?}");
                    out.errors.add("wake", "not_delivered", &detail);
                }
                out.sent_ids.extend(id.clone());
            }
            SendSide::Sent(Err(e), ..) => {
                out.errors.add("phone_send", e.kind(), &e.to_string());
                if !recover(
                    &mut sender,
                    &e,
                    send_target,
                    deadline,
                    None,
                    &mut out.errors,
                )
                .await
                {
                    break;
                }
            }
        }
        let mut received = received.unwrap_or_default();
        // Start the next round with an empty inbox (bounded: the message of
        // this round is committed, so one poll takes it).
        for _ in 0..3 {
            if id.as_ref().is_none_or(|id| received.contains(id)) {
                break;
            }
            match waiter
                .call_tool("phone_inbox", inbox_args(0), Some(&pair.waiter.token))
                .await
            {
                Ok(v) if message_ids(&v).is_empty() => break,
                Ok(v) => received.extend(message_ids(&v)),
                Err(e) => {
                    out.errors.add("phone_inbox", e.kind(), &e.to_string());
                    break;
                }
            }
        }
        out.received_ids.extend(received);
    }
    out
}
