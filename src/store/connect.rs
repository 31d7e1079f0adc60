//! Opening a connection: every host of `DATABASE_URL` in turn, each within
//! its connect timeout, until one accepts (and, unless told otherwise, takes
//! writes: `database_url.rs`).
//!
//! tokio-postgres tries several hosts itself, but bounds only each TCP
//! connect: a host that accepts and then says nothing (a frozen server, a
//! proxy in front of a dead one) would hold every attempt, and the hosts
//! after it would never be tried. Here the whole attempt on one host (TCP,
//! TLS, authentication, the read-write check) has the connect timeout, and
//! the next attempt begins at the host that last worked, so after a failover
//! only the first connection pays for finding the new primary.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use tokio_postgres::{
    Client, Config, Connection, Socket,
    config::{Host, LoadBalanceHosts},
    tls::MakeTlsConnect,
};

use super::{StoreError, tls::Tls};

/// A connection's socket-and-protocol half, to be driven by a task.
pub type Driver = Connection<Socket, <Tls as MakeTlsConnect<Socket>>::Stream>;

/// Opens connections to whichever host of the configuration answers first.
pub struct Connector {
    /// One configuration per host, in the order given.
    hosts: Vec<Config>,
    tls: Tls,
    per_host: Duration,
    /// Where the next attempt begins: the host that last worked, or the one
    /// after a host whose attempt was cut short.
    next: AtomicUsize,
    random: bool,
}

/// Without a `connect_timeout`, one host may take this long.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl Connector {
    pub fn new(config: &Config, tls: Tls) -> Result<Self, StoreError> {
        Ok(Self {
            hosts: one_per_host(config)?,
            tls,
            per_host: config
                .get_connect_timeout()
                .copied()
                .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
            next: AtomicUsize::new(0),
            random: config.get_load_balance_hosts() == LoadBalanceHosts::Random,
        })
    }

    /// How long one attempt on every host may take.
    pub fn budget(&self) -> Duration {
        self.per_host * self.hosts.len() as u32
    }

    /// A connection to the first host that accepts one. The last host tried
    /// is not bounded here: callers bound the whole (the pool's create
    /// timeout, [`Self::budget`]), and its error is the one reported.
    pub async fn connect(&self) -> Result<(Client, Driver), tokio_postgres::Error> {
        let n = self.hosts.len();
        let start = if self.random {
            rand::random_range(0..n)
        } else {
            self.next.load(Ordering::Relaxed) % n
        };
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            // Should the caller give up during this host, its next attempt
            // begins with the one after.
            self.next.store((i + 1) % n, Ordering::Relaxed);
            let attempt = self.hosts[i].connect(self.tls.clone());
            let outcome = if k + 1 < n {
                match tokio::time::timeout(self.per_host, attempt).await {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        tracing::warn!(
                            host = i + 1,
                            timeout_ms = self.per_host.as_millis() as u64,
                            "PostgreSQL host did not complete a connection in time; trying the next"
                        );
                        continue;
                    }
                }
            } else {
                attempt.await
            };
            match outcome {
                Ok(connected) => {
                    self.next.store(i, Ordering::Relaxed);
                    return Ok(connected);
                }
                Err(e) => {
                    if n > 1 {
                        tracing::debug!(host = i + 1, error = %crate::telemetry::error_chain(&e), "PostgreSQL host refused");
                    }
                    last = Some(e);
                }
            }
        }
        // The last host always runs to an outcome, so there is one.
        Err(last.expect("the last host's outcome"))
    }
}

impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        _: &Config,
    ) -> std::pin::Pin<
        Box<
            dyn Future<
                    Output = Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
                > + Send
                + '_,
        >,
    > {
        Box::pin(async move {
            let (client, connection) = Connector::connect(self).await?;
            let driver = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %super::error::describe(&e), "pooled connection ended");
                }
            });
            Ok((client, driver))
        })
    }
}

