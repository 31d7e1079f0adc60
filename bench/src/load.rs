//! The workloads: closed-loop send+poll mix, open-loop fixed rate, the
//! popular inbox (many senders and pollers, one recipient), search.
//! Every loop is bounded by a deadline and by an iteration count.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::mcp::{CallError, Conn, Target};
use crate::stats::{Errors, Lat};

/// Same text in the mix and in the pgbench baseline (no quotes: it is
/// pasted into the pgbench script as a literal).
pub const BODY: &str = "Hi, the nightly report for project atlas is ready: 3 new invoices, 1 failed \
payment retry, nothing urgent. Reply if you need the CSV.";

/// Upper bound on calls per worker, whatever the clock says.
pub const MAX_CALLS_PER_WORKER: u64 = 5_000_000;

#[derive(Clone, Debug)]
pub struct Agent {
    pub name: String,
    pub token: String,
}

/// Registers agents one after another through `phone_register` on one
/// connection (sequentially, so their ids are consecutive).
pub async fn register(
    target: &Target,
    names: &[String],
    project: &str,
) -> Result<Vec<Agent>, String> {
    let mut conn = Conn::open(target)
        .await
        .map_err(|e| format!("open {target:?}: {e}"))?;
    let mut agents = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let out = conn
            .call_tool(
                "phone_register",
                json!({
                    "name": name,
                    "description": format!("Benchmark agent {i}: sends status reports to its partner and reads its inbox in a loop."),
                    "project": project,
                }),
                None,
            )
            .await
            .map_err(|e| format!("phone_register {name}: {e}"))?;
        let token = out
            .get("token")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("phone_register {name}: no token in {out}"))?;
        agents.push(Agent {
            name: name.clone(),
            token: token.to_owned(),
        });
    }
    Ok(agents)
}

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

/// Opens a connection, retrying (bounded) until `deadline`; failures are
/// tallied in `errors`.
pub async fn open_until(target: &Target, deadline: Instant, errors: &mut Errors) -> Option<Conn> {
    for _ in 0..100 {
        match Conn::open(target).await {
            Ok(c) => return Some(c),
            Err(e) => {
                errors.add("initialize", e.kind(), &e.to_string());
                if Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    None
}

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

/// How the pollers of the popular inbox take their mail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotMode {
    /// `phone_inbox` marks what it returns read.
    Read,
    /// `mode: lease` for `seconds`, then one `phone_ack` of every receipt.
    Lease { seconds: u32 },
}

impl HotMode {
    /// The pollers' `phone_inbox` arguments.
    pub fn poll_args(self, limit: u32) -> Value {
        match self {
            HotMode::Read => json!({"limit": limit, "wait_seconds": 0}),
            HotMode::Lease { seconds } => json!({
                "limit": limit, "wait_seconds": 0, "mode": "lease", "lease_seconds": seconds
            }),
        }
    }
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
/// messages is followed by one `phone_ack` of all their receipts. Calls
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
            for _ in 0..MAX_CALLS_PER_WORKER {
                if Instant::now() >= stop_at {
                    break;
                }
                let t = Instant::now();
                let counted = t >= record_from && t < stop_at;
                let (tool, args) = if poller {
                    ("phone_inbox", &poll_args)
                } else {
                    ("phone_send", &send_args)
                };
                let r = conn.call_tool(tool, args.clone(), Some(&token)).await;
                let took = t.elapsed();
                out.calls_total += 1;
                let mut receipts = Vec::new();
                match r {
                    Ok(v) if poller => {
                        let at = Instant::now();
                        let ms = polled(&v);
                        for (id, receipt) in ms.iter().cloned() {
                            match id {
                                Some(id) => out.handouts.push(Handout { id, at }),
                                None => out.errors.add(tool, "bad_response", "message without id"),
                            }
                            if let HotMode::Lease { .. } = mode {
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
        if let HotMode::Lease { .. } = mode {
            match ack(&mut conn, &recipient.token, receipts).await {
                Ok(ids) => out.acked_ids.extend(ids),
                Err(e) => out.errors.add("drain ack", e.kind(), &e.to_string()),
            }
        }
    }
    taken
}

#[derive(Clone, Debug)]
pub struct SearchQuery {
    pub query: Option<String>,
    pub project: Option<String>,
}

#[derive(Default, Debug)]
pub struct SearchOutcome {
    pub lat: Lat,
    pub errors: Errors,
    pub results: u64,
    pub empty: u64,
}

/// Closed loop over `queries` (round-robin) with `workers` connections, for
/// `duration`, and on until at least `min_calls` were measured (slow
/// queries), but never past `hard_stop`.
pub async fn search(
    target: &Target,
    queries: &[SearchQuery],
    workers: usize,
    duration: Duration,
    min_calls: usize,
    hard_stop: Duration,
) -> SearchOutcome {
    let queries = Arc::new(queries.to_vec());
    let start = Instant::now();
    let (soft_stop, hard_stop) = (start + duration, start + hard_stop);
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (target, queries, done) = (target.clone(), queries.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = SearchOutcome::default();
            let Some(mut conn) = open_until(&target, hard_stop, &mut out.errors).await else {
                return out;
            };
            // One unrecorded call warms this connection's path.
            let _ = conn
                .call_tool("phone_search", args(&queries[w % queries.len()]), None)
                .await;
            for i in 0..MAX_CALLS_PER_WORKER as usize {
                let now = Instant::now();
                if now >= hard_stop
                    || (now >= soft_stop && done.load(Ordering::Relaxed) >= min_calls as u64)
                {
                    break;
                }
                let q = &queries[(i * workers + w) % queries.len()];
                let t = Instant::now();
                match conn.call_tool("phone_search", args(q), None).await {
                    Ok(v) => {
                        out.lat.record(t.elapsed());
                        done.fetch_add(1, Ordering::Relaxed);
                        let n = v
                            .get("agents")
                            .and_then(Value::as_array)
                            .map_or(0, |a| a.len() as u64);
                        out.results += n;
                        out.empty += u64::from(n == 0);
                    }
                    Err(e) => {
                        out.errors.add("phone_search", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, hard_stop, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => return out,
                            }
                        }
                    }
                }
            }
            out
        }));
    }
    let mut total = SearchOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.lat.merge(o.lat);
            total.errors.merge(o.errors);
            total.results += o.results;
            total.empty += o.empty;
        }
    }
    total
}

fn args(q: &SearchQuery) -> Value {
    let mut a = json!({"limit": 10});
    if let Some(query) = &q.query {
        a["query"] = json!(query);
    }
    if let Some(p) = &q.project {
        a["project"] = json!(p);
    }
    a
}
