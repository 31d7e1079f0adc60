//! A replica killed mid-delivery: two replicas deliver webhooks to a slow
//! local receiver while sends arrive; one is killed with -9 while its
//! deliveries are in flight (claimed, POSTed, not yet recorded). Every
//! acknowledged send to an agent with a webhook must reach the receiver at
//! least once (the survivor takes over the dead replica's claims when they
//! expire), repeats carry the same webhook-id, and the queue ends drained.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, body::Bytes, extract::State, http::HeaderMap, routing::post};
use serde_json::{Value, json};

use crate::client::{self, Mcp, Outcome};
use crate::harness::{self, Replica};
use crate::workload::{self, Row};

#[derive(Default)]
struct Receiver {
    /// message id -> webhook-ids it arrived with, one per arrival.
    got: Mutex<HashMap<String, Vec<String>>>,
    in_flight: AtomicUsize,
}

async fn receive(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> &'static str {
    r.in_flight.fetch_add(1, Ordering::SeqCst);
    // Slow enough that a kill finds deliveries in flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    if let Ok(v) = serde_json::from_slice::<Value>(&body)
        && let Some(message) = v["data"]["id"].as_str()
    {
        r.got
            .lock()
            .unwrap()
            .entry(message.to_owned())
            .or_default()
            .push(id);
    }
    r.in_flight.fetch_sub(1, Ordering::SeqCst);
    "ok"
}

async fn start_receiver() -> (SocketAddr, Arc<Receiver>) {
    let state = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/hook/{agent}", post(receive))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, state)
}

pub async fn replica_killed_mid_delivery() {
    let db = harness::fresh_database("webhooks").await;
    let env = [
        ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
        // Short attempts, so a dead replica's claims expire within the test
        // (claim = 2 × timeout + 5 s = 7 s).
        ("PHONE_WEBHOOK_TIMEOUT_SECS", "1"),
        ("PHONE_WEBHOOK_FIRST_RETRY_MS", "200"),
    ];
    let mut a = Replica::new("webhooks-a", &db, &env);
    let mut b = Replica::new("webhooks-b", &db, &env);
    a.start().await;
    b.start().await;
    let bases = vec![a.base(), b.base()];
    let (receiver_addr, receiver) = start_receiver().await;
    let mcp = Mcp::new(Duration::from_secs(10));

    let sender = client::register(&mcp, &bases, "wh-sender").await;
    let recipients = 8usize;
    let mut names = Vec::new();
    for i in 0..recipients {
        let name = format!("wh-r{i}");
        let token = client::register(&mcp, &bases, &name).await;
        let (out, _) = mcp
            .call(
                &bases[i % 2],
                "phone_settings",
                json!({"name": name, "token": token,
                       "webhook_url": format!("http://{receiver_addr}/hook/{name}")}),
            )
            .await;
        assert!(out.is_ok(), "set webhook: {out:?}");
        names.push(name);
    }

    // Sends through both replicas for a bounded time; the kill lands in the
    // middle, once the receiver has deliveries in flight.
    let t0 = Instant::now();
    let send_for = Duration::from_secs_f64(crate::secs("PHONE_CHAOS_WEBHOOK_SECS", 6.0));
    let mut acknowledged: HashSet<String> = HashSet::new();
    let mut failed_sends = 0usize;
    let mut killed_at = None;
    let mut in_flight_at_kill = 0;
    let mut n = 0usize;
    while t0.elapsed() < send_for && n < 5_000 {
        if killed_at.is_none()
            && t0.elapsed() > send_for / 3
            && receiver.in_flight.load(Ordering::SeqCst) > 0
        {
            in_flight_at_kill = receiver.in_flight.load(Ordering::SeqCst);
            a.kill9().await;
            killed_at = Some(t0.elapsed());
        }
        let base = if killed_at.is_some() {
            &bases[1]
        } else {
            &bases[n % 2]
        };
        let to = &names[n % recipients];
        let (out, _) = mcp
            .call(
                base,
                "phone_send",
                json!({"name": "wh-sender", "token": sender, "to": to,
                       "body": format!("m{n}"), "idempotency_key": format!("k{n}")}),
            )
            .await;
        match out {
            Outcome::Ok(v) => {
                acknowledged.insert(v["id"].as_str().expect("message id").to_owned());
            }
            _ => failed_sends += 1,
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let killed_at = killed_at.expect("the kill happened while deliveries were in flight");

    // The survivor delivers the rest, the dead replica's claims included.
    let check = harness::connect(&db).await;
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    let (pending, drained_after) = loop {
        let pending: i64 = check
            .query_one(
                "SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if pending == 0 || Instant::now() > drain_deadline {
            break (pending, t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Let a last in-flight POST land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let states: Vec<(String, i64)> = check
        .query(
            "SELECT state, count(*) FROM webhook_deliveries GROUP BY state ORDER BY state",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // Deliveries that needed another attempt: the dead replica's claims.
    let retaken: i64 = check
        .query_one(
            "SELECT count(*) FROM webhook_deliveries WHERE attempts > 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let got = receiver.got.lock().unwrap().clone();
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !got.contains_key(*id))
        .collect();
    let repeated = got.values().filter(|ids| ids.len() > 1).count();
    let id_changed = got
        .values()
        .filter(|ids| ids.iter().collect::<HashSet<_>>().len() > 1)
        .count();
    let invented = got.keys().filter(|id| !acknowledged.contains(*id)).count();

    let mut panics = harness::panics_in_logs(&[&a, &b]);
    panics.sort();
    workload::write_row(&Row {
        fault: "replica killed (-9) mid webhook delivery, 1 of 2".into(),
        load: format!(
            "{} sends over {:.0} s to {recipients} agents with webhooks (receiver answers in 300 ms); kill at {:.1} s with {in_flight_at_kill} POSTs in flight",
            acknowledged.len() + failed_sends,
            send_for.as_secs_f64(),
            killed_at.as_secs_f64()
        ),
        acknowledged: format!("{} sent", acknowledged.len()),
        delivered: format!("{} webhooks received", got.len() - invented),
        lost: format!("{}", missing.len()),
        duplicated: format!("{repeated} received twice (same webhook-id: at-least-once)"),
        recovery: format!(
            "queue drained at {:.1} s ({pending} pending then; {retaken} deliveries taken over after the dead replica's claims expired); by state {states:?}",
            drained_after.as_secs_f64()
        ),
        notes: format!(
            "{failed_sends} sends failed at the kill (not acknowledged, retried by no one)"
        ),
    });
    println!(
        "webhooks: {} acknowledged, {} received, {} missing, {repeated} repeated, kill at {killed_at:?}, drained at {drained_after:?}",
        acknowledged.len(),
        got.len(),
        missing.len()
    );
    assert!(panics.is_empty(), "panics in replica logs: {panics:?}");
    assert!(acknowledged.len() > 50, "the load did not run");
    assert!(
        retaken > 0,
        "the kill caught no delivery of the killed replica: nothing was tested"
    );
    assert!(
        missing.is_empty(),
        "acknowledged sends whose webhook never came: {missing:?}"
    );
    assert_eq!(invented, 0, "webhooks for messages nobody sent");
    assert_eq!(
        id_changed, 0,
        "a repeated delivery must keep its webhook-id"
    );
    assert_eq!(
        pending, 0,
        "the queue did not drain within 60 s: {states:?}"
    );
    b.stop(Duration::from_secs(5)).await;
}
