//! `DATABASE_URL` taken apart: libpq's two forms (`postgres://…` URLs and
//! `key=value` strings), with every host and port of a highly available
//! PostgreSQL (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`).
//!
//! tokio-postgres parses both forms and several hosts itself; what it
//! cannot express is taken out first: libpq's `verify-*` modes and
//! `sslrootcert` (TLS is ours, `tls.rs`), and the `target_session_attrs`
//! values only libpq knows. Every connection of phone writes, so unless the
//! string says otherwise each one must reach a server that takes writes
//! (`read-write`): after a failover the old primary, now a standby, is
//! skipped rather than connected to.

use std::path::PathBuf;

use tokio_postgres::config::TargetSessionAttrs;

use super::{
    StoreError,
    tls::{SslMode, Tls},
};

/// The connection settings and the TLS connector `database_url` asks for.
pub fn parse(database_url: &str) -> Result<(tokio_postgres::Config, Tls), StoreError> {
    let bad = |reason: String| StoreError::Config(format!("DATABASE_URL: {reason}"));
    let (rest, taken) = if is_url(database_url) {
        take_from_url(database_url)
    } else {
        take_from_keywords(database_url).map_err(bad)?
    };
    let mut mode = SslMode::Prefer;
    let mut root_cert: Option<PathBuf> = None;
    let mut target = TargetSessionAttrs::ReadWrite;
    for (key, value) in taken {
        match key.as_str() {
            "sslmode" => mode = ssl_mode(&value).map_err(bad)?,
            "sslrootcert" => root_cert = Some(PathBuf::from(value)),
            _ => target = session_attrs(&value).map_err(bad)?,
        }
    }
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e: tokio_postgres::Error| bad(crate::telemetry::error_chain(&e)))?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        return Err(bad("names no host".into()));
    }
    config.target_session_attrs(target);
    config.ssl_mode(match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    let tls = Tls::new(mode, root_cert.as_ref()).map_err(bad)?;
    Ok((config, tls))
}

/// Whether `s` is the URL form (else libpq's `key=value` form).
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The options handled here rather than by tokio-postgres.
const OURS: [&str; 3] = ["sslmode", "sslrootcert", "target_session_attrs"];

/// The URL without our options, and our options (decoded).
fn take_from_url(url: &str) -> (String, Vec<(String, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key);
        if OURS.contains(&key.as_str()) {
            taken.push((key, percent_decode(value)));
        } else {
            kept.push(pair);
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, taken)
}

/// `%XX` escapes decoded, as libpq reads URL parts (`+` stays `+`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `key=value` string without our options (re-quoted), and our options.
fn take_from_keywords(s: &str) -> Result<(String, Vec<(String, String)>), String> {
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for (key, value) in keywords(s)? {
        if OURS.contains(&key.as_str()) {
            taken.push((key, value));
        } else {
            let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
            kept.push(format!("{key}='{quoted}'"));
        }
    }
    Ok((kept.join(" "), taken))
}

/// libpq's `key = value` pairs, separated by whitespace; a value is bare
/// (up to whitespace) or single-quoted, `\` escaping the next character.
fn keywords(s: &str) -> Result<Vec<(String, String)>, String> {
    let malformed = || {
        "is neither a postgres:// URL nor a key=value connection string \
         (e.g. host=db1,db2 port=5432 dbname=phone user=phone)"
            .to_owned()
    };
    let mut pairs = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') || key.is_empty() {
            return Err(malformed());
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(format!("the value of {key} lacks its closing quote")),
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
    if pairs.is_empty() {
        return Err(malformed());
    }
    Ok(pairs)
}

fn ssl_mode(value: &str) -> Result<SslMode, String> {
    Ok(match value {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ));
        }
    })
}

