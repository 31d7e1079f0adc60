//! Statements of webhooks: an agent's webhook settings, the delivery queue
//! (`webhook_deliveries`), claimed by any replica with SKIP LOCKED, and the
//! destinations that failed (`webhook_hosts`), which pause.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Client, StoreError};

/// An agent's webhook as stored (the secret is not read back here).
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: Option<String>,
    /// Switched off (410 Gone, or its destination failed for the whole
    /// retry period): off until a URL is set again.
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

/// The webhook of `$1`, its row locked until the transaction ends: a change
/// is decided on what it replaces (two rotations at once are serialised,
/// and a URL set while another call clears the webhook cannot end up
/// without a secret).
const LOCK_WEBHOOK: &str = "SELECT webhook_url, webhook_secret IS NOT NULL AS has_secret
     FROM agents WHERE id = $1 FOR UPDATE";

/// An agent's webhook, locked for a change (see [`set_webhook`]).
#[derive(Debug, Clone)]
pub struct Locked {
    pub url: Option<String>,
    pub has_secret: bool,
}

/// Inside a transaction.
pub async fn lock_webhook(db: &Client, agent_id: i64) -> Result<Locked, StoreError> {
    let stmt = db.prepare_cached(LOCK_WEBHOOK).await?;
    let row = db.query_one(&stmt, &[&agent_id]).await?;
    Ok(Locked {
        url: row.get("webhook_url"),
        has_secret: row.get("has_secret"),
    })
}

/// Sets `$1`'s webhook: `$2` the URL (NULL clears it, and the secret), `$3`
/// a new secret, or NULL to keep the one it has, `$4` its destination
/// (`host:port`). Re-enables a webhook that was switched off.
const SET_WEBHOOK: &str = "UPDATE agents SET webhook_url = $2, webhook_host = $4,
         webhook_secret = CASE WHEN $2::text IS NULL THEN NULL ELSE coalesce($3, webhook_secret) END,
         webhook_disabled_at = NULL, updated_at = now()
     WHERE id = $1";

/// In the transaction of [`lock_webhook`]: `url` with its destination.
pub async fn set_webhook(
    db: &Client,
    agent_id: i64,
    url: Option<(&str, &str)>,
    new_secret: Option<&str>,
) -> Result<(), StoreError> {
    let stmt = db.prepare_cached(SET_WEBHOOK).await?;
    let (url, host) = url.unzip();
    db.execute(&stmt, &[&agent_id, &url, &new_secret, &host])
        .await?;
    Ok(())
}

