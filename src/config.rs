//! Configuration from the environment, parsed once at startup into each
//! layer's own settings (`store::Settings`, `http::Settings`, …), which
//! `startup` hands to them. No other module reads the environment's names.

use std::{net::IpAddr, time::Duration};

use crate::{
    console,
    domain::{
        console::OperatorKey,
        messages::{
            MAX_DELIVERIES_DEFAULT, MAX_DELIVERIES_MAX, MailRules, STALE_AFTER_DAYS_DEFAULT,
            WAIT_SECONDS_MAX,
        },
    },
    http, store, webhooks,
};

pub use crate::telemetry::LogFormat;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set; point it at PostgreSQL, e.g. postgres://user@127.0.0.1:5432/phone")]
    Missing(&'static str),
    #[error("{name}={value:?} is invalid: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
}

#[derive(Debug, Clone)]
pub struct Config {
    /// PostgreSQL: URL, pool size and timeouts.
    pub store: store::Settings,
    /// The router: hosts and origins, body limit, request timeout, where
    /// client addresses come from.
    pub http: http::Settings,
    /// Open connections and the header-read / keep-alive idle timeout.
    pub connections: http::serve::ConnectionLimits,
    pub bind_address: IpAddr,
    pub port: u16,
    pub shutdown_grace: Duration,
    pub log_filter: String,
    pub log_format: LogFormat,
    /// Failed authentications allowed per client address and per agent name
    /// in a 5-minute window (0: unlimited).
    pub auth_failure_limit: u32,
    /// New registrations allowed per client address per hour (0: unlimited).
    pub register_limit: u32,
    /// Mail settings: the longest wait, how often a lease goes out.
    pub mail: MailRules,
    /// Messages older than this many days are deleted (0: kept forever).
    pub retention_days: u32,
    /// Limits on sending (0: off), shared by every replica.
    pub quotas: store::Quotas,
    /// How webhooks are delivered.
    pub webhooks: webhooks::Settings,
    /// Name servers for webhook hosts (`PHONE_DNS_SERVERS`; empty: the
    /// system's), and how long one query may take.
    pub dns_servers: Vec<std::net::SocketAddr>,
    pub dns_timeout: Duration,
    /// The async runtime's worker threads (`PHONE_WORKER_THREADS`; `None`:
    /// tokio's default): read before the runtime starts
    /// (`worker_threads_from_env`), kept here so that `serve` refuses an
    /// invalid value like any other setting.
    pub worker_threads: Option<usize>,
    /// What the operator should hear at startup (a likely mistake that is
    /// not an error).
    pub warnings: Vec<String>,
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    /// Parses from any key lookup, so tests can build a configuration without
    /// touching the process environment.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let database_url = get("DATABASE_URL")
            .filter(|v| !v.trim().is_empty())
            .ok_or(ConfigError::Missing("DATABASE_URL"))?;
        // libpq's two forms: a URL, or `host=… port=… dbname=…` (checked
        // in full, hosts and options, by `store` at startup).
        let url =
            database_url.starts_with("postgres://") || database_url.starts_with("postgresql://");
        if !url && (database_url.contains("://") || !database_url.contains('=')) {
            return Err(ConfigError::Invalid {
                name: "DATABASE_URL",
                value: "<hidden>".into(),
                reason:
                    "must be a postgres:// (or postgresql://) URL, or a key=value connection string"
                        .into(),
            });
        }

