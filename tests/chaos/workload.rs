//! The steady send + poll load, the clients' histories, and the checker that
//! compares them with each other and with the database.
//!
//! Senders record every send the server acknowledged, with its idempotency
//! key; a failed call is retried on the next replica with the same key.
//! Pollers (read mode) record every message a poll returned; after a failed
//! poll (its response may have been lost, or its connection to PostgreSQL
//! after the commit) they look at their history (`include_read: true`),
//! since a poll marks messages read in the same transaction that returns them.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::client::{Mcp, Outcome, register};
use crate::harness;

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub senders: usize,
    pub recipients: usize,
    pub pollers_per_recipient: usize,
    /// Pause between one sender's messages (pacing, so the load is steady).
    pub send_interval: Duration,
    /// The client's own timeout for one call.
    pub client_timeout: Duration,
    /// A sender gives a message up after retrying it this long.
    pub message_deadline: Duration,
    /// Upper bound on messages per sender (every loop is bounded in count).
    pub max_per_sender: usize,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            senders: 4,
            recipients: 4,
            pollers_per_recipient: 2,
            send_interval: Duration::from_millis(20),
            client_timeout: Duration::from_secs(8),
            message_deadline: Duration::from_secs(30),
            max_per_sender: 5_000,
        }
    }
}

impl LoadConfig {
    pub fn describe(&self, replicas: usize, seconds: f64, acked: usize) -> String {
        format!(
            "{} senders → {} inboxes ({} pollers), {replicas} replica{}, {seconds:.0} s, ≈{:.0} sends/s",
            self.senders,
            self.recipients,
            self.recipients * self.pollers_per_recipient,
            if replicas == 1 { "" } else { "s" },
            acked as f64 / seconds.max(1.0)
        )
    }
}

#[derive(Debug, Clone)]
pub struct CallRecord {
    /// Seconds since the load started, when the call began and ended.
    pub start: f64,
    pub end: f64,
    pub replica: usize,
    pub tool: &'static str,
    /// The agent that called (sender or recipient); empty for probes.
    pub agent: String,
    pub kind: String,
    pub detail: String,
}

impl CallRecord {
    pub fn latency(&self) -> f64 {
        self.end - self.start
    }
    pub fn ok(&self) -> bool {
        self.kind == "ok"
    }
}

#[derive(Debug, Clone)]
pub struct SendRecord {
    pub key: String,
    pub recipient: String,
    pub body: String,
    pub attempts: u32,
    /// The id the server acknowledged, and whether that answer was a replay.
    pub acked: Option<(String, bool)>,
    pub gave_up: bool,
    /// A non-retryable answer (a bug in this workload or the server).
    pub rejected: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Poll,
    History,
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub recipient: String,
    pub id: String,
    pub body: String,
    pub read: bool,
    pub via: Via,
}

pub struct Agent {
    pub name: String,
    pub token: String,
}

pub struct Load {
    pub t0: Instant,
    /// The wall clock at `t0`, to place database timestamps on the call log.
    pub wall0: chrono::DateTime<chrono::Utc>,
    pub bases: Vec<String>,
    pub config: LoadConfig,
    pub calls: Mutex<Vec<CallRecord>>,
    pub sends: Mutex<Vec<SendRecord>>,
    pub seen: Mutex<Vec<Seen>>,
    pub senders: Vec<Agent>,
    pub recipients: Vec<Agent>,
    stop_sending: AtomicBool,
    stop_polling: AtomicBool,
    pub acked_count: AtomicUsize,
}

