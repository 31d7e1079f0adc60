//! Statements on an agent's own settings: its contact policy, whether the
//! directory lists it, and its contacts and blocks (`contacts`).

use super::{Client, StoreError};

/// An agent's settings as stored.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub contact_policy: String,
    pub listed: bool,
    pub contacts: i64,
    pub blocked: i64,
}

/// `$1` agent. Primary key; the counts from `contacts`' primary key.
const SETTINGS: &str = "SELECT a.contact_policy, a.listed,
            (SELECT count(*) FROM contacts c WHERE c.agent_id = a.id AND c.is_contact) AS contacts,
            (SELECT count(*) FROM contacts c WHERE c.agent_id = a.id AND c.is_blocked) AS blocked
     FROM agents a WHERE a.id = $1";

pub async fn settings(db: &Client, agent_id: i64) -> Result<Option<AgentSettings>, StoreError> {
    let stmt = db.prepare_cached(SETTINGS).await?;
    Ok(db
        .query_opt(&stmt, &[&agent_id])
        .await?
        .map(|r| AgentSettings {
            contact_policy: r.get("contact_policy"),
            listed: r.get("listed"),
            contacts: r.get("contacts"),
            blocked: r.get("blocked"),
        }))
}

/// `$1` agent, `$2` policy or NULL (unchanged), `$3` listed or NULL.
const SET_POLICY: &str = "UPDATE agents SET contact_policy = coalesce($2, contact_policy),
                      listed = coalesce($3, listed), updated_at = now()
     WHERE id = $1";

pub async fn set_policy(
    db: &Client,
    agent_id: i64,
    policy: Option<&str>,
    listed: Option<bool>,
) -> Result<(), StoreError> {
    let stmt = db.prepare_cached(SET_POLICY).await?;
    db.execute(&stmt, &[&agent_id, &policy, &listed])
        .await
        .map(drop)
}

/// What a change to contacts does to each named agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Allow,
    Disallow,
    Block,
    Unblock,
}

/// Applies marks for `$1` (agent) to the registered agents named `$2`
/// (marks `$3`: allow, disallow, block, unblock; for a name given twice the
/// later mark wins); returns the names that matched a registered agent other
/// than `$1`. A mark that removes (disallow, unblock) creates no row. A
/// block withdraws the blocked agent's unread mail from `$1`'s inbox (dead,
/// reason `blocked`: out of the inbox and its caps, kept for analytics); an
/// unblock brings back what is still unread. The flag the send statement
/// reads before it probes `contacts` (`uses_contacts`, V14) is written by
/// the trigger of V22, at the end of the statement: after the messages it
/// withdraws, as a poll takes messages before it writes the agent's
/// presence. Written here first, it held the agent's row while waiting for
/// a message a poll held, and the poll then waited for the row (safe only
/// while PostgreSQL happened to run it last). Names: `agents_active_name_idx`;
/// `contacts`' primary key; `messages_unread_sender_idx`, `messages_withdrawn_idx`.
const MARK: &str = "WITH req AS (
         SELECT * FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS r(name, mark, ord)),
     target AS (
         SELECT DISTINCT ON (a.id) a.id, a.name, r.mark
         FROM req r JOIN agents a ON a.name = r.name AND a.unregistered_at IS NULL
         WHERE a.id <> $1
         ORDER BY a.id, r.ord DESC),
     changed AS (
         INSERT INTO contacts AS c (agent_id, other_id, is_contact, is_blocked)
         SELECT $1, t.id, t.mark = 'allow', t.mark = 'block' FROM target t
         WHERE t.mark IN ('allow', 'block')
            OR EXISTS (SELECT 1 FROM contacts x WHERE x.agent_id = $1 AND x.other_id = t.id)
         ON CONFLICT (agent_id, other_id) DO UPDATE SET
             is_contact = CASE (SELECT t.mark FROM target t WHERE t.id = c.other_id)
                              WHEN 'allow' THEN true WHEN 'disallow' THEN false
                              ELSE c.is_contact END,
             is_blocked = CASE (SELECT t.mark FROM target t WHERE t.id = c.other_id)
                              WHEN 'block' THEN true WHEN 'unblock' THEN false
                              ELSE c.is_blocked END,
             updated_at = now()
         RETURNING 1),
     withdrawn AS (
         UPDATE messages m SET dead_at = now(), dead_reason = 'blocked'
         WHERE m.recipient_id = $1 AND m.read_at IS NULL AND m.dead_at IS NULL
           AND m.sender_id = ANY (ARRAY(SELECT id FROM target WHERE mark = 'block'))),
     restored AS (
         UPDATE messages m SET dead_at = NULL, dead_reason = NULL
         WHERE m.recipient_id = $1 AND m.dead_reason = 'blocked' AND m.read_at IS NULL
           AND m.sender_id = ANY (ARRAY(SELECT id FROM target WHERE mark = 'unblock')))
     SELECT t.name, (SELECT count(*) FROM changed) AS changed FROM target t";

