//! Slow and idle clients over raw TCP: connections that send nothing, stop
//! after one request, never finish their headers, or trickle their body.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::{self, Replica};

#[derive(Debug, Clone, Copy)]
pub struct Counts {
    pub idle: usize,
    pub keepalive: usize,
    pub slow_headers: usize,
    pub slow_body: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Connects and sends nothing.
    Idle,
    /// One complete request (GET /health), then silence on a kept-alive connection.
    KeepAlive,
    /// A request line and a header that never ends, one byte every 500 ms.
    SlowHeaders,
    /// Complete headers announcing 400 bytes, then one body byte every 500 ms.
    SlowBody,
}

#[derive(Debug, Default, Clone)]
pub struct Group {
    pub opened: usize,
    /// Connections the server closed within the watch.
    pub closed: usize,
    /// Connections that got a 408.
    pub timed_out: usize,
    /// The longest any connection lasted before the server closed it.
    pub slowest_close: f64,
    pub statuses: Vec<u16>,
}

impl Group {
    fn describe(&self, name: &str, total: usize) -> String {
        let mut statuses = self.statuses.clone();
        statuses.sort_unstable();
        statuses.dedup();
        format!(
            "{name}: {}/{total} connected, {} closed by the server (slowest after {:.1} s), {} got 408, statuses seen {statuses:?}",
            self.opened, self.closed, self.slowest_close, self.timed_out
        )
    }
}

pub struct Attack {
    pub idle: Group,
    pub keepalive: Group,
    pub slow_headers: Group,
    pub slow_body: Group,
    counts: Counts,
    watch: Duration,
}

impl Attack {
    pub fn describe(&self) -> String {
        format!(
            "attack for {:.0} s:\n  {}\n  {}\n  {}\n  {}",
            self.watch.as_secs_f64(),
            self.idle.describe("idle", self.counts.idle),
            self.keepalive
                .describe("idle keep-alive", self.counts.keepalive),
            self.slow_headers
                .describe("slow headers", self.counts.slow_headers),
            self.slow_body.describe("slow body", self.counts.slow_body)
        )
    }

    pub fn summary(&self) -> String {
        let w = self.watch.as_secs_f64();
        format!(
            "slow bodies: {}/{} got 408 and were closed in ≤ {:.1} s; still open after {w:.0} s: idle {}/{}, keep-alive {}/{}, slow headers {}/{}",
            self.slow_body.timed_out,
            self.counts.slow_body,
            self.slow_body.slowest_close,
            self.idle.opened - self.idle.closed,
            self.counts.idle,
            self.keepalive.opened - self.keepalive.closed,
            self.counts.keepalive,
            self.slow_headers.opened - self.slow_headers.closed,
            self.counts.slow_headers
        )
    }
}

struct ConnResult {
    kind: Kind,
    connected: bool,
    closed_after: Option<f64>,
    statuses: Vec<u16>,
}

/// Opens all the connections at once and watches each for `watch`.
pub async fn attack(addr: SocketAddr, counts: Counts, watch: Duration) -> Attack {
    let mut tasks = Vec::new();
    let plan = [
        (Kind::Idle, counts.idle),
        (Kind::KeepAlive, counts.keepalive),
        (Kind::SlowHeaders, counts.slow_headers),
        (Kind::SlowBody, counts.slow_body),
    ];
    for (kind, n) in plan {
        for _ in 0..n {
            tasks.push(tokio::spawn(one(addr, kind, watch)));
        }
    }
    let mut out = Attack {
        idle: Group::default(),
        keepalive: Group::default(),
        slow_headers: Group::default(),
        slow_body: Group::default(),
        counts,
        watch,
    };
    for t in tasks {
        let r = t.await.expect("slow client task");
        let g = match r.kind {
            Kind::Idle => &mut out.idle,
            Kind::KeepAlive => &mut out.keepalive,
            Kind::SlowHeaders => &mut out.slow_headers,
            Kind::SlowBody => &mut out.slow_body,
        };
        if r.connected {
            g.opened += 1;
        }
        if let Some(t) = r.closed_after {
            g.closed += 1;
            g.slowest_close = g.slowest_close.max(t);
        }
        if r.statuses.contains(&408) {
            g.timed_out += 1;
        }
        g.statuses.extend(r.statuses);
    }
    out
}

