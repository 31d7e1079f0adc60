//! Webhook deliveries: every replica runs one worker that claims due
//! deliveries from PostgreSQL (SKIP LOCKED, so replicas share the queue),
//! POSTs each, signed as Standard Webhooks says, and records the outcome:
//! done on 2xx, the webhook switched off on 410, refused for good on other
//! 4xx; anything else pauses the destination (5 s, doubling up to an hour)
//! and the delivery waits for the pause to end, for up to 24 h. Each
//! attempt has a timeout; at most a few attempts to one agent, and one to a
//! destination that failed, run at once across replicas; a claimed delivery
//! whose replica died is taken over when its claim ends, so nothing is lost
//! (at least once; `webhook-id` lets receivers drop repeats).

mod sign;

use std::{sync::Arc, time::Duration};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::domain::{
    MessageId,
    types::timestamp,
    webhook::{Resolver, WebhookUrl},
};
use crate::store::{
    Client, Store, StoreError, https_client_config,
    webhooks::{self, Backoff, ClaimRules, Claimed, Outcome},
};
use crate::telemetry::{error_chain, metrics};

/// How the worker delivers.
#[derive(Debug, Clone)]
pub struct Settings {
    /// One attempt, connect to the end of the answer.
    pub timeout: Duration,
    /// Private destinations and http allowed (local stacks, tests).
    pub allow_private: bool,
    /// Deliveries in flight on this replica, at most.
    pub in_flight: usize,
    /// Attempts to one agent under way at once, at most, across replicas.
    pub per_destination: usize,
    /// How often an idle worker looks for due deliveries (sends through
    /// this replica wake it at once).
    pub idle_poll: Duration,
    /// A destination that failed pauses this long, doubling with each
    /// further failure up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// A delivery still pending after this has failed; a destination that
    /// failed for this long has its webhooks switched off.
    pub give_up_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            allow_private: false,
            in_flight: 32,
            per_destination: 4,
            idle_poll: Duration::from_millis(500),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(24 * 3600),
        }
    }
}

impl Settings {
    fn pauses(&self) -> Backoff {
        Backoff {
            first: self.first_backoff,
            max: self.max_backoff,
            give_up_after: self.give_up_after,
        }
    }
}

/// The most of a response body read (and thrown away): a receiver cannot
/// make the server read without end.
const RESPONSE_CAP: usize = 64 * 1024;

/// Runs until `stop`. How many attempts run at once, per agent and per
/// failing destination, is decided by the claims in the database (see
/// `store::webhooks::claim`), so it holds across replicas, and nothing is
/// claimed only to be handed back: a receiver that never answers makes no
/// statements beyond its own attempts.
pub async fn run(store: Store, settings: Settings, resolver: Resolver, stop: CancellationToken) {
    let in_flight = Arc::new(Semaphore::new(settings.in_flight));
    let due = store.webhooks_due().clone();
    let mut last_queue_report = tokio::time::Instant::now() - Duration::from_secs(60);
    loop {
        if stop.is_cancelled() {
            return;
        }
        if last_queue_report.elapsed() > Duration::from_secs(10) {
            last_queue_report = tokio::time::Instant::now();
            if let Ok(db) = store.db().await.map(Client::unguarded)
                && let Ok((depth, oldest)) = webhooks::queue(&db).await
            {
                metrics::webhook_queue(depth, oldest);
            }
        }
        let free = in_flight.available_permits();
        let claimed = if free == 0 {
            Vec::new()
        } else {
            claim(&store, free, &settings).await
        };
        if claimed.is_empty() {
            tokio::select! {
                _ = due.notified() => {}
                _ = tokio::time::sleep(settings.idle_poll) => {}
                _ = stop.cancelled() => return,
            }
            continue;
        }
        for delivery in claimed {
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let (store, settings, resolver, due) = (
                store.clone(),
                settings.clone(),
                resolver.clone(),
                due.clone(),
            );
            tokio::spawn(async move {
                deliver(&store, &settings, &resolver, delivery).await;
                drop(permit);
                // A slot is free: look for more at once, not at the next idle poll.
                due.notify_one();
            });
        }
    }
}

