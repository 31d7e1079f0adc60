//! The inbox as an MCP resource, `phone://inbox`: read it (a peek: it marks
//! nothing read) or, with protocol 2026-07-28, hold a `subscriptions/listen`
//! stream open on it and get `notifications/resources/updated` when mail
//! arrives, from a send on any replica. The notification carries no mail:
//! the agent reads its inbox as usual, so a lost notification loses nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    ListResourcesResult, ReadResourceRequestParams, ReadResourceResult, Resource, ResourceContents,
    SubscriptionFilter,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};

use super::args::Args;
use super::{auth, render, wire};
use crate::domain::messages::{InboxArgs, InboxRequest};
use crate::domain::{Phone, PhoneError};

pub const INBOX_URI: &str = "phone://inbox";
/// A listen stream ends (gracefully: the client listens again) after this
/// long (under Railway's 5-minute limit per request), so that no
/// connection outlives a deployment by much and proxies that cut long
/// responses cut nothing in flight.
pub const LISTEN_MAX: Duration = Duration::from_secs(4 * 60);
/// Open listen streams per token on one replica: each holds a connection
/// for minutes, past the request timeout, so one agent cannot take them all.
pub const LISTENS_PER_AGENT: usize = 4;
/// How many unread messages reading the resource shows.
const READ_LIMIT: u32 = 20;

pub fn list() -> ListResourcesResult {
    let inbox = Resource::new(INBOX_URI, "inbox")
        .with_title("Your unread mail")
        .with_description(
            "Your unread messages, oldest first (reading this marks nothing read; phone_inbox does). \
             Subscribe (subscriptions/listen) to be told when mail arrives.",
        )
        .with_mime_type("text/plain");
    ListResourcesResult::with_all_items(vec![inbox])
}

fn unknown(uri: &str) -> McpError {
    McpError::resource_not_found(
        format!(
            "no resource {:?}; this server has {INBOX_URI}",
            uri.chars().take(100).collect::<String>()
        ),
        None,
    )
}

/// Authentication errors and the like, as the JSON-RPC error a resource
/// request can carry (there is no tool result to put them in).
fn refused(e: PhoneError) -> McpError {
    match e {
        PhoneError::Internal => McpError::internal_error("internal error", None),
        other => McpError::invalid_request(other.to_string(), None),
    }
}

pub async fn read(
    phone: &Phone,
    request: ReadResourceRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<ReadResourceResult, McpError> {
    if request.uri != INBOX_URI {
        return Err(unknown(&request.uri));
    }
    let args = Args::new("resources", None, &[]).map_err(|e| refused(e.into()))?;
    let creds = auth::credentials(&args, context).map_err(refused)?;
    let req = InboxRequest::parse(
        InboxArgs {
            limit: Some(READ_LIMIT),
            peek: true,
            ..InboxArgs::default()
        },
        phone.mail_rules(),
    )
    .map_err(|e| refused(e.into()))?;
    let inbox = phone
        .inbox(&creds, req, &auth::call(context))
        .await
        .map_err(refused)?;
    let text = render::inbox(&wire::Inbox::from(inbox));
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(text, INBOX_URI).with_mime_type("text/plain"),
    ]))
}

/// Grants a subscription to the inbox and nothing else (an empty grant when
/// the inbox was not asked for: the acknowledgment says so, and the stream
/// then ends at once).
pub fn accepted(requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
    let wants_inbox = requested
        .resource_subscriptions
        .as_ref()
        .is_some_and(|uris| uris.iter().any(|u| u == INBOX_URI));
    Some(if wants_inbox {
        SubscriptionFilter::builder()
            .resource_subscriptions([INBOX_URI])
            .build()
    } else {
        SubscriptionFilter::default()
    })
}

/// Runs one listen stream: for the caller's inbox, until the client
/// cancels, the server shuts down or [`LISTEN_MAX`] passes.
pub async fn listen(
    phone: &Phone,
    listeners: &Listeners,
    subscription: SubscriptionContext,
) -> Result<(), McpError> {
    let context = subscription.request_context();
    let watches_inbox = subscription
        .accepted()
        .resource_subscriptions
        .as_ref()
        .is_some_and(|uris| uris.iter().any(|u| u == INBOX_URI));
    if !watches_inbox {
        // Nothing granted, nothing to send: end the stream gracefully.
        return Ok(());
    }
    let args = Args::new("resources", None, &[]).map_err(|e| refused(e.into()))?;
    let creds = auth::credentials(&args, context).map_err(refused)?;
    let Some(_slot) = listeners.enter(creds.token.0) else {
        return Err(McpError::invalid_request(
            format!(
                "this agent already has {LISTENS_PER_AGENT} subscriptions/listen streams open on this server; close one first"
            ),
            None,
        ));
    };
    let sink = subscription.sink().clone();
    let until = tokio::time::Instant::now() + LISTEN_MAX;
    phone
        .watch_inbox(&creds, &context.ct, until, || {
            let sink = sink.clone();
            async move { sink.notify_resource_updated(INBOX_URI).await.is_ok() }
        })
        .await
        .map_err(refused)
}

/// Listen streams open on this replica, per token digest.
#[derive(Default)]
pub struct Listeners(Arc<Mutex<HashMap<[u8; 32], usize>>>);

/// One stream's place; freed when dropped.
pub struct ListenSlot {
    open: Arc<Mutex<HashMap<[u8; 32], usize>>>,
    key: [u8; 32],
}

impl Listeners {
    fn enter(&self, key: [u8; 32]) -> Option<ListenSlot> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key).or_default();
        if *n >= LISTENS_PER_AGENT {
            return None;
        }
        *n += 1;
        Some(ListenSlot {
            open: self.0.clone(),
            key,
        })
    }
}

impl Drop for ListenSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}