/// A delivery this replica claimed, with what it sends.
#[derive(Clone)]
pub struct Claimed {
    pub id: i64,
    pub agent_id: i64,
    /// The destination, `host:port`: failures are counted per destination.
    pub host: String,
    /// A "mail waits" delivery standing for the messages beyond the agent's
    /// capped backlog, rather than one message's.
    pub summary: bool,
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
        // Never the secret, nor the URL (its path may carry one).
        f.debug_struct("Claimed")
            .field("id", &self.id)
            .field("agent_id", &self.agent_id)
            .field("host", &self.host)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// Claims up to `$1` due deliveries for `$2` seconds (the claim's end is
/// when another replica may take one over), with what they send. Of the
/// first `$5` due deliveries, oldest due first:
/// - those whose recipient has no webhook any more end as `gone`, those
///   older than `$3` seconds as `failed` (nothing more is tried);
/// - those whose destination pauses after failures wait, untouched again,
///   until the pause ends (or until they would be given up): a destination
///   that never answers costs no statement per delivery;
/// - a destination that failed before gets one attempt at a time, across
///   every replica, until one succeeds;
/// - an agent gets at most `$4` attempts under way at once, across every
///   replica; the rest stay due for a later claim.
///
/// `webhook_deliveries_due_idx`, `webhook_deliveries_agent_idx`,
/// `agents_webhook_host_idx`; primary keys: the message and its sender are
/// LATERAL probes by id (OFFSET 0), because as plain joins a generic plan
/// made while `messages` was small walked the sender index through all of
/// a sender's mail on every idle look, twice a second per replica (test
/// `plans_made_on_an_empty_mailbox_still_use_the_indexes_once_it_fills`).
const CLAIM: &str = "WITH due AS MATERIALIZED (
         SELECT d.id, d.agent_id, d.created_at, d.attempts, a.webhook_host AS host,
                a.webhook_url IS NOT NULL AND a.webhook_disabled_at IS NULL
                    AND a.unregistered_at IS NULL AND a.suspended_at IS NULL
                    AND a.webhook_secret IS NOT NULL AS live,
                d.created_at < now() - make_interval(secs => $3) AS expired,
                -- A message past its lifetime is no longer delivered, nor
                -- announced; one deleted (retention, an operator) cannot be:
                -- claimed, it would drop out of the final join below and be
                -- claimed again until given up (primary key probes).
                NOT d.summary AND EXISTS (
                    SELECT 1 FROM messages m
                    WHERE m.id = d.message_id AND m.expires_at <= now()) AS lapsed,
                NOT EXISTS (SELECT 1 FROM messages m WHERE m.id = d.message_id) AS deleted,
                h.retry_at
         FROM webhook_deliveries d JOIN agents a ON a.id = d.agent_id
         LEFT JOIN webhook_hosts h ON h.host = a.webhook_host
         WHERE d.state = 'pending' AND d.next_at <= now()
         ORDER BY d.next_at LIMIT $5 FOR UPDATE OF d SKIP LOCKED),
     ready AS MATERIALIZED (
         SELECT x.*, row_number() OVER (PARTITION BY x.agent_id ORDER BY x.id) AS nth_agent,
                -- The least tried delivery probes a failing destination,
                -- so that the agents pointing at it take turns.
                row_number() OVER (PARTITION BY x.host ORDER BY x.attempts, x.id) AS nth_host
         FROM due x
         WHERE x.live AND NOT x.expired AND NOT x.lapsed AND NOT x.deleted
           AND (x.retry_at IS NULL OR x.retry_at <= now())),
     flying AS MATERIALIZED (
         SELECT r.agent_id, (
                    SELECT count(*) FROM webhook_deliveries f
                    WHERE f.agent_id = r.agent_id AND f.state = 'pending' AND f.claimed_until > now()
                ) AS agent_n,
                r.host IS NOT NULL AND EXISTS (
                    SELECT 1 FROM agents o JOIN webhook_deliveries f ON f.agent_id = o.id
                    WHERE o.webhook_host = r.host AND f.state = 'pending' AND f.claimed_until > now()
                ) AS host_busy
         FROM (SELECT DISTINCT agent_id, host FROM ready) r),
     chosen AS (
         SELECT r.id FROM ready r JOIN flying f ON f.agent_id = r.agent_id
         WHERE CASE WHEN r.retry_at IS NULL THEN f.agent_n + r.nth_agent <= $4
                    ELSE r.nth_host = 1 AND NOT f.host_busy END
         ORDER BY r.id LIMIT $1),
     claimed AS (
         UPDATE webhook_deliveries d
         SET next_at = now() + make_interval(secs => $2),
             claimed_until = now() + make_interval(secs => $2), attempts = d.attempts + 1
         WHERE d.id = ANY (ARRAY(SELECT id FROM chosen))
         RETURNING d.id, d.agent_id, d.message_id, d.attempts, d.created_at, d.summary),
     paused AS (
         UPDATE webhook_deliveries d
         SET next_at = least(x.retry_at, x.created_at + make_interval(secs => $3))
         FROM due x
         WHERE d.id = x.id AND x.live AND NOT x.expired AND NOT x.lapsed AND NOT x.deleted
           AND x.retry_at > now()),
     ended AS (
         UPDATE webhook_deliveries d
         SET state = CASE WHEN x.live AND NOT x.deleted THEN 'failed' ELSE 'gone' END,
             finished_at = now(), claimed_until = NULL,
             last_error = CASE WHEN x.deleted THEN 'the message was deleted before delivery'
                               WHEN NOT x.live THEN NULL
                               WHEN x.lapsed THEN 'the message expired before delivery'
                               ELSE 'not delivered within the retry period' END
         FROM due x
         WHERE d.id = x.id AND (NOT x.live OR x.expired OR x.lapsed OR x.deleted))
     SELECT c.id, c.agent_id, c.attempts, c.created_at, c.summary, a.webhook_url,
            a.webhook_host, a.webhook_secret,
            m.id AS message_id, s.name AS sender, s.project AS sender_project, a.name AS recipient,
            m.subject, m.thread_id, m.reply_to, m.sent_at
     FROM claimed c
     JOIN agents a ON a.id = c.agent_id
     CROSS JOIN LATERAL (
         SELECT m.id, m.sender_id, m.subject, m.thread_id, m.reply_to, m.sent_at
         FROM messages m WHERE m.id = c.message_id OFFSET 0) m
     CROSS JOIN LATERAL (
         SELECT s.name, s.project FROM agents s WHERE s.id = m.sender_id OFFSET 0) s";

