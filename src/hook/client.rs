//! The hooks' one question to the server, asked over MCP like any agent:
//! `phone_inbox {peek: true}` (consumes nothing), optionally waiting.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::remote::{Connection, Lifecycle, RemoteError, Target};

/// How many unread messages one peek looks at (the server's most).
const PEEK_LIMIT: u32 = 100;
/// While mail the hook already blocked for is still unread, a peek cannot
/// wait for more (it answers at once); it looks again this often.
const RECHECK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Deserialize)]
pub struct Brief {
    pub id: String,
    pub from: String,
    pub from_project: String,
    pub to: String,
    #[serde(default)]
    pub subject: Option<String>,
}

/// Unread mail, as a peek saw it.
#[derive(Debug, Default)]
pub struct Unread {
    /// Every unread message (100 means 100 or more).
    pub total: i64,
    /// The oldest of them, up to [`PEEK_LIMIT`].
    pub messages: Vec<Brief>,
    /// The agent's own name, when there is mail to tell it from.
    pub me: Option<String>,
}

#[derive(Deserialize)]
struct InboxOut {
    messages: Vec<Brief>,
    unread_remaining: i64,
}

async fn peek(client: &Connection, wait_secs: u64) -> Result<InboxOut, RemoteError> {
    let mut args = json!({"peek": true, "limit": PEEK_LIMIT});
    if wait_secs > 0 {
        args["wait_seconds"] = wait_secs.into();
    }
    let out = client
        .call("phone_inbox", args, Duration::from_secs(wait_secs))
        .await?;
    let mut out: InboxOut =
        serde_json::from_value(out).map_err(|e| RemoteError::Protocol(e.to_string()))?;
    if out.messages.len() >= PEEK_LIMIT as usize {
        // First: the summary names a few, and these are the ones a flood
        // would leave among "and 96 more".
        let mut newest: Vec<Brief> = client.newest_waiting().await?;
        newest.retain(|m| !out.messages.iter().any(|o| o.id == m.id));
        newest.append(&mut out.messages);
        out.messages = newest;
    }
    Ok(out)
}

/// Unread mail; with `wait`, first waits up to that long for mail that is not
/// all in `seen` (what the hook blocked for last time).
pub async fn peek_unread(
    target: &Target,
    wait: Duration,
    seen: &BTreeSet<String>,
) -> Result<Unread, RemoteError> {
    let client = Connection::open(target, "phone-hook", Lifecycle::Handshake).await?;
    let outcome = ask(&client, wait, seen).await;
    client.close().await;
    outcome
}

async fn ask(
    client: &Connection,
    wait: Duration,
    seen: &BTreeSet<String>,
) -> Result<Unread, RemoteError> {
    let deadline = tokio::time::Instant::now() + wait;
    let server_max = if wait.is_zero() {
        0
    } else {
        client.max_wait().await?
    };
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let wait_secs = left.as_secs().min(server_max);
        let out = peek(client, wait_secs).await?;
        let has_news = out.messages.iter().any(|m| !seen.contains(&m.id));
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if has_news || left.is_zero() {
            return Ok(unread(out));
        }
        // The server did not wait: mail it already told the agent about
        // answers a peek at once, and so does a wait under a second.
        if out.unread_remaining > 0 || wait_secs == 0 {
            tokio::time::sleep(RECHECK.min(left)).await;
        }
    }
}

fn unread(out: InboxOut) -> Unread {
    Unread {
        total: out.unread_remaining.max(out.messages.len() as i64),
        me: out.messages.first().map(|m| m.to.clone()),
        messages: out.messages,
    }
}
