//! Webhooks: set in phone_settings (secret shown once), refused for
//! non-https and private destinations, delivered signed (Standard
//! Webhooks) by the server to a real local receiver, retried with the same
//! webhook-id, switched off on 410, never redirected, a few at a time per
//! destination; sends to agents without a webhook queue nothing.

mod common;

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use base64::Engine as _;
use common::*;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};

#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: String,
}

#[derive(Default)]
struct Receiver {
    got: Mutex<Vec<Received>>,
    /// Statuses to answer, in order; then 200.
    script: Mutex<VecDeque<u16>>,
    delay: Mutex<Duration>,
    now: AtomicUsize,
    most: AtomicUsize,
}

async fn hook(
    State(r): State<Arc<Receiver>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(&'static str, &'static str); 1], &'static str) {
    let now = r.now.fetch_add(1, Ordering::SeqCst) + 1;
    r.most.fetch_max(now, Ordering::SeqCst);
    let delay = *r.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    r.got.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let status = r.script.lock().unwrap().pop_front().unwrap_or(200);
    r.now.fetch_sub(1, Ordering::SeqCst);
    (
        StatusCode::from_u16(status).unwrap(),
        [("location", "/elsewhere")],
        "ok",
    )
}

async fn receiver() -> (Arc<Receiver>, SocketAddr) {
    let state = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/hook", post(hook))
        .route("/elsewhere", post(hook))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (state, addr)
}

async fn until_received(r: &Receiver, n: usize) -> Vec<Received> {
    for _ in 0..300 {
        if r.got.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = r.got.lock().unwrap().clone();
    assert!(got.len() >= n, "{} of {n} deliveries arrived", got.len());
    got
}

fn verify(secret: &str, delivery: &Received) {
    let header = |name: &str| {
        delivery
            .headers
            .get(name)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(
        format!(
            "{}.{}.{}",
            header("webhook-id"),
            header("webhook-timestamp"),
            delivery.body
        )
        .as_bytes(),
    );
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    assert_eq!(header("webhook-signature"), format!("v1,{expected}"));
}

const LOCAL: [(&str, &str); 2] = [
    ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
    ("PHONE_WEBHOOK_FIRST_RETRY_MS", "50"),
];

#[tokio::test]
async fn destinations_must_be_https_and_public() {
    let app = spawn_app().await;
    let c = app.client().await;
    let me = register(&c, "me", "M", "p").await;
    for (url, says) in [
        ("http://agent.example.com/hook", "must be an https:// URL"),
        ("https://127.0.0.1:8443/hook", "not public"),
        ("https://localhost/hook", "not public"),
        ("https://[::1]/hook", "not public"),
        ("https://169.254.169.254/latest/meta-data", "not public"),
        ("https://user:pw@agent.example.com/", "credentials"),
        ("not a url", "is not a URL"),
    ] {
        let err = tool_err(&c, "phone_settings", me.with(json!({"webhook_url": url}))).await;
        assert!(err.contains(says), "{url}: {err}");
    }
    // A name that does not resolve and one that resolves to a private
    // address hear the same words: asking does not map which internal
    // names exist (`localhost` resolves, `*.invalid` never does).
    let said = async |host: &str| {
        tool_err(
            &c,
            "phone_settings",
            me.with(json!({"webhook_url": format!("https://{host}/hook")})),
        )
        .await
        .replace(host, "HOST")
    };
    assert_eq!(said("localhost").await, said("phone-test.invalid").await);
    let err = tool_err(
        &c,
        "phone_settings",
        me.with(json!({"rotate_webhook_secret": true})),
    )
    .await;
    assert!(err.contains("needs a webhook_url"), "{err}");
    app.stop().await;
}

#[tokio::test]
async fn a_new_message_is_delivered_signed_without_its_body() {
    let (hooks, addr) = receiver().await;
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "lab").await;
    let svc = register(&c, "service", "S", "p").await;
    let url = format!("http://{addr}/hook");
    let set = ok(&c, "phone_settings", svc.with(json!({"webhook_url": url}))).await;
    let secret = set["webhook_secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{set}");
    assert_eq!(set["webhook_url"], url);
    assert_eq!(set["webhook_active"], true);
    // Shown once.
    let again = ok(&c, "phone_settings", svc.with(json!({}))).await;
    assert!(again.get("webhook_secret").is_none(), "{again}");

    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "subject": "job", "body": "the secret body text"})),
    )
    .await;
    let got = until_received(&hooks, 1).await;
    let d = &got[0];
    assert_eq!(d.path, "/hook");
    assert_eq!(d.headers["webhook-id"], sent["id"].as_str().unwrap());
    verify(&secret, d);
    let body: Value = serde_json::from_str(&d.body).unwrap();
    assert_eq!(body["type"], "message.received");
    assert_eq!(body["data"]["id"], sent["id"]);
    assert_eq!(body["data"]["from"], "alice");
    assert_eq!(body["data"]["from_project"], "lab");
    assert_eq!(body["data"]["to"], "service");
    assert_eq!(body["data"]["subject"], "job");
    assert_eq!(body["data"]["thread_id"], sent["thread_id"]);
    assert!(
        !d.body.contains("the secret body text"),
        "the body travelled: {}",
        d.body
    );
    // The mail itself waits in the inbox as always.
    let inbox = ok(&c, "phone_inbox", svc.with(json!({}))).await;
    assert_eq!(inbox["messages"][0]["body"], "the secret body text");

    // Rotating: a new secret, and deliveries signed with it.
    let rotated = ok(
        &c,
        "phone_settings",
        svc.with(json!({"rotate_webhook_secret": true})),
    )
    .await;
    let new_secret = rotated["webhook_secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, secret);
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "two"})),
    )
    .await;
    let got = until_received(&hooks, 2).await;
    verify(&new_secret, &got[1]);
    // Cleared: nothing more is queued.
    let cleared = ok(&c, "phone_settings", svc.with(json!({"webhook_url": ""}))).await;
    assert_eq!(cleared["webhook_url"], Value::Null);
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "three"})),
    )
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries").await,
        2
    );
    // Agents without a webhook never had anything queued.
    ok(
        &c,
        "phone_send",
        svc.with(json!({"to": "alice", "body": "to one without"})),
    )
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries d JOIN agents a ON a.id = d.agent_id WHERE a.name = 'alice'")
            .await,
        0
    );
    app.stop().await;
}

