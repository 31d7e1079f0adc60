//! Statements on the address book (`agents`): registration, the caller by
//! token, token rotation, unregistering. Search is in `search`.

use chrono::{DateTime, Utc};

use super::fragments::{caller_by_token, presence_write};
use super::{Client, StoreError};

/// An agent whose token matched.
#[derive(Debug, Clone)]
pub struct AgentRow {
    pub id: i64,
    pub name: String,
    pub project: String,
}

/// A new agent, unless its name is registered, or was unregistered less
/// than `$5` days ago. `$1` name, `$2` description, `$3` project, `$4`
/// token digest. Returns its id when inserted. Indexes: `agents_name_idx`
/// (the reservation), `agents_active_name_idx` (the conflict).
const INSERT_NEW: &str = "INSERT INTO agents (name, description, project, token_hash, last_seen_at)
     SELECT $1, $2, $3, $4, now()
     WHERE NOT EXISTS (
         SELECT 1 FROM agents WHERE name = $1
         AND unregistered_at > now() - make_interval(days => $5))
     ON CONFLICT (name) WHERE unregistered_at IS NULL DO NOTHING
     RETURNING id";

/// Serialises registering and unregistering one name (`$1`), for the rest
/// of the transaction. Without it, a register whose snapshot predates an
/// unregister's commit saw the name active (not reserved), then waited on
/// the unregistering row's lock and, once it committed, inserted: the
/// 30-day reservation skipped.
const LOCK_NAME: &str = "SELECT pg_advisory_xact_lock(hashtextextended('phone:name:' || $1, 0))";

/// Registers a new agent (see [`INSERT_NEW`]) under the name's lock.
pub async fn insert_new(
    db: &Client,
    name: &str,
    description: &str,
    project: &str,
    token_hash: &[u8],
    reservation_days: i32,
) -> Result<Option<i64>, StoreError> {
    db.transaction(async |db| {
        let lock = db.prepare_cached(LOCK_NAME).await?;
        db.execute(&lock, &[&name]).await?;
        let stmt = db.prepare_cached(INSERT_NEW).await?;
        let row = db
            .query_opt(
                &stmt,
                &[
                    &name,
                    &description,
                    &project,
                    &token_hash,
                    &reservation_days,
                ],
            )
            .await?;
        Ok(row.map(|r| r.get("id")))
    })
    .await
}

/// Why a name is not free.
#[derive(Debug, Clone, Copy)]
pub struct NameStatus {
    /// An agent holds it now.
    pub active: bool,
    /// The end of the reservation left by the last agent that unregistered
    /// it (`$2` days after), if any did.
    pub reserved_until: Option<DateTime<Utc>>,
}

/// `$1` name, `$2` reservation days. Index: `agents_name_idx`.
const NAME_STATUS: &str =
    "SELECT max(unregistered_at) + make_interval(days => $2) AS reserved_until,
            coalesce(bool_or(unregistered_at IS NULL), false) AS active
     FROM agents WHERE name = $1";

pub async fn name_status(
    db: &Client,
    name: &str,
    reservation_days: i32,
) -> Result<NameStatus, StoreError> {
    let stmt = db.prepare_cached(NAME_STATUS).await?;
    let row = db.query_one(&stmt, &[&name, &reservation_days]).await?;
    Ok(NameStatus {
        active: row.get("active"),
        reserved_until: row.get("reserved_until"),
    })
}

/// Updates the entry of `$1` (name) held by the token digest `$2`: `$3`
/// description, `$4` project. A suspended agent's token works nowhere, so
/// it cannot rewrite its entry either. Index: `agents_active_name_idx`.
const UPDATE_ENTRY: &str = "UPDATE agents
     SET description = $3, project = $4, updated_at = now(), last_seen_at = now()
     WHERE name = $1 AND token_hash = $2 AND unregistered_at IS NULL AND suspended_at IS NULL
     RETURNING id";

/// Whether the entry was updated (the token is that name's).
pub async fn update_entry(
    db: &Client,
    name: &str,
    token_hash: &[u8],
    description: &str,
    project: &str,
) -> Result<bool, StoreError> {
    db.acknowledged(async |db| {
        let stmt = db.prepare_cached(UPDATE_ENTRY).await?;
        Ok(db
            .query_opt(&stmt, &[&name, &token_hash, &description, &project])
            .await?
            .is_some())
    })
    .await
}

/// `$1` name. Index: `agents_active_name_idx`.
const IS_REGISTERED: &str = "SELECT 1 FROM agents WHERE name = $1 AND unregistered_at IS NULL";

pub async fn is_registered(db: &Client, name: &str) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached(IS_REGISTERED).await?;
    Ok(db.query_opt(&stmt, &[&name]).await?.is_some())
}

/// The agent holding the token digest `$1`, whatever name it claims, and
/// its presence write when `$2` (the claimed name, or NULL) is its name.
static CALLER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let holder = caller_by_token("$1", "NULL");
    let touch = presence_write(
        "SELECT id, last_seen_at FROM holder WHERE $2::text IS NULL OR name = $2::text",
    );
    format!(
        "WITH holder AS (SELECT id, name, project, last_seen_at FROM agents WHERE {holder}),
              touched AS ({touch})
         SELECT id, name, project FROM holder"
    )
});