        let mut allowed_hosts = list(get("PHONE_ALLOWED_HOSTS"));
        // Railway publishes the service's public hostname here.
        if let Some(domain) = get("RAILWAY_PUBLIC_DOMAIN").filter(|d| !d.is_empty()) {
            allowed_hosts.push(domain);
        }
        let allowed_origins = list(get("PHONE_ALLOWED_ORIGINS"));
        for origin in &allowed_origins {
            if !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(ConfigError::Invalid {
                    name: "PHONE_ALLOWED_ORIGINS",
                    value: origin.clone(),
                    reason: "each origin needs a scheme, e.g. https://app.example.com".into(),
                });
            }
        }

        let log_format = match get("PHONE_LOG_FORMAT").as_deref() {
            None | Some("") | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: "PHONE_LOG_FORMAT",
                    value: other.into(),
                    reason: "expected text or json".into(),
                });
            }
        };

        let request_timeout =
            Duration::from_millis(parse(&get, "PHONE_REQUEST_TIMEOUT_MS", 30_000)?);
        // Kept below the request timeout, so a stuck statement frees its
        // connection and the caller gets a retryable error.
        let statement_timeout =
            Duration::from_millis(parse(&get, "PHONE_STATEMENT_TIMEOUT_MS", 10_000)?)
                .min(request_timeout.saturating_sub(Duration::from_millis(500)))
                .max(Duration::from_millis(100));
        let pool_timeout = Duration::from_millis(parse(&get, "PHONE_POOL_TIMEOUT_MS", 2000)?);
        let max_wait_secs = bounded(
            parse(&get, "PHONE_MAX_WAIT_SECS", WAIT_SECONDS_MAX as usize)?,
            "PHONE_MAX_WAIT_SECS",
            0,
            WAIT_SECONDS_MAX as usize,
        )? as u32;
        // A long poll's wait ends this long before its request times out,
        // for its last look and the answer's way out. (Should the last look
        // run over, the request times out and what it took goes back.)
        let last_look = Duration::from_millis(LAST_LOOK_MS);
        let longest = Duration::from_secs(max_wait_secs.into()) + last_look;
        if longest > request_timeout {
            return Err(ConfigError::Invalid {
                name: "PHONE_REQUEST_TIMEOUT_MS",
                value: request_timeout.as_millis().to_string(),
                reason: format!(
                    "cannot fit the longest phone_inbox wait: PHONE_MAX_WAIT_SECS={max_wait_secs} \
                     plus {LAST_LOOK_MS} ms for its last look is {} ms; \
                     raise PHONE_REQUEST_TIMEOUT_MS or lower PHONE_MAX_WAIT_SECS",
                    longest.as_millis()
                ),
            });
        }
        let client_address_from = client_address_from(&get)?;
        let console = console_settings(&get)?;
        let mut warnings = Vec::new();
        let on_railway = RAILWAY_VARIABLES
            .iter()
            .any(|v| get(v).is_some_and(|v| !v.trim().is_empty()));
        if on_railway && client_address_from == http::ClientAddressFrom::Peer {
            warnings.push(
                "running on Railway with PHONE_CLIENT_IP_HEADER=none: every client shares the edge's \
                 address, and so its rate limits (one stranger's bad tokens lock everyone out)"
                    .to_owned(),
            );
        }
        Ok(Self {
            store: store::Settings {
                database_url,
                pool_size: bounded(
                    parse(&get, "PHONE_POOL_SIZE", 10)?,
                    "PHONE_POOL_SIZE",
                    1,
                    1000,
                )?,
                pool_timeout,
                statement_timeout,
                connect_wait: Duration::from_secs(bounded(
                    parse(&get, "PHONE_DB_WAIT_SECS", 60)?,
                    "PHONE_DB_WAIT_SECS",
                    0,
                    3600,
                )? as u64),
                migration_timeout: Duration::from_secs(bounded(
                    parse(&get, "PHONE_MIGRATION_TIMEOUT_SECS", 300)?,
                    "PHONE_MIGRATION_TIMEOUT_SECS",
                    1,
                    86_400,
                )? as u64),
                require_sync_standby: parse(&get, "PHONE_REQUIRE_SYNC_STANDBY", false)?,
            },
            http: http::Settings {
                allowed_hosts,
                allowed_origins,
                max_body_bytes: bounded(
                    parse(&get, "PHONE_MAX_BODY_BYTES", 256 * 1024)?,
                    "PHONE_MAX_BODY_BYTES",
                    4096,
                    16 * 1024 * 1024,
                )?,
                request_timeout,
                answer_within: request_timeout.saturating_sub(last_look),
                client_address_from,
                console,
            },
            connections: http::serve::ConnectionLimits {
                max_connections: bounded(
                    parse(&get, "PHONE_MAX_CONNECTIONS", 1024)?,
                    "PHONE_MAX_CONNECTIONS",
                    1,
                    1_000_000,
                )?,
                idle_timeout: Duration::from_secs(bounded(
                    parse(&get, "PHONE_IDLE_TIMEOUT_SECS", 65)?,
                    "PHONE_IDLE_TIMEOUT_SECS",
                    1,
                    3600,
                )? as u64),
            },
            bind_address: parse(&get, "PHONE_BIND", IpAddr::from([0, 0, 0, 0]))?,
            port: parse(&get, "PORT", 3000)?,
            shutdown_grace: Duration::from_secs(parse(&get, "PHONE_SHUTDOWN_GRACE_SECS", 20)?),
            log_filter: get("RUST_LOG")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "info".into()),
            log_format,
            auth_failure_limit: parse(&get, "PHONE_AUTH_FAILURE_LIMIT", 20)?,
            register_limit: parse(&get, "PHONE_REGISTER_LIMIT", 60)?,
            mail: MailRules {
                max_wait_secs,
                max_deliveries: bounded(
                    parse(
                        &get,
                        "PHONE_MAX_DELIVERIES",
                        MAX_DELIVERIES_DEFAULT as usize,
                    )?,
                    "PHONE_MAX_DELIVERIES",
                    1,
                    MAX_DELIVERIES_MAX as usize,
                )? as u32,
                webhooks_allow_private: parse(&get, "PHONE_WEBHOOK_ALLOW_PRIVATE", false)?,
                stale_after_days: bounded(
                    parse(
                        &get,
                        "PHONE_STALE_AFTER_DAYS",
                        STALE_AFTER_DAYS_DEFAULT as usize,
                    )?,
                    "PHONE_STALE_AFTER_DAYS",
                    0,
                    36_500,
                )? as u32,
            },
            retention_days: bounded(
                parse(&get, "PHONE_RETENTION_DAYS", 0)?,
                "PHONE_RETENTION_DAYS",
                0,
                36_500,
            )? as u32,
            quotas: store::Quotas {
                sends_per_hour: quota(&get, "PHONE_SEND_QUOTA_PER_HOUR", 1_000)?,
                new_recipients_per_day: quota(&get, "PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", 100)?,
                unread_max: quota(&get, "PHONE_INBOX_UNREAD_MAX", 10_000)?,
                unread_per_sender: quota(&get, "PHONE_INBOX_UNREAD_PER_SENDER", 500)?,
                webhook_backlog: quota(&get, "PHONE_WEBHOOK_BACKLOG_MAX", 100)?.max(1),
            },
            webhooks: webhooks::Settings {
                timeout: Duration::from_secs(bounded(
                    parse(&get, "PHONE_WEBHOOK_TIMEOUT_SECS", 10)?,
                    "PHONE_WEBHOOK_TIMEOUT_SECS",
                    1,
                    60,
                )? as u64),
                allow_private: parse(&get, "PHONE_WEBHOOK_ALLOW_PRIVATE", false)?,
                first_backoff: Duration::from_millis(bounded(
                    parse(&get, "PHONE_WEBHOOK_FIRST_RETRY_MS", 5000)?,
                    "PHONE_WEBHOOK_FIRST_RETRY_MS",
                    10,
                    3_600_000,
                )? as u64),
                give_up_after: Duration::from_secs(bounded(
                    parse(&get, "PHONE_WEBHOOK_GIVE_UP_SECS", 24 * 3600)?,
                    "PHONE_WEBHOOK_GIVE_UP_SECS",
                    1,
                    7 * 24 * 3600,
                )? as u64),
                ..webhooks::Settings::default()
            },
            dns_servers: dns_servers(get("PHONE_DNS_SERVERS"))?,
            dns_timeout: Duration::from_millis(bounded(
                parse(&get, "PHONE_DNS_TIMEOUT_MS", 2000)?,
                "PHONE_DNS_TIMEOUT_MS",
                10,
                30_000,
            )? as u64),
            worker_threads: worker_threads(&get)?,
            warnings,
        })
    }
}

