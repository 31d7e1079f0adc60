//! The caller's network address, for rate limits: the TCP peer, or behind a
//! trusted proxy the address the proxy reports. Determined once per request
//! and handed to the MCP layer in the request's extensions, as a bucket:
//! an IPv4 address, or an IPv6 /64 (one subscriber's usual allocation, so a
//! client cannot walk around a limit by changing the low bits).

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    sync::atomic::{AtomicBool, Ordering},
};

use axum::{
    extract::{ConnectInfo, Request},
    middleware::Next,
    response::Response,
};

use crate::mcp::ClientAddress;

/// Where the caller's address comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAddressFrom {
    /// The TCP peer: the server faces its clients directly.
    Peer,
    /// The last X-Forwarded-For entry (the one the trusted proxy appended;
    /// earlier entries are the client's to forge), as behind the bundled
    /// nginx.
    ForwardedFor,
    /// A header the trusted proxy sets and overwrites, e.g. `X-Real-IP`,
    /// which Railway's edge sets.
    Header(http::HeaderName),
}

/// Headers a proxy adds: seen on a request while the address comes from
/// the peer, they mean every client shares the proxy's address.
const PROXY_HEADERS: [&str; 3] = ["x-forwarded-for", "x-real-ip", "forwarded"];

/// Warned once per process: requests come through a proxy, but the
/// address is taken from the peer.
static WARNED_PROXY: AtomicBool = AtomicBool::new(false);

impl ClientAddressFrom {
    fn address(&self, req: &Request) -> String {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|info| info.0.ip());
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        // A header the client sent itself may come first: the edge appends
        // (or sets) its own line last, so repeated lines resolve to it.
        let last_line = |name: &str| {
            req.headers()
                .get_all(name)
                .iter()
                .next_back()
                .and_then(|v| v.to_str().ok())
        };
        let proxied = match self {
            Self::Peer => {
                if PROXY_HEADERS.iter().any(|h| header(h).is_some())
                    && !WARNED_PROXY.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        "requests arrive through a proxy (X-Forwarded-For / X-Real-IP / Forwarded), \
                         but client addresses come from the TCP peer: every client shares the proxy's \
                         rate limits. Set PHONE_CLIENT_IP_HEADER (e.g. X-Real-IP) or \
                         PHONE_TRUST_FORWARDED_FOR=true (see docs/DEPLOY.md)"
                    );
                }
                None
            }
            Self::ForwardedFor => last_line("x-forwarded-for")
                .and_then(|v| v.rsplit(',').next())
                .and_then(parse_address),
            Self::Header(name) => last_line(name.as_str()).and_then(parse_address),
        };
        match proxied.or(peer) {
            Some(ip) => bucket(ip),
            None => "unknown".into(),
        }
    }
}

/// An address as a proxy writes it: `1.2.3.4`, `2001:db8::1`, `[2001:db8::1]:443`
/// or `1.2.3.4:5678`.
fn parse_address(raw: &str) -> Option<IpAddr> {
    let raw = raw.trim();
    if let Ok(ip) = raw.parse::<IpAddr>() {
        return Some(ip);
    }
    raw.parse::<SocketAddr>().ok().map(|s| s.ip())
}

/// The rate-limit bucket of an address: IPv4 as is (also when mapped into
/// IPv6), IPv6 by its /64.
pub fn bucket(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                let net = Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                format!("{net}/64")
            }
        },
    }
}

pub(super) async fn attach(from: ClientAddressFrom, mut req: Request, next: Next) -> Response {
    let address = from.address(&req);
    req.extensions_mut().insert(ClientAddress(address));
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(lines: &[(&str, &str)]) -> Request {
        let mut builder = http::Request::builder().uri("/mcp");
        for (name, value) in lines {
            builder = builder.header(*name, *value);
        }
        let mut req = builder.body(axum::body::Body::empty()).unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 9], 4000))));
        req
    }

    /// A client that sends the header itself cannot choose its bucket: of
    /// repeated lines, the edge's own (the last) counts.
    #[test]
    fn repeated_proxy_headers_resolve_to_the_edges_line() {
        let real_ip = ClientAddressFrom::Header(http::HeaderName::from_static("x-real-ip"));
        let req = request(&[("x-real-ip", "198.51.100.1"), ("x-real-ip", "203.0.113.7")]);
        assert_eq!(real_ip.address(&req), "203.0.113.7");
        let req = request(&[
            ("x-forwarded-for", "198.51.100.1, 198.51.100.2"),
            ("x-forwarded-for", "203.0.113.8"),
        ]);
        assert_eq!(ClientAddressFrom::ForwardedFor.address(&req), "203.0.113.8");
        let req = request(&[("x-forwarded-for", "198.51.100.1, 203.0.113.9")]);
        assert_eq!(ClientAddressFrom::ForwardedFor.address(&req), "203.0.113.9");
        assert_eq!(ClientAddressFrom::Peer.address(&request(&[])), "10.0.0.9");
    }

    #[test]
    fn ipv6_clients_share_their_64_and_ipv4_stays_whole() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(bucket(a), "2001:db8:1:2::/64");
        assert_eq!(bucket(a), bucket(b));
        assert_ne!(bucket(a), bucket(c));
        assert_eq!(bucket("::ffff:192.0.2.7".parse().unwrap()), "192.0.2.7");
        assert_eq!(bucket("192.0.2.7".parse().unwrap()), "192.0.2.7");
        assert_eq!(
            parse_address(" [2001:db8::1]:443 "),
            Some("2001:db8::1".parse().unwrap())
        );
        assert_eq!(
            parse_address("192.0.2.9:5000"),
            Some("192.0.2.9".parse().unwrap())
        );
        assert_eq!(parse_address("not an address"), None);
    }
}
