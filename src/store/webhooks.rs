//! Statements of webhooks: an agent's webhook settings, and the delivery
//! queue (`webhook_deliveries`), claimed by any replica with SKIP LOCKED.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Client, StoreError};

/// An agent's webhook as stored (the secret is not read back here).
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: Option<String>,
    /// The destination answered 410 Gone: off until a URL is set again.
    pub disabled: bool,
}

const WEBHOOK: &str =
    "SELECT webhook_url, webhook_disabled_at IS NOT NULL AS disabled FROM agents WHERE id = $1";

pub async fn webhook(db: &Client, agent_id: i64) -> Result<Webhook, StoreError> {
    let stmt = db.prepare_cached(WEBHOOK).await?;
    let row = db.query_one(&stmt, &[&agent_id]).await?;
    Ok(Webhook {
        url: row.get("webhook_url"),
        disabled: row.get("disabled"),
    })
}

/// Sets `$1`'s webhook: `$2` the URL (NULL clears it, and the secret),
/// `$3` a new secret, or NULL to keep the one it has. Re-enables a webhook
/// that was disabled. Returns whether the agent had a secret before.
const SET_WEBHOOK: &str = "WITH before AS (SELECT webhook_secret IS NOT NULL AS had FROM agents WHERE id = $1)
     UPDATE agents SET webhook_url = $2,
                       webhook_secret = CASE WHEN $2::text IS NULL THEN NULL ELSE coalesce($3, webhook_secret) END,
                       webhook_disabled_at = NULL, updated_at = now()
     WHERE id = $1
     RETURNING (SELECT had FROM before) AS had_secret";

pub async fn set_webhook(
    db: &Client,
    agent_id: i64,
    url: Option<&str>,
    new_secret: Option<&str>,
) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached(SET_WEBHOOK).await?;
    Ok(db
        .query_one(&stmt, &[&agent_id, &url, &new_secret])
        .await?
        .get("had_secret"))
}

/// Whether `$1` has a secret (so a URL set now needs no new one).
const HAS_SECRET: &str = "SELECT webhook_secret IS NOT NULL FROM agents WHERE id = $1";

pub async fn has_secret(db: &Client, agent_id: i64) -> Result<bool, StoreError> {
    let stmt = db.prepare_cached(HAS_SECRET).await?;
    Ok(db.query_one(&stmt, &[&agent_id]).await?.get(0))
}

/// A delivery this replica claimed, with what it sends.
#[derive(Clone)]
pub struct Claimed {
    pub id: i64,
    pub agent_id: i64,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub url: String,
    pub secret: String,
    pub message_id: i64,
    pub sender: String,
    pub sender_project: String,
    pub recipient: String,
    pub subject: Option<String>,
    pub thread_id: i64,
    pub reply_to: Option<i64>,
    pub sent_at: DateTime<Utc>,
}

impl std::fmt::Debug for Claimed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Claimed")
            .field("id", &self.id)
            .field("agent_id", &self.agent_id)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// Claims up to `$1` due deliveries for `$2` seconds (the claim's end is
/// when another replica may take one over), with what they send; those whose
/// recipient has no webhook any more end as `gone`. `webhook_deliveries_due_idx`;
/// primary keys: the message and its sender are LATERAL probes by id (OFFSET
/// 0), because as plain joins a generic plan made while `messages` was small
/// walked the sender index through all of a sender's mail on every idle
/// look, twice a second per replica (test
/// `plans_made_on_an_empty_mailbox_still_use_the_indexes_once_it_fills`).
const CLAIM: &str = "WITH due AS (
         SELECT d.id,
                a.webhook_url IS NOT NULL AND a.webhook_disabled_at IS NULL
                    AND a.unregistered_at IS NULL AND a.suspended_at IS NULL
                    AND a.webhook_secret IS NOT NULL AS live
         FROM webhook_deliveries d JOIN agents a ON a.id = d.agent_id
         WHERE d.state = 'pending' AND d.next_at <= now()
         ORDER BY d.next_at LIMIT $1 FOR UPDATE OF d SKIP LOCKED),
     claimed AS (
         UPDATE webhook_deliveries d
         SET next_at = now() + make_interval(secs => $2), attempts = d.attempts + 1
         WHERE d.id = ANY (ARRAY(SELECT id FROM due WHERE live))
         RETURNING d.id, d.agent_id, d.message_id, d.attempts, d.created_at),
     orphaned AS (
         UPDATE webhook_deliveries d SET state = 'gone', finished_at = now()
         WHERE d.id = ANY (ARRAY(SELECT id FROM due WHERE NOT live)))
     SELECT c.id, c.agent_id, c.attempts, c.created_at, a.webhook_url, a.webhook_secret,
            m.id AS message_id, s.name AS sender, s.project AS sender_project, a.name AS recipient,
            m.subject, m.thread_id, m.reply_to, m.sent_at
     FROM claimed c
     JOIN agents a ON a.id = c.agent_id
     CROSS JOIN LATERAL (
         SELECT m.id, m.sender_id, m.subject, m.thread_id, m.reply_to, m.sent_at
         FROM messages m WHERE m.id = c.message_id OFFSET 0) m
     CROSS JOIN LATERAL (
         SELECT s.name, s.project FROM agents s WHERE s.id = m.sender_id OFFSET 0) s";