/// libpq's `target_session_attrs`, for a service whose every connection
/// writes: `read-write` (the default here) and `primary` (the same for
/// phone: a primary that refuses writes is of no use to it) skip servers
/// that do not take writes; `any` takes the first that answers. The
/// read-only targets could only ever fail.
fn session_attrs(value: &str) -> Result<TargetSessionAttrs, String> {
    match value {
        "read-write" | "primary" => Ok(TargetSessionAttrs::ReadWrite),
        "any" => Ok(TargetSessionAttrs::Any),
        "read-only" | "standby" | "prefer-standby" => Err(format!(
            "target_session_attrs={value}: phone writes on every connection, so it needs \
             read-write (the default), primary or any"
        )),
        other => Err(format!(
            "target_session_attrs={other:?} is not one of read-write, primary, any"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::{Host, SslMode as PgSslMode};

    fn ok(url: &str) -> tokio_postgres::Config {
        parse(url).unwrap_or_else(|e| panic!("{url}: {e}")).0
    }

    fn err(url: &str) -> String {
        parse(url).err().expect("an error").to_string()
    }

    fn hosts(config: &tokio_postgres::Config) -> Vec<String> {
        config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(h) => h.clone(),
                Host::Unix(p) => p.display().to_string(),
            })
            .collect()
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
        let config = ok("postgres://u:p@db.example:5433/phone?sslmode=require&application_name=x");
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);
        assert_eq!(config.get_dbname(), Some("phone"));
        assert_eq!(config.get_application_name(), Some("x"));
        assert!(
            err("postgres://u@h/db?sslmode=verify-everything")
                .contains("sslmode=\"verify-everything\" is not one of")
        );
        assert!(
            err("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem")
                .contains("sslrootcert=/nonexistent.pem")
        );
        assert_eq!(ok("postgres://u@h/db").get_ssl_mode(), PgSslMode::Prefer);
    }

    /// The form pg_auto_failover prints (`pg_autoctl show uri`) and every
    /// managed service with a standby documents: it used to stop startup
    /// with "invalid port number".
    #[test]
    fn several_hosts_and_ports_in_a_url() {
        let config = ok(
            "postgres://phone:secret@127.0.0.1:57001,127.0.0.1:57002/phone?target_session_attrs=read-write&sslmode=disable",
        );
        assert_eq!(hosts(&config), ["127.0.0.1", "127.0.0.1"]);
        assert_eq!(config.get_ports(), [57001, 57002]);
        assert_eq!(config.get_dbname(), Some("phone"));
        assert_eq!(config.get_password(), Some(&b"secret"[..]));
        assert_eq!(config.get_ssl_mode(), PgSslMode::Disable);
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        // Host names, one port for all, IPv6, TLS verified against a CA.
        let config = ok(
            "postgresql://u@db-a.internal,db-b.internal:6432/phone?connect_timeout=3&sslmode=require",
        );
        assert_eq!(hosts(&config), ["db-a.internal", "db-b.internal"]);
        // As libpq reads a URL: a host without a port has the default.
        assert_eq!(config.get_ports(), [5432, 6432]);
        assert_eq!(
            config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);
        let config = ok("postgres://u@[::1]:5432,[fd00::2]:5433/phone");
        assert_eq!(hosts(&config), ["::1", "fd00::2"]);
        assert_eq!(config.get_ports(), [5432, 5433]);
    }

    #[test]
    fn the_key_value_form() {
        let config = ok(
            "host=10.0.0.1,10.0.0.2 port=5432,5433 dbname=phone user=phone password='a \\'quoted\\' one' \
             target_session_attrs=primary sslmode=require connect_timeout=4",
        );
        assert_eq!(hosts(&config), ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(config.get_ports(), [5432, 5433]);
        assert_eq!(config.get_user(), Some("phone"));
        assert_eq!(config.get_password(), Some(&b"a 'quoted' one"[..]));
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        let config = ok("host = db.example dbname='my db' user=phone");
        assert_eq!(config.get_dbname(), Some("my db"));
        assert!(err("host=db.example dbname='phone").contains("closing quote"));
    }

    #[test]
    fn every_connection_must_take_writes_unless_told_otherwise() {
        assert_eq!(
            ok("postgres://u@h/db").get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            ok("postgres://u@h/db?target_session_attrs=any").get_target_session_attrs(),
            TargetSessionAttrs::Any
        );
        for standby in ["read-only", "standby", "prefer-standby"] {
            let e = err(&format!(
                "postgres://u@h1,h2/db?target_session_attrs={standby}"
            ));
            assert!(e.contains("phone writes on every connection"), "{e}");
        }
        assert!(err("postgres://u@h/db?target_session_attrs=writable").contains("is not one of"));
    }

    #[test]
    fn malformed_strings_are_refused_clearly() {
        let e = err("postgres://u@h1:5432,h2:port/db");
        assert!(e.contains("DATABASE_URL") && e.contains("port"), "{e}");
        let e = err("postgres://u@h/db?no_such_option=1");
        assert!(e.contains("no_such_option"), "{e}");
        let e = err("db.example:5432");
        assert!(
            e.contains("neither a postgres:// URL nor a key=value"),
            "{e}"
        );
        let e = err("dbname=phone user=phone");
        assert!(e.contains("names no host"), "{e}");
        // The password never shows in an error.
        let e = err("postgres://u:hunter2@h/db?sslmode=bogus");
        assert!(!e.contains("hunter2"), "{e}");
    }
}
