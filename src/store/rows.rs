//! Plain records the statements return: no SQL, no wire format. The domain
//! works with these; the MCP layer turns them into its wire types.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

/// A directory entry as other agents see it. Never carries the token hash.
#[derive(Debug, Clone)]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub project: String,
    pub registered_at: DateTime<Utc>,
    pub last_seen_at: Option<DateTime<Utc>>,
    /// Unseen for longer than the server's stale period.
    pub stale: bool,
}

impl AgentCard {
    pub(super) fn from_row(row: &Row) -> Self {
        Self {
            name: row.get("name"),
            description: row.get("description"),
            project: row.get("project"),
            registered_at: row.get("registered_at"),
            last_seen_at: row.get("last_seen_at"),
            stale: row.get("stale"),
        }
    }
}

/// A message as its sender or recipient reads it.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: i64,
    /// The sender's verified name.
    pub sender: String,
    pub sender_project: String,
    pub recipient: String,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<i64>,
    pub thread_id: i64,
    pub sent_at: DateTime<Utc>,
    pub read_at: Option<DateTime<Utc>>,
    /// How many times a poll handed it out.
    pub delivery_count: i32,
    /// Until when it is leased to a worker, if it is.
    pub leased_until: Option<DateTime<Utc>>,
    /// When it stopped coming back (leased too often, never acknowledged).
    pub dead_at: Option<DateTime<Utc>>,
    /// When it is (or was) no longer delivered, if it has a lifetime.
    pub expires_at: Option<DateTime<Utc>>,
    /// A copy of a group send: the id of its first copy.
    pub group_id: Option<i64>,
    /// A copy of a group send, as its recipient sees it: the others it went to.
    pub also_to: Option<Vec<String>>,
    /// Its body's size in bytes, when an answer had no room for the body
    /// itself (a peek past its byte budget: `body` is then empty).
    pub body_omitted: Option<i64>,
}

impl Message {
    /// Its text in bytes, as an answer's byte budget counts it: body and
    /// subject.
    pub fn text_bytes(&self) -> i64 {
        (self.body.len() + self.subject.as_deref().map_or(0, str::len)) as i64
    }

    /// From a row with [`super::fragments::message_columns`].
    pub(super) fn from_row(row: &Row) -> Self {
        Self {
            id: row.get("id"),
            sender: row.get("sender"),
            sender_project: row.get("sender_project"),
            recipient: row.get("recipient"),
            subject: row.get("subject"),
            body: row.get("body"),
            reply_to: row.get("reply_to"),
            thread_id: row.get("thread_id"),
            sent_at: row.get("sent_at"),
            read_at: row.get("read_at"),
            delivery_count: row.get("delivery_count"),
            leased_until: row.get("leased_until"),
            dead_at: row.get("dead_at"),
            expires_at: row.get("expires_at"),
            group_id: row.get("group_id"),
            also_to: others(row.get("also_to")),
            body_omitted: None,
        }
    }
}

/// Where a sent message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Waiting,
    Leased,
    Read,
    Acknowledged,
    /// Leased too often without an acknowledgement: it stopped coming back.
    Dead,
    /// Its lifetime ended before it was read: it is no longer delivered.
    Expired,
}

impl Delivery {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Leased => "leased",
            Self::Read => "read",
            Self::Acknowledged => "acknowledged",
            Self::Dead => "dead",
            Self::Expired => "expired",
        }
    }

    pub(super) fn parse(state: &str) -> Self {
        match state {
            "acknowledged" => Self::Acknowledged,
            "read" => Self::Read,
            "leased" => Self::Leased,
            "dead" => Self::Dead,
            "expired" => Self::Expired,
            _ => Self::Waiting,
        }
    }
}

/// A message in its sender's outbox.
#[derive(Debug, Clone)]
pub struct Sent {
    pub id: i64,
    pub recipient: String,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<i64>,
    pub thread_id: i64,
    pub state: Delivery,
    pub sent_at: DateTime<Utc>,
    pub read_at: Option<DateTime<Utc>>,
    pub acked_at: Option<DateTime<Utc>>,
    pub delivery_count: i32,
}

impl Sent {
    /// Its text in bytes, as [`Message::text_bytes`].
    pub fn text_bytes(&self) -> i64 {
        (self.body.len() + self.subject.as_deref().map_or(0, str::len)) as i64
    }

    pub(super) fn from_row(row: &Row) -> Self {
        Self {
            id: row.get("id"),
            recipient: row.get("recipient"),
            subject: row.get("subject"),
            body: row.get("body"),
            reply_to: row.get("reply_to"),
            thread_id: row.get("thread_id"),
            state: Delivery::parse(row.get("state")),
            sent_at: row.get("sent_at"),
            read_at: row.get("read_at"),
            acked_at: row.get("acked_at"),
            delivery_count: row.get("delivery_count"),
        }
    }
}

/// A group send of which only one copy was stored (the others refused, or
/// deleted since) names no one else: no list rather than an empty one.
pub(super) fn others(names: Option<Vec<String>>) -> Option<Vec<String>> {
    names.filter(|n| !n.is_empty())
}