async fn claim(store: &Store, free: usize, settings: &Settings) -> Vec<Claimed> {
    let rules = ClaimRules {
        limit: free as i64,
        // A claimed delivery starts at once: long enough for the address
        // lookup and the attempt (each bounded by the timeout), plus slack.
        claim_for: settings.timeout * 2 + Duration::from_secs(5),
        give_up_after: settings.give_up_after,
        per_agent: settings.per_destination as i64,
    };
    let outcome = async {
        let db = store.db().await?.unguarded();
        webhooks::claim(&db, rules).await
    }
    .await;
    match outcome {
        Ok(claimed) => claimed,
        Err(e) => {
            tracing::warn!(error = %e, "could not claim webhook deliveries");
            Vec::new()
        }
    }
}

/// One attempt, and its outcome recorded.
async fn deliver(store: &Store, settings: &Settings, resolver: &Resolver, delivery: Claimed) {
    let outcome = attempt(settings, resolver, &delivery).await;
    let kind = match &outcome {
        Outcome::Delivered { .. } => "delivered",
        Outcome::Gone { .. } => "gone",
        Outcome::Refused { .. } => "refused",
        Outcome::Retry { .. } => "retry",
    };
    let recorded = async {
        let db = store.db().await?.unguarded();
        webhooks::finish(&db, &delivery, &outcome, settings.pauses()).await
    }
    .await;
    match recorded {
        Ok(state) => {
            let kind = if state == "failed" { "failed" } else { kind };
            metrics::webhook_attempt(kind);
            let (status, error) = match &outcome {
                Outcome::Retry { status, error } => (*status, error.as_str()),
                Outcome::Refused { status } => (Some(*status), "refused"),
                Outcome::Delivered { .. } | Outcome::Gone { .. } => return,
            };
            // The host only: a URL's path or query may carry a secret.
            tracing::info!(
                delivery = delivery.id,
                agent = delivery.agent_id,
                host = %delivery.host,
                attempts = delivery.attempts,
                status,
                error = %error,
                state = %state,
                "webhook delivery did not go through"
            );
        }
        // The claim ends by itself; another attempt follows then.
        Err(e) => log_unrecorded(&delivery, &e),
    }
}

fn log_unrecorded(delivery: &Claimed, e: &StoreError) {
    tracing::warn!(error = %e, delivery = delivery.id, "could not record a webhook attempt");
}

/// The TLS settings of every delivery, built once: each attempt needs its
/// own client (it pins the address it checked), and a client built from
/// scratch read the system's CA certificates from disk, file by file, on
/// every attempt, ~4.7 ms of CPU each, which cut the send rate to agents
/// with webhooks to an eighth (`make bench`, webhooks).
fn webhook_tls() -> Option<&'static rustls::ClientConfig> {
    static TLS: std::sync::OnceLock<Option<rustls::ClientConfig>> = std::sync::OnceLock::new();
    TLS.get_or_init(|| match https_client_config() {
        Ok(config) => Some(config),
        Err(e) => {
            tracing::warn!(error = %e, "https webhooks cannot be delivered");
            None
        }
    })
    .as_ref()
}