#[tokio::test]
async fn failures_are_retried_with_the_same_id_and_410_switches_it_off() {
    let (hooks, addr) = receiver().await;
    hooks.script.lock().unwrap().extend([500, 503, 200]);
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let svc = register(&c, "service", "S", "p").await;
    ok(
        &c,
        "phone_settings",
        svc.with(json!({"webhook_url": format!("http://{addr}/hook")})),
    )
    .await;
    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "x"})),
    )
    .await;
    let got = until_received(&hooks, 3).await;
    let ids: Vec<&str> = got
        .iter()
        .map(|d| d.headers["webhook-id"].to_str().unwrap())
        .collect();
    assert!(
        ids.iter().all(|id| *id == sent["id"].as_str().unwrap()),
        "{ids:?}"
    );
    let db = app.db().await;
    wait_until(
        &db,
        "the delivery is done",
        "SELECT state = 'delivered' AND attempts = 3 FROM webhook_deliveries",
    )
    .await;

    // 410 Gone: switched off, nothing more goes out.
    hooks.script.lock().unwrap().push_back(410);
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "y"})),
    )
    .await;
    until_received(&hooks, 4).await;
    wait_until(
        &db,
        "the webhook is off",
        "SELECT webhook_disabled_at IS NOT NULL FROM agents WHERE name = 'service'",
    )
    .await;
    let now = ok(&c, "phone_settings", svc.with(json!({}))).await;
    assert_eq!(now["webhook_active"], false, "{now}");
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "z"})),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        hooks.got.lock().unwrap().len(),
        4,
        "a disabled webhook was called"
    );
    app.stop().await;
}

#[tokio::test]
async fn redirects_are_not_followed_and_bursts_are_bounded_per_destination() {
    let (hooks, addr) = receiver().await;
    hooks.script.lock().unwrap().push_back(302);
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let svc = register(&c, "service", "S", "p").await;
    ok(
        &c,
        "phone_settings",
        svc.with(json!({"webhook_url": format!("http://{addr}/hook")})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "service", "body": "first"})),
    )
    .await;
    let got = until_received(&hooks, 2).await;
    assert!(
        got.iter().all(|d| d.path == "/hook"),
        "a redirect was followed"
    );

    // A burst of 40: at most 4 at once reach the destination.
    *hooks.delay.lock().unwrap() = Duration::from_millis(100);
    for i in 0..40 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "service", "body": format!("b{i}")})),
        )
        .await;
    }
    until_received(&hooks, 42).await;
    let most = hooks.most.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&most),
        "{most} deliveries at once to one destination"
    );
    app.stop().await;
}