/// The registered agent holding `token_hash`, if any (its name may differ
/// from `claimed`: the caller decides what that means). Writes its presence
/// when the claim holds.
pub async fn holder_of(
    db: &Client,
    token_hash: &[u8],
    claimed: Option<&str>,
) -> Result<Option<AgentRow>, StoreError> {
    let stmt = db.prepare_cached(&CALLER).await?;
    let row = db.query_opt(&stmt, &[&token_hash, &claimed]).await?;
    Ok(row.map(|r| AgentRow {
        id: r.get("id"),
        name: r.get("name"),
        project: r.get("project"),
    }))
}

/// The registered agent holding the token digest `$1`, without a presence
/// write: a person signing in to the console is not the agent being online.
static HOLDER: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT id, name, project FROM agents WHERE {}",
        caller_by_token("$1", "NULL")
    )
});

/// [`holder_of`] without the presence write.
pub async fn holder_quietly(
    db: &Client,
    token_hash: &[u8],
) -> Result<Option<AgentRow>, StoreError> {
    let stmt = db.prepare_cached(&HOLDER).await?;
    let row = db.query_opt(&stmt, &[&token_hash]).await?;
    Ok(row.map(|r| AgentRow {
        id: r.get("id"),
        name: r.get("name"),
        project: r.get("project"),
    }))
}

/// `$1` agent id, `$3` the digest of the token the call was verified by:
/// only while it is still the agent's (a rotation racing this one, or a
/// suspension, won), `$2` the new token digest. Primary key.
const REPLACE_TOKEN: &str = "UPDATE agents SET token_hash = $2, updated_at = now()
     WHERE id = $1 AND token_hash = $3 AND unregistered_at IS NULL AND suspended_at IS NULL
     RETURNING name";

/// The agent's name, when `presented` is still its token, now replaced.
pub async fn replace_token(
    db: &Client,
    id: i64,
    presented: &[u8],
    token_hash: &[u8],
) -> Result<Option<String>, StoreError> {
    db.acknowledged(async |db| {
        let stmt = db.prepare_cached(REPLACE_TOKEN).await?;
        Ok(db
            .query_opt(&stmt, &[&id, &token_hash, &presented])
            .await?
            .map(|r| r.get("name")))
    })
    .await
}

#[derive(Debug, Clone)]
pub struct Unregistered {
    pub name: String,
    pub unregistered_at: DateTime<Utc>,
    pub reserved_until: DateTime<Utc>,
}

/// `$1` agent id, `$4` the digest of the token the call was verified by
/// (as in [`REPLACE_TOKEN`]; NULL: the operator's `unregister-stale`), `$2`
/// a digest no token has, `$3` reservation days. Primary key.
const UNREGISTER: &str = "UPDATE agents SET unregistered_at = now(), token_hash = $2, updated_at = now()
     WHERE id = $1 AND unregistered_at IS NULL
       AND ($4::bytea IS NULL OR (token_hash = $4 AND suspended_at IS NULL))
     RETURNING name, unregistered_at, unregistered_at + make_interval(days => $3) AS reserved_until";

/// Locks agent `$1`'s row for a change of its settings, while `$2` is still
/// its token (as in [`REPLACE_TOKEN`]; waits for a rotation in flight and
/// sees its outcome). Primary key.
const LOCK_HOLDER: &str = "SELECT 1 FROM agents
     WHERE id = $1 AND token_hash = $2 AND unregistered_at IS NULL AND suspended_at IS NULL
     FOR NO KEY UPDATE";

/// Inside a transaction: whether `presented` is still agent `id`'s token,
/// its row then locked to the transaction's end.
pub async fn lock_holder(db: &Client, id: i64, presented: &[u8]) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached(LOCK_HOLDER).await?;
    Ok(db.query_opt(&stmt, &[&id, &presented]).await?.is_some())
}

/// The name of agent `$1`. Primary key.
const NAME_OF: &str = "SELECT name FROM agents WHERE id = $1";

/// Unregisters (see [`UNREGISTER`]) under the name's lock.
pub async fn unregister(
    db: &Client,
    id: i64,
    presented: Option<&[u8]>,
    revoked_hash: &[u8],
    reservation_days: i32,
) -> Result<Option<Unregistered>, StoreError> {
    let row = db
        .transaction(async |db| {
            let name_of = db.prepare_cached(NAME_OF).await?;
            let Some(name) = db.query_opt(&name_of, &[&id]).await? else {
                return Ok(None);
            };
            let lock = db.prepare_cached(LOCK_NAME).await?;
            db.execute(&lock, &[&name.get::<_, &str>("name")]).await?;
            let stmt = db.prepare_cached(UNREGISTER).await?;
            db.query_opt(&stmt, &[&id, &revoked_hash, &reservation_days, &presented])
                .await
        })
        .await?;
    Ok(row.map(|r| Unregistered {
        name: r.get("name"),
        unregistered_at: r.get("unregistered_at"),
        reserved_until: r.get("reserved_until"),
    }))
}
