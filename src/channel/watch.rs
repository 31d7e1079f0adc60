//! Watching the agent's inbox on the phone server, and announcing what is
//! new.
//!
//! How it waits: a peek long poll (`phone_inbox {peek: true,
//! wait_seconds}`) returns at once while any unread mail exists, also mail
//! already announced, so it cannot wait for *new* mail once the agent has
//! some unread. Instead the channel holds a `subscriptions/listen` stream on
//! `phone://inbox` (protocol 2026-07-28): the server sends
//! `notifications/resources/updated` once the watch is in place and then
//! whenever mail arrives through any replica (a burst coalesces into one),
//! and the channel answers each with one peek (limit 100, marking nothing
//! read) and announces the ids it has not announced before. An idle agent
//! costs one open stream (re-opened every 4 minutes, when the server ends
//! it) and one peek a minute as a safety net for a lost wake-up.
//!
//! Failures: an unreachable, slow or confused server is retried with
//! exponential backoff (1 s up to 60 s); a token the server refuses (HTTP
//! 401 when connecting) ends the channel with a message on stderr, since
//! waiting cannot fix it.

use std::collections::BTreeSet;
use std::time::Duration;

use rmcp::model::{CustomNotification, ServerNotification, SubscriptionFilter};
use rmcp::service::{Peer, RoleServer};
use serde::Deserialize;
use serde_json::json;

use super::announce::{self, Brief};
use super::memory::Memory;
use super::server::NOTIFICATION;
use crate::remote::{Connection, Lifecycle, RemoteError, Target};

/// Unread messages one look sees (the server's most).
const PEEK_LIMIT: usize = 100;
/// A quiet stream still looks this often: a wake-up can be lost (a
/// replica's LISTEN connection reconnecting), mail cannot.
const SAFETY_LOOK: Duration = Duration::from_secs(60);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Opening the inbox watch may take this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Writing one notification to Claude Code may take this long.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// A stream that ends sooner than this counts as trouble (backoff), so a
/// server that ends every stream at once is not hammered.
const STREAM_MIN: Duration = Duration::from_secs(2);
/// At most this many notifications in [`PACE_WINDOW`]: mail arriving
/// faster (a chatty correspondent, a script) waits for the window to pass
/// and is then announced as one summary, not one wake-up per message.
const PACE_MAX: usize = 3;
const PACE_WINDOW: Duration = Duration::from_secs(5);

/// Why the channel stops.
#[derive(Debug)]
pub enum Stop {
    /// The server refused the token: its `WWW-Authenticate` challenge.
    TokenRefused(String),
    /// Claude Code went away (its end of stdout closed).
    ClientGone,
}

enum Ended {
    /// The server ended the stream as it does every few minutes.
    Gracefully,
    Trouble(String),
    Stop(Stop),
}

#[derive(Deserialize)]
struct InboxOut {
    messages: Vec<Brief>,
    unread_remaining: i64,
}

/// What was announced: the file shared by the agent's channels, or, when
/// there is no place for it, this process's own memory; and when.
struct Announced {
    file: Option<Memory>,
    here: BTreeSet<String>,
    /// When the latest notifications went out (at most [`PACE_MAX`]).
    sent: std::collections::VecDeque<tokio::time::Instant>,
}

impl Announced {
    /// When `n` more notifications may go out: now, or once enough of the
    /// recent ones are older than the window.
    fn allowed_at(&self, n: usize) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let recent: Vec<_> = self
            .sent
            .iter()
            .filter(|t| now.duration_since(**t) < PACE_WINDOW)
            .collect();
        if recent.len() + n <= PACE_MAX {
            now
        } else {
            // The oldest that must leave the window first.
            let must_leave = (recent.len() + n)
                .saturating_sub(PACE_MAX)
                .min(recent.len());
            match must_leave {
                0 => now,
                k => *recent[k - 1] + PACE_WINDOW,
            }
        }
    }
}

/// Notes a notification that went out now.
fn record(sent: &mut std::collections::VecDeque<tokio::time::Instant>) {
    sent.push_back(tokio::time::Instant::now());
    while sent.len() > PACE_MAX {
        sent.pop_front();
    }
}

