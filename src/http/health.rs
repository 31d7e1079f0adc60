//! `GET /health`: 200 while this replica reaches PostgreSQL, 503 otherwise.

use std::time::Duration;

use axum::{Json, extract::State, http::StatusCode, response::IntoResponse};
use serde_json::json;

use crate::{domain::Phone, store::StoreError};

/// 200 when Postgres answers within a second, 503 otherwise.
pub(super) async fn health(State(phone): State<Phone>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(1), phone.store().ping()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            Json(json!({"status": "ok", "database": "ok"})),
        ),
        outcome => {
            // An exhausted pool is a busy replica, not a database outage:
            // both take the replica out of rotation, but say which it is.
            let (reason, database) = match outcome {
                Ok(Err(StoreError::Unavailable(reason))) => (reason, "busy"),
                Ok(Err(e)) => (e.to_string(), "unreachable"),
                Ok(Ok(())) | Err(_) => ("timed out".into(), "unreachable"),
            };
            tracing::warn!(%reason, "health check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": database, "reason": reason})),
            )
        }
    }
}