/// The async runtime's worker threads, `PHONE_WORKER_THREADS` (1-1024);
/// `None` when unset: tokio's default then, one per core (or its own
/// `TOKIO_WORKER_THREADS`). Where the server shares its cores with
/// PostgreSQL, fewer workers serve more: spare ones cost CPU waking,
/// parking and stealing work, taken from the database. On two shared cores
/// one worker served 11-26% more calls than two, with a quarter less CPU
/// per call (bench/RESULTS.md, seventh session). But one worker also means
/// one long response stalls every other request of the replica, so the
/// default stays every core.
pub fn worker_threads(get: &impl Fn(&str) -> Option<String>) -> Result<Option<usize>, ConfigError> {
    if get("PHONE_WORKER_THREADS").is_none_or(|v| v.trim().is_empty()) {
        return Ok(None);
    }
    let n = parse(get, "PHONE_WORKER_THREADS", 0)?;
    bounded(n, "PHONE_WORKER_THREADS", 1, 1024).map(Some)
}

/// [`worker_threads`] from the process environment, for `main` (which
/// builds the runtime before any subcommand runs).
pub fn worker_threads_from_env() -> Result<Option<usize>, ConfigError> {
    worker_threads(&|key: &str| std::env::var(key).ok())
}

/// `PHONE_CONSOLE_ADMIN_TOKEN` (the operator overview; off when unset) and
/// `PHONE_CONSOLE_SESSION_HOURS` (how long a console sign-in lasts).
fn console_settings(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<console::Settings, ConfigError> {
    let operator_key = match get("PHONE_CONSOLE_ADMIN_TOKEN").filter(|t| !t.trim().is_empty()) {
        None => None,
        Some(token) => {
            Some(
                OperatorKey::from_token(&token).map_err(|reason| ConfigError::Invalid {
                    name: "PHONE_CONSOLE_ADMIN_TOKEN",
                    value: "<hidden>".into(),
                    reason,
                })?,
            )
        }
    };
    let hours = bounded(
        parse(get, "PHONE_CONSOLE_SESSION_HOURS", 12)?,
        "PHONE_CONSOLE_SESSION_HOURS",
        1,
        24 * 30,
    )?;
    Ok(console::Settings {
        operator_key,
        session_ttl: Duration::from_secs(hours as u64 * 3600),
    })
}

/// The variables Railway sets in every deployment.
const RAILWAY_VARIABLES: [&str; 4] = [
    "RAILWAY_ENVIRONMENT",
    "RAILWAY_PROJECT_ID",
    "RAILWAY_SERVICE_ID",
    "RAILWAY_PUBLIC_DOMAIN",
];

/// Where client addresses come from: `PHONE_CLIENT_IP_HEADER` (a header
/// name, or `none` for the TCP peer), else `PHONE_TRUST_FORWARDED_FOR`,
/// else on Railway the `X-Real-IP` its edge sets, else the TCP peer.
fn client_address_from(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<http::ClientAddressFrom, ConfigError> {
    let header = get("PHONE_CLIENT_IP_HEADER").filter(|v| !v.trim().is_empty());
    let forwarded: Option<bool> = get("PHONE_TRUST_FORWARDED_FOR")
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|e: std::str::ParseBoolError| ConfigError::Invalid {
                    name: "PHONE_TRUST_FORWARDED_FOR",
                    value: v.clone(),
                    reason: e.to_string(),
                })
        })
        .transpose()?;
    let on_railway = RAILWAY_VARIABLES
        .iter()
        .any(|v| get(v).is_some_and(|v| !v.trim().is_empty()));
    Ok(match (header, forwarded) {
        (Some(h), _) if h.trim().eq_ignore_ascii_case("none") => http::ClientAddressFrom::Peer,
        (Some(h), _) => http::ClientAddressFrom::Header(
            ::http::HeaderName::try_from(h.trim()).map_err(|e| ConfigError::Invalid {
                name: "PHONE_CLIENT_IP_HEADER",
                value: h.clone(),
                reason: e.to_string(),
            })?,
        ),
        (None, Some(true)) => http::ClientAddressFrom::ForwardedFor,
        (None, _) if on_railway => {
            http::ClientAddressFrom::Header(::http::HeaderName::from_static("x-real-ip"))
        }
        (None, _) => http::ClientAddressFrom::Peer,
    })
}

