//! `GET /health` (readiness): 200 while this replica can write to
//! PostgreSQL, 503 otherwise. It says which dependency is down and how in
//! fixed words, never the error's own text (which names hosts, users and
//! databases) — that goes to the log.
//!
//! `GET /health/live` (liveness): 200 while the process serves HTTP at all,
//! whatever the database does. A platform that restarts what fails its
//! probe (a Kubernetes `livenessProbe`) should use this one: restarting
//! every replica because the database is failing over helps nobody.

use std::time::Duration;

use axum::{Json, extract::State, http::StatusCode, response::IntoResponse};
use serde_json::json;

use crate::{
    domain::Phone,
    store::{NO_SYNC_STANDBY, POOL_BUSY, READ_ONLY, STALLED, StoreError},
};

/// 200 when a pooled connection's server takes writes within a second (a
/// primary, its synchronous standby answering; `store::failover`), 503
/// otherwise. Also shows whether mail notifications arrive
/// (`notifications`): while they do not, long polls re-check on their own,
/// so the replica stays in rotation.
pub(super) async fn health(State(phone): State<Phone>) -> impl IntoResponse {
    let notifications = if phone.store().wakeup().is_listening() {
        "listening"
    } else {
        "reconnecting"
    };
    let database = match tokio::time::timeout(Duration::from_secs(1), phone.store().ping()).await {
        Ok(Ok(())) => "ok",
        // An exhausted pool is a busy replica, not a database outage: both
        // take the replica out of rotation, but say which it is.
        Ok(Err(StoreError::Unavailable(reason))) if reason == POOL_BUSY => "busy",
        // Reached, but a standby (or read-only): sends would fail. Mid-
        // failover, or a DATABASE_URL that names the old primary only.
        Ok(Err(StoreError::Unavailable(reason))) if reason == READ_ONLY => {
            tracing::warn!("health check: the database does not take writes");
            "read_only"
        }
        // PHONE_REQUIRE_SYNC_STANDBY, and the primary's commits would not
        // wait for a standby: mail is refused.
        Ok(Err(StoreError::Unavailable(reason))) if reason == NO_SYNC_STANDBY => {
            tracing::warn!("health check: the database has no synchronous standby");
            "no_sync_standby"
        }
        Ok(Err(e)) if !matches!(&e, StoreError::Unavailable(r) if r == STALLED) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            "unreachable"
        }
        // No answer: a stalled path, or a commit waiting for a synchronous
        // standby that does not confirm.
        _ => {
            tracing::warn!("health check: the database did not answer within 1 s");
            "timed_out"
        }
    };
    let status = if database == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let overall = if database == "ok" {
        "ok"
    } else {
        "unavailable"
    };
    (
        status,
        Json(json!({"status": overall, "database": database, "notifications": notifications})),
    )
}

/// Always 200: the process is up and serves HTTP.
pub(super) async fn live() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}
