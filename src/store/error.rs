//! Database errors, classified for the layers above.

use deadpool_postgres::PoolError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection became free in time, or none could be made: the caller
    /// may retry shortly.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
    #[error("bad DATABASE_URL: {0}")]
    Config(String),
    /// The group-commit batch that carried the call ended without an answer
    /// (its task panicked or was aborted).
    #[error("the batch carrying this call ended without an answer")]
    BatchLost,
    /// The caller went away before the statement began; nothing was done.
    #[error("the caller went away before its statement began")]
    CallerGone,
}

impl From<PoolError> for StoreError {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Timeout(_) => Self::Unavailable(POOL_BUSY.into()),
            PoolError::Backend(e) => Self::from(e),
            other => Self::Unavailable(other.to_string()),
        }
    }
}

impl StoreError {
    /// A closed connection or a server shutting down is an outage, not a bug.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable(_) => true,
            Self::Query(e) => {
                e.is_closed()
                    || e.code().is_some_and(|c| {
                        let c = c.code();
                        // Connection lost, server shutting down, too many
                        // connections, or our statement/lock timeout fired.
                        c.starts_with("08")
                            || c.starts_with("57P")
                            || c == "53300"
                            || c == "57014"
                            || c == "55P03"
                            || c == "40001"
                            || c == "40P01"
                    })
                    || e.as_db_error().is_none() && e.code().is_none() && !is_our_mistake(e)
            }
            _ => false,
        }
    }

    /// A deadlock or a serialization failure: the statement's transaction
    /// was rolled back, and trying again may well succeed.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Query(e)
            if e.code().is_some_and(|c| c.code() == "40001" || c.code() == "40P01"))
    }

    /// For an unavailable database: what a caller may be told (never the
    /// database's own text, which names hosts and users).
    pub fn unavailable_reason(&self) -> String {
        match self {
            Self::Unavailable(reason) => reason.clone(),
            _ if self.is_conflict() => "the call conflicted with a concurrent one".into(),
            Self::Query(e)
                if e.code()
                    .is_some_and(|c| c.code() == "57014" || c.code() == "55P03") =>
            {
                "the database is busy".into()
            }
            _ => "database unreachable".into(),
        }
    }
}

/// Errors the client library raises about the statement itself (wrong
/// parameter count or types, unexpected columns or rows): a bug here, not an
/// outage, whatever the database's state.
fn is_our_mistake(e: &tokio_postgres::Error) -> bool {
    let text = e.to_string();
    [
        "expected ",
        "error serializing parameter",
        "error deserializing column",
        "invalid column",
        "query returned an unexpected number of rows",
    ]
    .iter()
    .any(|p| text.starts_with(p))
}

/// Why a caller waited in vain for a pooled connection.
pub const POOL_BUSY: &str = "all database connections are busy";