pub struct Running {
    pub load: Arc<Load>,
    senders: Vec<tokio::task::JoinHandle<()>>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Registers the agents and starts senders and pollers.
    pub async fn start(bases: Vec<String>, config: LoadConfig, prefix: &str) -> Running {
        let mcp = Mcp::new(Duration::from_secs(10));
        let mut senders = Vec::new();
        let mut recipients = Vec::new();
        for i in 0..config.senders {
            let name = format!("{prefix}-s{i}");
            senders.push(Agent {
                token: register(&mcp, &bases, &name).await,
                name,
            });
        }
        for i in 0..config.recipients {
            let name = format!("{prefix}-r{i}");
            recipients.push(Agent {
                token: register(&mcp, &bases, &name).await,
                name,
            });
        }
        let load = Arc::new(Load {
            t0: Instant::now(),
            wall0: chrono::Utc::now(),
            bases,
            config: config.clone(),
            calls: Mutex::default(),
            sends: Mutex::default(),
            seen: Mutex::default(),
            senders,
            recipients,
            stop_sending: AtomicBool::new(false),
            stop_polling: AtomicBool::new(false),
            acked_count: AtomicUsize::new(0),
        });
        let senders = (0..config.senders)
            .map(|i| tokio::spawn(sender(load.clone(), i)))
            .collect();
        let mut pollers = Vec::new();
        for r in 0..config.recipients {
            for p in 0..config.pollers_per_recipient {
                pollers.push(tokio::spawn(poller(load.clone(), r, p)));
            }
        }
        Running {
            load,
            senders,
            pollers,
        }
    }

    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn record(&self, start: f64, replica: usize, tool: &'static str, agent: &str, out: &Outcome) {
        let end = self.now();
        self.calls.lock().unwrap().push(CallRecord {
            start,
            end,
            replica,
            tool,
            agent: agent.to_owned(),
            kind: out.kind(),
            detail: out.detail(),
        });
    }

    pub fn calls(&self) -> Vec<CallRecord> {
        self.calls.lock().unwrap().clone()
    }
}

impl Running {
    /// Stops sending (every message in flight is retried to the end), lets
    /// the pollers drain the inboxes, then reads every inbox's history once.
    pub async fn finish(self, drain: Duration) -> Arc<Load> {
        let load = self.load;
        load.stop_sending.store(true, Ordering::SeqCst);
        for s in self.senders {
            s.await.expect("sender task");
        }
        load.stop_polling.store(true, Ordering::SeqCst);
        let all = futures_util::future::join_all(self.pollers);
        if tokio::time::timeout(drain, all).await.is_err() {
            panic!("pollers did not drain the inboxes within {drain:?}");
        }
        final_history(&load).await;
        load
    }
}

