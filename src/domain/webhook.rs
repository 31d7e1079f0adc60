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

    /// The destination as `host:port`, lowercase: attempts and failures are
    /// counted per destination, whichever agent points at it.
    pub fn destination_key(&self) -> String {
        let port = self.0.port_or_known_default().unwrap_or(443);
        format!("{}:{port}", self.host().to_ascii_lowercase())
    }

    /// Resolves the host (bounded by `resolver`'s own timeouts, never on a
    /// shared thread pool); every address must be allowed. Returns the
    /// address to connect to. The error names the host, never an address
    /// it resolved to (an internal name must not reveal the network); and
    /// unless private addresses are allowed, a name that does not resolve
    /// and one that resolves to a private address hear the same words, so
    /// that asking does not map which internal names exist.
    pub async fn destination(
        &self,
        resolver: &Resolver,
        allow_private: bool,
    ) -> Result<SocketAddr, String> {
        let port = self.0.port_or_known_default().unwrap_or(443);
        let host = self
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let not_public = || {
            format!(
                "{} is not public: it does not resolve, or resolves to a private, loopback, \
                 link-local or reserved address",
                self.host()
            )
        };
        let unresolved = || {
            if allow_private {
                format!("{} does not resolve", self.host())
            } else {
                not_public()
            }
        };
        let addrs = resolver.lookup(&host).await.map_err(|e| match e {
            LookupError::TimedOut => format!("looking up {} took too long", self.host()),
            LookupError::NotFound => unresolved(),
        })?;
        let Some(first) = addrs.first().copied() else {
            return Err(unresolved());
        };
        if !allow_private && addrs.iter().any(|a| !is_public(*a)) {
            return Err(not_public());
        }
        Ok(SocketAddr::new(first, port))
    }
}

/// Why a host did not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupError {
    TimedOut,
    NotFound,
}

/// Looks up webhook hosts: an asynchronous resolver with its own timeouts,
/// so that a slow name server holds no thread (`getaddrinfo` ran on the
/// blocking pool, which a timeout does not free, and which also resolves
/// the database's host). Cheap to clone.
#[derive(Clone)]
pub struct Resolver {
    inner: std::sync::Arc<hickory_resolver::TokioResolver>,
    /// The whole lookup, however many servers and attempts.
    limit: std::time::Duration,
}

