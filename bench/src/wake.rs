//! Long-poll workloads (`phone_inbox {wait_seconds}`): wake-up pairs across
//! replicas, closed-loop sends, re-arming waiters, and a swarm of agents
//! each waiting in one long poll. Every loop is bounded by a deadline and
//! by an iteration count.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures_util::{StreamExt, stream};
use serde_json::{Value, json};
use tokio::{task::JoinHandle, time::Instant};

use crate::db::WaiterRows;
use crate::load::{Agent, BODY, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::{CallError, Conn, Target};
use crate::stats::{Errors, Lat};

/// How often a pair looks for its waiter's row before sending.
pub const ROW_POLL: Duration = Duration::from_millis(2);
/// Longest a pair waits for its waiter's row before giving the round up.
const ROW_WAIT: Duration = Duration::from_secs(2);
/// Connections the swarm opens at a time (each is an `initialize` and a
/// notification: no database work, but the replicas' accept loops share
/// the cores with everything else).
const OPEN_CONCURRENCY: usize = 32;

/// A long poll's client-side limit: its wait plus slack for a slow answer.
fn poll_timeout(wait_seconds: u64) -> Duration {
    Duration::from_secs(wait_seconds + 10)
}

fn inbox_args(wait_seconds: u64) -> Value {
    json!({"wait_seconds": wait_seconds, "limit": 100})
}

fn send_args(to: &str, body: &str) -> Value {
    json!({"to": to, "body": body})
}

/// Ids of the messages in a `phone_inbox` result.
fn message_ids(v: &Value) -> Vec<String> {
    v.get("messages")
        .and_then(Value::as_array)
        .map(|ms| {
            ms.iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a `phone_inbox` result holds a message with this body.
fn holds_body(v: &Value, body: &str) -> bool {
    v.get("messages")
        .and_then(Value::as_array)
        .is_some_and(|ms| {
            ms.iter()
                .any(|m| m.get("body").and_then(Value::as_str) == Some(body))
        })
}

/// The id of the message a `phone_send` result reports.
fn sent_id(v: &Value) -> Option<String> {
    v.get("id").and_then(Value::as_str).map(str::to_owned)
}

/// Replaces a connection after an error that leaves its state unknown;
/// `false` when no new one could be opened before `deadline`.
async fn recover(
    conn: &mut Conn,
    e: &CallError,
    target: &Target,
    deadline: Instant,
    timeout: Option<Duration>,
    errors: &mut Errors,
) -> bool {
    if !e.needs_reconnect() {
        return true;
    }
    match open_until(target, deadline, errors).await {
        Some(mut c) => {
            if let Some(t) = timeout {
                c.set_timeout(t);
            }
            *conn = c;
            true
        }
        None => false,
    }
}

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

#[derive(Default, Debug)]
pub struct SendOutcome {
    pub lat: Lat,
    /// Successful sends inside the measured window (client-side view).
    pub ok: u64,
    pub errors: Errors,
}

/// Closed loop: worker i sends through replica i to `recipients[i]` (round
/// robin), one send after another, on its own connection. Sends before
/// `warmup` are not recorded.
pub async fn sends(
    targets: &[Target],
    senders: &[Agent],
    recipients: &[String],
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> SendOutcome {
    let record_from = start + warmup;
    let stop_at = record_from + measure;
    let mut tasks = Vec::new();
    for (i, me) in senders.iter().enumerate() {
        let target = targets[i % targets.len()].clone();
        let me = me.clone();
        let args = send_args(&recipients[i % recipients.len()], BODY);
        tasks.push(tokio::spawn(async move {
            let mut out = SendOutcome::default();
            let Some(mut conn) = open_until(&target, stop_at, &mut out.errors).await else {
                return out;
            };
            for _ in 0..MAX_CALLS_PER_WORKER {
                let t = Instant::now();
                if t >= stop_at {
                    break;
                }
                match conn
                    .call_tool("phone_send", args.clone(), Some(&me.token))
                    .await
                {
                    Ok(_) => {
                        if t >= record_from {
                            out.lat.record(t.elapsed());
                            out.ok += 1;
                        }
                    }
                    Err(e) => {
                        out.errors.add("phone_send", e.kind(), &e.to_string());
                        if !recover(&mut conn, &e, &target, stop_at, None, &mut out.errors).await {
                            break;
                        }
                    }
                }
            }
            out
        }));
    }
    let mut total = SendOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.lat.merge(o.lat);
            total.ok += o.ok;
            total.errors.merge(o.errors);
        }
    }
    total
}

#[derive(Default, Debug)]
pub struct RearmOutcome {
    pub long_polls: u64,
    /// Long polls that waited their full time and returned nothing: with
    /// mail arriving every few milliseconds, each is a missed wake-up.
    pub empty_long_polls: u64,
    pub received_ids: Vec<String>,
    pub errors: Errors,
}

/// The body of the message that tells a re-arming waiter to stop.
pub const LAST_BODY: &str = "That was all for now: stop waiting.";

/// Agents that wait for mail in a loop: each long poll that returns is
/// followed at once by the next, until one returns a message with
/// `LAST_BODY`; then they drain their inboxes without waiting and end.
/// They wait on replica i+1 (the senders of `sends` use replica i). Send
/// the last message (with `deliver`) once every other send has been
/// answered: mail sent before it is then committed, and the drain takes it.
pub fn rearming(
    targets: &[Target],
    agents: &[Agent],
    wait_seconds: u64,
    hard_stop: Instant,
) -> Vec<JoinHandle<RearmOutcome>> {
    agents
        .iter()
        .enumerate()
        .map(|(i, me)| {
            let target = targets[(i + 1) % targets.len()].clone();
            let me = me.clone();
            tokio::spawn(async move {
                let mut out = RearmOutcome::default();
                let Some(mut conn) = open_until(&target, hard_stop, &mut out.errors).await else {
                    return out;
                };
                let timeout = poll_timeout(wait_seconds);
                conn.set_timeout(timeout);
                let mut told_to_stop = false;
                for _ in 0..MAX_CALLS_PER_WORKER {
                    if Instant::now() >= hard_stop {
                        break;
                    }
                    let wait = if told_to_stop { 0 } else { wait_seconds };
                    match conn
                        .call_tool("phone_inbox", inbox_args(wait), Some(&me.token))
                        .await
                    {
                        Ok(v) => {
                            let ids = message_ids(&v);
                            if told_to_stop && ids.is_empty() {
                                break;
                            }
                            if !told_to_stop {
                                out.long_polls += 1;
                                out.empty_long_polls += u64::from(ids.is_empty());
                            }
                            told_to_stop |= holds_body(&v, LAST_BODY);
                            out.received_ids.extend(ids);
                        }
                        Err(e) => {
                            out.errors.add("phone_inbox", e.kind(), &e.to_string());
                            if !recover(
                                &mut conn,
                                &e,
                                &target,
                                hard_stop,
                                Some(timeout),
                                &mut out.errors,
                            )
                            .await
                            {
                                break;
                            }
                        }
                    }
                }
                out
            })
        })
        .collect()
}

pub async fn join_rearming(
    tasks: Vec<JoinHandle<RearmOutcome>>,
    deadline: Instant,
) -> RearmOutcome {
    let mut total = RearmOutcome::default();
    for t in tasks {
        match tokio::time::timeout_at(deadline, t).await {
            Ok(Ok(o)) => {
                total.long_polls += o.long_polls;
                total.empty_long_polls += o.empty_long_polls;
                total.received_ids.extend(o.received_ids);
                total.errors.merge(o.errors);
            }
            Ok(Err(e)) => total.errors.add("waiter", "panic", &e.to_string()),
            Err(_) => total
                .errors
                .add("waiter", "did_not_end", "still polling at the deadline"),
        }
    }
    total
}

/// How one agent of the swarm fared.
#[derive(Debug)]
pub struct SwarmWaiter {
    pub received: Result<Vec<String>, CallError>,
    pub answered: Instant,
}

/// Many agents, each on its own keep-alive connection (replicas round
/// robin) with its own `initialize`, each in one long poll.
pub struct Swarm {
    /// (agent index, its long poll)
    tasks: Vec<(usize, JoinHandle<SwarmWaiter>)>,
    agents: usize,
    pub open_errors: Errors,
    /// When the last poll was due to go out.
    pub armed_by: Instant,
}

/// Opens a connection per agent (`OPEN_CONCURRENCY` at a time), then starts
/// their long polls one every `arm_every`, so that the polls' own
/// statements (poll, waiter row, poll) do not queue all at once for the
/// replicas' pools. Returns once every poll was scheduled.
pub async fn arm_swarm(
    targets: &[Target],
    agents: &[Agent],
    wait_seconds: u64,
    arm_every: Duration,
    deadline: Instant,
) -> Swarm {
    let mut open_errors = Errors::default();
    // Each open has its own timeout; `deadline` bounds them all (a stalled
    // replica would otherwise cost 10 s per 32 connections).
    let opened: Vec<(usize, Result<Conn, CallError>)> = stream::iter(0..agents.len())
        .map(|i| {
            let target = targets[i % targets.len()].clone();
            async move {
                let open = tokio::time::timeout_at(deadline, Conn::open(&target)).await;
                (
                    i,
                    open.unwrap_or(Err(CallError::Connect("not opened by the deadline".into()))),
                )
            }
        })
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let go = Instant::now() + Duration::from_millis(10);
    let mut tasks = Vec::new();
    for (i, conn) in opened {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                open_errors.add("initialize", e.kind(), &e.to_string());
                continue;
            }
        };
        conn.set_timeout(poll_timeout(wait_seconds));
        let me = agents[i].clone();
        let due = go + arm_every * i as u32;
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(due.min(deadline)).await;
            let r = conn
                .call_tool("phone_inbox", inbox_args(wait_seconds), Some(&me.token))
                .await;
            SwarmWaiter {
                received: r.map(|v| message_ids(&v)),
                answered: Instant::now(),
            }
        });
        tasks.push((i, task));
    }
    Swarm {
        tasks,
        agents: agents.len(),
        open_errors,
        armed_by: go + arm_every * agents.len() as u32,
    }
}

