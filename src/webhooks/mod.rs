//! Webhook deliveries: every replica runs one worker that claims due
//! deliveries from PostgreSQL (SKIP LOCKED, so replicas share the queue),
//! POSTs each, signed as Standard Webhooks says, and records the outcome:
//! done on 2xx, the webhook switched off on 410, otherwise again with
//! exponential backoff for up to 24 h. Each attempt has a timeout; at most
//! a few deliveries to one agent run at once on a replica; a claimed
//! delivery whose replica died is taken over when its claim ends, so
//! nothing is lost (at least once; `webhook-id` lets receivers drop
//! repeats).

mod sign;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::domain::{MessageId, types::timestamp, webhook::WebhookUrl};
use crate::store::{
    Store, StoreError, https_client_config,
    webhooks::{self, Claimed, Outcome},
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
    /// Deliveries to one agent in flight on this replica, at most.
    pub per_destination: usize,
    /// How often an idle worker looks for due deliveries (sends through
    /// this replica wake it at once).
    pub idle_poll: Duration,
    /// First retry after this; doubling up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// A delivery still failing after this has failed for good.
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

/// The most of a response body read (and thrown away): a receiver cannot
/// make the server read without end.
const RESPONSE_CAP: usize = 64 * 1024;

/// Runs until `stop`.
pub async fn run(store: Store, settings: Settings, stop: CancellationToken) {
    let in_flight = Arc::new(Semaphore::new(settings.in_flight));
    let per_agent: Arc<Mutex<HashMap<i64, Arc<Semaphore>>>> = Arc::default();
    let due = store.webhooks_due().clone();
    let mut last_queue_report = tokio::time::Instant::now() - Duration::from_secs(60);
    loop {
        if stop.is_cancelled() {
            return;
        }
        if last_queue_report.elapsed() > Duration::from_secs(10) {
            last_queue_report = tokio::time::Instant::now();
            if let Ok(db) = store.db().await
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
            let agent = {
                let mut map = per_agent.lock().unwrap_or_else(|p| p.into_inner());
                map.retain(|_, s| Arc::strong_count(s) > 1);
                map.entry(delivery.agent_id)
                    .or_insert_with(|| Arc::new(Semaphore::new(settings.per_destination)))
                    .clone()
            };
            // A slow destination waits in the database, not in this
            // replica's slots: with its agent's slots all busy, the delivery
            // goes back (due again shortly) and its permit serves others.
            let Ok(slot) = agent.try_acquire_owned() else {
                drop(permit);
                give_back(&store, &delivery).await;
                continue;
            };
            let (store, settings, due) = (store.clone(), settings.clone(), due.clone());
            tokio::spawn(async move {
                deliver(&store, &settings, delivery).await;
                drop(slot);
                drop(permit);
                // A slot is free: look for more at once, not at the next idle poll.
                due.notify_one();
            });
        }
    }
}

/// How long a delivery given back waits before it is due again.
const GIVE_BACK_FOR: Duration = Duration::from_millis(500);

async fn give_back(store: &Store, delivery: &Claimed) {
    let outcome = async {
        let db = store.db().await?;
        webhooks::release(&db, delivery, GIVE_BACK_FOR).await
    }
    .await;
    if let Err(e) = outcome {
        // The claim expires by itself; it is only later.
        log_unrecorded(delivery, &e);
    }
}

async fn claim(store: &Store, free: usize, settings: &Settings) -> Vec<Claimed> {
    // A claimed delivery starts at once or goes back: long enough for the
    // address lookup and the attempt (each bounded by the timeout), plus slack.
    let claim_for = settings.timeout * 2 + Duration::from_secs(5);
    let outcome = async {
        let db = store.db().await?;
        webhooks::claim(&db, free as i64, claim_for).await
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
async fn deliver(store: &Store, settings: &Settings, delivery: Claimed) {
    let outcome = attempt(settings, &delivery).await;
    let kind = match &outcome {
        Outcome::Delivered { .. } => "delivered",
        Outcome::Gone { .. } => "gone",
        Outcome::Retry { .. } => "retry",
    };
    let recorded = async {
        let db = store.db().await?;
        webhooks::finish(&db, &delivery, &outcome).await
    }
    .await;
    match recorded {
        Ok(state) => {
            let kind = if state == "failed" { "failed" } else { kind };
            metrics::webhook_attempt(kind);
            if let Outcome::Retry { status, error, .. } = &outcome {
                tracing::info!(
                    delivery = delivery.id,
                    agent = delivery.agent_id,
                    attempts = delivery.attempts,
                    status,
                    error = %error,
                    state = %state,
                    "webhook delivery did not go through"
                );
            }
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
/// recipient reads its inbox as usual).
pub fn payload(delivery: &Claimed, now: chrono::DateTime<chrono::Utc>) -> String {
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

async fn attempt(settings: &Settings, delivery: &Claimed) -> Outcome {
    let retry = |status: Option<i32>, error: String| Outcome::Retry {
        status,
        error,
        retry_in: backoff(settings, delivery.attempts),
        give_up_after: settings.give_up_after,
    };
    // Checked again now, whatever it resolved to when it was set: and the
    // connection goes to the very address checked (no second lookup).
    let url = match WebhookUrl::parse(&delivery.url, settings.allow_private) {
        Ok(url) => url,
        Err(e) => return retry(None, e.to_string()),
    };
    let address =
        match tokio::time::timeout(settings.timeout, url.destination(settings.allow_private)).await
        {
            Ok(Ok(address)) => address,
            Ok(Err(reason)) => return retry(None, reason),
            Err(_) => return retry(None, format!("looking up {} took too long", url.host())),
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
        Err(e) => return retry(None, e.to_string()),
    };
    let now = chrono::Utc::now();
    let body = payload(delivery, now);
    let id = MessageId(delivery.message_id).to_string();
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
            return retry(None, format!("{what}: {}", error_chain(&e)));
        }
    };
    let status = i32::from(response.status().as_u16());
    // Read a little of the answer (so the connection ends cleanly), never
    // more than the cap.
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
        _ => retry(Some(status), format!("answered HTTP {status}")),
    }
}

fn backoff(settings: &Settings, attempts: i32) -> Duration {
    let exponent = attempts.clamp(1, 20) as u32 - 1;
    let base = settings
        .first_backoff
        .saturating_mul(2u32.saturating_pow(exponent))
        .min(settings.max_backoff);
    // ±20 %, so that retries of a burst spread out.
    let jitter = 0.8 + 0.4 * rand::random::<f64>();
    base.mul_f64(jitter)
}