/// A receiver like `receiver()`, over TLS with the test CA's `localhost`
/// certificate (scripts/tls-certs.sh).
async fn tls_receiver() -> (Arc<Receiver>, SocketAddr) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let dir = std::path::PathBuf::from(
        std::env::var("PHONE_TEST_PG_TLS_DIR").expect("PHONE_TEST_PG_TLS_DIR: run with make test"),
    );
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let state = Arc::new(Receiver::default());
    let app = Router::new()
        .route("/hook", post(hook))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (state, addr)
}

/// https deliveries check the receiver's certificate against the system's
/// CA certificates (here the test CA, through SSL_CERT_FILE, which
/// rustls-native-certs reads): a name the certificate does not carry fails
/// and is retried, the right name is delivered.
#[tokio::test]
async fn https_deliveries_verify_the_receivers_certificate() {
    let dir = std::env::var("PHONE_TEST_PG_TLS_DIR").expect("PHONE_TEST_PG_TLS_DIR");
    // SAFETY: nextest runs each test in its own process; nothing else in
    // this one reads the environment concurrently yet.
    unsafe { std::env::set_var("SSL_CERT_FILE", format!("{dir}/ca.pem")) };
    let (hooks, addr) = tls_receiver().await;
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "lab").await;
    let wrong = register(&c, "wrong", "W", "p").await;
    let right = register(&c, "right", "R", "p").await;
    // The certificate names localhost, not 127.0.0.1.
    let port = addr.port();
    let wrong_set = json!({"webhook_url": format!("https://127.0.0.1:{port}/hook")});
    let set = ok(&c, "phone_settings", wrong.with(wrong_set)).await;
    let right_set = json!({"webhook_url": format!("https://localhost:{port}/hook")});
    let right_out = ok(&c, "phone_settings", right.with(right_set)).await;
    let secret = right_out["webhook_secret"].as_str().unwrap().to_owned();
    let _ = set;

    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "right", "body": "b"})),
    )
    .await;
    let got = until_received(&hooks, 1).await;
    verify(&secret, &got[0]);

    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "wrong", "body": "b"})),
    )
    .await;
    let db = app.db().await;
    wait_until(
        &db,
        "the delivery to a name the certificate lacks failed",
        "SELECT EXISTS (SELECT 1 FROM webhook_deliveries d JOIN agents a ON a.id = d.agent_id
                        WHERE a.name = 'wrong' AND d.attempts >= 1 AND d.last_error IS NOT NULL)",
    )
    .await;
    let (state, error): (String, String) = {
        let row = db
            .query_one(
                "SELECT d.state, d.last_error FROM webhook_deliveries d JOIN agents a ON a.id = d.agent_id
                 WHERE a.name = 'wrong'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(state, "pending", "retried later: {error}");
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert_eq!(
        hooks.got.lock().unwrap().len(),
        1,
        "nothing reached the receiver for the wrong name"
    );
}

/// A receiver that never answers holds only its own agent's few slots: its
/// backlog waits in the database, and another agent's delivery goes out at
/// once (it waited for the slow one's timeouts before).
#[tokio::test]
async fn a_receiver_that_never_answers_does_not_hold_up_other_agents() {
    let (slow, slow_addr) = receiver().await;
    *slow.delay.lock().unwrap() = Duration::from_secs(60);
    let (fast, fast_addr) = receiver().await;
    let app = spawn_app_with(&[
        ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("PHONE_WEBHOOK_TIMEOUT_SECS", "20"),
    ])
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let stuck = register(&c, "stuck", "S", "p").await;
    let quick = register(&c, "quick", "Q", "p").await;
    let hook = |addr: SocketAddr| json!({"webhook_url": format!("http://{addr}/hook")});
    ok(&c, "phone_settings", stuck.with(hook(slow_addr))).await;
    ok(&c, "phone_settings", quick.with(hook(fast_addr))).await;
    for i in 0..40 {
        let to_stuck = json!({"to": "stuck", "body": format!("s{i}")});
        ok(&c, "phone_send", alice.with(to_stuck)).await;
    }
    let db = app.db().await;
    wait_until(
        &db,
        "the slow receiver holds its agent's slots",
        "SELECT count(*) >= 4 FROM webhook_deliveries WHERE attempts >= 1",
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "quick", "body": "q"})),
    )
    .await;
    // until_received gives up after 6 s, well inside the slow attempts' 20 s.
    until_received(&fast, 1).await;
    assert!(
        slow.most.load(Ordering::SeqCst) <= 4,
        "at most 4 at once to one agent: {}",
        slow.most.load(Ordering::SeqCst)
    );
}