pub async fn claim(
    db: &Client,
    limit: i64,
    claim_for: Duration,
) -> Result<Vec<Claimed>, StoreError> {
    let stmt = db.prepare_cached(CLAIM).await?;
    Ok(db
        .query(&stmt, &[&limit, &claim_for.as_secs_f64()])
        .await?
        .iter()
        .map(|r| Claimed {
            id: r.get("id"),
            agent_id: r.get("agent_id"),
            attempts: r.get("attempts"),
            created_at: r.get("created_at"),
            url: r.get("webhook_url"),
            secret: r.get("webhook_secret"),
            message_id: r.get("message_id"),
            sender: r.get("sender"),
            sender_project: r.get("sender_project"),
            recipient: r.get("recipient"),
            subject: r.get("subject"),
            thread_id: r.get("thread_id"),
            reply_to: r.get("reply_to"),
            sent_at: r.get("sent_at"),
        })
        .collect())
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A 2xx answer.
    Delivered { status: i32 },
    /// 410 Gone: the agent's webhook at `url` is switched off.
    Gone { status: i32, url: String },
    /// Anything else: again after `retry_in`, unless the delivery is older
    /// than `give_up_after` (then it has failed).
    Retry {
        status: Option<i32>,
        error: String,
        retry_in: Duration,
        give_up_after: Duration,
    },
}

/// `$1` delivery, `$2` state, `$3` status, `$4` error, `$5` seconds to the
/// next attempt, `$6` seconds after which a retry is a failure, `$7` the
/// attempt this claim made. Only a pending delivery changes, and a retry only
/// while the claim is still this attempt's.
const FINISH: &str = "UPDATE webhook_deliveries
     SET state = CASE WHEN $2 = 'retry' AND created_at < now() - make_interval(secs => $6) THEN 'failed'
                      WHEN $2 = 'retry' THEN 'pending' ELSE $2 END,
         last_status = $3, last_error = $4,
         next_at = CASE WHEN $2 = 'retry' THEN now() + make_interval(secs => $5) ELSE next_at END,
         finished_at = CASE WHEN $2 = 'retry' AND created_at >= now() - make_interval(secs => $6) THEN NULL
                            ELSE now() END
     WHERE id = $1 AND state = 'pending' AND (attempts = $7 OR $2 <> 'retry')
     RETURNING state";

/// `$1` agent, `$2` the URL that answered 410 (a URL set since stays on).
const DISABLE: &str = "UPDATE agents SET webhook_disabled_at = now()
     WHERE id = $1 AND webhook_url = $2 AND webhook_disabled_at IS NULL";

/// Records how an attempt ended; returns the delivery's state now.
pub async fn finish(
    db: &Client,
    delivery: &Claimed,
    outcome: &Outcome,
) -> Result<String, StoreError> {
    let stmt = db.prepare_cached(FINISH).await?;
    let (state, status, error, retry_in, give_up) = match outcome {
        Outcome::Delivered { status } => ("delivered", Some(*status), None, 0.0, 0.0),
        Outcome::Gone { status, url } => {
            let disable = db.prepare_cached(DISABLE).await?;
            db.execute(&disable, &[&delivery.agent_id, url]).await?;
            ("gone", Some(*status), None, 0.0, 0.0)
        }
        Outcome::Retry {
            status,
            error,
            retry_in,
            give_up_after,
        } => (
            "retry",
            *status,
            Some(error.as_str()),
            retry_in.as_secs_f64(),
            give_up_after.as_secs_f64(),
        ),
    };
    let row = db
        .query_opt(
            &stmt,
            &[
                &delivery.id,
                &state,
                &status,
                &error,
                &retry_in,
                &give_up,
                &delivery.attempts,
            ],
        )
        .await?;
    // Nothing updated: another replica took the delivery over after this
    // claim expired (a late failure must not undo it), or it already ended.
    Ok(row.map_or_else(|| "superseded".to_owned(), |r| r.get("state")))
}

/// Gives a claimed delivery back without counting the attempt, due again
/// after `$2` seconds: its agent's slots on this replica were all busy.
const RELEASE: &str = "UPDATE webhook_deliveries
     SET next_at = now() + make_interval(secs => $2), attempts = attempts - 1
     WHERE id = $1 AND state = 'pending' AND attempts = $3";

pub async fn release(db: &Client, delivery: &Claimed, after: Duration) -> Result<(), StoreError> {
    let stmt = db.prepare_cached(RELEASE).await?;
    db.execute(
        &stmt,
        &[&delivery.id, &after.as_secs_f64(), &delivery.attempts],
    )
    .await?;
    Ok(())
}

/// The queue: deliveries waiting, and how long the oldest has waited.
const QUEUE: &str = "SELECT count(*) AS pending,
            coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest
     FROM webhook_deliveries WHERE state = 'pending'";

pub async fn queue(db: &Client) -> Result<(i64, f64), StoreError> {
    let stmt = db.prepare_cached(QUEUE).await?;
    let row = db.query_one(&stmt, &[]).await?;
    Ok((row.get("pending"), row.get("oldest")))
}
