//! Closed loops on many connections: the send+poll mix between pairs of
//! agents, and requests that reach the MCP layer but not the database.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Agent, BODY, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::Target;
use crate::stats::{Errors, Lat};

#[derive(Default, Debug)]
pub struct MixOutcome {
    pub send: Lat,
    pub inbox: Lat,
    pub errors: Errors,
    /// Successful calls inside the measured window (client-side view).
    pub sends_ok: u64,
    pub polls_ok: u64,
    pub messages_returned: u64,
    /// Every call, warm-up included (for per-call database counters).
    pub calls_total: u64,
    /// Successful sends, warm-up included (to check each was stored).
    pub sends_total: u64,
    pub protocol: String,
}

impl MixOutcome {
    fn merge(&mut self, o: MixOutcome) {
        self.send.merge(o.send);
        self.inbox.merge(o.inbox);
        self.errors.merge(o.errors);
        self.sends_ok += o.sends_ok;
        self.polls_ok += o.polls_ok;
        self.messages_returned += o.messages_returned;
        self.calls_total += o.calls_total;
        self.sends_total += o.sends_total;
        if self.protocol.is_empty() {
            self.protocol = o.protocol;
        }
    }
}

/// Closed loop: one worker per agent, each on its own keep-alive connection
/// (replicas round-robin). Agent i sends to agent i^1, then polls its own
/// inbox: sends and polls 1:1. Calls before `warmup` are not recorded.
pub async fn mix(
    targets: &[Target],
    agents: &[Agent],
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> MixOutcome {
    assert!(agents.len().is_multiple_of(2), "agents come in pairs");
    let record_from = start + warmup;
    let stop_at = record_from + measure;
    let mut tasks = Vec::new();
    for (i, me) in agents.iter().enumerate() {
        let target = targets[i % targets.len()].clone();
        let me = me.clone();
        let peer = agents[i ^ 1].name.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = MixOutcome::default();
            let mut conn = match open_until(&target, stop_at, &mut out.errors).await {
                Some(c) => c,
                None => return out,
            };
            out.protocol = conn.protocol().to_owned();
            let send_args = json!({"to": peer, "body": BODY});
            let poll_args = json!({"limit": 10});
            for _ in 0..MAX_CALLS_PER_WORKER {
                if Instant::now() >= stop_at {
                    break;
                }
                for poll in [false, true] {
                    let t = Instant::now();
                    let (tool, args) = if poll {
                        ("phone_inbox", &poll_args)
                    } else {
                        ("phone_send", &send_args)
                    };
                    let r = conn.call_tool(tool, args.clone(), Some(&me.token)).await;
                    let took = t.elapsed();
                    out.calls_total += 1;
                    let counted = t >= record_from && t < stop_at;
                    match r {
                        Ok(v) => {
                            if !poll {
                                out.sends_total += 1;
                            }
                            if counted {
                                if poll {
                                    out.inbox.record(took);
                                    out.polls_ok += 1;
                                    out.messages_returned += v
                                        .get("messages")
                                        .and_then(Value::as_array)
                                        .map_or(0, |m| m.len() as u64);
                                } else {
                                    out.send.record(took);
                                    out.sends_ok += 1;
                                }
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
                }
            }
            out
        }));
    }
    let mut total = MixOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.merge(o);
        }
    }
    total
}

/// Requests that reach the MCP layer but not the database, to price the
/// server's fixed cost per request: JSON-RPC `ping`, or a `phone_inbox`
/// call whose arguments fail validation (a tool error before any query).
#[derive(Clone, Copy, Debug)]
pub enum NoDb {
    Ping,
    InvalidToolCall,
}

pub async fn no_db(
    targets: &[Target],
    workers: usize,
    what: NoDb,
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> (Lat, Errors) {
    let record_from = start + warmup;
    let stop_at = record_from + measure;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let target = targets[w % targets.len()].clone();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Lat::default(), Errors::default());
            let Some(mut conn) = open_until(&target, stop_at, &mut errors).await else {
                return (lat, errors);
            };
            for _ in 0..MAX_CALLS_PER_WORKER {
                if Instant::now() >= stop_at {
                    break;
                }
                let t = Instant::now();
                let r = match what {
                    NoDb::Ping => conn.request("ping", json!({}), None).await.map(|_| ()),
                    NoDb::InvalidToolCall => match conn
                        .call_tool("phone_inbox", json!({"limit": 0}), None)
                        .await
                    {
                        Err(crate::mcp::CallError::Tool(_)) => Ok(()),
                        Ok(v) => Err(crate::mcp::CallError::Decode(format!(
                            "expected a tool error, got {v}"
                        ))),
                        Err(e) => Err(e),
                    },
                };
                match r {
                    Ok(()) => {
                        if t >= record_from {
                            lat.record(t.elapsed());
                        }
                    }
                    Err(e) => {
                        errors.add("no-db", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, stop_at, &mut errors).await {
                                Some(c) => conn = c,
                                None => break,
                            }
                        }
                    }
                }
            }
            (lat, errors)
        }));
    }
    let (mut lat, mut errors) = (Lat::default(), Errors::default());
    for t in tasks {
        if let Ok((l, e)) = t.await {
            lat.merge(l);
            errors.merge(e);
        }
    }
    (lat, errors)
}
