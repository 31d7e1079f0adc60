//! The console in a real browser: headless Chromium (Debian's `chromium`)
//! driven by tests/browser/console.mjs through playwright-core, against the
//! real server and PostgreSQL. `scripts/browser-setup.sh` installs both
//! (`make test` runs it). The screenshots land in
//! target/console-screenshots (`make screenshots` refreshes docs/console,
//! which docs/CONSOLE.md shows).

mod common;

use std::path::Path;

use common::*;
use serde_json::json;

const OPERATOR: &str = "operator-token-for-the-browser-test-0001";

#[tokio::test]
async fn a_person_signs_in_reads_replies_writes_and_signs_out_in_chromium() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("tests/browser/console.mjs");
    let chromium =
        std::env::var("PHONE_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists() && root.join("tests/browser/node_modules").exists(),
        "headless Chromium or playwright-core is missing: run scripts/browser-setup.sh \
         (make test does)"
    );
    let shots = std::env::var("PHONE_SCREENSHOT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("target/console-screenshots"));

    let app = spawn_app_with(&[("PHONE_CONSOLE_ADMIN_TOKEN", OPERATOR)]).await;
    let c = app.client().await;
    let alice = register(
        &c,
        "alice",
        "Schedules deploys and watches the release train",
        "infra",
    )
    .await;
    let bob = register(&c, "bob", "Writes the release notes", "docs").await;
    register(&c, "carol", "Translates release notes", "docs").await;
    let first = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "Release notes for 2.4?",
                          "body": "Can you have them ready by Friday?"})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        bob.with(json!({"reply_to": first["id"], "body": "Yes, draft by Thursday."})),
    )
    .await;
    // Read by bob's agent: the console shows history, not only unread mail.
    ok(&c, "phone_inbox", bob.with(json!({}))).await;
    let hostile = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "<b>deploy</b> window",
                          "body": "Is Tuesday 10:00 UTC fine?\n<script>alert('x')</script><img src=x onerror=alert(1)>"})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "Changelog format", "body": "Keep a Changelog, please."})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "And one without a subject."})),
    )
    .await;

    let output = tokio::process::Command::new("node")
        .arg(&script)
        .env("PHONE_URL", format!("http://{}", app.addr))
        .env("BOB_TOKEN", &bob.token)
        .env("OPERATOR_TOKEN", OPERATOR)
        .env("SCREENSHOT_DIR", &shots)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), output)
        .await
        .expect("the browser run took over 2 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the browser run failed:\n{stdout}");
    assert!(stdout.contains("browser: all steps passed"));
    for shot in [
        "inbox.png",
        "thread.png",
        "compose.png",
        "overview.png",
        "inbox-phone.png",
    ] {
        let size = std::fs::metadata(shots.join(shot))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(size > 10_000, "{shot} is missing or empty ({size} bytes)");
    }

    // What the person did reached alice as bob, in the right thread.
    let got = ok(&c, "phone_inbox", alice.with(json!({"limit": 10}))).await;
    let messages = got["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{got}");
    let reply = messages
        .iter()
        .find(|m| m["body"].as_str().unwrap().starts_with("Tuesday works."))
        .expect("the reply");
    assert_eq!(reply["from"], "bob");
    assert_eq!(reply["reply_to"], hostile["id"]);
    let new = messages
        .iter()
        .find(|m| m["subject"] == "Status")
        .expect("the new message");
    assert_eq!(new["body"], "All green on our side.\nSecond line.");
    // Looking consumed nothing: bob's agent still gets its three unread.
    let bobs = ok(&c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
    assert_eq!(bobs["messages"].as_array().unwrap().len(), 3, "{bobs}");
    app.stop().await;
}
