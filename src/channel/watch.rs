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
/// Writing one notification to Claude Code may take this long.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// A stream that ends sooner than this counts as trouble (backoff), so a
/// server that ends every stream at once is not hammered.
const STREAM_MIN: Duration = Duration::from_secs(2);

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
/// there is no place for it, this process's own memory.
struct Announced {
    file: Option<Memory>,
    here: BTreeSet<String>,
}

/// Watches until the token is refused or Claude Code leaves.
pub async fn run(target: Target, memory: Option<Memory>, peer: Peer<RoleServer>) -> Stop {
    let mut announced = Announced {
        file: memory,
        here: BTreeSet::new(),
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

async fn listen(connection: &Connection, announced: &mut Announced, peer: &Peer<RoleServer>) -> Ended {
    let filter = SubscriptionFilter::builder()
        .resource_subscriptions(["phone://inbox"])
        .build();
    let mut stream = match connection.client().listen(filter).await {
        Ok(s) => s,
        Err(e) => return Ended::Trouble(format!("cannot watch the inbox: {e}")),
    };
    loop {
        // The first update comes once the server's watch is in place, and
        // covers mail that arrived while the channel was away.
        let look_now = match tokio::time::timeout(SAFETY_LOOK, stream.next()).await {
            Err(_quiet) => true,
            Ok(Ok(Some(ServerNotification::ResourceUpdatedNotification(_)))) => true,
            Ok(Ok(Some(_other))) => false,
            Ok(Ok(None)) => return Ended::Gracefully,
            Ok(Err(e)) => return Ended::Trouble(format!("the inbox subscription ended: {e}")),
        };
        if look_now && let Err(ended) = look(connection, announced, peer).await {
            return ended;
        }
    }
}

/// One peek; announces what was not announced before.
async fn look(
    connection: &Connection,
    announced: &mut Announced,
    peer: &Peer<RoleServer>,
) -> Result<(), Ended> {
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
    let inbox: InboxOut = serde_json::from_value(out)
        .map_err(|e| Ended::Trouble(format!("the server's inbox makes no sense: {e}")))?;
    // Held until the announcements are out and remembered: another channel
    // of the same agent waits, then finds them announced.
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
    let before = match &locked {
        Some(l) => l.load(),
        None => announced.here.clone(),
    };
    let new: Vec<&Brief> = inbox
        .messages
        .iter()
        .filter(|m| !before.contains(&m.id))
        .collect();
    for note in announce::announcements(&new, inbox.unread_remaining) {
        let notification = ServerNotification::CustomNotification(CustomNotification::new(
            NOTIFICATION,
            Some(note.params()),
        ));
        match tokio::time::timeout(NOTIFY_TIMEOUT, peer.send_notification(notification)).await {
            Ok(Ok(())) => {}
            _ => return Err(Ended::Stop(Stop::ClientGone)),
        }
    }
    // Seen whole (fewer than a full page), the backlog tells what was read
    // meanwhile: forget those.
    let mut after: BTreeSet<String> = if inbox.messages.len() < PEEK_LIMIT {
        let unread: BTreeSet<&String> = inbox.messages.iter().map(|m| &m.id).collect();
        before.into_iter().filter(|id| unread.contains(id)).collect()
    } else {
        before
    };
    after.extend(new.iter().map(|m| m.id.clone()));
    if let Some(l) = &locked
        && let Err(e) = l.save(&after)
    {
        eprintln!("phone channel: cannot remember what it announced ({e}); a restart may announce it again");
    }
    announced.here = after;
    Ok(())
}
