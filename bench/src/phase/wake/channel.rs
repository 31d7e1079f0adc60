//! The channel's wake-up: `phone channel`, the stdio MCP server Claude Code
//! starts for an idle session, watching one agent's inbox through replica 2
//! while a sender writes through replica 1. Measured from the send going
//! out to its `notifications/claude/channel` line on the channel's stdout,
//! beside the long poll's own wake-up.

use std::{process::Stdio, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader},
    process::Command,
    sync::mpsc,
    time::Instant,
};

use super::{Once, WakeCtx, WakeLatRow};
use crate::db;
use crate::load::Agent;
use crate::mcp::Conn;
use crate::stats::{Errors, Lat};

/// The channel paces its announcements (three in five seconds, then a
/// summary): one send per this interval stays inside the pace.
const EVERY: Duration = Duration::from_millis(1800);
/// A notification that does not come within this is counted as missed.
const WITHIN: Duration = Duration::from_secs(10);

pub(crate) async fn wake_channel(
    ctx: &WakeCtx<'_>,
    waiter: &Agent,
    rounds: usize,
) -> Result<WakeLatRow, String> {
    let bin = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("phone");
    let state = std::env::temp_dir().join(format!("phone-bench-channel-{}", std::process::id()));
    std::fs::create_dir_all(&state).map_err(|e| e.to_string())?;
    let log = std::fs::File::create("data/bench/logs/channel.log").map_err(|e| e.to_string())?;
    let watched = &ctx.tg[1 % ctx.tg.len()];
    let mut child = Command::new(&bin)
        .arg("channel")
        .env("PHONE_URL", format!("http://{}", watched.host))
        .env("PHONE_TOKEN", &waiter.token)
        .env("PHONE_CHANNEL_STATE_DIR", &state)
        .env("HOME", &state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start {} channel: {e}", bin.display()))?;
    let mut stdin = child.stdin.take().ok_or("channel stdin")?;
    let stdout = child.stdout.take().ok_or("channel stdout")?;

    // Every announcement's message id, with when its line arrived.
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Instant)>();
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let at = Instant::now();
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["method"] == "notifications/claude/channel"
                && let Some(id) = v["params"]["meta"]["message_id"].as_str()
            {
                let _ = tx.send((id.to_owned(), at));
            }
        }
    });
    let handshake = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "phone-bench", "version": env!("CARGO_PKG_VERSION")}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for message in handshake {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .map_err(|e| format!("channel stdin: {e}"))?;
    }
    // The channel's first long poll is armed on the server.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let sender = &ctx.senders[0];
    let mut conn = Conn::open(&ctx.tg[0])
        .await
        .map_err(|e| format!("sender connection: {e}"))?;
    let (mut send, mut from_send, mut from_response) =
        (Lat::default(), Lat::default(), Lat::default());
    let mut errors = Errors::default();
    let (mut sent_ids, mut received_ids) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        let t0 = Instant::now();
        let args = json!({"to": waiter.name, "body": format!("channel wake-up {n}")});
        let id = match conn
            .call_tool("phone_send", args, Some(&sender.token))
            .await
        {
            Ok(v) => match v["id"].as_str() {
                Some(id) => id.to_owned(),
                None => {
                    errors.add("phone_send", "bad_response", &format!("no id in {v}"));
                    continue;
                }
            },
            Err(e) => {
                errors.add("phone_send", e.kind(), &e.to_string());
                continue;
            }
        };
        let answered = Instant::now();
        send.record(answered - t0);
        sent_ids.push(id.clone());
        let deadline = t0 + WITHIN;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((got, at))) => {
                    received_ids.push(got.clone());
                    if got == id {
                        from_send.record(at - t0);
                        from_response.record(at.saturating_duration_since(answered));
                        break;
                    }
                }
                Ok(None) => {
                    errors.add("channel", "exited", "the channel closed its stdout");
                    break;
                }
                Err(_) => {
                    errors.add(
                        "channel",
                        "missed",
                        &format!("no announcement of {id} within {WITHIN:?}"),
                    );
                    break;
                }
            }
        }
        tokio::time::sleep_until(t0 + EVERY).await;
    }
    drop(stdin);
    let _ = child.kill().await;
    reader.abort();
    let _ = std::fs::remove_dir_all(&state);
    // The channel only looks (peek): every message it announced is unread.
    let ids = db::ids_by_name(&ctx.wdb, std::slice::from_ref(&waiter.name)).await?;
    let (stored, unread) = db::addressed_to(&ctx.wdb, &ids).await?;
    if unread != stored {
        errors.add(
            "channel",
            "marked_read",
            &format!("{} of {stored} messages marked read", stored - unread),
        );
    }
    Ok(WakeLatRow {
        case: "`phone channel` (stdio, as Claude Code starts it) watching replica 2, send through replica 1, one send every 1.8 s (the channel's pace); it only peeks, so every message stays unread".into(),
        short: "wake-up of an idle Claude Code session (phone channel)".into(),
        send: send.summary(),
        from_send: from_send.summary(),
        from_send_response: from_response.summary(),
        answered_first: 0,
        notifications: 0,
        once: Once::check(&sent_ids, &received_ids, (stored, 0)),
        errors: errors.describe(),
        error_count: errors.total(),
    })
}
