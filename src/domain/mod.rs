//! The mailbox and the address book: the rules, and the SQL that enforces them.

pub mod agents;
mod batch;
pub mod limits;
pub mod messages;
pub mod types;
pub mod wakeup;

use std::sync::Arc;

use crate::store::Pool;
use tokio_util::sync::CancellationToken;

pub use types::{AgentName, IdempotencyKey, InvalidInput, MessageId, Token};

use crate::store::StoreError;

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
    #[error("message {0} not found among the messages you sent or received")]
    UnknownMessage(MessageId),
    #[error("{reply_to} is a conversation with '{other}'; omit `to` or set it to '{other}'")]
    ReplyToOtherParty { reply_to: MessageId, other: String },
    #[error(
        "idempotency_key '{0}' was already used for a different message; use a new key for a new message"
    )]
    IdempotencyConflict(String),
    #[error("name '{0}' was unregistered recently and stays reserved until {1}; pick another name")]
    NameReserved(AgentName, String),
    #[error("too many {what} from here; retry after {retry_at}")]
    RateLimited {
        what: &'static str,
        retry_at: String,
    },
    #[error("the mailbox is temporarily unavailable ({0}); retry in a few seconds")]
    Unavailable(String),
    #[error("internal error; retry later")]
    Internal,
}

impl From<StoreError> for PhoneError {
    fn from(err: StoreError) -> Self {
        if err.is_unavailable() {
            tracing::warn!(error = %err, "database unavailable");
            let timed_out = matches!(&err, StoreError::Query(e)
                if e.code().is_some_and(|c| c.code() == "57014" || c.code() == "55P03"));
            match err {
                StoreError::Unavailable(reason) => Self::Unavailable(reason),
                _ if timed_out => Self::Unavailable("the database is busy".into()),
                _ => Self::Unavailable("database unreachable".into()),
            }
        } else {
            tracing::error!(error = %err, "database error");
            Self::Internal
        }
    }
}

impl From<tokio_postgres::Error> for PhoneError {
    fn from(err: tokio_postgres::Error) -> Self {
        StoreError::from(err).into()
    }
}

impl From<deadpool_postgres::PoolError> for PhoneError {
    fn from(err: deadpool_postgres::PoolError) -> Self {
        StoreError::from(err).into()
    }
}

impl PhoneError {
    /// A short machine-readable kind, for logs and traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_argument",
            Self::NameTaken(_) => "name_taken",
            Self::NameReserved(..) => "name_reserved",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::UnknownAgent(_) => "unknown_agent",
            Self::UnknownMessage(_) => "unknown_message",
            Self::ReplyToOtherParty { .. } => "reply_mismatch",
            Self::IdempotencyConflict(_) => "idempotency_conflict",
            Self::RateLimited { .. } => "rate_limited",
            Self::Unavailable(_) => "unavailable",
            Self::Internal => "internal",
        }
    }
}

/// The domain's entry point: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Phone {
    pool: Pool,
    wakeup: Arc<wakeup::Wakeup>,
    /// Cancelled at shutdown, so long polls return at once.
    shutdown: CancellationToken,
    limits: Arc<limits::Limits>,
    /// Sends and read polls in flight on this replica, written together
    /// (group commit).
    mail: batch::Batcher<batch::mail::MailWrite>,
}

impl Phone {
    pub fn new(
        pool: Pool,
        wakeup: Arc<wakeup::Wakeup>,
        shutdown: CancellationToken,
        limits: limits::Limits,
    ) -> Self {
        let mail = batch::Batcher::new(
            batch::mail::MailWrite {
                pool: pool.clone(),
                cap: messages::UNREAD_COUNT_CAP,
                wakes: batch::PendingWakes::default(),
            },
            pool.wait_timeout(),
            pool.status().max_size,
        );
        Self {
            mail,
            pool,
            wakeup,
            shutdown,
            limits: Arc::new(limits),
        }
    }

    pub fn limits(&self) -> &limits::Limits {
        &self.limits
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn wakeup(&self) -> &Arc<wakeup::Wakeup> {
        &self.wakeup
    }
}

/// What a request presents to prove who it is. Only the token's digest is
/// kept. Hot paths (send, poll) verify it inside their own statement, so a
/// call costs one round trip; the rest verify it first with `authenticate`.
#[derive(Clone)]
pub struct Credentials {
    pub token: types::TokenHash,
    /// The `name` argument, when given: it must match the token's agent.
    pub claimed: Option<AgentName>,
    /// The caller's network address, for rate limits.
    pub client_address: String,
}

/// The presence write, at most once a minute per agent: `callers` selects
/// the `id` and `last_seen_at` of the verified callers. Only stale callers
/// become keys, so a fresh one costs no index lookup; the staleness test is
/// repeated in the WHERE so that concurrent calls re-check it on the locked
/// row.
pub(crate) fn presence_write(callers: &str) -> String {
    const STALE: &str = "(last_seen_at IS NULL OR last_seen_at < now() - interval '60 seconds')";
    format!(
        "UPDATE agents SET last_seen_at = now()
         WHERE id = ANY (ARRAY(SELECT id FROM ({callers}) c WHERE {STALE})) AND {STALE}"
    )
}

/// The clause every one-round-trip statement of a single call starts with:
/// the caller (`me`), by token digest ($1) and optional claimed name ($2),
/// and its presence write.
pub(crate) fn caller_cte() -> String {
    format!(
        "me AS (
        SELECT id, name, last_seen_at FROM agents
        WHERE token_hash = $1 AND unregistered_at IS NULL AND ($2::text IS NULL OR name = $2)),
     touched AS ({})",
        presence_write("SELECT id, last_seen_at FROM me")
    )
}

/// An agent whose token was verified for this request.
#[derive(Debug, Clone)]
pub struct Caller {
    pub id: i64,
    pub name: AgentName,
    pub project: String,
}
