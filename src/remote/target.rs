//! Which server, and which agent's token: the first of
//!
//! - the server: `--url` (register, login), `PHONE_URL`, the Claude Code
//!   plugin's `url` option (`CLAUDE_PLUGIN_OPTION_URL`), the profile;
//! - the token: `PHONE_TOKEN`, the profile's (only for the profile's own
//!   server: a token is never sent to another server than the one it was
//!   saved for), the plugin's `token` option (`CLAUDE_PLUGIN_OPTION_TOKEN`).
//!
//! The plugin's HTTP server gets its header from `phone mcp-headers`, which
//! cannot see the plugin's options; this order is the one it can follow, so
//! the hooks, the channel and the MCP server always agree.

use std::fmt;
use std::net::IpAddr;

use super::profile::{Profile, ProfileError, Secret};
use super::{Env, var};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    PluginOption,
    Profile,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Flag => "the command line",
            Self::Env => "the environment",
            Self::PluginOption => "the Claude Code plugin's options",
            Self::Profile => "the profile",
        })
    }
}

/// Where the server is and who the agent is.
#[derive(Debug, Clone)]
pub struct Target {
    /// The server's MCP endpoint.
    pub mcp_url: String,
    pub url_from: Source,
    pub token: Option<Secret>,
    pub token_from: Option<Source>,
    /// The agent's name, when the token is the profile's.
    pub name: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(
        "no server: PHONE_URL is not set (the phone server, e.g. https://phone.example.com), and there is no profile (phone login)"
    )]
    NoUrl,
    #[error("{from} names {url:?}, which is not a phone server URL: {why}")]
    BadUrl {
        from: Source,
        url: String,
        why: String,
    },
    #[error(
        "no token: PHONE_TOKEN is not set (the agent's token from phone_register), and there is no profile for {0} (phone login)"
    )]
    NoToken(String),
    /// A token is printable ASCII (`phn_` and base64url): one with a line
    /// break or a space inside cannot go in a header, and the channel took
    /// the failure for an unreachable server and retried for ever.
    #[error(
        "the token from {0} holds characters no token has (a space, a line break or a character beyond ASCII): give the token exactly as phone_register showed it"
    )]
    BadToken(Source),
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

impl Target {
    /// From the environment, the plugin's options and `profile`; `flag` is
    /// a `--url` given on the command line.
    pub fn resolve(
        env: Env<'_>,
        flag: Option<&str>,
        profile: Option<&Profile>,
    ) -> Result<Self, TargetError> {
        let (raw, url_from) = flag
            .map(|u| (u.trim().to_owned(), Source::Flag))
            .or_else(|| var(env, "PHONE_URL").map(|u| (u, Source::Env)))
            .or_else(|| var(env, "CLAUDE_PLUGIN_OPTION_URL").map(|u| (u, Source::PluginOption)))
            .or_else(|| profile.map(|p| (p.url.clone(), Source::Profile)))
            .ok_or(TargetError::NoUrl)?;
        let mcp_url = server_url(&raw).map_err(|why| TargetError::BadUrl {
            from: url_from,
            url: raw.clone(),
            why,
        })?;
        let own = profile.filter(|p| same_server(&p.url, &mcp_url));
        let (token, token_from, name) = if let Some(t) = var(env, "PHONE_TOKEN") {
            (Some(Secret::new(t)), Some(Source::Env), None)
        } else if let Some(p) = own {
            (
                Some(p.token.clone()),
                Some(Source::Profile),
                Some(p.name.clone()),
            )
        } else if let Some(t) = var(env, "CLAUDE_PLUGIN_OPTION_TOKEN") {
            (Some(Secret::new(t)), Some(Source::PluginOption), None)
        } else {
            (None, None, None)
        };
        Ok(Self {
            mcp_url,
            url_from,
            token,
            token_from,
            name,
        })
    }

    /// The token, or why there is none or it cannot be one.
    pub fn token(&self) -> Result<&Secret, TargetError> {
        let token = self
            .token
            .as_ref()
            .ok_or_else(|| TargetError::NoToken(self.mcp_url.clone()))?;
        if !token.expose().bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TargetError::BadToken(
                self.token_from.unwrap_or(Source::Env),
            ));
        }
        Ok(token)
    }
}

/// The MCP endpoint of a server given by its root or by its endpoint.
pub fn server_url(raw: &str) -> Result<String, String> {
    let mut url = url::Url::parse(raw.trim()).map_err(|e| e.to_string())?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("it must be http or https".into());
    }
    if url.host().is_none() {
        return Err("it names no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it must not carry a user or password (the token travels in a header)".into());
    }
    if url.path() == "/" || url.path().is_empty() {
        url.set_path("/mcp");
    }
    Ok(url.to_string())
}

/// Whether two URLs name the same server endpoint.
pub fn same_server(a: &str, b: &str) -> bool {
    matches!((server_url(a), server_url(b)), (Ok(a), Ok(b)) if a == b)
}

