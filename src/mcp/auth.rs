//! Who is calling: the presented credentials (a `token` argument or an
//! `Authorization: Bearer` header, and an optional `name`), and the
//! caller's network address that the HTTP layer determined.

use std::sync::Arc;

use rmcp::service::{RequestContext, RoleServer};

use super::args::Args;
use crate::domain::{
    AgentName, Call, Caller, Credentials, Hangup, InvalidInput, Phone, PhoneError, Token,
    handover::Handover,
};

/// The caller's network address as the HTTP layer determined it (behind a
/// trusted proxy, from the proxy's header), for rate limits. Put into the
/// request's extensions by the HTTP layer.
#[derive(Debug, Clone)]
pub struct ClientAddress(pub String);

/// When the answer must be on its way (a margin before the request times
/// out). Put into the request's extensions by the HTTP layer.
#[derive(Debug, Clone, Copy)]
pub struct RequestDeadline(pub tokio::time::Instant);

/// The request this call arrives in: rmcp cancels the context's token when
/// the client disconnects or the request's future is dropped (the request
/// timed out) before the answer, and the HTTP layer sets the deadline.
pub(super) fn call(context: &RequestContext<RoleServer>) -> Call {
    let parts = context.extensions.get::<http::request::Parts>();
    Call {
        gone: context.ct.clone(),
        deadline: parts
            .and_then(|parts| parts.extensions.get::<RequestDeadline>())
            .map(|d| d.0),
        handover: parts.and_then(|parts| parts.extensions.get::<Arc<Handover>>().cloned()),
        hangup: parts.and_then(|parts| parts.extensions.get::<Arc<dyn Hangup>>().cloned()),
    }
}

/// Identity comes from the token only: from the `token` argument or an
/// `Authorization: Bearer` header. A `name`, when given, must match it.
/// Checks the token first (one query), for the tools off the hot path.
pub(super) async fn authenticate(
    phone: &Phone,
    args: &Args<'_>,
    context: &RequestContext<RoleServer>,
) -> Result<Caller, PhoneError> {
    let creds = credentials(args, context)?;
    let caller = phone.authenticate(&creds).await?;
    tracing::Span::current().record("agent", caller.name.as_str());
    Ok(caller)
}

/// The presented credentials, parsed but not yet verified: send and inbox
/// verify them inside their own statement.
pub(super) fn credentials(
    args: &Args<'_>,
    context: &RequestContext<RoleServer>,
) -> Result<Credentials, PhoneError> {
    let claimed = args
        .str("name")?
        .map(|n| AgentName::parse("name", n))
        .transpose()?;
    let from_args = args.str("token")?.map(Token::parse).transpose()?;
    let from_header = bearer_token(context)?;
    let token = match (from_args, from_header) {
        (Some(a), Some(h)) if a.hash() != h.hash() => {
            return Err(PhoneError::Unauthenticated(
                "the `token` argument and the Authorization header carry different tokens; send only one",
            ));
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => {
            return Err(PhoneError::Unauthenticated(
                "authentication required: pass `name` and `token` from phone_register, or an Authorization: Bearer header",
            ));
        }
    };
    Ok(Credentials {
        token: token.hash(),
        claimed,
        client_address: client_address(context),
    })
}

/// The address the HTTP layer put into the request (`unknown` without one,
/// as when the server is driven without HTTP).
pub(super) fn client_address(context: &RequestContext<RoleServer>) -> String {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<ClientAddress>())
        .map(|a| a.0.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// After a call verified `creds`, the claimed name (if any) is the agent's.
pub(super) fn record_agent(creds: &Credentials) {
    if let Some(name) = &creds.claimed {
        tracing::Span::current().record("agent", name.as_str());
    }
}

fn bearer_token(context: &RequestContext<RoleServer>) -> Result<Option<Token>, PhoneError> {
    let Some(parts) = context.extensions.get::<http::request::Parts>() else {
        return Ok(None);
    };
    let Some(value) = parts.headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| {
        InvalidInput::new(
            "Authorization",
            "header is not plain ASCII; expected Bearer <token>",
        )
    })?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(InvalidInput::new("Authorization", "header must be 'Bearer <token>'").into());
    }
    // `Bearer` and nothing: a template whose token was unset (a Claude Code
    // plugin without its token option), as if there were no header.
    if token.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(Token::parse(token)?))
}
