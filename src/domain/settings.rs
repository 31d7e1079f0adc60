//! An agent's own settings: who may start a conversation with it (contact
//! policy, contacts, blocks) and whether the directory lists it.

use base64::Engine as _;

use super::types::{AgentName, InvalidInput};
use super::webhook::{WebhookUrl, new_secret};
use super::{Caller, Phone, PhoneError};
use crate::store::{self, settings::Mark};

/// Who may start a conversation with an agent. Whatever the policy, an
/// agent may answer a message the recipient sent it; a block wins over all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContactPolicy {
    /// Anyone (the default).
    Open,
    /// Agents of the same project, and contacts.
    Project,
    /// Contacts only.
    Contacts,
    /// No one starts a new conversation.
    Closed,
}

impl ContactPolicy {
    pub const NAMES: [&'static str; 4] = ["open", "project", "contacts", "closed"];

    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        match raw.trim() {
            "open" => Ok(Self::Open),
            "project" => Ok(Self::Project),
            "contacts" => Ok(Self::Contacts),
            "closed" => Ok(Self::Closed),
            other => Err(InvalidInput::new(
                "contact_policy",
                format!(
                    "must be one of {}; got {:?}",
                    Self::NAMES.join(", "),
                    other.chars().take(40).collect::<String>()
                ),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// Names changed by one call, at most.
pub const MARKS_MAX: usize = 100;
/// Names of each list shown per page.
pub const LIST_PAGE: i64 = 50;

#[derive(Debug, Clone, Default)]
pub struct SettingsRequest {
    pub contact_policy: Option<ContactPolicy>,
    pub listed: Option<bool>,
    /// Names to mark, in order: allow, disallow, block, unblock.
    pub marks: Vec<(AgentName, Mark)>,
    /// Where the lists continue (`next_cursor` of the previous answer).
    pub after: Option<(String, String)>,
    /// `Some(Some(url))` sets the webhook, `Some(None)` clears it.
    pub webhook: Option<Option<WebhookUrl>>,
    pub rotate_webhook_secret: bool,
}

impl SettingsRequest {
    #[allow(clippy::too_many_arguments)]
    pub fn parse(
        me: &AgentName,
        contact_policy: Option<&str>,
        listed: Option<bool>,
        allow: &[&str],
        disallow: &[&str],
        block: &[&str],
        unblock: &[&str],
        cursor: Option<&str>,
        webhook_url: Option<&str>,
        rotate_webhook_secret: bool,
        allow_private: bool,
    ) -> Result<Self, InvalidInput> {
        let mut marks = Vec::new();
        for (field, names, mark) in [
            ("allow", allow, Mark::Allow),
            ("disallow", disallow, Mark::Disallow),
            ("block", block, Mark::Block),
            ("unblock", unblock, Mark::Unblock),
        ] {
            for raw in names {
                let name = AgentName::parse(field, raw)?;
                if &name == me && matches!(mark, Mark::Allow | Mark::Block) {
                    return Err(InvalidInput::new(
                        field,
                        "names yourself; contacts and blocks are about other agents",
                    ));
                }
                marks.push((name, mark));
            }
        }
        if marks.len() > MARKS_MAX {
            return Err(InvalidInput::new(
                "allow",
                format!(
                    "with disallow, block and unblock lists {} names; change at most {MARKS_MAX} per call",
                    marks.len()
                ),
            ));
        }
        Ok(Self {
            contact_policy: contact_policy.map(ContactPolicy::parse).transpose()?,
            listed,
            marks,
            after: cursor.map(decode_cursor).transpose()?,
            webhook: match webhook_url {
                None => None,
                Some(raw) if raw.trim().is_empty() => Some(None),
                Some(raw) => Some(Some(WebhookUrl::parse(raw, allow_private)?)),
            },
            rotate_webhook_secret,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub contact_policy: String,
    pub listed: bool,
    /// A page of contacts and of blocked agents, by name.
    pub contacts: Vec<String>,
    pub blocked: Vec<String>,
    pub contacts_total: i64,
    pub blocked_total: i64,
    /// Pass back as `cursor` for the next page of both lists.
    pub next_cursor: Option<String>,
    /// Names this call could not mark: no such registered agent.
    pub unknown: Vec<String>,
    pub webhook_url: Option<String>,
    /// The webhook receives deliveries (false after a 410 Gone).
    pub webhook_active: bool,
    /// Shown once: when a webhook is first set, or its secret rotated.
    pub webhook_secret: Option<String>,
}

fn encode_cursor(contacts_after: &str, blocked_after: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("c:{contacts_after}\nb:{blocked_after}"))
}

fn decode_cursor(raw: &str) -> Result<(String, String), InvalidInput> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            let (c, b) = s.split_once('\n')?;
            // Each part is empty or a name this server issued: anything else
            // is forged (a NUL byte reached PostgreSQL as "internal error").
            let part = |p: &str| -> Option<String> {
                (p.is_empty() || AgentName::parse("cursor", p).is_ok_and(|n| n.as_str() == p))
                    .then(|| p.to_owned())
            };
            Some((part(c.strip_prefix("c:")?)?, part(b.strip_prefix("b:")?)?))
        })
        .ok_or_else(|| {
            InvalidInput::new(
                "cursor",
                "is not a cursor from this server; pass next_cursor back unchanged",
            )
        })
}

/// Webhook changes (a URL set or cleared, a secret rotated) an agent may
/// make per hour: each names a host to look up and a destination to call.
pub const WEBHOOK_CHANGES_PER_HOUR: u32 = 10;
const WEBHOOK_CHANGES: &str = "webhook changes by this agent";

impl Phone {
    /// Applies what the request changes, in one transaction (a new secret
    /// is shown, or it is not stored), then shows the settings.
    pub async fn settings(
        &self,
        me: &Caller,
        req: SettingsRequest,
    ) -> Result<Settings, PhoneError> {
        let changes_webhook = req.webhook.is_some() || req.rotate_webhook_secret;
        // Switching webhooks off names no host and no destination: never
        // limited (an agent over the limit could not stop a receiver that
        // misbehaved, for up to an hour).
        let switches_off = matches!(req.webhook, Some(None)) && !req.rotate_webhook_secret;
        if changes_webhook && !switches_off {
            let bucket = format!("webhook:agent:{}", me.id);
            self.check_block(&bucket, WEBHOOK_CHANGES)?;
            self.count(
                bucket,
                std::time::Duration::from_secs(3600),
                WEBHOOK_CHANGES_PER_HOUR,
                WEBHOOK_CHANGES,
            )
            .await?;
        }
        if let Some(Some(url)) = &req.webhook {
            // Checked now (and before every delivery): a host that resolves
            // to a private address is refused. Before taking a connection,
            // by a resolver with its own timeouts (no thread held).
            let allow_private = self.mail_rules().webhooks_allow_private;
            if let Err(reason) = url.destination(&self.resolver, allow_private).await {
                return Err(
                    InvalidInput::new("webhook_url", format!("is refused: {reason}")).into(),
                );
            }
        }
        let db = self.store.db().await?;
        let (webhook_secret, unknown) = db
            .transaction(async |db| {
                let changes = changes_webhook
                    || req.contact_policy.is_some()
                    || req.listed.is_some()
                    || !req.marks.is_empty();
                // Marks first, before anything locks the agent's row: a
                // block waits for mail a poll holds, and that poll then for
                // the agent's row (its presence). With the row locked first
                // (a policy, listing or webhook change in the same call),
                // the two deadlocked (an outsider's attack on the fixes).
                let mut unknown = Vec::new();
                if !req.marks.is_empty() {
                    let marks: Vec<(String, Mark)> = req
                        .marks
                        .iter()
                        .map(|(n, m)| (n.as_str().to_owned(), *m))
                        .collect();
                    let matched = store::settings::mark(db, me.id, &marks).await?;
                    for (name, _) in &req.marks {
                        if name != &me.name
                            && !matched.iter().any(|m| m == name.as_str())
                            && !unknown.iter().any(|u| u == name.as_str())
                        {
                            unknown.push(name.to_string());
                        }
                    }
                }
                let mut webhook_secret = None;
                if changes_webhook {
                    let current = store::webhooks::lock_webhook(db, me.id).await?;
                    let url = match &req.webhook {
                        Some(Some(url)) => Some((url.as_str().to_owned(), url.destination_key())),
                        Some(None) => None,
                        None => current.url.as_deref().and_then(|u| {
                            WebhookUrl::parse(u, true)
                                .ok()
                                .map(|parsed| (u.to_owned(), parsed.destination_key()))
                        }),
                    };
                    if url.is_none() && req.rotate_webhook_secret {
                        return Err(InvalidInput::new(
                            "rotate_webhook_secret",
                            "needs a webhook_url, set now or before",
                        )
                        .into());
                    }
                    let needs_secret =
                        url.is_some() && (req.rotate_webhook_secret || !current.has_secret);
                    let secret = needs_secret.then(new_secret);
                    store::webhooks::set_webhook(
                        db,
                        me.id,
                        url.as_ref().map(|(u, h)| (u.as_str(), h.as_str())),
                        secret.as_deref(),
                    )
                    .await?;
                    webhook_secret = secret;
                }
                if req.contact_policy.is_some() || req.listed.is_some() {
                    store::settings::set_policy(
                        db,
                        me.id,
                        req.contact_policy.map(ContactPolicy::as_str),
                        req.listed,
                    )
                    .await?;
                }
                // The token verified before (and before a webhook host's
                // lookup, seconds long) must still be the agent's as the
                // changes commit, or they are undone: a call in flight with
                // a token just rotated away changed its new holder's
                // settings. Checked last, with the row locked to the commit
                // (a rotation waits, or is waited for and seen).
                if changes && !store::agents::lock_holder(db, me.id, me.token.as_bytes()).await? {
                    return Err(PhoneError::Unauthenticated(super::agents::TOKEN_CHANGED));
                }
                Ok::<_, PhoneError>((webhook_secret, unknown))
            })
            .await?;
        let blocked: Vec<&str> = req
            .marks
            .iter()
            .filter(|(_, m)| matches!(m, Mark::Block))
            .map(|(n, _)| n.as_str())
            .collect();
        if !blocked.is_empty() {
            store::settings::withdraw_again(&db, me.id, &blocked).await?;
        }
        let now =
            store::settings::settings(&db, me.id)
                .await?
                .ok_or(PhoneError::Unauthenticated(
                    "this agent is no longer registered",
                ))?;
        let (after_contacts, after_blocked) = req.after.unwrap_or_default();
        let mut contacts =
            store::settings::list(&db, me.id, true, &after_contacts, LIST_PAGE + 1).await?;
        let mut blocked =
            store::settings::list(&db, me.id, false, &after_blocked, LIST_PAGE + 1).await?;
        let more = contacts.len() as i64 > LIST_PAGE || blocked.len() as i64 > LIST_PAGE;
        contacts.truncate(LIST_PAGE as usize);
        blocked.truncate(LIST_PAGE as usize);
        let next_cursor = more.then(|| {
            encode_cursor(
                contacts.last().map_or(&after_contacts, |s| s),
                blocked.last().map_or(&after_blocked, |s| s),
            )
        });
        let webhook = store::webhooks::webhook(&db, me.id).await?;
        Ok(Settings {
            webhook_active: webhook.url.is_some() && !webhook.disabled,
            webhook_url: webhook.url,
            webhook_secret,
            contact_policy: now.contact_policy,
            listed: now.listed,
            contacts,
            blocked,
            contacts_total: now.contacts,
            blocked_total: now.blocked,
            next_cursor,
            unknown,
        })
    }
}