/// A warning when `url` is plain http to a host that is not this machine:
/// the token would travel in clear.
pub fn cleartext_warning(url: &str) -> Option<String> {
    let parsed = url::Url::parse(url).ok()?;
    if parsed.scheme() != "http" {
        return None;
    }
    let loopback = match parsed.host()? {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => IpAddr::V4(ip).is_loopback(),
        url::Host::Ipv6(ip) => IpAddr::V6(ip).is_loopback(),
    };
    (!loopback).then(|| {
        format!(
            "warning: {url} is plain http to a host that is not this machine: the agent's token and its mail travel unencrypted; use https"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn profile(url: &str) -> Profile {
        Profile {
            url: url.into(),
            name: "bob".into(),
            token: Secret::new("phn_profile"),
        }
    }

    #[test]
    fn the_url_may_name_the_server_or_its_endpoint() {
        assert_eq!(
            server_url("https://p.example.com").unwrap(),
            "https://p.example.com/mcp"
        );
        assert_eq!(
            server_url("https://p.example.com/mcp").unwrap(),
            "https://p.example.com/mcp"
        );
        assert!(server_url("ftp://p.example.com").is_err());
        assert!(server_url("not a url").is_err());
        assert!(server_url("https://bob:pw@p.example.com").is_err());
        assert!(same_server(
            "https://p.example.com/",
            "https://p.example.com/mcp"
        ));
        assert!(!same_server(
            "https://p.example.com",
            "https://q.example.com"
        ));
    }

    #[test]
    fn the_environment_wins_then_the_plugin_url_then_the_profile() {
        let p = profile("https://p.example.com");
        let t = Target::resolve(&env(&[]), None, Some(&p)).unwrap();
        assert_eq!(
            (t.url_from, t.token_from, t.name.as_deref()),
            (Source::Profile, Some(Source::Profile), Some("bob"))
        );
        let e = env(&[
            ("PHONE_URL", "https://e.example.com"),
            ("PHONE_TOKEN", "phn_env"),
        ]);
        let t = Target::resolve(&e, None, Some(&p)).unwrap();
        assert_eq!(t.mcp_url, "https://e.example.com/mcp");
        assert_eq!(t.token.unwrap().expose(), "phn_env");
        let plugin = env(&[
            ("CLAUDE_PLUGIN_OPTION_URL", "https://p.example.com/mcp"),
            ("CLAUDE_PLUGIN_OPTION_TOKEN", "phn_option"),
        ]);
        let t = Target::resolve(&plugin, None, Some(&p)).unwrap();
        assert_eq!(t.url_from, Source::PluginOption);
        assert_eq!(t.token.unwrap().expose(), "phn_profile", "same server");
        let t = Target::resolve(&plugin, Some("http://127.0.0.1:9"), None).unwrap();
        assert_eq!(t.url_from, Source::Flag);
    }

    #[test]
    fn a_token_that_cannot_go_in_a_header_is_refused_before_any_call() {
        const URL: &str = "https://p.example.com";
        for bad in [
            &[("PHONE_URL", URL), ("PHONE_TOKEN", "phn_a\r\nX-Evil: 1")],
            &[("PHONE_URL", URL), ("PHONE_TOKEN", "phn_a b")],
            &[("PHONE_URL", URL), ("PHONE_TOKEN", "phn_\u{e9}")],
        ] {
            let t = Target::resolve(&env(bad), None, None).unwrap();
            let err = t.token().unwrap_err();
            assert!(
                matches!(err, TargetError::BadToken(Source::Env)),
                "{bad:?}: {err}"
            );
        }
        let t = Target::resolve(
            &env(&[
                ("PHONE_URL", "https://p.example.com"),
                ("PHONE_TOKEN", "phn_A-b_9"),
            ]),
            None,
            None,
        )
        .unwrap();
        assert_eq!(t.token().unwrap().expose(), "phn_A-b_9");
    }

    #[test]
    fn a_profile_token_is_never_sent_to_another_server() {
        let p = profile("https://p.example.com");
        let other = env(&[("PHONE_URL", "https://evil.example.com")]);
        let t = Target::resolve(&other, None, Some(&p)).unwrap();
        assert!(t.token.is_none());
        assert!(t.token().unwrap_err().to_string().contains("PHONE_TOKEN"));
        let with_option = env(&[
            ("CLAUDE_PLUGIN_OPTION_URL", "https://evil.example.com"),
            ("CLAUDE_PLUGIN_OPTION_TOKEN", "phn_option"),
        ]);
        let t = Target::resolve(&with_option, None, Some(&p)).unwrap();
        assert_eq!(t.token.unwrap().expose(), "phn_option");
    }

    #[test]
    fn missing_or_bad_urls_say_what_to_set() {
        let err = Target::resolve(&env(&[]), None, None).unwrap_err();
        assert!(err.to_string().contains("PHONE_URL is not set"), "{err}");
        let err = Target::resolve(&env(&[("PHONE_URL", "ftp://x")]), None, None).unwrap_err();
        assert!(err.to_string().contains("http or https"), "{err}");
    }

    #[test]
    fn plain_http_is_fine_on_this_machine_only() {
        for quiet in [
            "http://127.0.0.1:3000/mcp",
            "http://127.8.9.1/mcp",
            "http://localhost:3000/mcp",
            "http://[::1]:3000/mcp",
            "https://phone.example.com/mcp",
        ] {
            assert_eq!(cleartext_warning(quiet), None, "{quiet}");
        }
        for loud in [
            "http://phone.example.com/mcp",
            "http://10.0.0.5:3000/mcp",
            "http://0.0.0.0:3000/mcp",
            "http://[2001:db8::1]/mcp",
        ] {
            assert!(
                cleartext_warning(loud).is_some_and(|w| w.contains("unencrypted")),
                "{loud}"
            );
        }
    }
}
