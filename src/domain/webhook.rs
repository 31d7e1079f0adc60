//! Where a webhook may point, and its secret. A destination must be
//! `https`, and every address its host resolves to must be public: no
//! loopback, private, link-local (cloud metadata lives there), shared,
//! multicast or unspecified address, so that the server cannot be made to
//! call into its own network. `allow_private` (PHONE_WEBHOOK_ALLOW_PRIVATE,
//! for local stacks and tests) lifts both rules. The check runs when the
//! URL is set and again before every delivery, which then connects to the
//! very address it checked.

use std::net::{IpAddr, SocketAddr};

use base64::Engine as _;

use super::types::InvalidInput;

pub const URL_MAX: usize = 2000;

/// A webhook destination that passed the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl(url::Url);

impl WebhookUrl {
    pub fn parse(raw: &str, allow_private: bool) -> Result<Self, InvalidInput> {
        let bad = |reason: &str| InvalidInput::new("webhook_url", reason.to_owned());
        let raw = raw.trim();
        if raw.len() > URL_MAX {
            return Err(bad(&format!("is longer than {URL_MAX} characters")));
        }
        let url = url::Url::parse(raw).map_err(|e| {
            bad(&format!(
                "is not a URL ({e}); e.g. https://agent.example.com/phone"
            ))
        })?;
        match url.scheme() {
            "https" => {}
            "http" if allow_private => {}
            _ => return Err(bad("must be an https:// URL")),
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("needs a host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad(
                "must not carry credentials; the signature proves the sender",
            ));
        }
        Ok(Self(url))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn host(&self) -> &str {
        self.0.host_str().unwrap_or_default()
    }

    /// Resolves the host; every address must be allowed. Returns the
    /// address to connect to.
    pub async fn destination(&self, allow_private: bool) -> Result<SocketAddr, String> {
        let port = self.0.port_or_known_default().unwrap_or(443);
        let host = self
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("{} does not resolve ({e})", self.host()))?
            .collect();
        let Some(first) = addrs.first().copied() else {
            return Err(format!("{} does not resolve", self.host()));
        };
        if !allow_private && let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
            return Err(format!(
                "{} resolves to {}, which is not a public address",
                self.host(),
                bad.ip()
            ));
        }
        Ok(first)
    }
}

/// Whether an address is on the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || a == 0
                // Shared address space (carrier-grade NAT) and benchmarking.
                || (a == 100 && (64..128).contains(&b))
                || (a == 198 && (b == 18 || b == 19))
                // IETF protocol assignments (192.0.0.0/24).
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let seg = v6.segments();
            let first = seg[0];
            let v4_in = |hi: u16, lo: u16| {
                std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            // Forms that carry an IPv4 address a gateway may forward to: NAT64
            // (64:ff9b::/96), 6to4 (2002::/16, the address in bits 16-47) and
            // IPv4-compatible (::a.b.c.d): judged by the address inside.
            if (seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || seg[..6] == [0, 0, 0, 0, 0, 0])
                && !v6.is_loopback()
                && !v6.is_unspecified()
            {
                return is_public(IpAddr::V4(v4_in(seg[6], seg[7])));
            }
            if first == 0x2002 {
                return is_public(IpAddr::V4(v4_in(seg[1], seg[2])));
            }
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // Unique local (fc00::/7) and link-local (fe80::/10).
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                // Documentation (2001:db8::/32).
                || (first == 0x2001 && v6.segments()[1] == 0x0db8))
        }
    }
}

/// A new signing secret: `whsec_` + base64 of 32 random bytes (Standard
/// Webhooks).
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_destinations() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "64:ff9b::127.0.0.1",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "::10.0.0.1",
            "::127.0.0.1",
            "192.0.0.8",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    #[test]
    fn urls_must_be_https_without_credentials() {
        assert!(WebhookUrl::parse("https://agent.example.com/hook", false).is_ok());
        for bad in [
            "http://agent.example.com/hook",
            "ftp://x/",
            "not a url",
            "https://u:p@x.example/",
        ] {
            assert!(WebhookUrl::parse(bad, false).is_err(), "{bad}");
        }
        assert!(WebhookUrl::parse("http://127.0.0.1:9/hook", true).is_ok());
        assert!(new_secret().starts_with("whsec_"));
    }

    #[tokio::test]
    async fn a_host_that_resolves_to_loopback_is_refused() {
        let url = WebhookUrl::parse("https://localhost:8443/hook", false).unwrap();
        let err = url.destination(false).await.unwrap_err();
        assert!(err.contains("not a public address"), "{err}");
        assert!(url.destination(true).await.is_ok());
    }
}
