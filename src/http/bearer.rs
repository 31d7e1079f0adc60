//! A bad bearer token is refused at the door: a client that connects or
//! lists the tools (`initialize`, `server/discover`, `tools/list`) with an
//! `Authorization` header whose token is not an agent's gets HTTP 401 with
//! `WWW-Authenticate: Bearer …`, so `claude mcp list` and any SDK client
//! fail to connect instead of reporting "connected" and failing on the
//! first tool call.
//!
//! Only those calls are checked here (one indexed lookup, no write); tool
//! calls are not, since send and poll verify the token inside their own
//! statement and an extra lookup would double their round trips. A wrong
//! token there still gets a tool error. Requests without the header are
//! not affected (tokens in arguments, registration). Each refusal counts
//! toward the per-address limit on failed authentication, as in a call.

use axum::{
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};

use super::jsonrpc::{Handshake, jsonrpc_error};
use crate::domain::{Credentials, Phone, PhoneError, Token};
use crate::mcp::ClientAddress;

/// What the Authorization header presents.
enum Presented {
    /// No header, or a bearer scheme with nothing after it (an unset
    /// template such as `Bearer ${TOKEN}`): as without a header.
    Nothing,
    Token(Token),
    Malformed(&'static str),
}

fn presented(req: &Request) -> Presented {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Presented::Nothing;
    };
    let Ok(value) = value.to_str() else {
        return Presented::Malformed("the Authorization header is not plain ASCII");
    };
    let value = value.trim();
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Presented::Malformed("the Authorization header must be 'Bearer <token>'");
    }
    if rest.trim().is_empty() {
        return Presented::Nothing;
    }
    match Token::parse(rest) {
        Ok(token) => Presented::Token(token),
        Err(_) => Presented::Malformed("the bearer token is not a phone token (phn_...)"),
    }
}

pub(super) async fn check(phone: std::sync::Arc<Phone>, req: Request, next: Next) -> Response {
    // Two tokens in one request (a client's and a proxy's, say): the tool
    // calls took the first, silently. Which agent is meant is the caller's
    // to say; every request, not only the handshake, is refused.
    if req
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        return (
            StatusCode::BAD_REQUEST,
            jsonrpc_error(
                -32600,
                "the Authorization header was sent more than once: send one, with the agent's token",
            ),
        )
            .into_response();
    }
    if req.extensions().get::<Handshake>().is_none() {
        return next.run(req).await;
    }
    let token = match presented(&req) {
        Presented::Nothing => return next.run(req).await,
        Presented::Malformed(why) => return unauthorized(why),
        Presented::Token(token) => token,
    };
    let creds = Credentials {
        token: token.hash(),
        claimed: None,
        client_address: req
            .extensions()
            .get::<ClientAddress>()
            .map(|a| a.0.clone())
            .unwrap_or_else(|| "unknown".into()),
    };
    match phone.authenticate_quietly(&creds).await {
        Ok(_) => next.run(req).await,
        Err(PhoneError::Unauthenticated(why)) => unauthorized(why),
        Err(e @ PhoneError::RateLimited { .. }) => (
            StatusCode::TOO_MANY_REQUESTS,
            jsonrpc_error(-32001, &e.to_string()),
        )
            .into_response(),
        // The database cannot answer: let the call through; a tool call
        // checks the token again.
        Err(e) => {
            tracing::warn!(error = %e, "cannot check a bearer token at the door");
            next.run(req).await
        }
    }
}

fn unauthorized(why: &str) -> Response {
    // A quoted-string of plain ASCII: no quotes or backslashes inside.
    let description: String = why
        .chars()
        .map(|c| if matches!(c, '"' | '\\') { '\'' } else { c })
        .filter(|c| c.is_ascii() && !c.is_ascii_control())
        .collect();
    let challenge = format!(
        "Bearer realm=\"phone\", error=\"invalid_token\", error_description=\"{description}\""
    );
    let mut response = (StatusCode::UNAUTHORIZED, jsonrpc_error(-32001, why)).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}
