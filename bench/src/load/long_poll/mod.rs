//! Long-poll workloads (`phone_inbox {wait_seconds}`): wake-up pairs across
//! replicas (`pairs`), closed-loop sends (here), re-arming waiters and a
//! swarm of agents each waiting in one long poll (`waiting`), and one
//! message to each of many agents (here). Every loop is bounded by a
//! deadline and by an iteration count.

mod pairs;
mod waiting;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::load::{Agent, BODY, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::{CallError, Conn, Target};
use crate::stats::{Errors, Lat};

pub use pairs::{Pair, PairPlan, PairsOutcome, SendWhen, pairs};
pub use waiting::{LAST_BODY, arm_swarm, join_rearming, rearming};

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