/// `config` as one configuration per host (with its address and port), the
/// rest copied: tokio-postgres' own rules for pairing hosts, addresses and
/// ports, checked once at startup.
fn one_per_host(config: &Config) -> Result<Vec<Config>, StoreError> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let n = hosts.len().max(addrs.len());
    let bad = |reason: String| StoreError::Config(format!("DATABASE_URL: {reason}"));
    if n == 0 {
        return Err(bad("names no host".into()));
    }
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return Err(bad(format!(
            "{} hosts but {} hostaddrs",
            hosts.len(),
            addrs.len()
        )));
    }
    if ports.len() > 1 && ports.len() != n {
        return Err(bad(format!(
            "{} ports for {n} hosts (give one port for all, or one per host)",
            ports.len()
        )));
    }
    Ok((0..n)
        .map(|i| {
            let mut one = copy_all_but_hosts(config);
            match hosts.get(i) {
                Some(Host::Tcp(host)) => {
                    one.host(host);
                }
                #[cfg(unix)]
                Some(Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addrs.get(i) {
                one.hostaddr(*addr);
            }
            if let Some(port) = ports.get(i).or(ports.first()) {
                one.port(*port);
            }
            one
        })
        .collect())
}

fn copy_all_but_hosts(from: &Config) -> Config {
    let mut to = Config::new();
    if let Some(v) = from.get_user() {
        to.user(v);
    }
    if let Some(v) = from.get_password() {
        to.password(v);
    }
    if let Some(v) = from.get_dbname() {
        to.dbname(v);
    }
    if let Some(v) = from.get_options() {
        to.options(v);
    }
    if let Some(v) = from.get_application_name() {
        to.application_name(v);
    }
    if let Some(v) = from.get_connect_timeout() {
        to.connect_timeout(*v);
    }
    if let Some(v) = from.get_tcp_user_timeout() {
        to.tcp_user_timeout(*v);
    }
    if let Some(v) = from.get_keepalives_interval() {
        to.keepalives_interval(v);
    }
    if let Some(v) = from.get_keepalives_retries() {
        to.keepalives_retries(v);
    }
    to.ssl_mode(from.get_ssl_mode())
        .ssl_negotiation(from.get_ssl_negotiation())
        .keepalives(from.get_keepalives())
        .keepalives_idle(from.get_keepalives_idle())
        .target_session_attrs(from.get_target_session_attrs())
        .channel_binding(from.get_channel_binding())
        .load_balance_hosts(from.get_load_balance_hosts());
    to
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single host's configuration comes out unchanged: nothing the
    /// string said is lost on the way (Config compares every field).
    #[test]
    fn one_host_is_copied_whole() {
        for s in [
            "postgres://u:p@db.example:6432/phone?application_name=x&connect_timeout=3&keepalives_idle=7&sslmode=require&target_session_attrs=read-write&channel_binding=require&options=-c%20jit%3Doff",
            "host=/var/run/postgresql user=u dbname=d keepalives=0 tcp_user_timeout=9 keepalives_interval=2 keepalives_retries=4",
            "hostaddr=127.0.0.1 port=5433 user=u",
        ] {
            let config: Config = s.parse().unwrap();
            assert_eq!(one_per_host(&config).unwrap(), [config], "{s}");
        }
    }

    #[test]
    fn each_host_gets_its_port() {
        let config: Config = "postgres://u@a:1,b:2,c:3/db".parse().unwrap();
        let hosts = one_per_host(&config).unwrap();
        let ports: Vec<&[u16]> = hosts.iter().map(|c| c.get_ports()).collect();
        assert_eq!(ports, [&[1u16][..], &[2], &[3]]);
        let config: Config = "host=a,b port=7 user=u".parse().unwrap();
        for one in one_per_host(&config).unwrap() {
            assert_eq!(one.get_ports(), [7]);
        }
        let config: Config = "host=a,b,c port=1,2 user=u".parse().unwrap();
        let e = one_per_host(&config).unwrap_err().to_string();
        assert!(e.contains("2 ports for 3 hosts"), "{e}");
    }

    /// A host that accepts the TCP connection and then never answers (a
    /// frozen server, a proxy in front of a dead one) costs one connect
    /// timeout, then the next host is tried; the next attempt begins at
    /// the host that worked.
    #[tokio::test]
    async fn a_silent_host_is_passed_over() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refusing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (silent_port, refusing_port) = (
            silent.local_addr().unwrap().port(),
            refusing.local_addr().unwrap().port(),
        );
        drop(refusing);
        // Accepts and holds every connection, answering nothing.
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                open.push(socket);
            }
        });
        let config: Config = format!(
            "postgres://u@127.0.0.1:{silent_port},127.0.0.1:{refusing_port}/db?connect_timeout=1&sslmode=disable"
        )
        .parse()
        .unwrap();
        let connector = Connector::new(
            &config,
            Tls::new(super::super::tls::SslMode::Disable, None).unwrap(),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let e = connector.connect().await.err().expect("nothing to reach");
        let took = started.elapsed();
        // The error is the last host's (refused), reached after one timeout.
        assert!(
            crate::telemetry::error_chain(&e).contains("refused"),
            "{}",
            crate::telemetry::error_chain(&e)
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(3),
            "{took:?}"
        );
        held.abort();
    }
}