/// A block's withdrawal once more, in a statement that begins after the
/// block committed: a send whose statement began before the block and
/// committed after the block's own withdrawal looked was seen by neither
/// (each statement reads its own snapshot), and its message would wait in
/// the inbox past the block (tests/teams.rs, a group send racing a block).
/// `$1` the agent, `$2` names it blocked. `messages_unread_sender_idx`.
const WITHDRAW_AGAIN: &str = "UPDATE messages m SET dead_at = now(), dead_reason = 'blocked'
     WHERE m.recipient_id = $1 AND m.read_at IS NULL AND m.dead_at IS NULL
       AND m.sender_id = ANY (ARRAY(
           SELECT c.other_id FROM contacts c JOIN agents a ON a.id = c.other_id
           WHERE c.agent_id = $1 AND c.is_blocked AND a.name = ANY ($2::text[])))";

/// The other transactions of this database in progress now (their
/// virtual ids): every statement that took its snapshot before now runs in
/// one of them. `pg_locks`, `pg_stat_activity`.
const IN_PROGRESS: &str = "SELECT coalesce(array_agg(l.virtualtransaction), '{}') FROM pg_locks l
     JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'virtualxid' AND l.pid <> pg_backend_pid()
       AND a.datname = current_database()";

/// How many of the transactions `$1` are still in progress.
const STILL_IN_PROGRESS: &str = "SELECT count(*) FROM pg_locks
     WHERE locktype = 'virtualxid' AND virtualtransaction = ANY ($1::text[])";

/// The longest a block waits for the sends that may have missed it.
const STRADDLERS_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// [`WITHDRAW_AGAIN`], after the block's transaction committed and every
/// transaction then in progress ended (up to [`STRADDLERS_WAIT`]): a send
/// whose statement took its snapshot before the block committed runs in one
/// of them, so once they are over, whatever such a send stored is visible
/// to this statement and withdrawn; a send that began later sees the block
/// and is refused. The wait is the blocker's alone (a block is rare); no
/// send pays for it.
pub async fn withdraw_again(
    db: &Client,
    agent_id: i64,
    blocked: &[&str],
) -> Result<u64, StoreError> {
    let list = db.prepare_cached(IN_PROGRESS).await?;
    let open: Vec<String> = db.query_one(&list, &[]).await?.get(0);
    let still = db.prepare_cached(STILL_IN_PROGRESS).await?;
    let until = tokio::time::Instant::now() + STRADDLERS_WAIT;
    while !open.is_empty() && tokio::time::Instant::now() < until {
        let n: i64 = db.query_one(&still, &[&open]).await?.get(0);
        if n == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let stmt = db.prepare_cached(WITHDRAW_AGAIN).await?;
    db.execute(&stmt, &[&agent_id, &blocked]).await
}

/// Rows of `$1` that say nothing any more (after a disallow or unblock).
const PRUNE: &str =
    "DELETE FROM contacts WHERE agent_id = $1 AND NOT is_contact AND NOT is_blocked";

pub async fn mark(
    db: &Client,
    agent_id: i64,
    marks: &[(String, Mark)],
) -> Result<Vec<String>, StoreError> {
    let names: Vec<&str> = marks.iter().map(|(n, _)| n.as_str()).collect();
    let kinds: Vec<&str> = marks
        .iter()
        .map(|(_, m)| match m {
            Mark::Allow => "allow",
            Mark::Disallow => "disallow",
            Mark::Block => "block",
            Mark::Unblock => "unblock",
        })
        .collect();
    let stmt = db.prepare_cached(MARK).await?;
    let matched: Vec<String> = db
        .query(&stmt, &[&agent_id, &names, &kinds])
        .await?
        .iter()
        .map(|r| r.get("name"))
        .collect();
    let prune = db.prepare_cached(PRUNE).await?;
    db.execute(&prune, &[&agent_id]).await?;
    Ok(matched)
}

/// A page of `$1`'s contacts (`$2` = true) or blocks (false), by name,
/// after `$3` (a name, or '' from the start), `$4` rows.
const LIST: &str = "SELECT a.name FROM contacts c JOIN agents a ON a.id = c.other_id
     WHERE c.agent_id = $1 AND (CASE WHEN $2 THEN c.is_contact ELSE c.is_blocked END)
       AND a.name > $3
     ORDER BY a.name LIMIT $4";

pub async fn list(
    db: &Client,
    agent_id: i64,
    contacts: bool,
    after: &str,
    fetch: i64,
) -> Result<Vec<String>, StoreError> {
    let stmt = db.prepare_cached(LIST).await?;
    Ok(db
        .query(&stmt, &[&agent_id, &contacts, &after, &fetch])
        .await?
        .iter()
        .map(|r| r.get("name"))
        .collect())
}
