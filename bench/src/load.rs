//! The workloads: closed-loop send+poll mix, open-loop fixed rate, search.
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

use crate::mcp::{Conn, Target};
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
    let agents: Arc<Vec<Agent>> = Arc::new(agents.to_vec());
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
    let send_args: Arc<Vec<Value>> = Arc::new(
        agents
            .iter()
            .enumerate()
            .map(|(k, _)| json!({"to": agents[k ^ 1].name, "body": BODY}))
            .collect(),
    );
    let mut tasks = Vec::new();
    for (mut conn, target) in conns {
        let (agents, next, send_args) = (agents.clone(), next.clone(), send_args.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = RateOutcome::default();
            for _ in 0..MAX_CALLS_PER_WORKER {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= hard_stop {
                    break;
                }
                let due = t0 + Duration::from_secs_f64(n as f64 / rate);
                tokio::time::sleep_until(due).await;
                let sent = Instant::now();
                let k = ((n / 2) as usize) % agents.len();
                let poll = n % 2 == 1;
                let r = if poll {
                    conn.call_tool("phone_inbox", json!({"limit": 10}), Some(&agents[k].token))
                        .await
                } else {
                    conn.call_tool("phone_send", send_args[k].clone(), Some(&agents[k].token))
                        .await
                };
                let done = Instant::now();
                let tool = if poll { "phone_inbox" } else { "phone_send" };
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
