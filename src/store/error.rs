//! Database errors, classified for the layers above.

use deadpool_postgres::PoolError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection became free in time, or none could be made: the caller
    /// may retry shortly.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// Logged with PostgreSQL's SQLSTATE and message (`describe`).
    #[error("database error: {}", describe(.0))]
    Query(#[from] tokio_postgres::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] refinery::Error),
    #[error("bad DATABASE_URL: {0}")]
    Config(String),
    /// The group-commit batch that carried the call ended without an answer
    /// (its task panicked or was aborted).
    #[error("the batch carrying this call ended without an answer")]
    BatchLost,
    /// The database cannot serve this configuration (a missing privilege).
    #[error("{0}")]
    Setup(String),
    /// The caller went away before the statement began; nothing was done.
    #[error("the caller went away before its statement began")]
    CallerGone,
}

impl From<PoolError> for StoreError {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => {
                Self::Unavailable(POOL_BUSY.into())
            }
            // No host completed a connection within its connect timeout.
            PoolError::Timeout(_) => Self::Unavailable(UNREACHABLE.into()),
            // Every host answered, none takes writes: mid-failover, or a
            // DATABASE_URL that names only standbys.
            PoolError::Backend(e) if refuses_writes(&e) => Self::Unavailable(READ_ONLY.into()),
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
                            // A server that no longer takes writes: the
                            // connection reached a standby (failover).
                            || c == READ_ONLY_SQL_TRANSACTION
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

    /// An error that says the connection's server is not (or no longer) the
    /// primary, or is going away: a standby refused a write, the server is
    /// shutting down (as a failover stops the old primary), the connection
    /// broke. The connection is discarded, and with it every other made
    /// before, which reached the same server.
    pub fn is_wrong_server(&self) -> bool {
        match self {
            Self::Unavailable(reason) => reason == STALLED || reason == READ_ONLY,
            Self::Query(e) => {
                Self::is_connection_lost(e)
                    || e.code()
                        .is_some_and(|c| c.code() == READ_ONLY_SQL_TRANSACTION)
            }
            _ => false,
        }
    }

    /// The connection broke or its session was ended (by an administrator,
    /// a shutdown, a restart): the connection, not the server's role.
    pub fn is_connection_lost(e: &tokio_postgres::Error) -> bool {
        e.is_closed()
            || e.code().is_some_and(|c| {
                let c = c.code();
                c.starts_with("08") || ["57P01", "57P02", "57P03"].contains(&c)
            })
            || e.as_db_error().is_none() && e.code().is_none() && !is_our_mistake(e)
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
                    .is_some_and(|c| c.code() == READ_ONLY_SQL_TRANSACTION) =>
            {
                READ_ONLY.into()
            }
            Self::Query(e)
                if e.code()
                    .is_some_and(|c| c.code() == "57014" || c.code() == "55P03") =>
            {
                "the database is busy".into()
            }
            _ => UNREACHABLE.into(),
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

/// Why a caller cannot write now: the server reached does not take writes.
pub const READ_ONLY: &str = "the database is read-only right now, as during a failover";

/// No host completed a connection in time.
pub const UNREACHABLE: &str = "database unreachable";

/// A statement got no answer at all within its deadline.
pub const STALLED: &str = "the database did not answer in time";

/// `PHONE_REQUIRE_SYNC_STANDBY`: the primary's commits would not wait for a
/// standby, so the call was rolled back (`pool::standby`).
pub const NO_SYNC_STANDBY: &str = "the database has no synchronous standby right now, as during a failover, \
     and this server acknowledges mail and changes only once a standby holds them; nothing was done";

/// `PHONE_REQUIRE_SYNC_STANDBY`: the call committed on a primary that had
/// no synchronous standby, and no standby confirmed holding it.
pub const UNCONFIRMED: &str = "the database committed this call but no standby confirmed holding it, as during a \
     failover: its outcome is unknown";

/// SQLSTATE `read_only_sql_transaction`: a write reached a standby (or a
/// server made read-only).
const READ_ONLY_SQL_TRANSACTION: &str = "25006";

/// A database error as logs may show it: PostgreSQL's SQLSTATE and message
/// (never its DETAIL, which quotes row values); otherwise the client
/// library's chain ("error connecting to server: Connection refused").
/// Messages of data errors (class 22) may quote the offending value: those
/// quotes are blanked.
pub fn describe(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return crate::telemetry::error_chain(e);
    };
    let code = db.code().code();
    let message = if code.starts_with("22") {
        blank_quotes(db.message())
    } else {
        db.message().to_owned()
    };
    format!("SQLSTATE {code}: {message}")
}

/// `invalid input syntax for type uuid: "…"`: what stood between double
/// quotes is left out.
fn blank_quotes(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, part) in message.split('"').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        } else {
            out.push_str("\"…\"");
        }
    }
    out
}

/// tokio-postgres' refusal of a server that does not take writes
/// (`target_session_attrs=read-write`).
fn refuses_writes(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            io.kind() == std::io::ErrorKind::PermissionDenied
                && io.to_string().contains("does not allow writes")
        })
}
