//! The MCP tool surface: thin. Parse arguments, authenticate, call the
//! domain, render. Domain errors become tool errors in `tool_error`.

mod args;
mod render;
pub mod tools;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde::Serialize;
use tracing::Instrument;

use crate::domain::agents::{RegisterRequest, SearchRequest};
use crate::domain::messages::{self, InboxRequest, SendRequest};
use crate::domain::{
    AgentName, Caller, Credentials, InvalidInput, MessageId, Phone, PhoneError, Token,
};
use args::Args;

/// Where the caller's address comes from, for rate limits.
#[derive(Debug, Clone)]
pub enum ClientAddressFrom {
    Peer,
    /// The last X-Forwarded-For entry (the one the trusted proxy appended).
    ForwardedFor,
    /// A header the trusted proxy sets, e.g. X-Real-IP.
    Header(http::HeaderName),
}

impl ClientAddressFrom {
    pub fn from_config(config: &crate::config::Config) -> Self {
        match (&config.client_ip_header, config.trust_forwarded_for) {
            (Some(name), _) => Self::Header(name.clone()),
            (None, true) => Self::ForwardedFor,
            (None, false) => Self::Peer,
        }
    }
}

/// Built once; every request's handler is an `Arc` clone of it.
pub struct Surface {
    phone: Phone,
    client_address_from: ClientAddressFrom,
    tools: Vec<Tool>,
    info: ServerConfig,
}

#[derive(Clone)]
pub struct PhoneServer(Arc<Surface>);

impl PhoneServer {
    pub fn new(phone: Phone, client_address_from: ClientAddressFrom) -> Self {
        let info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("phone", env!("CARGO_PKG_VERSION"))
                    .with_title("phone: mailbox and address book for AI agents"),
            )
            .with_instructions(tools::INSTRUCTIONS);
        Self(Arc::new(Surface {
            phone,
            client_address_from,
            tools: tools::definitions(),
            info,
        }))
    }

    pub fn tools(&self) -> &[Tool] {
        &self.0.tools
    }
}

impl ServerHandler for PhoneServer {
    fn get_info(&self) -> ServerConfig {
        self.0.info.clone()
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.0.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.as_ref();
        if !self.0.tools.iter().any(|t| t.name == name) {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool '{}'; this server has: {}",
                    name.chars().take(64).collect::<String>(),
                    self.0
                        .tools
                        .iter()
                        .map(|t| t.name.as_ref())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None,
            ));
        }
        let started = std::time::Instant::now();
        let span = tracing::info_span!(
            "tool",
            otel.name = %format_args!("tools/call {name}"),
            otel.status_code = tracing::field::Empty,
            tool = %name,
            agent = tracing::field::Empty,
            outcome = tracing::field::Empty,
            error.kind = tracing::field::Empty
        );
        let result = self
            .dispatch(&request, &context)
            .instrument(span.clone())
            .await;
        let mut error_kind = None;
        let result = match result {
            Ok(result) => {
                span.record("outcome", "ok");
                result
            }
            Err(err) => {
                span.record("outcome", "error");
                span.record("error.kind", err.kind());
                if matches!(err, PhoneError::Internal | PhoneError::Unavailable(_)) {
                    span.record("otel.status_code", "error");
                }
                error_kind = Some(err.kind());
                tool_error(&err)
            }
        };
        crate::metrics::tool_call(&request, &result, error_kind, started.elapsed());
        Ok(result.into())
    }
}