impl Resolver {
    /// The system's name servers (`/etc/resolv.conf`, `/etc/hosts`), or
    /// `servers` when given; each query times out after `timeout`, and a
    /// whole lookup after twice that.
    pub fn new(servers: &[SocketAddr], timeout: std::time::Duration) -> Self {
        use hickory_resolver::{
            Resolver as Hickory,
            config::{ConnectionConfig, NameServerConfig, ResolverConfig},
            net::runtime::TokioRuntimeProvider,
        };
        let provider = TokioRuntimeProvider::default();
        let mut builder = if servers.is_empty() {
            match Hickory::builder(provider.clone()) {
                Ok(builder) => builder,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the system's DNS settings; webhook hosts will not resolve");
                    Hickory::builder_with_config(
                        ResolverConfig::from_name_servers(Vec::new()),
                        provider,
                    )
                }
            }
        } else {
            let name_servers = servers
                .iter()
                .map(|s| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = s.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = s.port();
                    NameServerConfig::new(s.ip(), true, vec![udp, tcp])
                })
                .collect();
            Hickory::builder_with_config(ResolverConfig::from_name_servers(name_servers), provider)
        };
        let options = builder.options_mut();
        options.timeout = timeout;
        options.attempts = 1;
        // Both families, so that every address is judged; IPv4 first, as
        // getaddrinfo orders them on most hosts (the one connected to).
        options.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
        let inner = builder.build().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot build the DNS resolver; webhook hosts will not resolve");
            Hickory::builder_with_config(
                ResolverConfig::from_name_servers(Vec::new()),
                TokioRuntimeProvider::default(),
            )
            .build()
            .expect("a resolver without servers builds")
        });
        Self {
            inner: std::sync::Arc::new(inner),
            limit: timeout * 2,
        }
    }

    /// Every address `host` resolves to (an IP address is itself).
    pub async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, LookupError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        match tokio::time::timeout(self.limit, self.inner.lookup_ip(host)).await {
            Err(_) => Err(LookupError::TimedOut),
            Ok(Err(hickory_resolver::net::NetError::Timeout)) => Err(LookupError::TimedOut),
            Ok(Err(_)) => Err(LookupError::NotFound),
            Ok(Ok(found)) => Ok(found.iter().collect()),
        }
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
                // IETF protocol assignments (192.0.0.0/24) and the
                // deprecated 6to4 relay anycast (192.88.99.0/24).
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 192 && b == 88 && v4.octets()[2] == 99)
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
            // (64:ff9b::/96), SIIT (::ffff:0:a.b.c.d), 6to4 (2002::/16, the
            // address in bits 16-47) and IPv4-compatible (::a.b.c.d): judged
            // by the address inside.
            if (seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                || seg[..6] == [0, 0, 0, 0, 0, 0]
                || seg[..6] == [0, 0, 0, 0, 0xffff, 0])
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
                // Unique local (fc00::/7), link-local (fe80::/10) and the
                // deprecated site-local (fec0::/10).
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || (first & 0xffc0) == 0xfec0
                // Local-use NAT64 (64:ff9b:1::/48): translates to anything.
                || (first == 0x64 && seg[1] == 0xff9b && seg[2] == 1)
                // Discard-only (100::/64).
                || (first == 0x100 && seg[1..4] == [0, 0, 0])
                // IETF protocol assignments (2001::/23: Teredo 2001::/32,
                // benchmarking, ORCHID, …) and documentation (2001:db8::/32,
                // 3fff::/20).
                || (first == 0x2001 && seg[1] < 0x200)
                || (first == 0x2001 && seg[1] == 0x0db8)
                || (first & 0xfff0) == 0x3ff0
                // Segment routing identifiers (5f00::/16).
                || first == 0x5f00)
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
            "192.88.99.1",
            // Site-local, SIIT, local-use NAT64, Teredo, discard-only.
            "fec0::1",
            "::ffff:0:10.0.0.1",
            "::ffff:0:127.0.0.1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1::808:808",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "100::1",
            "2001:2::1",
            "3fff::1",
            "5f00::1",
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
            "::ffff:0:8.8.8.8",
            "2001:4860:4860::8888",
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
    async fn a_host_that_resolves_to_loopback_is_refused_without_naming_it() {
        let resolver = Resolver::new(&[], std::time::Duration::from_secs(2));
        let url = WebhookUrl::parse("https://localhost:8443/hook", false).unwrap();
        let err = url.destination(&resolver, false).await.unwrap_err();
        assert!(err.contains("not public"), "{err}");
        assert!(!err.contains("127.0.0.1") && !err.contains("::1"), "{err}");
        assert!(url.destination(&resolver, true).await.is_ok());
        assert_eq!(url.destination_key(), "localhost:8443");
        let url = WebhookUrl::parse("https://Agent.Example.com/x?token=secret", false).unwrap();
        assert_eq!(url.destination_key(), "agent.example.com:443");
    }

    /// A name server that never answers: the lookup ends by the resolver's
    /// own timeout, on no thread of a shared pool.
    #[tokio::test]
    async fn a_silent_name_server_times_out() {
        // Over TCP too, on the same port: it accepts and never answers. A
        // port free for UDP may be taken for TCP by a test running beside
        // this one: then another port.
        let (silent, _silent_tcp) = (0..20)
            .find_map(|_| {
                let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                let tcp = std::net::TcpListener::bind(udp.local_addr().unwrap()).ok()?;
                Some((udp, tcp))
            })
            .expect("a port free for both UDP and TCP");
        let resolver = Resolver::new(
            &[silent.local_addr().unwrap()],
            std::time::Duration::from_millis(200),
        );
        let url = WebhookUrl::parse("https://hook.example.com/x", false).unwrap();
        let err = url.destination(&resolver, false).await.unwrap_err();
        assert!(err.contains("took too long"), "{err}");
    }
}
