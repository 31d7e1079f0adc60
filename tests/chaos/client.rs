//! A raw MCP client over HTTP/1.1: one JSON-RPC `tools/call` per POST, no
//! handshake (the server is stateless), every outcome classified.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const PROTOCOL_VERSION: &str = "2025-11-25";

#[derive(Debug, Clone)]
pub enum Outcome {
    Ok(Value),
    /// `isError: true`: the text the agent reads.
    Tool(String),
    /// A JSON-RPC error object.
    Rpc(i64, String),
    /// A non-200 status.
    Http(u16, String),
    /// Connection refused, reset, closed mid-response.
    Transport(String),
    /// No answer within the client's timeout.
    Timeout,
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok(_))
    }

    /// Worth retrying with the same arguments (on another replica).
    pub fn retryable(&self) -> bool {
        match self {
            Self::Ok(_) | Self::Rpc(..) => false,
            Self::Tool(t) => t.contains("temporarily unavailable") || t.contains("retry later"),
            Self::Http(s, _) => *s >= 500 || *s == 408 || *s == 429,
            Self::Transport(_) | Self::Timeout => true,
        }
    }

    pub fn kind(&self) -> String {
        match self {
            Self::Ok(_) => "ok".into(),
            Self::Tool(t) if t.contains("temporarily unavailable") => "busy".into(),
            Self::Tool(t) if t.contains("internal error") => "internal".into(),
            Self::Tool(_) => "tool_error".into(),
            Self::Rpc(c, _) => format!("jsonrpc_{c}"),
            Self::Http(s, _) => format!("http_{s}"),
            Self::Transport(_) => "transport".into(),
            Self::Timeout => "timeout".into(),
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Self::Ok(_) => String::new(),
            Self::Tool(t) | Self::Transport(t) => t.clone(),
            Self::Rpc(c, m) => format!("{c}: {m}"),
            Self::Http(s, b) => format!("{s}: {b}"),
            Self::Timeout => "timeout".into(),
        }
    }
}

/// One client's HTTP connection pool (reqwest keeps connections alive).
#[derive(Clone)]
pub struct Mcp {
    http: reqwest::Client,
}

impl Mcp {
    pub fn new(timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_millis(500))
            .pool_idle_timeout(Duration::from_secs(5))
            .no_proxy()
            .build()
            .expect("HTTP client");
        Self { http }
    }

    /// Calls `tool` on the replica at `base` (`http://127.0.0.1:PORT`).
    pub async fn call(&self, base: &str, tool: &str, args: Value) -> (Outcome, Duration) {
        let t0 = Instant::now();
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                          "params": {"name": tool, "arguments": args}});
        let outcome = self.exchange(base, body).await;
        (outcome, t0.elapsed())
    }

    async fn exchange(&self, base: &str, body: Value) -> Outcome {
        let sent = self
            .http
            .post(format!("{base}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .body(body.to_string())
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) if e.is_timeout() => return Outcome::Timeout,
            Err(e) => return Outcome::Transport(error_chain(&e)),
        };
        let status = response.status().as_u16();
        let bytes = match response.bytes().await {
            Ok(b) => b,
            Err(e) if e.is_timeout() => return Outcome::Timeout,
            Err(e) => return Outcome::Transport(error_chain(&e)),
        };
        let text = String::from_utf8_lossy(&bytes);
        if status != 200 {
            return Outcome::Http(status, snippet(&text));
        }
        let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
            return Outcome::Http(status, format!("undecodable body: {}", snippet(&text)));
        };
        if let Some(err) = message.get("error") {
            return Outcome::Rpc(
                err["code"].as_i64().unwrap_or(0),
                err["message"].as_str().unwrap_or_default().to_owned(),
            );
        }
        let result = &message["result"];
        if result["isError"].as_bool() == Some(true) {
            return Outcome::Tool(
                result["content"][0]["text"]
                    .as_str()
                    .unwrap_or("(no text)")
                    .to_owned(),
            );
        }
        Outcome::Ok(result["structuredContent"].clone())
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

pub fn snippet(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// Registers `name` through any replica that answers; returns its token.
pub async fn register(mcp: &Mcp, bases: &[String], name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        let (out, _) = mcp
            .call(
                &bases[i % bases.len()],
                "phone_register",
                json!({"name": name, "description": "chaos test agent", "project": "chaos"}),
            )
            .await;
        match out {
            Outcome::Ok(v) => return v["token"].as_str().expect("token").to_owned(),
            other => {
                assert!(
                    Instant::now() < deadline && other.retryable(),
                    "register {name}: {}",
                    other.detail()
                );
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
