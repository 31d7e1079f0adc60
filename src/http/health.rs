//! `GET /health`: 200 while this replica reaches PostgreSQL, 503 otherwise.
//! It says which dependency is down and how, never the error's own text
//! (which names hosts, users and databases) — that goes to the log.

use std::time::Duration;

use axum::{Json, extract::State, http::StatusCode, response::IntoResponse};
use serde_json::json;

use crate::{domain::Phone, store::StoreError};

/// 200 when PostgreSQL answers within a second, 503 otherwise. Also shows
/// whether mail notifications arrive (`notifications`): while they do not,
/// long polls re-check on their own, so the replica stays in rotation.
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
        Ok(Err(StoreError::Unavailable(reason))) if reason == crate::store::POOL_BUSY => "busy",
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            "unreachable"
        }
        Err(_) => {
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