/// Due deliveries one claim looks at, at most: it stays cheap however long
/// the queue is.
const CLAIM_SCAN: i64 = 500;

/// What one claim may take.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRules {
    /// Deliveries this replica can start now.
    pub limit: i64,
    /// How long a claim lasts (then another replica may take it over).
    pub claim_for: Duration,
    /// A delivery still pending after this has failed.
    pub give_up_after: Duration,
    /// Attempts under way at once per agent, across replicas.
    pub per_agent: i64,
}

pub async fn claim(db: &Client, rules: ClaimRules) -> Result<Vec<Claimed>, StoreError> {
    let stmt = db.prepare_cached(CLAIM).await?;
    Ok(db
        .query(
            &stmt,
            &[
                &rules.limit,
                &rules.claim_for.as_secs_f64(),
                &rules.give_up_after.as_secs_f64(),
                &rules.per_agent,
                &CLAIM_SCAN,
            ],
        )
        .await?
        .iter()
        .map(|r| Claimed {
            id: r.get("id"),
            agent_id: r.get("agent_id"),
            host: r
                .get::<_, Option<String>>("webhook_host")
                .unwrap_or_default(),
            summary: r.get("summary"),
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
    /// The destination refused this delivery for good (a 4xx answer other
    /// than 408, 425 and 429): it is not tried again.
    Refused { status: i32 },
    /// Anything else (no answer in time, no connection, a 5xx): the
    /// destination pauses, and this delivery is due again when the pause
    /// ends, unless it is older than the retry period (then it failed).
    /// `error` names the host at most, never the URL.
    Retry { status: Option<i32>, error: String },
}

/// How failures pause a destination.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first pause; each further failure doubles it.
    pub first: Duration,
    pub max: Duration,
    /// Deliveries older than this have failed; a destination failing for
    /// this long has its webhooks switched off.
    pub give_up_after: Duration,
}

/// `$1` delivery, `$2` state (`delivered`, `gone`, `failed`, `retry`), `$3`
/// status, `$4` error (never a URL), `$5` when it is due again (a retry),
/// `$6` seconds after which a retry is a failure, `$7` the attempt this
/// claim made. Only a pending delivery changes, and only while the claim
/// is still this attempt's: a late outcome cannot undo another replica's.
const FINISH: &str = "UPDATE webhook_deliveries
     SET state = CASE WHEN $2 = 'retry' AND created_at < now() - make_interval(secs => $6) THEN 'failed'
                      WHEN $2 = 'retry' THEN 'pending' ELSE $2 END,
         last_status = $3, last_error = $4, claimed_until = NULL,
         next_at = CASE WHEN $2 = 'retry'
                        THEN least($5::timestamptz, created_at + make_interval(secs => $6))
                        ELSE next_at END,
         finished_at = CASE WHEN $2 = 'retry' AND created_at >= now() - make_interval(secs => $6)
                            THEN NULL ELSE now() END
     WHERE id = $1 AND state = 'pending' AND attempts = $7
     RETURNING state";

/// A destination answered: its pause, if any, ends. `$1` host.
const HOST_ANSWERED: &str = "DELETE FROM webhook_hosts WHERE host = $1";

/// A destination failed: `$1` host, `$2` first pause (seconds), `$3` the
/// longest pause, `$4` seconds of failing after which its webhooks are
/// switched off. Returns when it may be tried again and whether it has
/// failed for that long. The pause doubles per failure, ±20 %, so that
/// replicas and destinations spread out.
const HOST_FAILED: &str =
    "INSERT INTO webhook_hosts AS h (host, failures, first_failed_at, retry_at)
     VALUES ($1, 1, now(), now() + make_interval(secs => $2 * (0.8 + 0.4 * random())))
     ON CONFLICT (host) DO UPDATE SET
         failures = h.failures + 1,
         retry_at = now() + make_interval(secs => least($3, $2 * power(2, least(h.failures, 30)))
                                                  * (0.8 + 0.4 * random()))
     RETURNING retry_at, first_failed_at < now() - make_interval(secs => $4) AS given_up";

/// Switches off the webhooks pointing at `$1` (it failed for the whole
/// retry period) and ends their pending deliveries.
const HOST_GIVEN_UP: &str = "WITH off AS (
         UPDATE agents SET webhook_disabled_at = now()
         WHERE webhook_host = $1 AND webhook_disabled_at IS NULL
         RETURNING id)
     UPDATE webhook_deliveries d SET state = 'failed', finished_at = now(), claimed_until = NULL,
            last_error = 'its destination failed for the whole retry period; the webhook is off'
     WHERE d.state = 'pending' AND d.agent_id IN (SELECT id FROM off)";

/// `$1` agent, `$2` the URL that answered 410 (a URL set since stays on).
const DISABLE: &str = "UPDATE agents SET webhook_disabled_at = now()
     WHERE id = $1 AND webhook_url = $2 AND webhook_disabled_at IS NULL";

/// Records how an attempt ended, and what it says of its destination, in
/// one transaction; returns the delivery's state now.
pub async fn finish(
    db: &Client,
    delivery: &Claimed,
    outcome: &Outcome,
    backoff: Backoff,
) -> Result<String, StoreError> {
    let give_up = backoff.give_up_after.as_secs_f64();
    let (state, status, error) = match outcome {
        Outcome::Delivered { status } => ("delivered", Some(*status), None),
        Outcome::Gone { status, .. } => ("gone", Some(*status), None),
        Outcome::Refused { status } => (
            "failed",
            Some(*status),
            Some(format!("refused with HTTP {status}")),
        ),
        Outcome::Retry { status, error } => ("retry", *status, Some(error.clone())),
    };
    db.transaction(async |db| {
        let mut retry_at: Option<DateTime<Utc>> = None;
        match outcome {
            Outcome::Delivered { .. } | Outcome::Gone { .. } => {
                if let Outcome::Gone { url, .. } = outcome {
                    let disable = db.prepare_cached(DISABLE).await?;
                    db.execute(&disable, &[&delivery.agent_id, url]).await?;
                }
                let answered = db.prepare_cached(HOST_ANSWERED).await?;
                db.execute(&answered, &[&delivery.host]).await?;
            }
            Outcome::Refused { .. } | Outcome::Retry { .. } => {
                let failed = db.prepare_cached(HOST_FAILED).await?;
                let row = db
                    .query_one(
                        &failed,
                        &[
                            &delivery.host,
                            &backoff.first.as_secs_f64(),
                            &backoff.max.as_secs_f64(),
                            &give_up,
                        ],
                    )
                    .await?;
                retry_at = Some(row.get("retry_at"));
                if row.get::<_, bool>("given_up") {
                    let off = db.prepare_cached(HOST_GIVEN_UP).await?;
                    db.execute(&off, &[&delivery.host]).await?;
                }
            }
        }
        let stmt = db.prepare_cached(FINISH).await?;
        let row = db
            .query_opt(
                &stmt,
                &[
                    &delivery.id,
                    &state,
                    &status,
                    &error,
                    &retry_at,
                    &give_up,
                    &delivery.attempts,
                ],
            )
            .await?;
        // Nothing updated: another replica took the delivery over after
        // this claim expired (a late failure must not undo it), or it ended.
        Ok(row.map_or_else(|| "superseded".to_owned(), |r| r.get("state")))
    })
    .await
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