/// `PHONE_DNS_SERVERS`: name servers (`IP` or `IP:PORT`, comma-separated)
/// for webhook hosts, instead of the system's.
fn dns_servers(value: Option<String>) -> Result<Vec<std::net::SocketAddr>, ConfigError> {
    list(value)
        .into_iter()
        .map(|s| {
            s.parse::<std::net::SocketAddr>()
                .or_else(|_| {
                    s.parse::<IpAddr>()
                        .map(|ip| std::net::SocketAddr::new(ip, 53))
                })
                .map_err(|_| ConfigError::Invalid {
                    name: "PHONE_DNS_SERVERS",
                    value: s.clone(),
                    reason: "expected IP or IP:PORT, comma-separated".into(),
                })
        })
        .collect()
}

/// A quota: 0 (off) up to a million.
fn quota(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: usize,
) -> Result<i32, ConfigError> {
    Ok(bounded(parse(get, name, default)?, name, 0, 1_000_000)? as i32)
}

/// What a long poll keeps of its request's time for its last look.
const LAST_LOOK_MS: u64 = 2000;

fn list(value: Option<String>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse<T>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, ConfigError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match get(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(default),
        Some(value) => value
            .trim()
            .parse()
            .map_err(|e: T::Err| ConfigError::Invalid {
                name,
                reason: e.to_string(),
                value,
            }),
    }
}