/// A replica, and an agent `service` whose webhook answers 500 to
/// everything, sent one message by `alice` (`send`: phone_send's arguments
/// but `to`), once its first attempt has arrived.
struct Failing {
    app: TestApp,
    c: Client,
    svc: Agent,
}

async fn one_failing_delivery(mut send: Value) -> Failing {
    let (hooks, addr) = receiver().await;
    hooks.script.lock().unwrap().extend([500; 100]);
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let svc = register(&c, "service", "S", "p").await;
    let url = format!("http://{addr}/hook");
    ok(&c, "phone_settings", svc.with(json!({"webhook_url": url}))).await;
    send["to"] = json!("service");
    ok(&c, "phone_send", alice.with(send)).await;
    until_received(&hooks, 1).await;
    Failing { app, c, svc }
}

/// An agent that leaves stops receiving: its pending deliveries end as gone.
#[tokio::test]
async fn deliveries_to_an_agent_that_unregistered_end() {
    let Failing { app, c, svc } = one_failing_delivery(json!({"body": "x"})).await;
    ok(&c, "phone_unregister", svc.with(json!({}))).await;
    let db = app.db().await;
    wait_until(
        &db,
        "the delivery ended as gone",
        "SELECT state = 'gone' FROM webhook_deliveries",
    )
    .await;
}

/// A forged settings cursor is refused before anything changes: the webhook
/// asked for in the same call is not set with a secret nobody saw.
#[tokio::test]
async fn a_forged_cursor_is_refused_before_anything_changes() {
    let (_hooks, addr) = receiver().await;
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let svc = register(&c, "service", "S", "p").await;
    let url = format!("http://{addr}/hook");
    // "c:\0\nb:", base64url.
    let err = tool_err(
        &c,
        "phone_settings",
        svc.with(json!({"webhook_url": url, "cursor": "YzoACmI6"})),
    )
    .await;
    assert!(err.contains("cursor"), "{err}");
    let now = ok(&c, "phone_settings", svc.with(json!({}))).await;
    assert!(now["webhook_url"].is_null(), "{now}");
}

/// A receiver that accepts connections and never answers, while mail keeps
/// arriving for its agent. Its destination pauses after the first attempts
/// time out, and while it pauses nothing is claimed and handed back: once
/// the sends stop, the database runs as many transactions a second as with
/// no webhook at all. The agent's backlog is capped (the rest collapses
/// into one "mail waits" delivery), and every delivery ends as failed when
/// the retry period is over.
#[tokio::test]
async fn a_receiver_that_never_answers_costs_nothing_while_it_pauses() {
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    // Accepts, reads nothing, answers nothing; holds every connection.
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hang.accept().await {
            held.push(socket);
        }
    });
    let app = spawn_app_with(&[
        ("PHONE_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("PHONE_WEBHOOK_TIMEOUT_SECS", "1"),
        ("PHONE_WEBHOOK_FIRST_RETRY_MS", "1000"),
        ("PHONE_WEBHOOK_GIVE_UP_SECS", "12"),
        ("PHONE_WEBHOOK_BACKLOG_MAX", "20"),
    ])
    .await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let svc = register(&c, "service", "S", "p").await;
    let db = app.db().await;
    // Statements run in this database, as pg_stat_statements counts them
    // when each ends. (pg_stat_database's transactions are reported by each
    // backend up to seconds later: the trickle's could land in the window
    // measured after it.)
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .unwrap();
    let xacts = async |db: &tokio_postgres::Client| -> i64 {
        db.query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    let window = Duration::from_secs(6);
    // The idle server, for comparison.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = xacts(&db).await;
    tokio::time::sleep(window).await;
    let idle = xacts(&db).await - before;

    ok(
        &c,
        "phone_settings",
        svc.with(json!({"webhook_url": format!("http://{hang_addr}/hook")})),
    )
    .await;
    // A steady trickle: 60 messages over about 3 s.
    for i in 0..60 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "service", "body": format!("m{i}")})),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let queued = app
        .count("SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'")
        .await;
    assert!(
        queued <= 21,
        "the backlog is capped at 20 and one summary: {queued}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries WHERE summary")
            .await,
        1
    );
    // Let the first attempts time out and the destination pause.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = xacts(&db).await;
    tokio::time::sleep(window).await;
    let hanging = xacts(&db).await - before;
    assert!(
        hanging <= idle * 2 + 12,
        "a hanging receiver keeps the database busy: {hanging} statements in {window:?} \
         against {idle} idle"
    );
    wait_until_for(
        &db,
        "every delivery ended as failed when the retry period was over",
        "SELECT count(*) = 0 FROM webhook_deliveries WHERE state = 'pending'",
        Duration::from_secs(15),
    )
    .await;
    let attempts = app
        .count("SELECT coalesce(sum(attempts), 0)::bigint FROM webhook_deliveries")
        .await;
    assert!(
        attempts <= 12,
        "one attempt at a time while the destination fails: {attempts}"
    );
    app.stop().await;
}

