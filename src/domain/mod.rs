//! The mailbox and the address book: the rules, in plain types. What is
//! stored and how is `store`'s; what goes over the wire is `mcp`'s.
//!
//! - `types`: values that parse on the way in (names, tokens, ids, text).
//! - `agents`: registering, authenticating, token rotation, unregistering.
//! - `search`: directory queries and their paging.
//! - `messages`: sending, replying, polling (read, lease, peek, history,
//!   long polls), acknowledging, outbox and threads.
//! - `limits`: rate limits on failed authentication and registration.
//! - `console`: sessions of the web console, and what its pages list.

pub mod agents;
pub mod console;
pub mod handover;
pub mod limits;
pub mod mail_search;
pub mod messages;
pub mod search;
pub mod send;
pub mod settings;
pub mod types;
pub mod webhook;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use types::{AgentName, IdempotencyKey, InvalidInput, MessageId, Receipt, Token, TokenHash};

use crate::store::{Store, StoreError};

/// Everything a tool call can fail with. Each variant is something the agent
/// can act on; the MCP layer turns it into a one-line tool error.
#[derive(Debug, thiserror::Error)]
pub enum PhoneError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("name already registered: '{0}'. Pass its token to update it, or pick another name")]
    NameTaken(AgentName),
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("no agent named '{0}'. Use phone_search to find the exact name")]
    UnknownAgent(AgentName),
    #[error(
        "'{0}' of this conversation left the directory (unregistered): a reply cannot reach it. An agent registered under that name since is not the same agent"
    )]
    PartyLeft(AgentName),
    #[error("message {0} not found among the messages you sent or received")]
    UnknownMessage(MessageId),
    #[error(
        "{reply_to} is a conversation with '{other}'; omit `to` (its other party), name some of them, or set `to` to \"*\" for all"
    )]
    ReplyToOtherParty { reply_to: MessageId, other: String },
    #[error(
        "idempotency_key '{0}' was already used for a different message; use a new key for a new message"
    )]
    IdempotencyConflict(String),
    #[error("name '{0}' was unregistered recently and stays reserved until {1}; pick another name")]
    NameReserved(AgentName, String),
    #[error("too many {what}; retry after {retry_at}")]
    RateLimited {
        what: &'static str,
        retry_at: String,
    },
    #[error(
        "'{0}' does not accept new conversations from you (its contact policy); ask its operator to add you as a contact, or reply to a message it sent you"
    )]
    Refused(AgentName),
    #[error(
        "'{0}''s inbox is full (too much unread mail from agents it does not know); nothing was sent. Try later, or ask it to add you as a contact"
    )]
    InboxFull(AgentName),
    #[error(
        "'{0}' has not read the messages you already sent it: your share of its inbox is full, and nothing was sent. Wait until it reads some (phone_outbox shows their state)"
    )]
    InboxShare(AgentName),
    /// A send to several recipients stored nothing: each one's reason.
    #[error("nothing was sent: {0}")]
    NothingSent(String),
    #[error("you reached your quota of {what}; nothing was sent, try later")]
    Quota { what: &'static str },
    #[error("the mailbox is temporarily unavailable ({0}); retry in a few seconds")]
    Unavailable(String),
    /// Some receipts were for deliveries that are over: the message went to
    /// another worker after the lease ended. The others were acknowledged.
    #[error("{}", stale_receipts(acknowledged, stale))]
    StaleReceipts {
        acknowledged: Vec<MessageId>,
        stale: Vec<(messages::AckRef, i32)>,
    },
    /// The caller left (disconnected, or its request timed out) before the
    /// answer: nothing it would have been handed was consumed.
    #[error("the request ended before its answer; nothing was taken")]
    CallerGone,
    #[error("internal error; retry later")]
    Internal,
}

impl From<StoreError> for PhoneError {
    fn from(err: StoreError) -> Self {
        if matches!(err, StoreError::CallerGone) {
            return Self::CallerGone;
        }
        if matches!(err, StoreError::BatchLost) {
            tracing::error!(error = %err, "database error");
            return Self::Unavailable("the server lost track of this call".into());
        }
        if err.is_unavailable() {
            tracing::warn!(error = %err, "database unavailable");
            Self::Unavailable(err.unavailable_reason())
        } else {
            tracing::error!(error = %err, "database error");
            Self::Internal
        }
    }
}

