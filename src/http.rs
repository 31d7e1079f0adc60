//! The HTTP surface: `/mcp` (rmcp's streamable HTTP server, stateless),
//! `/health`, and the layers around them.

use std::time::Duration;

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::IntoResponse,
    routing::{any, get},
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use serde_json::json;
use tower_http::{
    limit::RequestBodyLimitLayer, set_header::SetResponseHeaderLayer, timeout::TimeoutLayer,
    trace::TraceLayer,
};

use crate::{config::Config, domain::Phone, mcp::PhoneServer, store};

const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

pub fn router(config: &Config, phone: Phone) -> Router {
    let server = PhoneServer::new(phone.clone());
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(config.allowed_hosts.iter().cloned());
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(hosts)
        .with_allowed_origins(config.allowed_origins.clone())
        // No browser origin is trusted unless configured: DNS rebinding.
        .enforce_origin_validation()
        .with_max_request_body_bytes(config.max_body_bytes);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        NeverSessionManager::default().into(),
        mcp_config,
    );

    Router::new()
        .nest_service("/mcp", mcp)
        .route("/health", get(health))
        // Claude Code probes OAuth discovery; a plain 404 tells it no auth flow exists.
        .route("/.well-known/{*rest}", any(|| async { StatusCode::NOT_FOUND }))
        .with_state(phone)
        .layer(RequestBodyLimitLayer::new(config.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, config.request_timeout))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(TraceLayer::new_for_http())
}

/// 200 when Postgres answers within a second, 503 otherwise.
async fn health(State(phone): State<Phone>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(1), store::ping(phone.pool())).await {
        Ok(Ok(())) => (StatusCode::OK, Json(json!({"status": "ok", "database": "ok"}))),
        outcome => {
            let reason = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".into(),
            };
            tracing::warn!(%reason, "health check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "database": "unreachable"})),
            )
        }
    }
}