impl Swarm {
    /// Every waiter's outcome, in agent order (`None`: never connected, or
    /// still waiting at `deadline`, then abandoned).
    pub async fn finish(self, deadline: Instant) -> Vec<Option<SwarmWaiter>> {
        let mut out: Vec<Option<SwarmWaiter>> = (0..self.agents).map(|_| None).collect();
        for (i, task) in self.tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(w)) => out[i] = Some(w),
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        out
    }
}

/// One send of `deliver`: when it went out, when its response came, and the
/// message's id.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub sent: Instant,
    pub answered: Instant,
    pub id: String,
}

/// One message with `body` to each of `recipients`, sent by
/// `senders.len()` workers on their own connections (replicas round robin),
/// each taking the next recipient. Per recipient: its send, if it succeeded.
pub async fn deliver(
    targets: &[Target],
    senders: &[Agent],
    recipients: &[String],
    body: &str,
    deadline: Instant,
) -> (Vec<Option<Delivered>>, Errors) {
    let recipients = Arc::new(recipients.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (w, me) in senders.iter().enumerate() {
        let target = targets[w % targets.len()].clone();
        let (me, recipients, next) = (me.clone(), recipients.clone(), next.clone());
        let body = body.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut errors = Errors::default();
            let Some(mut conn) = open_until(&target, deadline, &mut errors).await else {
                return (sent, errors);
            };
            for _ in 0..recipients.len() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= recipients.len() || Instant::now() >= deadline {
                    break;
                }
                let t0 = Instant::now();
                match conn
                    .call_tool(
                        "phone_send",
                        send_args(&recipients[i], &body),
                        Some(&me.token),
                    )
                    .await
                {
                    Ok(v) => match sent_id(&v) {
                        Some(id) => sent.push((
                            i,
                            Delivered {
                                sent: t0,
                                answered: Instant::now(),
                                id,
                            },
                        )),
                        None => errors.add("phone_send", "bad_response", &format!("no id in {v}")),
                    },
                    Err(e) => {
                        errors.add("phone_send", e.kind(), &e.to_string());
                        if !recover(&mut conn, &e, &target, deadline, None, &mut errors).await {
                            break;
                        }
                    }
                }
            }
            (sent, errors)
        }));
    }
    let mut by_recipient = vec![None; recipients.len()];
    let mut errors = Errors::default();
    for t in tasks {
        if let Ok((sent, e)) = t.await {
            for (i, d) in sent {
                by_recipient[i] = Some(d);
            }
            errors.merge(e);
        }
    }
    (by_recipient, errors)
}