async fn sender(load: Arc<Load>, idx: usize) {
    let cfg = &load.config;
    let mcp = Mcp::new(cfg.client_timeout);
    let me = &load.senders[idx];
    let n = load.bases.len();
    for seq in 0..cfg.max_per_sender {
        if load.stop_sending.load(Ordering::SeqCst) {
            break;
        }
        let paced = Instant::now() + cfg.send_interval;
        let to = &load.recipients[(idx + seq) % load.recipients.len()];
        let key = format!("{}-{seq}", me.name);
        let body = format!("chaos {key}");
        let mut rec = SendRecord {
            key: key.clone(),
            recipient: to.name.clone(),
            body: body.clone(),
            attempts: 0,
            acked: None,
            gave_up: false,
            rejected: None,
        };
        let started = Instant::now();
        let mut r = (idx + seq) % n;
        loop {
            rec.attempts += 1;
            let at = load.now();
            let args = json!({"name": me.name, "token": me.token, "to": to.name, "body": body, "idempotency_key": key});
            let (out, _) = mcp.call(&load.bases[r], "phone_send", args).await;
            load.record(at, r, "phone_send", &me.name, &out);
            match out {
                Outcome::Ok(v) => {
                    let id = v["id"].as_str().expect("sent id").to_owned();
                    rec.acked = Some((id, v["replayed"].as_bool() == Some(true)));
                    load.acked_count.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                o if o.retryable() => {
                    if started.elapsed() > cfg.message_deadline {
                        rec.gave_up = true;
                        break;
                    }
                    r = (r + 1) % n;
                    let backoff = (25 * u64::from(rec.attempts)).min(250);
                    tokio::time::sleep(Duration::from_millis(backoff)).await;
                }
                o => {
                    rec.rejected = Some(o.detail());
                    break;
                }
            }
        }
        load.sends.lock().unwrap().push(rec);
        tokio::time::sleep_until(paced.into()).await;
    }
}

async fn poller(load: Arc<Load>, recipient: usize, p: usize) {
    let cfg = &load.config;
    let mcp = Mcp::new(cfg.client_timeout);
    let me = &load.recipients[recipient];
    let n = load.bases.len();
    // Half the pollers long-poll (LISTEN/NOTIFY path), half poll and sleep.
    let wait = if p % 2 == 1 { 1 } else { 0 };
    let mut r = (recipient + p) % n;
    let mut need_history = false;
    let mut drained_at: Option<Instant> = None;
    // Bounded: at most this many polls, however long the run.
    for _ in 0..200_000 {
        let draining = load.stop_polling.load(Ordering::SeqCst);
        let at = load.now();
        let wait_now = if draining { 0 } else { wait };
        let args =
            json!({"name": me.name, "token": me.token, "limit": 20, "wait_seconds": wait_now});
        let (out, _) = mcp.call(&load.bases[r], "phone_inbox", args).await;
        load.record(at, r, "phone_inbox", &me.name, &out);
        match out {
            Outcome::Ok(v) => {
                let messages = v["messages"].as_array().cloned().unwrap_or_default();
                record_seen(&load, me, &messages, Via::Poll);
                if need_history && history(&load, &mcp, r, me).await {
                    need_history = false;
                }
                let empty = messages.is_empty() && v["unread_remaining"].as_i64() == Some(0);
                if draining && empty && !need_history {
                    // Twice empty, a moment apart: nothing was in flight.
                    match drained_at {
                        Some(t) if t.elapsed() > Duration::from_millis(300) => return,
                        Some(_) => {}
                        None => drained_at = Some(Instant::now()),
                    }
                } else {
                    drained_at = None;
                }
                if messages.is_empty() && wait_now == 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            o => {
                // Whatever the failure, the poll may have committed: a
                // connection lost after PostgreSQL ran the UPDATE reads as
                // "temporarily unavailable; retry", and a retry will not
                // return those messages again. Look at the history.
                if !matches!(o, Outcome::Rpc(..)) {
                    need_history = true;
                }
                r = (r + 1) % n;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn record_seen(load: &Load, me: &Agent, messages: &[Value], via: Via) {
    let mut seen = load.seen.lock().unwrap();
    for m in messages {
        seen.push(Seen {
            recipient: me.name.clone(),
            id: m["id"].as_str().unwrap_or_default().to_owned(),
            body: m["body"].as_str().unwrap_or_default().to_owned(),
            read: !m["read_at"].is_null(),
            via,
        });
    }
}

/// The inbox's 100 most recent messages, read or not; marks nothing.
async fn history(load: &Load, mcp: &Mcp, r: usize, me: &Agent) -> bool {
    let at = load.now();
    let args = json!({"name": me.name, "token": me.token, "limit": 100, "include_read": true});
    let (out, _) = mcp.call(&load.bases[r], "phone_inbox", args).await;
    load.record(at, r, "phone_inbox", &me.name, &out);
    match out {
        Outcome::Ok(v) => {
            record_seen(
                load,
                me,
                v["messages"].as_array().map(Vec::as_slice).unwrap_or(&[]),
                Via::History,
            );
            true
        }
        _ => false,
    }
}

async fn final_history(load: &Load) {
    let mcp = Mcp::new(Duration::from_secs(10));
    for me in &load.recipients {
        let mut ok = false;
        for attempt in 0..20 {
            if history(load, &mcp, attempt % load.bases.len(), me).await {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(ok, "could not read {}'s history at the end", me.name);
    }
}

// ---------------------------------------------------------------------------
// The checker.

#[derive(Debug, Default, Clone)]
pub struct Verdict {
    pub attempted: usize,
    pub acknowledged: usize,
    /// Acknowledgements that were replays of an earlier, unanswered attempt.
    pub replayed: usize,
    pub gave_up: usize,
    pub rejected: Vec<String>,
    /// Acknowledged and returned by exactly one poll.
    pub delivered_once: usize,
    /// Read in the database, never returned to a client by a poll (a poll
    /// whose response was lost), found by the client in its history.
    pub via_history: usize,
    /// Read in the database, never seen by any client, not even in history.
    pub read_unseen: usize,
    /// Acknowledged, unread in the database (allowed: still waiting).
    pub waiting: usize,
    /// Acknowledged but not in the database.
    pub lost: Vec<String>,
    /// Returned by more than one poll, or handed out more than once.
    pub duplicated: Vec<String>,
    /// Polled or stored messages that no client ever attempted.
    pub invented: Vec<String>,
    /// The acknowledged id differs from the one polled or stored.
    pub mismatched: Vec<String>,
    /// Keys stored more than once.
    pub stored_twice: Vec<String>,
    /// Never acknowledged but stored anyway (the client gave up; allowed).
    pub stored_unacknowledged: usize,
    pub db_rows: usize,
    pub polled: usize,
    /// For messages read but never returned by a poll: key, and when the
    /// database marked them read (seconds since the load started).
    pub unseen: Vec<(String, String, f64)>,
}

impl Verdict {
    pub fn delivered(&self) -> usize {
        self.delivered_once + self.via_history + self.read_unseen
    }

    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut add = |what: &str, list: &[String]| {
            if !list.is_empty() {
                v.push(format!(
                    "{what}: {} (e.g. {:?})",
                    list.len(),
                    &list[..list.len().min(5)]
                ));
            }
        };
        add("lost", &self.lost);
        add("duplicated", &self.duplicated);
        add("invented", &self.invented);
        add("id mismatch", &self.mismatched);
        add("stored twice", &self.stored_twice);
        add("rejected sends", &self.rejected);
        v
    }

    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "attempted {}, acknowledged {} ({} replayed), gave up {}, delivered {} (once by poll {}, \
             via history {}, read-unseen {}), waiting {}, lost {}, duplicated {}, invented {}, \
             id mismatches {}, stored twice {}, stored unacknowledged {}, db rows {}, polled {}",
            self.attempted,
            self.acknowledged,
            self.replayed,
            self.gave_up,
            self.delivered(),
            self.delivered_once,
            self.via_history,
            self.read_unseen,
            self.waiting,
            self.lost.len(),
            self.duplicated.len(),
            self.invented.len(),
            self.mismatched.len(),
            self.stored_twice.len(),
            self.stored_unacknowledged,
            self.db_rows,
            self.polled,
        );
        s
    }
}

/// Compares the clients' histories with each other and with the database.
pub async fn check(load: &Load, database_url: &str) -> Verdict {
    let sends = load.sends.lock().unwrap().clone();
    let seen = load.seen.lock().unwrap().clone();
    let db = harness::connect(database_url).await;
    let rows = db
        .query(
            "SELECT m.id, s.name AS sender, r.name AS recipient, m.idempotency_key, m.body,
                    m.read_at IS NOT NULL AS read, m.read_at, m.delivery_count
             FROM messages m JOIN agents s ON s.id = m.sender_id JOIN agents r ON r.id = m.recipient_id",
            &[],
        )
        .await
        .expect("read messages");

    let mut v = Verdict {
        attempted: sends.len(),
        db_rows: rows.len(),
        ..Verdict::default()
    };
    let by_key: HashMap<&str, &SendRecord> = sends.iter().map(|s| (s.key.as_str(), s)).collect();

    // key -> (id, read, delivery_count) rows in the database
    let mut stored: HashMap<String, Vec<(String, bool, i32)>> = HashMap::new();
    let mut read_at: HashMap<String, f64> = HashMap::new();
    for row in &rows {
        let key: Option<String> = row.get("idempotency_key");
        let body: String = row.get("body");
        let id = format!("msg_{}", row.get::<_, i64>("id"));
        let Some(key) = key else {
            v.invented
                .push(format!("{id} stored without a key: {body:?}"));
            continue;
        };
        match by_key.get(key.as_str()) {
            Some(s) if s.body == body && s.recipient == row.get::<_, String>("recipient") => {}
            _ => v
                .invented
                .push(format!("{id} stored with key {key}: {body:?}")),
        }
        if let Some(t) = row.get::<_, Option<chrono::DateTime<chrono::Utc>>>("read_at") {
            read_at.insert(
                key.clone(),
                (t - load.wall0).num_milliseconds() as f64 / 1000.0,
            );
        }
        stored
            .entry(key)
            .or_default()
            .push((id, row.get("read"), row.get("delivery_count")));
    }
    for (key, copies) in &stored {
        if copies.len() > 1 {
            v.stored_twice.push(key.clone());
        }
        if copies.iter().any(|(_, _, n)| *n > 1) {
            v.duplicated.push(format!(
                "{key} handed out {} times (delivery_count)",
                copies[0].2
            ));
        }
    }

    // key -> ids returned by polls
    let mut polled: HashMap<String, Vec<String>> = HashMap::new();
    let mut in_history: HashSet<String> = HashSet::new();
    for s in &seen {
        let key = s.body.strip_prefix("chaos ").unwrap_or(&s.body).to_owned();
        let known = by_key
            .get(key.as_str())
            .is_some_and(|rec| rec.recipient == s.recipient);
        match s.via {
            Via::Poll => {
                v.polled += 1;
                if !known {
                    v.invented
                        .push(format!("{} polled by {}: {:?}", s.id, s.recipient, s.body));
                }
                polled.entry(key).or_default().push(s.id.clone());
            }
            Via::History => {
                if !known {
                    v.invented.push(format!(
                        "{} in {}'s history: {:?}",
                        s.id, s.recipient, s.body
                    ));
                }
                if s.read {
                    in_history.insert(key);
                }
            }
        }
    }

    for s in &sends {
        if let Some(r) = &s.rejected {
            v.rejected.push(format!("{}: {r}", s.key));
        }
        if s.gave_up {
            v.gave_up += 1;
        }
        let copies = stored.get(&s.key);
        let Some((acked_id, replayed)) = &s.acked else {
            if copies.is_some() {
                v.stored_unacknowledged += 1;
            }
            continue;
        };
        v.acknowledged += 1;
        if *replayed {
            v.replayed += 1;
        }
        let Some(copies) = copies else {
            v.lost.push(format!("{} ({acked_id})", s.key));
            continue;
        };
        if copies.iter().any(|(id, _, _)| id != acked_id) {
            v.mismatched.push(format!(
                "{}: acknowledged {acked_id}, stored {:?}",
                s.key, copies
            ));
        }
        let ids = polled.get(&s.key).cloned().unwrap_or_default();
        if ids.iter().any(|id| id != acked_id) {
            v.mismatched.push(format!(
                "{}: acknowledged {acked_id}, polled {ids:?}",
                s.key
            ));
        }
        match ids.len() {
            1 => v.delivered_once += 1,
            0 if copies[0].1 => {
                v.unseen.push((
                    s.key.clone(),
                    s.recipient.clone(),
                    read_at.get(&s.key).copied().unwrap_or(f64::NAN),
                ));
                if in_history.contains(&s.key) {
                    v.via_history += 1;
                } else {
                    v.read_unseen += 1;
                }
            }
            0 => v.waiting += 1,
            n => v
                .duplicated
                .push(format!("{} returned by {n} polls", s.key)),
        }
    }
    v
}

// ---------------------------------------------------------------------------
// Reading the call log.

/// The longest stretch, within `[from, to]`, with no successful `tool` call
/// ending, in seconds.
pub fn longest_gap(calls: &[CallRecord], tool: &str, from: f64, to: f64) -> f64 {
    let mut ends: Vec<f64> = calls
        .iter()
        .filter(|c| c.tool == tool && c.ok() && c.end >= from && c.end <= to)
        .map(|c| c.end)
        .collect();
    ends.sort_by(f64::total_cmp);
    let mut prev = from;
    let mut gap: f64 = 0.0;
    for e in ends {
        gap = gap.max(e - prev);
        prev = e;
    }
    gap.max(to - prev)
}

/// When the first call started at or after `t` succeeded (its end), if any.
pub fn first_success_after(
    calls: &[CallRecord],
    tool: &str,
    t: f64,
    replica: Option<usize>,
) -> Option<f64> {
    calls
        .iter()
        .filter(|c| {
            c.tool == tool && c.ok() && c.start >= t && replica.is_none_or(|r| c.replica == r)
        })
        .map(|c| c.end)
        .min_by(f64::total_cmp)
}

/// Failed calls that started within `[from, to]`: counts by kind, and the
/// slowest failure's latency.
pub fn failures(
    calls: &[CallRecord],
    from: f64,
    to: f64,
    replica: Option<usize>,
) -> (Vec<(String, usize)>, f64) {
    let mut kinds: HashMap<String, usize> = HashMap::new();
    let mut slowest: f64 = 0.0;
    for c in calls.iter().filter(|c| {
        !c.ok() && c.start >= from && c.start <= to && replica.is_none_or(|r| c.replica == r)
    }) {
        *kinds.entry(c.kind.clone()).or_default() += 1;
        slowest = slowest.max(c.latency());
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    (kinds, slowest)
}

/// For each message read but never returned by a poll: the failed polls of
/// its inbox around the moment it was marked read (evidence of a lost response).
pub fn explain_unseen(load: &Load, v: &Verdict) -> Vec<String> {
    let calls = load.calls();
    v.unseen
        .iter()
        .take(10)
        .map(|(key, recipient, t)| {
            let near: Vec<String> = calls
                .iter()
                .filter(|c| {
                    c.tool == "phone_inbox" && c.agent == *recipient && !c.ok() && c.start <= t + 0.05 && c.end >= t - 0.05
                })
                .map(|c| format!("{} from replica {} {:.2}–{:.2} s: {}", c.kind, c.replica, c.start, c.end, crate::client::snippet(&c.detail)))
                .collect();
            format!("{key} to {recipient} marked read at {t:.2} s; that inbox's failed polls then: {near:?}")
        })
        .collect()
}

pub fn kinds_text(kinds: &[(String, usize)]) -> String {
    if kinds.is_empty() {
        return "none".into();
    }
    kinds
        .iter()
        .map(|(k, n)| format!("{k}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Example error texts of one kind (first few distinct).
pub fn examples(calls: &[CallRecord], kind: &str, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in calls.iter().filter(|c| c.kind == kind) {
        let d = crate::client::snippet(&c.detail);
        if !out.contains(&d) {
            out.push(d);
            if out.len() >= max {
                break;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The results table.

pub struct Row {
    pub fault: String,
    pub load: String,
    pub acknowledged: String,
    pub delivered: String,
    pub lost: String,
    pub duplicated: String,
    pub recovery: String,
    pub notes: String,
}

impl Row {
    pub fn from_verdict(
        fault: &str,
        load: String,
        v: &Verdict,
        recovery: String,
        notes: String,
    ) -> Self {
        let mut delivered = format!("{}", v.delivered());
        let mut parts = Vec::new();
        if v.via_history > 0 {
            parts.push(format!("{} via history", v.via_history));
        }
        if v.read_unseen > 0 {
            parts.push(format!("{} read-unseen", v.read_unseen));
        }
        if v.waiting > 0 {
            parts.push(format!("{} waiting", v.waiting));
        }
        if !parts.is_empty() {
            let _ = write!(delivered, " ({})", parts.join(", "));
        }
        let mut acknowledged = format!("{} / {} attempted", v.acknowledged, v.attempted);
        if v.replayed > 0 {
            let _ = write!(acknowledged, ", {} replayed", v.replayed);
        }
        Self {
            fault: fault.into(),
            load,
            acknowledged,
            delivered,
            lost: v.lost.len().to_string(),
            duplicated: (v.duplicated.len() + v.stored_twice.len()).to_string(),
            recovery,
            notes,
        }
    }
}

/// Appends a row to `target/chaos/results.md` (scripts/chaos.sh prints it).
pub fn write_row(row: &Row) {
    let path = harness::out_dir().join("results.md");
    let clean = |s: &str| s.replace('|', "/").replace('\n', " ");
    let line = format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
        clean(&row.fault),
        clean(&row.load),
        clean(&row.acknowledged),
        clean(&row.delivered),
        clean(&row.lost),
        clean(&row.duplicated),
        clean(&row.recovery),
        clean(&row.notes)
    );
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open results.md");
    f.write_all(line.as_bytes()).expect("write results.md");
    println!("RESULT {line}");
}

/// Appends free text (findings, details) to `target/chaos/findings.md`.
pub fn write_finding(text: &str) {
    let path = harness::out_dir().join("findings.md");
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("open findings.md");
    f.write_all(format!("{text}\n").as_bytes())
        .expect("write findings.md");
    println!("{text}");
}
