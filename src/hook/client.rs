//! The hooks' one question to the server, asked over MCP like any agent:
//! `phone_inbox {peek: true}` (consumes nothing), optionally waiting.

use std::collections::BTreeSet;
use std::time::Duration;

use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Target;

/// How many unread messages one peek looks at (the server's most).
const PEEK_LIMIT: u32 = 100;
/// Connecting and each call that does not wait get this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// While mail the hook already blocked for is still unread, a peek cannot
/// wait for more (it answers at once); it looks again this often.
const RECHECK: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum HookClientError {
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the server answered: {0}")]
    Refused(String),
    #[error("the server took longer than {0:?}")]
    Timeout(Duration),
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
}

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

type Client = RunningService<RoleClient, ClientConfig>;

async fn connect(target: &Target) -> Result<Client, HookClientError> {
    let config = StreamableHttpClientTransportConfig::with_uri(target.mcp_url.clone())
        .auth_header(target.token.clone());
    let transport = StreamableHttpClientTransport::from_config(config);
    let info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("phone-hook", env!("CARGO_PKG_VERSION")),
    );
    match tokio::time::timeout(CALL_TIMEOUT, info.serve(transport)).await {
        Err(_) => Err(HookClientError::Timeout(CALL_TIMEOUT)),
        Ok(Err(e)) => Err(HookClientError::Unreachable {
            url: target.mcp_url.clone(),
            detail: e.to_string(),
        }),
        Ok(Ok(client)) => Ok(client),
    }
}

/// The server's longest `wait_seconds`, from the tool's schema (0 if absent).
async fn max_wait(client: &Client) -> Result<u64, HookClientError> {
    let tools = tokio::time::timeout(CALL_TIMEOUT, client.list_all_tools())
        .await
        .map_err(|_| HookClientError::Timeout(CALL_TIMEOUT))?
        .map_err(|e| HookClientError::Protocol(e.to_string()))?;
    Ok(tools
        .iter()
        .find(|t| t.name == "phone_inbox")
        .and_then(|t| t.input_schema.get("properties"))
        .and_then(|p| p.get("wait_seconds"))
        .and_then(|w| w.get("maximum"))
        .and_then(Value::as_u64)
        .unwrap_or(0))
}

async fn peek(client: &Client, wait_secs: u64) -> Result<InboxOut, HookClientError> {
    let mut args = json!({"peek": true, "limit": PEEK_LIMIT});
    if wait_secs > 0 {
        args["wait_seconds"] = wait_secs.into();
    }
    let args = args.as_object().cloned().unwrap_or_default();
    let limit = CALL_TIMEOUT + Duration::from_secs(wait_secs);
    let result = tokio::time::timeout(
        limit,
        client.call_tool(CallToolRequestParams::new("phone_inbox").with_arguments(args)),
    )
    .await
    .map_err(|_| HookClientError::Timeout(limit))?
    .map_err(|e| HookClientError::Protocol(e.to_string()))?;
    if result.is_error == Some(true) {
        let text = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join(" ");
        return Err(HookClientError::Refused(text));
    }
    let structured = result.structured_content.ok_or_else(|| {
        HookClientError::Protocol("phone_inbox returned no structured content".into())
    })?;
    serde_json::from_value(structured).map_err(|e| HookClientError::Protocol(e.to_string()))
}

/// Unread mail; with `wait`, first waits up to that long for mail that is not
/// all in `seen` (what the hook blocked for last time).
pub async fn peek_unread(
    target: &Target,
    wait: Duration,
    seen: &BTreeSet<String>,
) -> Result<Unread, HookClientError> {
    let client = connect(target).await?;
    let outcome = ask(&client, wait, seen).await;
    // A stateless server keeps nothing for us; closing is a courtesy.
    let _ = client.cancel().await;
    outcome
}

async fn ask(
    client: &Client,
    wait: Duration,
    seen: &BTreeSet<String>,
) -> Result<Unread, HookClientError> {
    let deadline = tokio::time::Instant::now() + wait;
    let server_max = if wait.is_zero() {
        0
    } else {
        max_wait(client).await?
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
