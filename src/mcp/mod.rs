//! The MCP tool surface, thin: parse the arguments (`args`), authenticate
//! (`auth`), call the domain, answer with wire types (`wire`) and their text
//! rendering (`render`). Domain errors become tool errors in one place
//! (`errors`). The tool definitions a model reads are in `tools`.

mod args;
mod auth;
mod errors;
mod render;
pub mod resources;
pub mod tools;
pub mod wire;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    InitializeRequestParams, InitializeResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData as McpError, ServerHandler};
use tracing::Instrument;

use crate::domain::agents::RegisterRequest;
use crate::domain::mail_search::MailSearch;
use crate::domain::messages::{self, InboxArgs, InboxMode, InboxRequest, SendRequest};
use crate::domain::search::{SEARCH_LIMIT_MAX, SearchRequest};
use crate::domain::send;
use crate::domain::settings::SettingsRequest;
use crate::domain::{InvalidInput, MessageId, Phone, PhoneError};
use crate::telemetry::metrics;
use args::Args;
pub use auth::{ClientAddress, RequestDeadline};
use errors::{success, tool_error};

/// Built once; every request's handler is an `Arc` clone of it.
pub struct Surface {
    phone: Phone,
    listeners: resources::Listeners,
    tools: Vec<Tool>,
    info: ServerConfig,
}

#[derive(Clone)]
pub struct PhoneServer(Arc<Surface>);

impl PhoneServer {
    pub fn new(phone: Phone) -> Self {
        let info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
        )
        .with_server_info(
            Implementation::new("phone", env!("CARGO_PKG_VERSION"))
                .with_title("phone: mailbox and address book for AI agents"),
        )
        .with_instructions(tools::INSTRUCTIONS);
        let tools = tools::definitions(phone.mail_rules());
        Self(Arc::new(Surface {
            phone,
            listeners: resources::Listeners::default(),
            tools,
            info,
        }))
    }

    pub fn tools(&self) -> &[Tool] {
        &self.0.tools
    }
}

/// What a successful call delivered, for the message counters.
#[derive(Default)]
struct Delivered {
    sent: u64,
    read: Option<(&'static str, u64)>,
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

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // Only protocol versions with this handshake have resources/subscribe,
        // which needs a session these replicas do not keep; subscriptions
        // (subscriptions/listen) are 2026-07-28's, which has no initialize.
        if let Some(resources) = result.capabilities.resources.as_mut() {
            resources.subscribe = None;
        }
        Ok(result)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(resources::list())
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        resources::read(&self.0.phone, request, &context)
            .await
            .map(Into::into)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        resources::accepted(requested)
    }

    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        resources::listen(&self.0.phone, &self.0.listeners, subscription).await
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(tool) = tools::NAMES
            .iter()
            .copied()
            .find(|t| *t == request.name.as_ref())
        else {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool '{}'; this server has: {}",
                    request.name.chars().take(64).collect::<String>(),
                    tools::NAMES.join(", ")
                ),
                None,
            ));
        };
        let started = std::time::Instant::now();
        let span = tracing::info_span!(
            "tool",
            otel.name = %format_args!("tools/call {tool}"),
            otel.status_code = tracing::field::Empty,
            tool = %tool,
            agent = tracing::field::Empty,
            outcome = tracing::field::Empty,
            error.kind = tracing::field::Empty
        );
        let outcome = self
            .dispatch(tool, &request, &context)
            .instrument(span.clone())
            .await;
        let (result, call) = match outcome {
            Ok((result, delivered)) => {
                span.record("outcome", "ok");
                let call = metrics::ToolCall {
                    tool,
                    error_kind: None,
                    messages_sent: delivered.sent,
                    messages_read: delivered.read,
                };
                (result, call)
            }
            Err(err) => {
                span.record("outcome", "error");
                span.record("error.kind", err.kind());
                if matches!(err, PhoneError::Internal | PhoneError::Unavailable(_)) {
                    span.record("otel.status_code", "error");
                }
                let call = metrics::ToolCall {
                    tool,
                    error_kind: Some(err.kind()),
                    messages_sent: 0,
                    messages_read: None,
                };
                (tool_error(&err), call)
            }
        };
        metrics::tool_call(call, started.elapsed());
        Ok(result.into())
    }
}

/// An answer's text, with the line that says where the rest are when it
/// stopped at its byte budget.
fn noting_cut(mut text: String, cut: bool, rest: render::Rest) -> String {
    if cut {
        text.push_str(&render::answer_full(messages::ANSWER_BYTES_MAX, rest));
    }
    text
}

