//! The caller's network address, for rate limits: the TCP peer, or behind a
//! trusted proxy the address the proxy reports. Determined once per request
//! and handed to the MCP layer in the request's extensions.

use std::net::SocketAddr;

use axum::{
    extract::{ConnectInfo, Request},
    middleware::Next,
    response::Response,
};

use crate::mcp::ClientAddress;

/// Where the caller's address comes from.
#[derive(Debug, Clone)]
pub enum ClientAddressFrom {
    /// The TCP peer: the server faces its clients directly.
    Peer,
    /// The last X-Forwarded-For entry (the one the trusted proxy appended;
    /// earlier entries are the client's to forge).
    ForwardedFor,
    /// A header the trusted proxy sets, e.g. X-Real-IP.
    Header(http::HeaderName),
}

impl ClientAddressFrom {
    fn address(&self, req: &Request) -> String {
        let from_header = |name: &http::HeaderName, last_entry: bool| {
            let value = req.headers().get(name)?.to_str().ok()?;
            let value = if last_entry {
                value.rsplit(',').next()?
            } else {
                value
            };
            Some(value.trim().to_owned()).filter(|v| !v.is_empty())
        };
        let proxied = match self {
            Self::Peer => None,
            Self::ForwardedFor => {
                from_header(&http::HeaderName::from_static("x-forwarded-for"), true)
            }
            Self::Header(name) => from_header(name, false),
        };
        if let Some(address) = proxied {
            return address;
        }
        req.extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip().to_string())
            .unwrap_or_else(|| "unknown".into())
    }
}

pub(super) async fn attach(from: ClientAddressFrom, mut req: Request, next: Next) -> Response {
    let address = from.address(&req);
    req.extensions_mut().insert(ClientAddress(address));
    next.run(req).await
}
