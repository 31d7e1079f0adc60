//! Open loop: requests at a fixed rate, each due at its time whatever
//! happened before, latency from the due time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Agent, BODY, MAX_CALLS_PER_WORKER};
use crate::mcp::{Conn, Target};
use crate::stats::{Errors, Lat};

#[derive(Default, Debug)]
pub struct RateOutcome {
    pub send: Lat,
    pub inbox: Lat,
    /// Both tools, from the intended send time.
    pub all: Lat,
    /// From the moment the request actually went out (no queueing).
    pub service: Lat,
    /// How late requests left compared with their schedule.
    pub dispatch_lag: Lat,
    pub errors: Errors,
    pub completed: u64,
    pub measured_secs: f64,
}

/// One request of an open-loop schedule: a poll (`phone_inbox`) or a send,
/// its arguments, and the caller's token.
pub struct Planned {
    pub poll: bool,
    pub args: Value,
    pub token: Arc<str>,
}

/// What request `n` of an open-loop schedule is.
pub type Plan = Arc<dyn Fn(u64) -> Planned + Send + Sync>;

/// Open loop: request n is due at t0 + n/rate, whatever happened before.
/// `connections` workers take the next due request when free; latency is
/// measured from the due time, so a slow server cannot slow the schedule
/// down and hide its own queueing (no coordinated omission). Requests
/// alternate send (agent k to k^1) and poll (agent k).
pub async fn open_loop(
    targets: &[Target],
    agents: &[Agent],
    rate: f64,
    warmup: Duration,
    measure: Duration,
    connections: usize,
) -> RateOutcome {
    let tokens: Vec<Arc<str>> = agents.iter().map(|a| Arc::from(a.token.as_str())).collect();
    let send_args: Vec<Value> = (0..agents.len())
        .map(|k| json!({"to": agents[k ^ 1].name, "body": BODY}))
        .collect();
    let n_agents = agents.len();
    let plan: Plan = Arc::new(move |n| {
        let k = ((n / 2) as usize) % n_agents;
        let poll = n % 2 == 1;
        Planned {
            poll,
            args: if poll {
                json!({"limit": 10})
            } else {
                send_args[k].clone()
            },
            token: tokens[k].clone(),
        }
    });
    open_loop_plan(targets, plan, rate, warmup, measure, connections).await
}

/// Open loop over any schedule of sends and polls (see `open_loop`).
pub async fn open_loop_plan(
    targets: &[Target],
    plan: Plan,
    rate: f64,
    warmup: Duration,
    measure: Duration,
    connections: usize,
) -> RateOutcome {
    let total = ((warmup + measure).as_secs_f64() * rate).floor() as u64;
    let next = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::new();
    let mut out = RateOutcome::default();
    for i in 0..connections {
        let target = &targets[i % targets.len()];
        match Conn::open(target).await {
            Ok(c) => conns.push((c, target.clone())),
            Err(e) => out.errors.add("initialize", e.kind(), &e.to_string()),
        }
    }
    let t0 = Instant::now() + Duration::from_millis(20);
    let record_from = t0 + warmup;
    let hard_stop = t0 + warmup + measure + Duration::from_secs(15);
    let mut tasks = Vec::new();
    for (mut conn, target) in conns {
        let (plan, next) = (plan.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = RateOutcome::default();
            for _ in 0..MAX_CALLS_PER_WORKER {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= hard_stop {
                    break;
                }
                let due = t0 + Duration::from_secs_f64(n as f64 / rate);
                let call = plan(n);
                tokio::time::sleep_until(due).await;
                let sent = Instant::now();
                let poll = call.poll;
                let tool = if poll { "phone_inbox" } else { "phone_send" };
                let r = conn.call_tool(tool, call.args, Some(&call.token)).await;
                let done = Instant::now();
                match r {
                    Ok(_) => {
                        if due >= record_from {
                            let lat = done - due;
                            if poll {
                                out.inbox.record(lat)
                            } else {
                                out.send.record(lat)
                            }
                            out.all.record(lat);
                            out.service.record(done - sent);
                            out.dispatch_lag.record(sent - due);
                            out.completed += 1;
                        }
                    }
                    Err(e) => {
                        out.errors.add(tool, e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match Conn::open(&target).await {
                                Ok(c) => conn = c,
                                Err(e) => {
                                    out.errors.add("initialize", e.kind(), &e.to_string());
                                    break;
                                }
                            }
                        }
                    }
                }
            }
            out
        }));
    }
    for t in tasks {
        if let Ok(o) = t.await {
            out.send.merge(o.send);
            out.inbox.merge(o.inbox);
            out.all.merge(o.all);
            out.service.merge(o.service);
            out.dispatch_lag.merge(o.dispatch_lag);
            out.errors.merge(o.errors);
            out.completed += o.completed;
        }
    }
    out.measured_secs = measure.as_secs_f64();
    let missing = total.saturating_sub(next.load(Ordering::Relaxed).min(total));
    if missing > 0 {
        out.errors.add(
            "schedule",
            "not_sent",
            &format!("{missing} scheduled requests never went out"),
        );
    }
    out
}
