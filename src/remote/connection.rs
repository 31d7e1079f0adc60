//! One MCP connection to a phone server over HTTP (rmcp's client), with a
//! time limit on everything, and errors that say what went wrong: the
//! server could not be reached, it refused the token, a tool refused the
//! call, or its answer made no sense.

use std::time::Duration;

use rmcp::{
    ClientServiceExt as _, RoleClient, ServiceExt as _,
    model::{
        CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
    },
    service::{ClientInitializeError, RunningService},
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{AuthRequiredError, StreamableHttpClientTransportConfig},
    },
};
use serde_json::Value;

use super::Target;

/// Connecting, and each call that does not wait, get this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("cannot reach {url}: {detail}")]
    Unreachable { url: String, detail: String },
    /// HTTP 401: the token is not (or no longer) an agent's token.
    #[error(
        "the server refused the token (HTTP 401: {0}); it was mistyped, rotated or revoked: run phone login with the agent's current token"
    )]
    Unauthorized(String),
    #[error("the server answered: {0}")]
    Refused(String),
    #[error("the server took longer than {0:?}")]
    Timeout(Duration),
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
}

/// Which lifecycle to speak: the initialize handshake, or 2026-07-28
/// (`server/discover`, needed for `subscriptions/listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Handshake,
    Modern,
}

pub type Client = RunningService<RoleClient, ClientConfig>;

pub struct Connection {
    client: Client,
    url: String,
}

impl Connection {
    /// Connects as `client_name`, with the target's token (if any) in an
    /// `Authorization: Bearer` header.
    pub async fn open(
        target: &Target,
        client_name: &str,
        lifecycle: Lifecycle,
    ) -> Result<Self, RemoteError> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(target.mcp_url.clone());
        if let Some(token) = &target.token {
            config = config.auth_header(token.expose().to_owned());
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(client_name.to_owned(), env!("CARGO_PKG_VERSION")),
        );
        let connecting = async {
            match lifecycle {
                Lifecycle::Handshake => info.serve(transport).await,
                Lifecycle::Modern => {
                    info.serve_with_lifecycle(
                        transport,
                        rmcp::ClientLifecycleMode::Discover {
                            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                        },
                    )
                    .await
                }
            }
        };
        match tokio::time::timeout(CALL_TIMEOUT, connecting).await {
            Err(_) => Err(RemoteError::Timeout(CALL_TIMEOUT)),
            Ok(Err(e)) => Err(connect_error(&target.mcp_url, e)),
            Ok(Ok(client)) => Ok(Self {
                client,
                url: target.mcp_url.clone(),
            }),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Calls `tool`; its structured result, or the tool's error as
    /// [`RemoteError::Refused`]. `wait` is how long the call may wait on the
    /// server beyond the usual limit (a long poll).
    pub async fn call(
        &self,
        tool: &str,
        args: Value,
        wait: Duration,
    ) -> Result<Value, RemoteError> {
        let args = args.as_object().cloned().unwrap_or_default();
        let limit = CALL_TIMEOUT + wait;
        let result = tokio::time::timeout(
            limit,
            self.client
                .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args)),
        )
        .await
        .map_err(|_| RemoteError::Timeout(limit))?
        .map_err(|e| match auth_challenge(&e) {
            Some(challenge) => RemoteError::Unauthorized(challenge),
            None => RemoteError::Protocol(e.to_string()),
        })?;
        if result.is_error == Some(true) {
            let text = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join(" ");
            return Err(RemoteError::Refused(text));
        }
        result
            .structured_content
            .ok_or_else(|| RemoteError::Protocol(format!("{tool} returned no structured content")))
    }

    /// The server's longest `wait_seconds` for phone_inbox, from the tool's
    /// schema (0 if absent).
    pub async fn max_wait(&self) -> Result<u64, RemoteError> {
        let tools = tokio::time::timeout(CALL_TIMEOUT, self.client.list_all_tools())
            .await
            .map_err(|_| RemoteError::Timeout(CALL_TIMEOUT))?
            .map_err(|e| RemoteError::Protocol(e.to_string()))?;
        Ok(tools
            .iter()
            .find(|t| t.name == "phone_inbox")
            .and_then(|t| t.input_schema.get("properties"))
            .and_then(|p| p.get("wait_seconds"))
            .and_then(|w| w.get("maximum"))
            .and_then(Value::as_u64)
            .unwrap_or(0))
    }

    /// Closes the connection (a courtesy: a stateless server keeps nothing).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.cancel()).await;
    }
}

fn connect_error(url: &str, e: ClientInitializeError) -> RemoteError {
    let challenge = match &e {
        ClientInitializeError::TransportError { error, .. } => auth_challenge(error),
        other => auth_challenge(other),
    };
    match challenge {
        Some(challenge) => RemoteError::Unauthorized(challenge),
        None => RemoteError::Unreachable {
            url: url.to_owned(),
            detail: e.to_string(),
        },
    }
}

/// The server's `WWW-Authenticate` challenge, when `error` is (or was
/// caused by) an HTTP 401.
fn auth_challenge(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(auth) = e.downcast_ref::<AuthRequiredError>() {
            return Some(auth.www_authenticate_header.clone());
        }
        current = e.source();
    }
    None
}

/// How many of the newest messages a full peek is followed by.
const NEWEST_LOOK: usize = 20;

#[derive(serde::Deserialize)]
struct Recent<B> {
    messages: Vec<Waiting<B>>,
}

#[derive(serde::Deserialize)]
struct Waiting<B> {
    #[serde(flatten)]
    message: B,
    #[serde(default)]
    read_at: Option<String>,
    #[serde(default)]
    dead_at: Option<String>,
    #[serde(default)]
    lease_expires_at: Option<String>,
}

impl Connection {
    /// Unread mail a full peek (the oldest hundred) cannot reach: of the
    /// newest [`NEWEST_LOOK`] messages, read or not (`include_read` marks
    /// nothing), those still waiting, oldest first, each as `B`. A
    /// stranger's hundred unread held every later message out of the
    /// hooks' and the channel's peeks, a colleague's too, and they told the
    /// agent nothing of it (an outsider's attack).
    pub async fn newest_waiting<B: serde::de::DeserializeOwned>(
        &self,
    ) -> Result<Vec<B>, RemoteError> {
        let out = self
            .call(
                "phone_inbox",
                serde_json::json!({"include_read": true, "limit": NEWEST_LOOK}),
                Duration::ZERO,
            )
            .await?;
        let recent: Recent<B> =
            serde_json::from_value(out).map_err(|e| RemoteError::Protocol(e.to_string()))?;
        let mut waiting: Vec<B> = recent
            .messages
            .into_iter()
            .filter(|m| m.read_at.is_none() && m.dead_at.is_none() && m.lease_expires_at.is_none())
            .map(|m| m.message)
            .collect();
        waiting.reverse();
        Ok(waiting)
    }
}