fn stale_receipts(acknowledged: &[MessageId], stale: &[(messages::AckRef, i32)]) -> String {
    let refused: Vec<String> = stale
        .iter()
        .map(|(r, current)| match r {
            messages::AckRef::Receipt(receipt) => format!(
                "{} (receipt of delivery {}; it is on delivery {current} now)",
                receipt.message, receipt.delivery
            ),
            messages::AckRef::Id(id) => id.to_string(),
        })
        .collect();
    let done = if acknowledged.is_empty() {
        "nothing else to acknowledge".to_owned()
    } else {
        let ids: Vec<String> = acknowledged.iter().map(ToString::to_string).collect();
        format!("acknowledged {}", ids.join(", "))
    };
    format!(
        "not acknowledged: {}: your lease ended and the message was handed to another worker, \
         which will acknowledge it; do not act on it again ({done})",
        refused.join(", ")
    )
}

impl PhoneError {
    /// A short machine-readable kind, for logs, traces and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_argument",
            Self::NameTaken(_) => "name_taken",
            Self::NameReserved(..) => "name_reserved",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::UnknownAgent(_) => "unknown_agent",
            Self::PartyLeft(_) => "party_left",
            Self::UnknownMessage(_) => "unknown_message",
            Self::ReplyToOtherParty { .. } => "reply_mismatch",
            Self::IdempotencyConflict(_) => "idempotency_conflict",
            Self::RateLimited { .. } => "rate_limited",
            Self::Unavailable(_) => "unavailable",
            Self::Refused(_) => "refused",
            Self::InboxFull(_) => "inbox_full",
            Self::InboxShare(_) => "inbox_share",
            Self::Quota { .. } => "quota",
            Self::NothingSent(_) => "nothing_sent",
            Self::CallerGone => "caller_gone",
            Self::StaleReceipts { .. } => "stale_receipt",
            Self::Internal => "internal",
        }
    }
}

/// The domain's entry point: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Phone {
    store: Store,
    /// Cancelled at shutdown, so long polls return at once.
    shutdown: CancellationToken,
    limits: Arc<limits::Limits>,
    mail_rules: messages::MailRules,
    /// Looks up webhook hosts (phone_settings).
    resolver: webhook::Resolver,
}

impl Phone {
    pub fn new(
        store: Store,
        shutdown: CancellationToken,
        limits: limits::Limits,
        mail_rules: messages::MailRules,
        resolver: webhook::Resolver,
    ) -> Self {
        Self {
            store,
            shutdown,
            limits: Arc::new(limits),
            mail_rules,
            resolver,
        }
    }

    /// This server's settings for mail (longest wait, deliveries of a lease).
    pub fn mail_rules(&self) -> &messages::MailRules {
        &self.mail_rules
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
}

/// What a request presents to prove who it is. Only the token's digest is
/// kept. Hot paths (send, poll) verify it inside their own statement, so a
/// call costs one round trip; the rest verify it first with `authenticate`.
#[derive(Clone)]
pub struct Credentials {
    pub token: TokenHash,
    /// The `name` argument, when given: it must match the token's agent.
    pub claimed: Option<AgentName>,
    /// The caller's network address, for rate limits.
    pub client_address: String,
}

impl Credentials {
    fn claimed_name(&self) -> Option<&str> {
        self.claimed.as_ref().map(AgentName::as_str)
    }
}

/// Asks the caller's connection whether the caller closed its end (the HTTP
/// layer's socket check: `http::peer`), which the request's own
/// cancellation does not see when unread input waits on the connection.
pub trait Hangup: Send + Sync {
    fn hung_up(&self) -> bool;
}

/// The request a call arrives in: whether its caller can still hear the
/// answer, and by when the answer must leave.
#[derive(Clone, Default)]
pub struct Call {
    /// Cancelled when the caller can no longer hear the answer: it
    /// disconnected, or its request timed out.
    pub gone: CancellationToken,
    /// Its connection, asked before a long poll takes mail again.
    pub hangup: Option<Arc<dyn Hangup>>,
    /// When the answer must be on its way, a margin before the request
    /// times out: long polls end by then. `None`: no limit but the wait's.
    pub deadline: Option<tokio::time::Instant>,
    /// Where a poll leaves what it took until the answer has left the
    /// server (`None`: the caller holds it as soon as the poll returns).
    pub handover: Option<Arc<handover::Handover>>,
}

impl Call {
    /// The caller can no longer hear the answer: its request was cancelled,
    /// or its connection was closed at the far end.
    pub fn caller_left(&self) -> bool {
        self.gone.is_cancelled() || self.hangup.as_ref().is_some_and(|h| h.hung_up())
    }
}

/// An agent whose token was verified for this request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub id: i64,
    pub name: AgentName,
    pub project: String,
    /// The digest of the token it was verified by: a change made later in
    /// the request (rotation, unregistering, settings) holds only while it
    /// is still the agent's token.
    pub token: TokenHash,
}