/// phone_settings runs in one transaction: when a later part fails, the
/// webhook set earlier in the call is not stored either, so no secret is
/// ever stored that its agent was never shown.
#[tokio::test]
async fn a_settings_call_that_fails_stores_no_secret_it_did_not_show() {
    let (_hooks, addr) = receiver().await;
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let svc = register(&c, "service", "S", "p").await;
    register(&c, "other", "O", "p").await;
    // A later statement of the call fails (here a trigger refuses it).
    app.db()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON contacts FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .await
        .unwrap();
    let err = tool_err(
        &c,
        "phone_settings",
        svc.with(json!({"webhook_url": format!("http://{addr}/hook"), "allow": ["other"]})),
    )
    .await;
    assert!(err.contains("retry") || err.contains("error"), "{err}");
    assert_eq!(
        app.count("SELECT count(*) FROM agents WHERE webhook_secret IS NOT NULL OR webhook_url IS NOT NULL")
            .await,
        0,
        "a secret nobody was shown was stored"
    );
    app.stop().await;
}

/// Each webhook change names a host to look up and a destination to call:
/// an agent may make 10 an hour.
#[tokio::test]
async fn webhook_changes_are_limited_per_agent() {
    let (_hooks, addr) = receiver().await;
    let app = spawn_app_with(&LOCAL).await;
    let c = app.client().await;
    let svc = register(&c, "service", "S", "p").await;
    let other = register(&c, "other", "O", "p").await;
    for i in 0..10 {
        let url = format!("http://{addr}/hook/{i}");
        ok(&c, "phone_settings", svc.with(json!({"webhook_url": url}))).await;
    }
    let err = tool_err(
        &c,
        "phone_settings",
        svc.with(json!({"rotate_webhook_secret": true})),
    )
    .await;
    assert!(
        err.contains("too many webhook changes by this agent; retry after"),
        "{err}"
    );
    // Switching webhooks off is never limited.
    let off = ok(&c, "phone_settings", svc.with(json!({"webhook_url": ""}))).await;
    assert!(off["webhook_url"].is_null(), "{off}");
    // Other settings, and other agents, are not limited.
    ok(&c, "phone_settings", svc.with(json!({"listed": false}))).await;
    let url = format!("http://{addr}/hook");
    ok(
        &c,
        "phone_settings",
        other.with(json!({"webhook_url": url})),
    )
    .await;
    app.stop().await;
}

/// A message past its lifetime is no longer announced: a delivery still
/// retrying when it expires ends, and no further POST goes out for it.
#[tokio::test]
async fn a_delivery_for_mail_that_expired_ends() {
    let Failing { app, .. } =
        one_failing_delivery(json!({"body": "soon stale", "expires_in": 3600})).await;
    let db = app.db().await;
    db.execute(
        "UPDATE messages SET expires_at = now() - interval '1 second'",
        &[],
    )
    .await
    .unwrap();
    wait_until(
        &db,
        "the delivery ended",
        "SELECT state = 'failed' AND last_error = 'the message expired before delivery'
         FROM webhook_deliveries",
    )
    .await;
}

/// A message deleted while its delivery still retries (the retention of
/// `PHONE_RETENTION_DAYS`, or an operator's DELETE) is no longer announced:
/// the delivery ends at once instead of being claimed, and never attempted,
/// until the retry period runs out.
#[tokio::test]
async fn a_delivery_for_mail_that_was_deleted_ends() {
    let Failing { app, .. } = one_failing_delivery(json!({"body": "soon deleted"})).await;
    let db = app.db().await;
    db.execute(
        "UPDATE messages SET sent_at = now() - interval '40 days'",
        &[],
    )
    .await
    .unwrap();
    // A replica with a retention of 30 days deletes it as it starts.
    let pruner = spawn_app_on(
        &app.database_url,
        &[LOCAL[0], LOCAL[1], ("PHONE_RETENTION_DAYS", "30")],
    )
    .await;
    wait_until(
        &db,
        "the message deleted",
        "SELECT count(*) = 0 FROM messages",
    )
    .await;
    wait_until(
        &db,
        "the delivery ended",
        "SELECT state = 'gone' AND last_error = 'the message was deleted before delivery'
         FROM webhook_deliveries",
    )
    .await;
    pruner.stop().await;
}
