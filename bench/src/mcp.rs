//! A minimal MCP client over HTTP/1.1 keep-alive: one TCP connection, one
//! `initialize` at open, then JSON-RPC `tools/call` POSTs to `/mcp`.

use std::{fmt, net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode, client::conn::http1::SendRequest, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

pub const PROTOCOL_VERSION: &str = "2025-11-25";
/// Longest a single request may take before it counts as an error and the
/// connection is replaced (see `Conn::set_timeout` for long polls).
const TIMEOUT: Duration = Duration::from_secs(10);

/// One replica: where to connect and what to put in `Host`.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

impl Target {
    pub fn local(port: u16) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            host: format!("127.0.0.1:{port}"),
        }
    }
}

#[derive(Debug, Clone)]
pub enum CallError {
    Connect(String),
    Transport(String),
    Timeout(Duration),
    Http(u16, String),
    JsonRpc(i64, String),
    Tool(String),
    Decode(String),
}

impl CallError {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect",
            Self::Transport(_) => "transport",
            Self::Timeout(_) => "timeout",
            Self::Http(..) => "http_status",
            Self::JsonRpc(..) => "jsonrpc_error",
            Self::Tool(_) => "tool_error",
            Self::Decode(_) => "bad_response",
        }
    }

    /// After these the connection's state is unknown: open a new one.
    pub fn needs_reconnect(&self) -> bool {
        matches!(
            self,
            Self::Connect(_) | Self::Transport(_) | Self::Timeout(_)
        )
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect(e) => write!(f, "connect: {e}"),
            Self::Transport(e) => write!(f, "transport: {e}"),
            Self::Timeout(t) => write!(f, "no answer within {:.1}s", t.as_secs_f64()),
            Self::Http(s, body) => write!(f, "HTTP {s}: {body}"),
            Self::JsonRpc(c, m) => write!(f, "JSON-RPC error {c}: {m}"),
            Self::Tool(m) => write!(f, "tool error: {m}"),
            Self::Decode(e) => write!(f, "undecodable response: {e}"),
        }
    }
}

pub struct Conn {
    target: Target,
    sender: SendRequest<Full<Bytes>>,
    protocol: String,
    next_id: u64,
    timeout: Duration,
}