impl PhoneServer {
    async fn dispatch(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, PhoneError> {
        let phone = &self.0.phone;
        let arguments = request.arguments.as_ref();
        match request.name.as_ref() {
            tools::REGISTER => {
                let args = Args::new(tools::REGISTER, arguments, tools::REGISTER_ARGS)?;
                let req = RegisterRequest::parse(
                    args.required_str("name")?,
                    args.required_str("description")?,
                    args.required_str("project")?,
                    args.str("token")?,
                )?;
                tracing::Span::current().record("agent", req.name.as_str());
                let out = phone.register(req, &self.client_address(context)).await?;
                Ok(success(&out, render::registration(&out)))
            }
            tools::SEARCH => {
                let args = Args::new(tools::SEARCH, arguments, tools::SEARCH_ARGS)?;
                let req = SearchRequest::parse(
                    args.str("query")?,
                    args.str("project")?,
                    args.int("limit", 1, crate::domain::agents::SEARCH_LIMIT_MAX)?,
                    args.str("cursor")?,
                )?;
                let out = phone.search(req).await?;
                Ok(success(&out, render::search(&out)))
            }
            tools::SEND => {
                let args = Args::new(tools::SEND, arguments, tools::SEND_ARGS)?;
                let req = SendRequest::parse(
                    args.str("to")?,
                    args.required_str("body")?,
                    args.str("subject")?,
                    args.str("reply_to")?,
                    args.str("idempotency_key")?,
                )?;
                let creds = self.credentials(&args, context)?;
                let out = phone.send(&creds, req).await?;
                record_agent(&creds);
                Ok(success(&out, render::sent(&out)))
            }
            tools::INBOX => {
                let args = Args::new(tools::INBOX, arguments, tools::INBOX_ARGS)?;
                let req = InboxRequest::parse(
                    args.int("limit", 1, messages::INBOX_LIMIT_MAX)?,
                    args.bool("peek")?,
                    args.bool("include_read")?,
                    args.str("mode")?,
                    args.int("lease_seconds", 1, messages::LEASE_SECONDS_MAX)?,
                    args.int("wait_seconds", 0, messages::WAIT_SECONDS_MAX)?,
                )?;
                let creds = self.credentials(&args, context)?;
                let out = phone.inbox(&creds, req).await?;
                record_agent(&creds);
                Ok(success(&out, render::inbox(&out)))
            }
            tools::ACK => {
                let args = Args::new(tools::ACK, arguments, tools::ACK_ARGS)?;
                let ids = messages::parse_ack_ids(&args.str_list("ids")?)?;
                let me = self.authenticate(&args, context).await?;
                let out = phone.ack(&me, &ids).await?;
                Ok(success(&out, render::acked(&out)))
            }
            tools::OUTBOX => {
                let args = Args::new(tools::OUTBOX, arguments, tools::OUTBOX_ARGS)?;
                let limit = args
                    .int("limit", 1, messages::LIST_LIMIT_MAX)?
                    .unwrap_or(20);
                let before = args
                    .str("cursor")?
                    .map(messages::decode_cursor)
                    .transpose()?;
                let me = self.authenticate(&args, context).await?;
                let out = phone.outbox(&me, limit, before).await?;
                Ok(success(&out, render::outbox(&out)))
            }
            tools::THREAD => {
                let args = Args::new(tools::THREAD, arguments, tools::THREAD_ARGS)?;
                let message_id = MessageId::parse("message_id", args.required_str("message_id")?)?;
                let limit = args
                    .int("limit", 1, messages::LIST_LIMIT_MAX)?
                    .unwrap_or(50);
                let after = args
                    .str("cursor")?
                    .map(messages::decode_cursor)
                    .transpose()?;
                let me = self.authenticate(&args, context).await?;
                let out = phone.thread(&me, message_id, limit, after).await?;
                Ok(success(&out, render::thread(&out)))
            }
            tools::ROTATE => {
                let args = Args::new(tools::ROTATE, arguments, tools::AUTH_ARGS)?;
                let me = self.authenticate(&args, context).await?;
                let out = phone.rotate_token(&me).await?;
                Ok(success(&out, render::rotated(&out)))
            }
            tools::UNREGISTER => {
                let args = Args::new(tools::UNREGISTER, arguments, tools::AUTH_ARGS)?;
                let me = self.authenticate(&args, context).await?;
                let out = phone.unregister(&me).await?;
                Ok(success(&out, render::unregistered(&out)))
            }
            _ => Err(PhoneError::Internal),
        }
    }

    /// Identity comes from the token only: from the `token` argument or an
    /// `Authorization: Bearer` header. A `name`, when given, must match it.
    /// Checks the token first (one query), for the tools off the hot path.
    async fn authenticate(
        &self,
        args: &Args<'_>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Caller, PhoneError> {
        let creds = self.credentials(args, context)?;
        let caller = self.0.phone.authenticate(&creds).await?;
        tracing::Span::current().record("agent", caller.name.as_str());
        Ok(caller)
    }

    /// The presented credentials, parsed but not yet verified: send and
    /// inbox verify them inside their own statement.
    fn credentials(
        &self,
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
            client_address: self.client_address(context),
        })
    }
}

impl PhoneServer {
    /// The caller's network address, for rate limits: the peer address, or
    /// behind a trusted proxy the last `X-Forwarded-For` entry (the one the
    /// proxy itself appended; earlier entries are the client's to forge).
    fn client_address(&self, context: &RequestContext<RoleServer>) -> String {
        let Some(parts) = context.extensions.get::<http::request::Parts>() else {
            return "unknown".into();
        };
        let from_header = |name: &http::HeaderName, last_entry: bool| {
            let value = parts.headers.get(name)?.to_str().ok()?;
            let value = if last_entry {
                value.rsplit(',').next()?
            } else {
                value
            };
            Some(value.trim().to_owned()).filter(|v| !v.is_empty())
        };
        let proxied = match &self.0.client_address_from {
            ClientAddressFrom::Peer => None,
            ClientAddressFrom::ForwardedFor => {
                from_header(&http::HeaderName::from_static("x-forwarded-for"), true)
            }
            ClientAddressFrom::Header(name) => from_header(name, false),
        };
        if let Some(address) = proxied {
            return address;
        }
        parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0.ip().to_string())
            .unwrap_or_else(|| "unknown".into())
    }
}

/// After a call verified `creds`, the claimed name (if any) is the agent's.
fn record_agent(creds: &Credentials) {
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
    Ok(Some(Token::parse(token)?))
}

fn success<T: Serialize>(value: &T, text: String) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(serde_json::to_value(value).expect("tool outputs serialize"));
    result
}

/// The one place where domain errors become what the agent reads.
fn tool_error(err: &PhoneError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(err.to_string())])
}