/// The Standard Webhooks body of one delivery: no message body (the
/// recipient reads its inbox as usual). A summary stands for the messages
/// beyond the agent's capped backlog and names the first of them.
pub fn payload(delivery: &Claimed, now: chrono::DateTime<chrono::Utc>) -> String {
    if delivery.summary {
        return json!({
            "type": "inbox.waiting",
            "timestamp": timestamp(now),
            "data": {
                "to": delivery.recipient,
                "first_id": MessageId(delivery.message_id).to_string(),
                "sent_at": timestamp(delivery.sent_at),
                "note": "more mail waits than was announced one by one; read your inbox",
            }
        })
        .to_string();
    }
    json!({
        "type": "message.received",
        "timestamp": timestamp(now),
        "data": {
            "id": MessageId(delivery.message_id).to_string(),
            "from": delivery.sender,
            "from_project": delivery.sender_project,
            "to": delivery.recipient,
            "subject": delivery.subject,
            "thread_id": MessageId(delivery.thread_id).to_string(),
            "reply_to": delivery.reply_to.map(|id| MessageId(id).to_string()),
            "sent_at": timestamp(delivery.sent_at),
        }
    })
    .to_string()
}

/// The `webhook-id` of a delivery: its message's id (every attempt of one
/// message's delivery shares it), or for a summary one of its own.
pub fn webhook_id(delivery: &Claimed) -> String {
    if delivery.summary {
        format!("waiting_{}", delivery.id)
    } else {
        MessageId(delivery.message_id).to_string()
    }
}

async fn attempt(settings: &Settings, resolver: &Resolver, delivery: &Claimed) -> Outcome {
    let retry = |status: Option<i32>, error: String| Outcome::Retry { status, error };
    // Checked again now, whatever it resolved to when it was set: and the
    // connection goes to the very address checked (no second lookup).
    let url = match WebhookUrl::parse(&delivery.url, settings.allow_private) {
        Ok(url) => url,
        Err(e) => return retry(None, e.to_string()),
    };
    let address = match url.destination(resolver, settings.allow_private).await {
        Ok(address) => address,
        Err(reason) => return retry(None, reason),
    };
    // Every client builds a TLS connector, even for http: always hand it
    // the shared one.
    let mut builder = reqwest::Client::builder();
    match webhook_tls() {
        Some(tls) => builder = builder.tls_backend_preconfigured(tls.clone()),
        None if url.as_str().starts_with("https:") => {
            return retry(
                None,
                "no CA certificates on this machine to check the destination with".into(),
            );
        }
        None => {}
    }
    let client = match builder
        .redirect(reqwest::redirect::Policy::none())
        .timeout(settings.timeout)
        .connect_timeout(settings.timeout.min(Duration::from_secs(5)))
        .no_proxy()
        .resolve(url.host(), address)
        .user_agent(concat!("phone-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(e) => return retry(None, error_chain(&e.without_url())),
    };
    let now = chrono::Utc::now();
    let body = payload(delivery, now);
    let id = webhook_id(delivery);
    let unix = now.timestamp();
    let signature = match sign::signature(&delivery.secret, &id, unix, &body) {
        Ok(signature) => signature,
        Err(e) => return retry(None, e),
    };
    let sent = client
        .post(url.as_str())
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", unix.to_string())
        .header("webhook-signature", format!("v1,{signature}"))
        .body(body)
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(e) => {
            let what = if e.is_timeout() {
                "timed out"
            } else {
                "could not connect or send"
            };
            // reqwest's text names the URL, whose path or query may carry
            // a secret: it never reaches a log or `last_error`.
            return retry(
                None,
                format!("{what} ({}): {}", url.host(), error_chain(&e.without_url())),
            );
        }
    };
    let status = i32::from(response.status().as_u16());
    // Read a little of the answer (so the connection ends cleanly), never
    // more than the cap; the client's timeout bounds the time.
    let mut read = 0usize;
    while read < RESPONSE_CAP {
        match response.chunk().await {
            Ok(Some(chunk)) => read += chunk.len(),
            _ => break,
        }
    }
    match status {
        200..=299 => Outcome::Delivered { status },
        410 => Outcome::Gone {
            status,
            url: delivery.url.clone(),
        },
        // The receiver refuses this delivery: trying again changes nothing.
        400..=499 if !matches!(status, 408 | 425 | 429) => Outcome::Refused { status },
        _ => retry(Some(status), format!("answered HTTP {status}")),
    }
}