async fn one(addr: SocketAddr, kind: Kind, watch: Duration) -> ConnResult {
    let mut result = ConnResult {
        kind,
        connected: false,
        closed_after: None,
        statuses: Vec::new(),
    };
    let t0 = Instant::now();
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(addr)).await
    else {
        return result;
    };
    result.connected = true;
    let host = format!("Host: {addr}\r\n");
    let opening: Vec<u8> = match kind {
        Kind::Idle => Vec::new(),
        Kind::KeepAlive => format!("GET /health HTTP/1.1\r\n{host}\r\n").into_bytes(),
        Kind::SlowHeaders => format!("POST /mcp HTTP/1.1\r\n{host}X-Slow: ").into_bytes(),
        Kind::SlowBody => format!(
            "POST /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Content-Length: 400\r\n\r\n{{\"jsonrpc\""
        )
        .into_bytes(),
    };
    if !opening.is_empty() && s.write_all(&opening).await.is_err() {
        result.closed_after = Some(t0.elapsed().as_secs_f64());
        return result;
    }
    let drip: &[u8] = match kind {
        Kind::SlowHeaders => b"a",
        Kind::SlowBody => b" ",
        _ => b"",
    };
    let deadline = tokio::time::Instant::from_std(t0 + watch);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut buf = vec![0u8; 4096];
    let mut seen = Vec::new();
    loop {
        tokio::select! {
            r = s.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    result.closed_after = Some(t0.elapsed().as_secs_f64());
                    break;
                }
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            },
            _ = tick.tick() => {
                if !drip.is_empty() {
                    // A write error shows as a close on the next read.
                    let _ = s.write_all(drip).await;
                }
            }
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    let text = String::from_utf8_lossy(&seen);
    result.statuses = text
        .match_indices("HTTP/1.1 ")
        .filter_map(|(i, _)| text.get(i + 9..i + 12).and_then(|c| c.parse().ok()))
        .collect();
    result
}

pub struct Exhaustion {
    pub limit: u32,
    pub attempted: usize,
    pub connected: usize,
    pub served_during: bool,
    pub during: String,
    pub served_after: bool,
    pub recovery: Option<f64>,
    pub accept_errors: usize,
}

impl Exhaustion {
    pub fn describe(&self) -> String {
        format!(
            "descriptor exhaustion (RLIMIT_NOFILE {}): {}/{} idle connections connected; a new client {} ({}); \
             after closing them: {} ({} 'accept error' lines in the log)",
            self.limit,
            self.connected,
            self.attempted,
            if self.served_during {
                "was served"
            } else {
                "was NOT served"
            },
            self.during,
            match (self.served_after, self.recovery) {
                (true, Some(t)) => format!("served again {t:.2} s later"),
                _ => "still not serving".into(),
            },
            self.accept_errors
        )
    }

    pub fn summary(&self) -> String {
        format!(
            "{} idle connections vs {} descriptors: a new client willing to wait 8 s was {} while they stayed open ({}); \
             served again {} after they closed",
            self.attempted,
            self.limit,
            if self.served_during {
                "served"
            } else {
                "not served"
            },
            self.during,
            self.recovery
                .map_or("never".into(), |t| format!("{t:.2} s"))
        )
    }

    pub fn recovery_text(&self) -> String {
        format!(
            "descriptor-exhausted replica serves again {} after the idle connections close",
            self.recovery
                .map_or("never".into(), |t| format!("{t:.2} s"))
        )
    }
}

/// Holds `n` idle connections open against a replica that may open `limit`
/// files, and checks whether anyone else is served meanwhile and afterwards.
pub async fn exhaust_descriptors(db: &str, limit: u32, n: usize) -> Exhaustion {
    // A connection cap below the descriptor limit and a short idle timeout:
    // settings a server without them ignores.
    let mut r = Replica::new(
        "fd-r0",
        db,
        &[
            ("PHONE_POOL_SIZE", "4"),
            ("PHONE_MAX_CONNECTIONS", "128"),
            ("PHONE_IDLE_TIMEOUT_SECS", "3"),
        ],
    )
    .with_nofile(limit);
    r.start().await;
    let mut held = Vec::new();
    for _ in 0..n {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(r.addr())).await
        {
            held.push(s);
        }
    }
    let connected = held.len();
    // Give the server time to accept what it can.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A new client that is willing to wait up to 8 s (longer than the idle
    // timeout given above, so a server that sheds idle connections serves it).
    let t = Instant::now();
    let status = reqwest::Client::builder()
        .timeout(Duration::from_secs(8))
        .build()
        .unwrap()
        .get(format!("{}/health", r.base()))
        .send()
        .await
        .ok()
        .map(|resp| resp.status().as_u16());
    let during = format!(
        "GET /health → {status:?} after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let served_during = status == Some(200);
    drop(held);
    let dropped = Instant::now();
    let mut recovery = None;
    while dropped.elapsed() < Duration::from_secs(10) {
        if harness::health(&r.base()).await == Some(200) {
            recovery = Some(dropped.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    r.stop(Duration::from_secs(5)).await;
    let accept_errors = std::fs::read_to_string(r.log_path())
        .map(|t| t.lines().filter(|l| l.contains("accept error")).count())
        .unwrap_or(0);
    Exhaustion {
        limit,
        attempted: n,
        connected,
        served_during,
        during,
        served_after: recovery.is_some(),
        recovery,
        accept_errors,
    }
}
