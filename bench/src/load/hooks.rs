//! Workloads of the webhook and contact-policy phases: a local webhook
//! receiver, closed-loop sends spread over many recipients, sends at a fixed
//! rate that keep each message's id and times, and `phone_settings` for many
//! agents. Every loop is bounded by a deadline and by an iteration count.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, task::JoinHandle, time::Instant};

use super::{Agent, BODY, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::{CallError, Target};
use crate::stats::{Errors, Lat};

/// The words of a send refused by the recipient's contact policy or a
/// block (the same for both: `PhoneError::Refused`).
const REFUSED: &str = "does not accept new conversations from you";

/// One POST the receiver took: its `webhook-id` header, the message id in
/// its body (`data.id`), and when its body had arrived.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub webhook_id: String,
    pub message_id: String,
    pub at: Instant,
}

#[derive(Default)]
struct Log {
    arrivals: Vec<Arrival>,
    /// POSTs without the Standard Webhooks headers, of another type, or
    /// whose `webhook-id` is not the message's id.
    malformed: u64,
    examples: Vec<String>,
}

/// A webhook receiver on 127.0.0.1 (a port of the kernel's choosing): every
/// POST is answered 200 with an empty body and logged.
pub struct Receiver {
    pub port: u16,
    log: Arc<Mutex<Log>>,
    accept: JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("webhook receiver: bind: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("webhook receiver: {e}"))?
            .port();
        let log: Arc<Mutex<Log>> = Arc::default();
        let shared = log.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of file descriptors, say: try again shortly.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let log = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| take(req, log.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { port, log, accept })
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// POSTs taken so far (well-formed ones).
    pub fn count(&self) -> usize {
        self.log().arrivals.len()
    }

    /// Every well-formed POST so far, in order of arrival.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.log().arrivals.clone()
    }

    /// Malformed POSTs so far, and the first few of them.
    pub fn malformed(&self) -> (u64, Vec<String>) {
        let log = self.log();
        (log.malformed, log.examples.clone())
    }

