//! Callers that vanish: under a steady send load, pollers that give up at
//! random points of their requests (a client timeout from 1 ms to 60 ms,
//! some of them in long polls). Every message ends up in one of:
//! - delivered to a caller that got the response;
//! - still unread (a later poll gets it);
//! - read by a caller that left: split by when the taking statement began
//!   (`read_at`) against the give-up times of that inbox's vanished polls.
//!   A statement that began after its caller had left must take nothing
//!   (0); one that began while the caller was there and whose answer was
//!   lost on its way out is the window that remains, counted.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::client::{self, Mcp, Outcome};
use crate::harness::{self, Replica};
use crate::workload::{self, Row};

/// One poll whose client gave up: when it started and when it left.
#[derive(Debug, Clone, Copy)]
struct Vanished {
    started: DateTime<Utc>,
    left: DateTime<Utc>,
}

#[derive(Default)]
struct Books {
    /// Message ids acknowledged to senders.
    sent: HashSet<String>,
    /// Message ids some poller received, with how often.
    seen: HashMap<String, usize>,
    /// Per recipient: its polls whose callers left, in order.
    polls: HashMap<String, Vec<Vanished>>,
    polls_answered: usize,
    polls_abandoned: usize,
}

fn ids(v: &Value) -> Vec<String> {
    v["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub async fn callers_vanish() {
    let run_for = Duration::from_secs_f64(crate::secs("PHONE_CHAOS_VANISH_SECS", 20.0));
    let db = harness::fresh_database("vanish").await;
    let mut a = Replica::new(
        "vanish-a",
        &db,
        &[("RUST_LOG", "warn,phone::domain::handover=debug")],
    );
    let mut b = Replica::new(
        "vanish-b",
        &db,
        &[("RUST_LOG", "warn,phone::domain::handover=debug")],
    );
    a.start().await;
    b.start().await;
    let bases = vec![a.base(), b.base()];
    let reliable = Mcp::new(Duration::from_secs(20));
    let (senders, recipients) = (3usize, 6usize);
    let mut tokens = HashMap::new();
    for i in 0..senders {
        let name = format!("v-s{i}");
        tokens.insert(
            name.clone(),
            client::register(&reliable, &bases, &name).await,
        );
    }
    for i in 0..recipients {
        let name = format!("v-r{i}");
        tokens.insert(
            name.clone(),
            client::register(&reliable, &bases, &name).await,
        );
    }
    let tokens = Arc::new(tokens);
    let books = Arc::new(Mutex::new(Books::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let mut tasks = Vec::new();
    for s in 0..senders {
        let (tokens, books, stop, bases) =
            (tokens.clone(), books.clone(), stop.clone(), bases.clone());
        tasks.push(tokio::spawn(async move {
            let mcp = Mcp::new(Duration::from_secs(20));
            let me = format!("v-s{s}");
            for n in 0..20_000u32 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let to = format!("v-r{}", n as usize % recipients);
                let args = json!({"name": me, "token": tokens[&me], "to": to,
                                  "body": format!("{me}-{n}"), "idempotency_key": format!("{me}-{n}")});
                // Retried until acknowledged (same key: never twice).
                for attempt in 0..50 {
                    let (out, _) = mcp.call(&bases[(n as usize + attempt) % 2], "phone_send", args.clone()).await;
                    match out {
                        Outcome::Ok(v) => {
                            books.lock().unwrap().sent.insert(v["id"].as_str().unwrap().to_owned());
                            break;
                        }
                        other if other.retryable() => tokio::time::sleep(Duration::from_millis(20)).await,
                        other => panic!("send: {}", other.detail()),
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // One poller per inbox, one poll at a time, so that every statement
    // that takes an inbox's mail belongs to the last poll that began before
    // it; after a poll it gave up on, the poller pauses, so a statement
    // that began after its caller left cannot pass for the next poll's.
    for r in 0..recipients {
        let (tokens, books, stop, bases) =
            (tokens.clone(), books.clone(), stop.clone(), bases.clone());
        tasks.push(tokio::spawn(async move {
            let me = format!("v-r{r}");
            for n in 0..100_000u64 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                // Give up after 1..60 ms, skewed short; every third poll
                // is a long poll, so some leave while waiting.
                let give_up = Duration::from_micros(
                    1_000 + (rand::random::<u64>() % 60_000) * (rand::random::<u64>() % 2 + 1) / 2,
                );
                let wait = if n % 3 == 2 { 1 } else { 0 };
                let mcp = Mcp::new(give_up);
                let args =
                    json!({"name": me, "token": tokens[&me], "limit": 5, "wait_seconds": wait});
                let at = Utc::now();
                let (out, _) = mcp
                    .call(&bases[(n as usize + r) % 2], "phone_inbox", args)
                    .await;
                let abandoned = {
                    let mut books = books.lock().unwrap();
                    match out {
                        Outcome::Ok(v) => {
                            books.polls_answered += 1;
                            for id in ids(&v) {
                                *books.seen.entry(id).or_default() += 1;
                            }
                            false
                        }
                        Outcome::Timeout | Outcome::Transport(_) => {
                            books.polls_abandoned += 1;
                            books.polls.entry(me.clone()).or_default().push(Vanished {
                                started: at,
                                left: Utc::now(),
                            });
                            true
                        }
                        _ => false,
                    }
                };
                if abandoned {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let load_secs = started.elapsed().as_secs_f64();
    // Abandoned polls' give-backs run just after their statements: let them.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // What is still unread now, before a reliable poller drains it.
    let pg = harness::connect(&db).await;
    let unread_before_drain: i64 = pg
        .query_one("SELECT count(*) FROM messages WHERE read_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    for r in 0..recipients {
        let me = format!("v-r{r}");
        for _ in 0..10_000 {
            let (out, _) = reliable
                .call(
                    &bases[0],
                    "phone_inbox",
                    json!({"name": me, "token": tokens[&me], "limit": 100}),
                )
                .await;
            let Outcome::Ok(v) = out else {
                panic!("drain: {}", out.detail())
            };
            let got = ids(&v);
            let mut books = books.lock().unwrap();
            for id in &got {
                *books.seen.entry(id.clone()).or_default() += 1;
            }
            if got.is_empty() {
                break;
            }
        }
    }

    let rows = pg
        .query(
            "SELECT 'msg_' || m.id, r.name, m.read_at FROM messages m JOIN agents r ON r.id = m.recipient_id",
            &[],
        )
        .await
        .unwrap();
    let books = std::mem::take(&mut *books.lock().unwrap());
    let (mut delivered, mut unread, mut in_window, mut after_leaving) = (0, 0, 0, 0);
    let mut stored = HashSet::new();
    let slack = chrono::Duration::milliseconds(5);
    // For reads in the window: how long after the statement began the
    // caller left.
    let mut window_ms: Vec<f64> = Vec::new();
    for row in &rows {
        let (id, recipient, read_at): (String, String, Option<DateTime<Utc>>) =
            (row.get(0), row.get(1), row.get(2));
        stored.insert(id.clone());
        if books.seen.contains_key(&id) {
            delivered += 1;
            continue;
        }
        let Some(read_at) = read_at else {
            unread += 1;
            continue;
        };
        // The statement that read it began at `read_at`, for the last poll
        // of this inbox that began before: was its caller still there?
        let issuer = books
            .polls
            .get(&recipient)
            .into_iter()
            .flatten()
            .filter(|v| v.started - slack <= read_at)
            .max_by_key(|v| v.started);
        if let Some(v) = issuer.filter(|v| read_at <= v.left + slack) {
            in_window += 1;
            window_ms.push((v.left - read_at).num_microseconds().unwrap_or(0) as f64 / 1000.0);
        } else {
            after_leaving += 1;
        }
    }
    let lost = books.sent.iter().filter(|id| !stored.contains(*id)).count();
    // The replicas log each answer with messages that left the server
    // (debug, `phone::domain::handover`): every message read for a caller
    // that left while it was there must be in one of them.
    let left_server: usize = [&a, &b]
        .iter()
        .flat_map(|r| {
            std::fs::read_to_string(r.log_path())
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.contains("answer left the server"))
        .filter_map(|l| {
            l.split("messages=")
                .nth(1)
                .and_then(|n| n.split_whitespace().next()?.parse::<usize>().ok())
        })
        .sum();
    let duplicated = books.seen.values().filter(|n| **n > 1).count();
    let summary = format!(
        "{} messages: {delivered} delivered to a caller that got the response, {unread} still unread, \
         read by a caller that left: {after_leaving} by a statement that began after it left, \
         {in_window} while it was there (answer lost on its way out); {left_server} messages in answers that left \
         the server; {} polls answered, {} abandoned; \
         unread before the final drain {unread_before_drain}; lost {lost}, duplicated {duplicated}",
        rows.len(),
        books.polls_answered,
        books.polls_abandoned
    );
    println!("callers vanish: {summary}");
    window_ms.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        window_ms
            .get(((window_ms.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "callers vanish: in the window, the caller left this long after the statement began: p10 {:.1} ms, p50 {:.1} ms, p90 {:.1} ms",
        pct(0.1),
        pct(0.5),
        pct(0.9)
    );
    workload::write_row(&Row {
        fault: "callers vanish: pollers give up after 1–60 ms (some mid long poll), from either of 2 replicas".into(),
        load: format!(
            "{senders} senders → {recipients} inboxes (a poller each), 2 replicas, {load_secs:.0} s, {} polls",
            books.polls_answered + books.polls_abandoned
        ),
        acknowledged: format!("{} sent", books.sent.len()),
        delivered: format!("{delivered} to a caller that got the response"),
        lost: format!("{lost}; read by a caller that left after it left: {after_leaving}"),
        duplicated: format!("{duplicated}"),
        recovery: format!("{unread_before_drain} unread after the run, drained by one poll each"),
        notes: format!(
            "{in_window} read while their caller was still there, in answers that had left the server \
             ({left_server} messages left in answers, {delivered} arrived): the window that remains, include_read shows them; \
             {} of {} polls abandoned",
            books.polls_abandoned,
            books.polls_answered + books.polls_abandoned
        ),
    });
    assert!(
        books.polls_abandoned > 50,
        "too few callers vanished to test anything: {summary}"
    );
    assert_eq!(lost, 0, "{summary}");
    assert_eq!(duplicated, 0, "{summary}");
    assert_eq!(unread, 0, "the final drain left mail: {summary}");
    assert_eq!(
        after_leaving, 0,
        "mail taken for callers that had already left: {summary}"
    );
    assert!(
        in_window <= left_server.saturating_sub(delivered),
        "mail lost inside the server (its answer never left): {summary}"
    );
    let panics = harness::panics_in_logs(&[&a, &b]);
    assert!(panics.is_empty(), "{panics:?}");
    a.stop(Duration::from_secs(5)).await;
    b.stop(Duration::from_secs(5)).await;
}