fn bounded(value: usize, name: &'static str, min: usize, max: usize) -> Result<usize, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            name,
            value: value.to_string(),
            reason: format!("must be between {min} and {max}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
    }

    #[test]
    fn worker_threads_are_tokios_default_unless_set() {
        let url = ("DATABASE_URL", "postgres://x@h/db");
        assert_eq!(config(&[url]).unwrap().worker_threads, None);
        let unset = config(&[url, ("PHONE_WORKER_THREADS", " ")]).unwrap();
        assert_eq!(unset.worker_threads, None);
        let set = config(&[url, ("PHONE_WORKER_THREADS", "3")]).unwrap();
        assert_eq!(set.worker_threads, Some(3));
        for bad in ["0", "1025", "two"] {
            let err = config(&[url, ("PHONE_WORKER_THREADS", bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with("PHONE_WORKER_THREADS="),
                "{err}"
            );
        }
    }

    #[test]
    fn database_url_is_required() {
        assert!(matches!(
            config(&[]),
            Err(ConfigError::Missing("DATABASE_URL"))
        ));
    }

    #[test]
    fn defaults_and_railway_domain() {
        let c = config(&[
            ("DATABASE_URL", "postgres://x@127.0.0.1/db"),
            ("RAILWAY_PUBLIC_DOMAIN", "phone.up.railway.app"),
            ("PHONE_ALLOWED_HOSTS", "a.example, b.example"),
        ])
        .unwrap();
        assert_eq!(c.port, 3000);
        assert_eq!(
            c.http.allowed_hosts,
            ["a.example", "b.example", "phone.up.railway.app"]
        );
    }

    #[test]
    fn the_operator_token_must_be_long_and_is_never_echoed() {
        let base = ("DATABASE_URL", "postgres://x@h/db");
        assert!(config(&[base]).unwrap().http.console.operator_key.is_none());
        let err = config(&[base, ("PHONE_CONSOLE_ADMIN_TOKEN", "short-secret")]).unwrap_err();
        assert!(err.to_string().contains("too short"), "{err}");
        assert!(!err.to_string().contains("short-secret"), "{err}");
        let c = config(&[
            base,
            (
                "PHONE_CONSOLE_ADMIN_TOKEN",
                "a-long-enough-operator-token-1234",
            ),
        ])
        .unwrap();
        assert!(c.http.console.operator_key.is_some());
        assert!(!format!("{c:?}").contains("a-long-enough-operator-token-1234"));
    }

    #[test]
    fn bad_numbers_name_the_variable() {
        let err = config(&[("DATABASE_URL", "postgres://x@h/db"), ("PORT", "http")]).unwrap_err();
        assert!(
            err.to_string().starts_with("PORT=\"http\" is invalid"),
            "{err}"
        );
        let err = config(&[
            ("DATABASE_URL", "postgres://x@h/db"),
            ("PHONE_POOL_SIZE", "0"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("between 1 and 1000"), "{err}");
    }

    #[test]
    fn client_addresses_come_from_railways_header_by_default_there() {
        let url = ("DATABASE_URL", "postgres://x@h/db");
        let real_ip = http::ClientAddressFrom::Header(::http::HeaderName::from_static("x-real-ip"));
        let railway = ("RAILWAY_ENVIRONMENT", "production");
        assert_eq!(
            config(&[url]).unwrap().http.client_address_from,
            http::ClientAddressFrom::Peer
        );
        assert_eq!(
            config(&[url, railway]).unwrap().http.client_address_from,
            real_ip
        );
        assert_eq!(
            config(&[url, railway, ("PHONE_CLIENT_IP_HEADER", "none")])
                .unwrap()
                .http
                .client_address_from,
            http::ClientAddressFrom::Peer
        );
        assert_eq!(
            config(&[url, ("PHONE_TRUST_FORWARDED_FOR", "true")])
                .unwrap()
                .http
                .client_address_from,
            http::ClientAddressFrom::ForwardedFor
        );
        assert_eq!(
            config(&[url, ("PHONE_CLIENT_IP_HEADER", "CF-Connecting-IP")])
                .unwrap()
                .http
                .client_address_from,
            http::ClientAddressFrom::Header(::http::HeaderName::from_static("cf-connecting-ip"))
        );
    }

    #[test]
    fn a_request_timeout_too_short_for_the_longest_wait_is_refused() {
        let err = config(&[
            ("DATABASE_URL", "postgres://x@h/db"),
            ("PHONE_REQUEST_TIMEOUT_MS", "20000"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("PHONE_REQUEST_TIMEOUT_MS") && err.contains("PHONE_MAX_WAIT_SECS=25"),
            "{err}"
        );
        let fits = config(&[
            ("DATABASE_URL", "postgres://x@h/db"),
            ("PHONE_REQUEST_TIMEOUT_MS", "20000"),
            ("PHONE_MAX_WAIT_SECS", "18"),
        ])
        .unwrap();
        assert_eq!(fits.mail.max_wait_secs, 18);
        assert_eq!(fits.http.answer_within, Duration::from_secs(18));
    }
}
