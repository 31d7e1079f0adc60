//! No token (issued or presented) and no message body reaches the log, at
//! any level: the real binary at `RUST_LOG=trace`, in both log formats,
//! driven through every tool.

mod common;

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::Duration,
};

use common::*;
use serde_json::json;

/// The server binary on a free port with `env`, its output to a file.
struct Process {
    child: std::process::Child,
    log: std::path::PathBuf,
    url: String,
}

impl Process {
    async fn start(database_url: &str, env: &[(&str, &str)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::env::temp_dir().join(format!("phone-log-{port}.txt"));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_phone"));
        command
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("PORT", port.to_string())
            .env("PHONE_BIND", "127.0.0.1")
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out));
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the phone binary starts");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if reqwest::get(format!("{url}/health"))
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                return Self { child, log, url };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the server did not become healthy");
    }

    fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let mut text = String::new();
        std::fs::File::open(&self.log)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let _ = std::fs::remove_file(&self.log);
        text
    }
}

async fn every_tool_at_trace(format: &str) {
    let db = fresh_database().await;
    let server = Process::start(&db, &[("RUST_LOG", "trace"), ("PHONE_LOG_FORMAT", format)]).await;
    let app = TestApp::external(&server.url);
    let c = app.client().await;
    let mut secrets = Vec::new();
    let alice = register(&c, "alice", "sender", "p").await;
    let bob = register(&c, "bob", "recipient", "p").await;
    secrets.extend([alice.token.clone(), bob.token.clone()]);
    let body = "the-secret-body-7f1e: wire the money";
    let reply = "the-secret-reply-93ac";
    let sent = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": body, "subject": "s", "idempotency_key": "k1"})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": body, "subject": "s", "idempotency_key": "k1"})),
    )
    .await;
    ok(&c, "phone_search", json!({"query": "recipient"})).await;
    ok(&c, "phone_inbox", bob.with(json!({"peek": true}))).await;
    ok(&c, "phone_inbox", bob.with(json!({"mode": "lease"}))).await;
    let history = ok(&c, "phone_inbox", bob.with(json!({"include_read": true}))).await;
    let id = history["messages"][0]["id"].clone();
    ok(&c, "phone_ack", bob.with(json!({"ids": [id.clone()]}))).await;
    ok(
        &c,
        "phone_send",
        bob.with(json!({"reply_to": sent["id"], "body": reply})),
    )
    .await;
    ok(&c, "phone_inbox", alice.with(json!({"wait_seconds": 1}))).await;
    ok(&c, "phone_outbox", alice.with(json!({}))).await;
    ok(
        &c,
        "phone_thread",
        alice.with(json!({"message_id": sent["id"]})),
    )
    .await;
    // Presented by header too, and wrongly.
    let by_header = app.client_with(Some(&bob.token)).await;
    ok(&by_header, "phone_inbox", json!({})).await;
    let forged = format!("phn_{}", "Q".repeat(43));
    tool_err(&c, "phone_inbox", json!({"token": forged.clone()})).await;
    secrets.push(forged);
    let rotated = ok(&c, "phone_rotate_token", alice.with(json!({}))).await;
    secrets.push(rotated["token"].as_str().unwrap().to_owned());
    let alice_now = Agent {
        name: "alice".into(),
        token: rotated["token"].as_str().unwrap().to_owned(),
    };
    ok(&c, "phone_unregister", alice_now.with(json!({}))).await;
    let log = server.stop();

    assert!(
        log.lines().count() > 50,
        "trace logging produced little: {log}"
    );
    assert!(log.contains("/mcp"), "the log shows the requests");
    assert!(
        log.contains("answer left the server"),
        "the log has this crate's debug lines: {log}"
    );
    for secret in secrets
        .iter()
        .map(String::as_str)
        .chain([body, "the-secret-body-7f1e", reply])
    {
        let hits: Vec<&str> = log.lines().filter(|l| l.contains(secret)).take(3).collect();
        assert!(
            hits.is_empty(),
            "{secret:?} in the {format} log at trace: {hits:#?}"
        );
    }
    // Nor the tokens' digests, as Rust or SQL would print them.
    for token in &secrets {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(token.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!log.contains(&hex), "a token digest in the log");
        assert!(
            !log.contains(&format!("{:?}", digest.as_slice())),
            "a token digest in the log"
        );
    }
}

#[tokio::test]
async fn no_secret_in_the_text_log_at_trace() {
    every_tool_at_trace("text").await;
}

#[tokio::test]
async fn no_secret_in_the_json_log_at_trace() {
    every_tool_at_trace("json").await;
}