impl PhoneServer {
    /// phone_inbox with `query`: a search of the caller's own mail, which
    /// takes nothing and so combines with none of a poll's arguments.
    async fn search_mail(
        &self,
        args: &Args<'_>,
        query: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(CallToolResult, Delivered), PhoneError> {
        for key in [
            "peek",
            "include_read",
            "mode",
            "lease_seconds",
            "max_deliveries",
            "wait_seconds",
            "ack",
        ] {
            if args.is_given(key) {
                return Err(InvalidInput::new(
                    "query",
                    format!(
                        "searches your mail and takes nothing; drop {key}, or drop query to poll"
                    ),
                )
                .into());
            }
        }
        let search = MailSearch::parse(
            query,
            args.int("limit", 1, messages::LIST_LIMIT_MAX)?
                .unwrap_or(10),
            args.str("cursor")?,
        )?;
        let creds = auth::credentials(args, context)?;
        let found = self.0.phone.search_mail(&creds, &search).await?;
        auth::record_agent(&creds);
        let full = found.inbox.full;
        let out = wire::Inbox::from(found);
        let text = noting_cut(render::found(&out), full, render::Rest::Cursor);
        Ok((success(&out, text), Delivered::default()))
    }

    async fn dispatch(
        &self,
        tool: &'static str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<(CallToolResult, Delivered), PhoneError> {
        let phone = &self.0.phone;
        let arguments = request.arguments.as_ref();
        let nothing = Delivered::default;
        match tool {
            tools::REGISTER => {
                let args = Args::new(tool, arguments, tools::REGISTER_ARGS)?;
                let req = RegisterRequest::parse(
                    args.required_str("name")?,
                    args.required_str("description")?,
                    args.required_str("project")?,
                    args.str("token")?,
                )?;
                tracing::Span::current().record("agent", req.name.as_str());
                let out = wire::Registration::from(
                    phone.register(req, &auth::client_address(context)).await?,
                );
                Ok((success(&out, render::registration(&out)), nothing()))
            }
            tools::SEARCH => {
                let args = Args::new(tool, arguments, tools::SEARCH_ARGS)?;
                let req = SearchRequest::parse(
                    args.str("query")?,
                    args.str("project")?,
                    args.int("limit", 1, SEARCH_LIMIT_MAX)?,
                    args.str("cursor")?,
                )?;
                let out = wire::SearchResult::from(phone.search(req).await?);
                Ok((success(&out, render::search(&out)), nothing()))
            }
            tools::SEND => {
                let args = Args::new(tool, arguments, tools::SEND_ARGS)?;
                let req = SendRequest::parse_to(
                    &args.str_list("to")?,
                    args.required_str("body")?,
                    args.str("subject")?,
                    args.str("reply_to")?,
                    args.str("idempotency_key")?,
                    args.int("expires_in", 1, send::EXPIRES_IN_MAX)?,
                )?;
                let creds = auth::credentials(&args, context)?;
                let sent = phone.send(&creds, req, &auth::call(context)).await?;
                auth::record_agent(&creds);
                let stored = if sent.copies.is_empty() {
                    1
                } else {
                    sent.copies.iter().filter(|c| c.id.is_some()).count() as u64
                };
                let delivered = Delivered {
                    sent: if sent.replayed { 0 } else { stored },
                    read: None,
                };
                let out = wire::Sent::from(sent);
                Ok((success(&out, render::sent(&out)), delivered))
            }
            tools::INBOX => {
                let args = Args::new(tool, arguments, tools::INBOX_ARGS)?;
                if let Some(query) = args.str("query")? {
                    return self.search_mail(&args, query, context).await;
                }
                let rules = phone.mail_rules();
                let req = InboxRequest::parse(
                    InboxArgs {
                        limit: args.int("limit", 1, messages::INBOX_LIMIT_MAX)?,
                        peek: args.bool("peek")?,
                        include_read: args.bool("include_read")?,
                        mode: args.str("mode")?,
                        lease_seconds: args.int("lease_seconds", 1, messages::LEASE_SECONDS_MAX)?,
                        max_deliveries: args.int(
                            "max_deliveries",
                            1,
                            messages::MAX_DELIVERIES_MAX,
                        )?,
                        wait_seconds: args.int("wait_seconds", 0, rules.max_wait_secs)?,
                        cursor: args.str("cursor")?,
                    },
                    rules,
                )?;
                let acks = messages::parse_inbox_acks(&args.str_list("ack")?, req.mode)?;
                let creds = auth::credentials(&args, context)?;
                let call = auth::call(context);
                let mut inbox = phone.inbox_acking(&creds, req, &acks, &call).await?;
                let acked = inbox.acked.take();
                let full = inbox.full;
                auth::record_agent(&creds);
                let n = inbox.messages.len() as u64;
                let read = match req.mode {
                    InboxMode::Read => Some(("read", n)),
                    InboxMode::Lease { .. } => Some(("lease", n)),
                    InboxMode::Peek | InboxMode::History { .. } => None,
                };
                let mut out = wire::Inbox::from(inbox);
                if req.mode == InboxMode::Read {
                    out = out.read_poll();
                }
                out.acks = acked.map(wire::InboxAcks::from);
                // A poll that takes mail leaves the rest unread; a page of
                // include_read goes on with its cursor (a peek is not cut).
                let rest = match req.mode {
                    InboxMode::Read | InboxMode::Lease { .. } => render::Rest::Unread,
                    InboxMode::Peek | InboxMode::History { .. } => render::Rest::Cursor,
                };
                let text = noting_cut(render::inbox(&out), full, rest);
                Ok((success(&out, text), Delivered { sent: 0, read }))
            }
            tools::ACK => {
                let args = Args::new(tool, arguments, tools::ACK_ARGS)?;
                let ids = messages::parse_ack_ids(&args.str_list("ids")?)?;
                let creds = auth::credentials(&args, context)?;
                let out = wire::Acked::from(phone.ack(&creds, &ids).await?);
                auth::record_agent(&creds);
                Ok((success(&out, render::acked(&out)), nothing()))
            }
            tools::OUTBOX => {
                let args = Args::new(tool, arguments, tools::OUTBOX_ARGS)?;
                let limit = args
                    .int("limit", 1, messages::LIST_LIMIT_MAX)?
                    .unwrap_or(20);
                let before = args
                    .str("cursor")?
                    .map(messages::decode_cursor)
                    .transpose()?;
                let me = auth::authenticate(phone, &args, context).await?;
                let mut outbox = phone.outbox(&me, limit, before).await?;
                let full = outbox.fit_answer();
                let out = wire::Outbox::from(outbox);
                let text = noting_cut(render::outbox(&out), full, render::Rest::Cursor);
                Ok((success(&out, text), nothing()))
            }
            tools::THREAD => {
                let args = Args::new(tool, arguments, tools::THREAD_ARGS)?;
                let message_id = MessageId::parse("message_id", args.required_str("message_id")?)?;
                let limit = args
                    .int("limit", 1, messages::LIST_LIMIT_MAX)?
                    .unwrap_or(50);
                let after = args
                    .str("cursor")?
                    .map(messages::decode_cursor)
                    .transpose()?;
                let me = auth::authenticate(phone, &args, context).await?;
                let mut thread = phone.thread(&me, message_id, limit, after).await?;
                let full = thread.fit_answer();
                let out = wire::Thread::from(thread);
                let text = noting_cut(render::thread(&out), full, render::Rest::Cursor);
                Ok((success(&out, text), nothing()))
            }
            tools::SETTINGS => {
                let args = Args::new(tool, arguments, tools::SETTINGS_ARGS)?;
                let me = auth::authenticate(phone, &args, context).await?;
                let req = SettingsRequest::parse(
                    &me.name,
                    args.str("contact_policy")?,
                    args.opt_bool("listed")?,
                    &args.str_list("allow")?,
                    &args.str_list("disallow")?,
                    &args.str_list("block")?,
                    &args.str_list("unblock")?,
                    args.str("cursor")?,
                    args.str("webhook_url")?,
                    args.bool("rotate_webhook_secret")?,
                    phone.mail_rules().webhooks_allow_private,
                )?;
                let out = wire::Settings::from(phone.settings(&me, req).await?);
                Ok((success(&out, render::settings(&out)), nothing()))
            }
            tools::ROTATE => {
                let args = Args::new(tool, arguments, tools::AUTH_ARGS)?;
                let me = auth::authenticate(phone, &args, context).await?;
                let out = wire::Rotated::from(phone.rotate_token(&me).await?);
                Ok((success(&out, render::rotated(&out)), nothing()))
            }
            tools::UNREGISTER => {
                let args = Args::new(tool, arguments, tools::AUTH_ARGS)?;
                let me = auth::authenticate(phone, &args, context).await?;
                let out = wire::Unregistered::from(phone.unregister(&me).await?);
                Ok((success(&out, render::unregistered(&out)), nothing()))
            }
            _ => Err(PhoneError::Internal),
        }
    }
}
