//! The HTTP surface: `/mcp` (rmcp's streamable HTTP server, stateless),
//! `/console` (web pages, `crate::console`), `/health`, and the layers
//! around them; `serve` is the accept loop.

mod bearer;
mod call_shape;
mod client_address;
mod handover;
mod health;
mod jsonrpc;
mod peer;
pub mod serve;
mod stall;

use std::time::Duration;

use axum::{
    Router,
    http::{HeaderValue, StatusCode, header},
    middleware,
    routing::{any, get},
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::never::NeverSessionManager,
};
use tower_http::{
    limit::RequestBodyLimitLayer, set_header::SetResponseHeaderLayer, timeout::TimeoutLayer,
};

pub use client_address::ClientAddressFrom;

use crate::{
    domain::Phone,
    mcp::{PhoneServer, RequestDeadline},
};

const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// What the router needs to know about its deployment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Host names (optionally host:port) accepted in the `Host` header, on
    /// top of loopback. DNS-rebinding protection.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (scheme://host[:port]) allowed to call `/mcp`.
    pub allowed_origins: Vec<String>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    /// How long after a request arrives its answer must be on its way: the
    /// request timeout less time for a long poll's last look. Long polls
    /// end by then, so they never outlive their request.
    pub answer_within: Duration,
    /// Where the caller's address comes from, for rate limits.
    pub client_address_from: ClientAddressFrom,
    /// The web console: the operator's token, how long a sign-in lasts.
    pub console: crate::console::Settings,
}

pub fn router(settings: &Settings, phone: Phone) -> Router {
    let server = PhoneServer::new(phone.clone());
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    hosts.extend(settings.allowed_hosts.iter().cloned());
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        // Only subscriptions/listen answers as SSE: a comment every 20 s keeps
        // proxies (nginx's 60 s read timeout, Railway's edge) from cutting it.
        .with_sse_keep_alive(Some(std::time::Duration::from_secs(20)))
        .with_allowed_hosts(hosts)
        .with_allowed_origins(allowed_origins(settings))
        // No browser origin is trusted unless configured: DNS rebinding.
        .enforce_origin_validation()
        .with_max_request_body_bytes(settings.max_body_bytes);
    let mcp = SharedMcp(std::sync::Arc::new(StreamableHttpService::new(
        move || Ok(server.clone()),
        NeverSessionManager::default().into(),
        mcp_config,
    )));

    let max_body = settings.max_body_bytes;
    let address_from = settings.client_address_from.clone();
    let answer_within = settings.answer_within;
    let console = crate::console::router(
        phone.clone(),
        settings.console.clone(),
        crate::console::Rules {
            allowed_hosts: settings.allowed_hosts.clone(),
            allowed_origins: settings.allowed_origins.clone(),
        },
    );
    // Shared, not cloned per request: a `Phone` clone is a handful of
    // reference counts and a cancellation token's handle count (a lock).
    let door = std::sync::Arc::new(phone.clone());
    let mcp = Router::new()
        .nest_service("/mcp", mcp)
        // Inside the envelope check, which tells it the call's method.
        .layer(middleware::from_fn(move |req, next| {
            bearer::check(door.clone(), req, next)
        }))
        // Bodies of other methods than POST (which the envelope check
        // reads within the limit, and refuses as a JSON-RPC error, declared
        // or grown past it).
        .layer(RequestBodyLimitLayer::new(max_body))
        .layer(middleware::from_fn(move |req, next| {
            jsonrpc::check_jsonrpc(max_body, req, next)
        }))
        // Outside rmcp and the envelope check, so that it sees the bytes
        // that go out and the request's future being dropped.
        .layer(middleware::from_fn(handover::attach));
    // The console's own limit, its 413 a page that says what to do (a
    // person pasting a long text), not the limit's bare line of text.
    let console = console
        .layer(RequestBodyLimitLayer::new(max_body))
        .layer(middleware::from_fn(
            move |req: axum::extract::Request, next: middleware::Next| async move {
                let response = next.run(req).await;
                if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    return crate::console::too_large(max_body);
                }
                response
            },
        ));
    let plain = Router::new()
        .route("/health", get(health::health))
        .route("/health/live", get(health::live))
        // Claude Code probes OAuth discovery; a plain 404 tells it no auth flow exists.
        .route(
            "/.well-known/{*rest}",
            any(|| async { StatusCode::NOT_FOUND }),
        )
        .with_state(phone);
    Router::new()
        .merge(mcp)
        .nest("/console", console)
        // The nested router answers `/console`, not `/console/`.
        .route(
            "/console/",
            get(|| async {
                (
                    StatusCode::PERMANENT_REDIRECT,
                    [(header::LOCATION, "/console")],
                )
            }),
        )
        .layer(middleware::from_fn(move |req, next| {
            client_address::attach(address_from.clone(), req, next)
        }))
        // The deadline counts from the request's arrival, before any queue.
        .layer(middleware::from_fn(
            move |mut req: axum::extract::Request, next: middleware::Next| async move {
                let deadline = tokio::time::Instant::now() + answer_within;
                req.extensions_mut().insert(RequestDeadline(deadline));
                next.run(req).await
            },
        ))
        .merge(plain)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            settings.request_timeout,
        ))
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
        // Outermost: the request's span (joining the caller's W3C trace
        // context), its trace id for the log, and the request metrics.
        .layer(middleware::from_fn(crate::telemetry::trace_request))
}

/// rmcp's service, shared: axum clones a nested service for every request
/// and rmcp's own `call` clones it once more, each clone copying its whole
/// config (the host and origin lists, and a cancellation token, whose
/// handle count takes a lock): ~1.5% of the replica's CPU under the pairs
/// load (bench/PROFILE.md). Its `handle` takes `&self`, so one instance
/// serves every request.
#[derive(Clone)]
struct SharedMcp(std::sync::Arc<StreamableHttpService<PhoneServer, NeverSessionManager>>);

impl tower::Service<axum::extract::Request> for SharedMcp {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::extract::Request) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let (parts, body) = service.handle(req).await.into_parts();
            Ok(axum::response::Response::from_parts(
                parts,
                axum::body::Body::new(body),
            ))
        })
    }
}

/// Browser origins accepted on `/mcp`: the server's own (loopback on any
/// port, and each configured public host over HTTPS) plus configured ones.
/// Any other Origin gets 403; requests without an Origin are not affected.
fn allowed_origins(settings: &Settings) -> Vec<String> {
    let mut origins: Vec<String> = ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"]
        .map(String::from)
        .into();
    for host in &settings.allowed_hosts {
        if host.contains(':') {
            origins.push(format!("https://{host}"));
        } else {
            origins.push(format!("https://{host}:443"));
        }
    }
    origins.extend(settings.allowed_origins.iter().cloned());
    origins
}