    /// Waits (bounded) until `pred` holds for the arrivals so far; whether it did.
    pub async fn until(&self, deadline: Instant, pred: impl Fn(&[Arrival]) -> bool) -> bool {
        loop {
            if pred(&self.log().arrivals) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn take(
    req: Request<Incoming>,
    log: Arc<Mutex<Log>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let at = Instant::now();
    let parsed = body
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let message_id = parsed
        .as_ref()
        .filter(|v| v.get("type").and_then(Value::as_str) == Some("message.received"))
        .and_then(|v| v.pointer("/data/id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let well_formed = timestamp
        .as_deref()
        .is_some_and(|t| t.parse::<i64>().is_ok())
        && signature.as_deref().is_some_and(|s| s.starts_with("v1,"));
    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
    match (id, message_id) {
        (Some(webhook_id), Some(message_id)) if well_formed && webhook_id == message_id => {
            log.arrivals.push(Arrival {
                webhook_id,
                message_id,
                at,
            })
        }
        (id, message_id) => {
            log.malformed += 1;
            if log.examples.len() < 5 {
                log.examples.push(format!(
                    "webhook-id {id:?}, data.id {message_id:?}, timestamp {timestamp:?}, signature present: {}",
                    signature.is_some()
                ));
            }
        }
    }
    Ok(Response::new(Full::new(Bytes::new())))
}

#[derive(Default, Debug)]
pub struct SpreadOutcome {
    /// Sends stored (answered with an id) inside the measured window.
    pub lat: Lat,
    pub ok: u64,
    /// Sends refused by the recipient's policy inside the window.
    pub refused: u64,
    /// Per sender, warm-up included: (stored, refused) answers.
    pub per_sender: Vec<(u64, u64)>,
    pub errors: Errors,
}

impl SpreadOutcome {
    pub fn ok_total(&self) -> u64 {
        self.per_sender.iter().map(|s| s.0).sum()
    }
    pub fn refused_total(&self) -> u64 {
        self.per_sender.iter().map(|s| s.1).sum()
    }
}

/// Closed loop: worker i sends as `senders[i]` through replica i (round
/// robin), on its own connection, one send after another, each to the next
/// of `recipients` (worker i starts at its own offset, so that the workers
/// spread over all of them). Sends before `warmup` are not recorded; a
/// refusal by the recipient's policy is counted apart, not as an error.
pub async fn spread(
    targets: &[Target],
    senders: &[Agent],
    recipients: &[String],
    start: Instant,
    warmup: Duration,
    measure: Duration,
) -> SpreadOutcome {
    let record_from = start + warmup;
    let stop_at = record_from + measure;
    let recipients = Arc::new(recipients.to_vec());
    let mut tasks = Vec::new();
    for (i, me) in senders.iter().enumerate() {
        let target = targets[i % targets.len()].clone();
        let (me, recipients) = (me.clone(), recipients.clone());
        let first = i * recipients.len() / senders.len();
        tasks.push(tokio::spawn(async move {
            let mut out = SpreadOutcome::default();
            let (mut stored, mut refused) = (0, 0);
            let Some(mut conn) = open_until(&target, stop_at, &mut out.errors).await else {
                out.per_sender.push((stored, refused));
                return out;
            };
            for k in 0..MAX_CALLS_PER_WORKER as usize {
                let t = Instant::now();
                if t >= stop_at {
                    break;
                }
                let to = &recipients[(first + k) % recipients.len()];
                let counted = t >= record_from;
                match conn
                    .call_tool(
                        "phone_send",
                        json!({"to": to, "body": BODY}),
                        Some(&me.token),
                    )
                    .await
                {
                    Ok(_) => {
                        stored += 1;
                        if counted {
                            out.lat.record(t.elapsed());
                            out.ok += 1;
                        }
                    }
                    Err(CallError::Tool(text)) if text.contains(REFUSED) => {
                        refused += 1;
                        out.refused += u64::from(counted);
                    }
                    Err(e) => {
                        out.errors.add("phone_send", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, stop_at, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => break,
                            }
                        }
                    }
                }
            }
            out.per_sender.push((stored, refused));
            out
        }));
    }
    let mut total = SpreadOutcome::default();
    for t in tasks {
        match t.await {
            Ok(o) => {
                total.lat.merge(o.lat);
                total.ok += o.ok;
                total.refused += o.refused;
                total.per_sender.extend(o.per_sender);
                total.errors.merge(o.errors);
            }
            Err(e) => {
                total.per_sender.push((0, 0));
                total.errors.add("worker", "panicked", &e.to_string());
            }
        }
    }
    total
}

/// One send of `paced`: the message's id, when the request went out and
/// when its answer came.
#[derive(Clone, Debug)]
pub struct PacedSend {
    pub id: String,
    pub sent: Instant,
    pub answered: Instant,
}

#[derive(Default, Debug)]
pub struct PacedOutcome {
    pub sends: Vec<PacedSend>,
    /// The sends themselves, request to answer, and how late each went out.
    pub lat: Lat,
    pub lag: Lat,
    pub errors: Errors,
}

/// Open loop: send n is due at t0 + n/rate for `duration`, from
/// `senders[n % s]` to `recipients[n % r]`; `connections` workers (replicas
/// round robin) take the next due send when free.
pub async fn paced(
    targets: &[Target],
    senders: &[Agent],
    recipients: &[String],
    rate: f64,
    duration: Duration,
    connections: usize,
) -> PacedOutcome {
    let total = (duration.as_secs_f64() * rate).floor() as u64;
    let next = Arc::new(AtomicU64::new(0));
    let (senders, recipients) = (Arc::new(senders.to_vec()), Arc::new(recipients.to_vec()));
    let t0 = Instant::now() + Duration::from_millis(200);
    let hard_stop = t0 + duration + Duration::from_secs(15);
    let mut tasks = Vec::new();
    for w in 0..connections {
        let target = targets[w % targets.len()].clone();
        let (next, senders, recipients) = (next.clone(), senders.clone(), recipients.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = PacedOutcome::default();
            let Some(mut conn) = open_until(&target, t0, &mut out.errors).await else {
                return out;
            };
            for _ in 0..MAX_CALLS_PER_WORKER {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total || Instant::now() >= hard_stop {
                    break;
                }
                let due = t0 + Duration::from_secs_f64(n as f64 / rate);
                let me = &senders[(n as usize) % senders.len()];
                let to = &recipients[(n as usize) % recipients.len()];
                tokio::time::sleep_until(due).await;
                let sent = Instant::now();
                let r = conn
                    .call_tool(
                        "phone_send",
                        json!({"to": to, "body": BODY}),
                        Some(&me.token),
                    )
                    .await;
                let answered = Instant::now();
                match r {
                    Ok(v) => match v.get("id").and_then(Value::as_str) {
                        Some(id) => {
                            out.lat.record(answered - sent);
                            out.lag.record(sent - due);
                            out.sends.push(PacedSend {
                                id: id.to_owned(),
                                sent,
                                answered,
                            });
                        }
                        None => {
                            out.errors
                                .add("phone_send", "bad_response", &format!("no id in {v}"))
                        }
                    },
                    Err(e) => {
                        out.errors.add("phone_send", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, hard_stop, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => break,
                            }
                        }
                    }
                }
            }
            out
        }));
    }
    let mut out = PacedOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            out.sends.extend(o.sends);
            out.lat.merge(o.lat);
            out.lag.merge(o.lag);
            out.errors.merge(o.errors);
        }
    }
    let went_out = next.load(Ordering::Relaxed).min(total);
    if went_out < total {
        out.errors.add(
            "schedule",
            "not_sent",
            &format!("{} scheduled sends never went out", total - went_out),
        );
    }
    out
}

/// `phone_settings` for each agent with its own arguments, by `workers`
/// connections at once (replicas round robin); per agent its answer's
/// `structuredContent`, or the error.
pub async fn settings_each(
    targets: &[Target],
    calls: Vec<(Agent, Value)>,
    workers: usize,
    deadline: Instant,
) -> Vec<Result<Value, String>> {
    let n = calls.len();
    let calls = Arc::new(calls);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..workers.min(n) {
        let target = targets[w % targets.len()].clone();
        let (calls, next) = (calls.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut errors = Errors::default();
            let Some(mut conn) = open_until(&target, deadline, &mut errors).await else {
                return done;
            };
            for _ in 0..calls.len() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= calls.len() || Instant::now() >= deadline {
                    break;
                }
                let (agent, args) = &calls[i];
                let r = conn
                    .call_tool("phone_settings", args.clone(), Some(&agent.token))
                    .await;
                if let Err(e) = &r
                    && e.needs_reconnect()
                {
                    match open_until(&target, deadline, &mut errors).await {
                        Some(c) => conn = c,
                        None => break,
                    }
                }
                done.push((i, r.map_err(|e| format!("{}: {e}", agent.name))));
            }
            done
        }));
    }
    let mut by_agent: HashMap<usize, Result<Value, String>> = HashMap::new();
    for t in tasks {
        if let Ok(done) = t.await {
            by_agent.extend(done);
        }
    }
    (0..n)
        .map(|i| {
            by_agent
                .remove(&i)
                .unwrap_or_else(|| Err(format!("{}: not called in time", calls[i].0.name)))
        })
        .collect()
}