impl Conn {
    /// Connects and performs the MCP handshake (`initialize`, then
    /// `notifications/initialized`), as a real client does.
    pub async fn open(target: &Target) -> Result<Self, CallError> {
        let connect = async {
            let stream = TcpStream::connect(target.addr)
                .await
                .map_err(|e| CallError::Connect(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| CallError::Connect(e.to_string()))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            Ok::<_, CallError>(sender)
        };
        let sender = tokio::time::timeout(TIMEOUT, connect)
            .await
            .map_err(|_| CallError::Timeout(TIMEOUT))??;
        let mut conn = Self {
            target: target.clone(),
            sender,
            protocol: PROTOCOL_VERSION.to_owned(),
            next_id: 1,
            timeout: TIMEOUT,
        };
        let init = conn
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "phone-bench", "version": env!("CARGO_PKG_VERSION")},
                }),
                None,
            )
            .await?;
        if let Some(v) = init.get("protocolVersion").and_then(Value::as_str) {
            conn.protocol = v.to_owned();
        }
        conn.notify("notifications/initialized").await?;
        Ok(conn)
    }

    /// Longest a request on this connection may take from now on (a long
    /// poll waits up to 25 s by design).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The protocol version the server agreed to in `initialize`.
    pub fn protocol(&self) -> &str {
        &self.protocol
    }

    async fn post(
        &mut self,
        body: Vec<u8>,
        token: Option<&str>,
        version_header: bool,
    ) -> Result<(StatusCode, Bytes, bool), CallError> {
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let mut req = Request::post("/mcp")
                .header(header::HOST, &self.target.host)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "application/json, text/event-stream");
            if version_header {
                req = req.header("mcp-protocol-version", &self.protocol);
            }
            if let Some(t) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = req
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let status = resp.status();
            let sse = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?
                .to_bytes();
            Ok((status, bytes, sse))
        };
        let timeout = self.timeout;
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout(timeout))?
    }

    /// One JSON-RPC request; returns its `result`.
    pub async fn request(
        &mut self,
        method: &str,
        params: Value,
        token: Option<&str>,
    ) -> Result<Value, CallError> {
        let id = self.next_id;
        self.next_id += 1;
        let body = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .expect("request serializes");
        let (status, bytes, sse) = self.post(body, token, method != "initialize").await?;
        if !status.is_success() {
            return Err(CallError::Http(status.as_u16(), snippet(&bytes)));
        }
        let message = if sse {
            last_sse_message(&bytes)?
        } else {
            parse(&bytes)?
        };
        let Value::Object(mut message) = message else {
            return Err(CallError::Decode(snippet(&bytes)));
        };
        if let Some(err) = message.get("error") {
            return Err(CallError::JsonRpc(
                err.get("code").and_then(Value::as_i64).unwrap_or(0),
                err.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            ));
        }
        message
            .remove("result")
            .ok_or_else(|| CallError::Decode(snippet(&bytes)))
    }

    /// `tools/call`; a result with `isError: true` is an error; otherwise
    /// returns `structuredContent`.
    pub async fn call_tool(
        &mut self,
        name: &str,
        arguments: Value,
        token: Option<&str>,
    ) -> Result<Value, CallError> {
        let mut result = self
            .request(
                "tools/call",
                json!({"name": name, "arguments": arguments}),
                token,
            )
            .await?;
        if result.get("isError").and_then(Value::as_bool) == Some(true) {
            let text = result
                .pointer("/content/0/text")
                .and_then(Value::as_str)
                .unwrap_or("(no text)")
                .to_owned();
            return Err(CallError::Tool(text));
        }
        Ok(result
            .get_mut("structuredContent")
            .map(Value::take)
            .unwrap_or(Value::Null))
    }

    async fn notify(&mut self, method: &str) -> Result<(), CallError> {
        let body =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "method": method})).expect("serializes");
        let (status, bytes, _) = self.post(body, None, true).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(CallError::Http(status.as_u16(), snippet(&bytes)))
        }
    }

    /// A plain GET on this connection (for `/health`).
    pub async fn get(&mut self, path: &str) -> Result<StatusCode, CallError> {
        let exchange = async {
            self.sender
                .ready()
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let req = Request::get(path)
                .header(header::HOST, &self.target.host)
                .body(Full::new(Bytes::new()))
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let resp = self
                .sender
                .send_request(req)
                .await
                .map_err(|e| CallError::Transport(e.to_string()))?;
            let status = resp.status();
            let _ = resp.into_body().collect().await;
            Ok(status)
        };
        let timeout = self.timeout;
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout(timeout))?
    }
}

/// Opens a bare HTTP connection without the MCP handshake (health checks
/// while a replica is still starting).
pub async fn health(target: &Target) -> bool {
    let attempt = async {
        let stream = TcpStream::connect(target.addr).await.ok()?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut conn = Conn {
            target: target.clone(),
            sender,
            protocol: PROTOCOL_VERSION.into(),
            next_id: 1,
            timeout: TIMEOUT,
        };
        conn.get("/health").await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), attempt).await, Ok(Some(s)) if s.is_success())
}

fn parse(bytes: &[u8]) -> Result<Value, CallError> {
    serde_json::from_slice(bytes).map_err(|e| CallError::Decode(format!("{e}: {}", snippet(bytes))))
}

/// The last JSON-RPC response in an SSE body (in case the server streams).
fn last_sse_message(bytes: &[u8]) -> Result<Value, CallError> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
        .ok_or_else(|| CallError::Decode(snippet(bytes)))
}

fn snippet(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim();
    if s.chars().count() > 160 {
        format!("{}…", s.chars().take(160).collect::<String>())
    } else {
        s.to_owned()
    }
}