/// Watches until the token is refused or Claude Code leaves.
pub async fn run(target: Target, memory: Option<Memory>, peer: Peer<RoleServer>) -> Stop {
    let mut announced = Announced {
        file: memory,
        here: BTreeSet::new(),
        sent: Default::default(),
    };
    let mut backoff = BACKOFF_FIRST;
    let mut healthy = true;
    loop {
        let started = tokio::time::Instant::now();
        let ended = session(&target, &mut announced, &peer).await;
        let ended = match ended {
            Ended::Gracefully if started.elapsed() < STREAM_MIN => {
                Ended::Trouble("the server ended the inbox subscription at once".into())
            }
            other => other,
        };
        match ended {
            Ended::Stop(stop) => return stop,
            Ended::Gracefully => {
                backoff = BACKOFF_FIRST;
                if !healthy {
                    eprintln!("phone channel: watching the inbox again");
                    healthy = true;
                }
            }
            Ended::Trouble(why) => {
                // Up to a fifth more, so that many channels do not retry in step.
                let jitter = backoff.mul_f64(rand::random::<f64>() * 0.2);
                let wait = backoff + jitter;
                eprintln!(
                    "phone channel: {why}; trying again in {:.1} s",
                    wait.as_secs_f64()
                );
                healthy = false;
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

async fn session(target: &Target, announced: &mut Announced, peer: &Peer<RoleServer>) -> Ended {
    let connection = match Connection::open(target, "phone-channel", Lifecycle::Modern).await {
        Ok(c) => c,
        Err(RemoteError::Unauthorized(challenge)) => {
            return Ended::Stop(Stop::TokenRefused(challenge));
        }
        Err(e) => return Ended::Trouble(e.to_string()),
    };
    let ended = listen(&connection, announced, peer).await;
    connection.close().await;
    ended
}

async fn listen(
    connection: &Connection,
    announced: &mut Announced,
    peer: &Peer<RoleServer>,
) -> Ended {
    let filter = SubscriptionFilter::builder()
        .resource_subscriptions(["phone://inbox"])
        .build();
    let listening = tokio::time::timeout(CALL_TIMEOUT, connection.client().listen(filter)).await;
    let mut stream = match listening {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Ended::Trouble(format!("cannot watch the inbox: {e}")),
        Err(_) => return Ended::Trouble("the server did not acknowledge the inbox watch".into()),
    };
    // Set when new mail waits for the pace window: look again then.
    let mut deferred: Option<tokio::time::Instant> = None;
    loop {
        // The first update comes once the server's watch is in place, and
        // covers mail that arrived while the channel was away.
        let wake = deferred.unwrap_or_else(|| tokio::time::Instant::now() + SAFETY_LOOK);
        let look_now = match tokio::time::timeout_at(wake, stream.next()).await {
            Err(_time) => true,
            Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(_)))) => deferred.is_none(),
            Ok(Ok(Some(_other))) => false,
            Ok(Ok(None)) => return Ended::Gracefully,
            Ok(Err(e)) => return Ended::Trouble(format!("the inbox subscription ended: {e}")),
        };
        if look_now {
            match look(connection, announced, peer).await {
                Ok(next) => deferred = next,
                Err(ended) => return ended,
            }
        }
    }
}

/// One peek; announces what was not announced before, or, when that
/// would be too many notifications too soon, returns when to look again.
async fn look(
    connection: &Connection,
    announced: &mut Announced,
    peer: &Peer<RoleServer>,
) -> Result<Option<tokio::time::Instant>, Ended> {
    // Held from before the peek until the announcements are out and
    // remembered: another channel of the same agent waits, then finds them
    // announced. Taken after the peek, a channel whose peek was older than
    // the other's announcement saved its own view over it, forgot what the
    // other announced, and announced it again on its next look.
    let locked = match &announced.file {
        Some(memory) => match memory.lock().await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!(
                    "phone channel: cannot use {} ({e}); remembering in memory only",
                    memory.path().display()
                );
                None
            }
        },
        None => None,
    };
    let out = connection
        .call(
            "phone_inbox",
            json!({"peek": true, "limit": PEEK_LIMIT}),
            Duration::ZERO,
        )
        .await
        .map_err(|e| match e {
            RemoteError::Unauthorized(c) => Ended::Stop(Stop::TokenRefused(c)),
            other => Ended::Trouble(format!("cannot look at the inbox: {other}")),
        })?;
    let mut inbox: InboxOut = serde_json::from_value(out)
        .map_err(|e| Ended::Trouble(format!("the server's inbox makes no sense: {e}")))?;
    // A full look (the oldest hundred unread) cannot reach newer mail: a
    // stranger's flood held a colleague's message out of every look, and
    // the channel said nothing more (an outsider's attack). The newest
    // messages still waiting are looked at too.
    if inbox.messages.len() >= PEEK_LIMIT {
        let newest: Vec<Brief> = connection.newest_waiting().await.map_err(|e| match e {
            RemoteError::Unauthorized(c) => Ended::Stop(Stop::TokenRefused(c)),
            other => Ended::Trouble(format!("cannot look at the inbox: {other}")),
        })?;
        for m in newest {
            if !inbox.messages.iter().any(|o| o.id == m.id) {
                inbox.messages.push(m);
            }
        }
    }
    let before = match &locked {
        Some(l) => l.load(),
        None => announced.here.clone(),
    };
    let new: Vec<&Brief> = inbox
        .messages
        .iter()
        .filter(|m| !before.contains(&m.id))
        .collect();
    let notes = announce::announcements(&new, inbox.unread_remaining);
    let allowed_at = announced.allowed_at(notes.len());
    if allowed_at > tokio::time::Instant::now() {
        return Ok(Some(allowed_at));
    }
    for note in notes {
        let notification = ServerNotification::CustomNotification(CustomNotification::new(
            NOTIFICATION,
            Some(note.params()),
        ));
        match tokio::time::timeout(NOTIFY_TIMEOUT, peer.send_notification(notification)).await {
            Ok(Ok(())) => record(&mut announced.sent),
            _ => return Err(Ended::Stop(Stop::ClientGone)),
        }
    }
    // Seen whole (fewer than a full page), the backlog tells what was read
    // meanwhile: forget those.
    let mut after: BTreeSet<String> = if inbox.messages.len() < PEEK_LIMIT {
        let unread: BTreeSet<&String> = inbox.messages.iter().map(|m| &m.id).collect();
        before
            .into_iter()
            .filter(|id| unread.contains(id))
            .collect()
    } else {
        before
    };
    after.extend(new.iter().map(|m| m.id.clone()));
    if let Some(l) = &locked
        && let Err(e) = l.save(&after)
    {
        eprintln!(
            "phone channel: cannot remember what it announced ({e}); a restart may announce it again"
        );
    }
    announced.here = after;
    Ok(None)
}
