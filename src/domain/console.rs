//! The console: a person signs in with an agent's name and token (or with
//! the operator's token) and gets a session that any replica accepts,
//! because it lives in PostgreSQL. What the console shows never changes the
//! mailbox: no read mark, no lease, no presence.

use std::time::Duration;

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::types::{AgentName, InvalidInput, Token, TokenHash};
use super::{Caller, Credentials, Phone, PhoneError};
use crate::store::{self, console::SessionOwner};

pub use crate::store::console::{
    Backlog, Overview, ProjectCount, Received, THREAD_COUNT_MAX, ThreadSummary,
};

/// Random bytes in a session secret and in a CSRF token.
const SECRET_BYTES: usize = 32;
/// Most rows on a console page.
pub const PAGE_MAX: u32 = 100;
/// The unread count in a page header stops here ("100+").
pub const UNREAD_SHOWN_MAX: i64 = 100;

/// The secret a session cookie carries. Only its SHA-256 is stored.
#[derive(Clone)]
pub struct SessionSecret(String);

impl SessionSecret {
    fn generate() -> Self {
        Self(random_text())
    }

    /// A cookie's value, if it could be one of ours.
    pub fn parse(raw: &str) -> Option<Self> {
        let well_formed = raw.len() == 43
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        well_formed.then(|| Self(raw.to_owned()))
    }

    /// The value for the one Set-Cookie that issues it.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(<redacted>)")
    }
}

/// 32 random bytes, URL-safe base64 (43 characters).
pub fn random_text() -> String {
    let mut bytes = [0u8; SECRET_BYTES];
    rand::fill(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Equal without telling by its timing where two strings first differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b): ([u8; 32], [u8; 32]) = (Sha256::digest(a).into(), Sha256::digest(b).into());
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The operator's token (`PHONE_CONSOLE_ADMIN_TOKEN`), as its digest.
#[derive(Clone, PartialEq, Eq)]
pub struct OperatorKey([u8; 32]);

impl OperatorKey {
    /// Shortest operator token accepted: it is the only secret guarding
    /// the overview, so it must not be guessable.
    pub const MIN_LEN: usize = 24;

    pub fn from_token(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw.chars().count() < Self::MIN_LEN {
            return Err(format!(
                "is too short: use at least {} random characters (e.g. `openssl rand -base64 32`)",
                Self::MIN_LEN
            ));
        }
        Ok(Self(Sha256::digest(raw.as_bytes()).into()))
    }

    fn matches(&self, presented: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        digest
            .iter()
            .zip(self.0.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
    }
}

impl std::fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorKey(<redacted>)")
    }
}

/// The agent a session speaks for, and the token digest it signed in with
/// (still the agent's: a rotated token ends the session).
#[derive(Debug, Clone)]
pub struct AgentViewer {
    pub caller: Caller,
    token: TokenHash,
}

impl AgentViewer {
    /// Credentials as if the agent called: sends from the console pass
    /// through the same checks as the agent's own (contacts, quotas, limits).
    pub fn credentials(&self, client_address: &str) -> Credentials {
        Credentials {
            token: self.token,
            claimed: Some(self.caller.name.clone()),
            client_address: client_address.to_owned(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Viewer {
    Agent(AgentViewer),
    Operator,
}

/// A live session: who, and the CSRF token its forms carry.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    pub viewer: Viewer,
    pub csrf: String,
}

/// A page of the agent's received mail, newest first.
#[derive(Debug, Clone)]
pub struct InboxPage {
    pub messages: Vec<Received>,
    /// The id to pass as `before` for the next (older) page.
    pub older: Option<i64>,
    /// Unread mail, counted up to [`UNREAD_SHOWN_MAX`].
    pub unread: i64,
}

#[derive(Debug, Clone)]
pub struct ThreadsPage {
    pub threads: Vec<ThreadSummary>,
    pub older: Option<i64>,
}

impl Phone {
    /// Signs in as the agent `name` with its `token`: the same check as a
    /// tool call's, failures counted against the same rate limit.
    pub async fn console_sign_in(
        &self,
        name: &str,
        token: &str,
        client_address: &str,
        ttl: Duration,
    ) -> Result<(SessionSecret, ConsoleSession), PhoneError> {
        let name = AgentName::parse("name", name)?;
        let token = match Token::parse(token) {
            Ok(token) => token,
            Err(e) => {
                // A malformed token is a failed sign-in too.
                self.auth_failed(client_address, Some(&name), "malformed_token")
                    .await?;
                return Err(e.into());
            }
        };
        let creds = Credentials {
            token: token.hash(),
            claimed: Some(name),
            client_address: client_address.to_owned(),
        };
        let caller = self.authenticate_quietly(&creds).await?;
        let owner = SessionOwner::Agent {
            id: caller.id,
            name: caller.name.as_str().to_owned(),
            project: caller.project.clone(),
            token_hash: creds.token.as_bytes().to_vec(),
        };
        let (secret, csrf) = self.create_console_session(&owner, ttl).await?;
        Ok((
            secret,
            ConsoleSession {
                viewer: Viewer::Agent(AgentViewer {
                    caller,
                    token: creds.token,
                }),
                csrf,
            },
        ))
    }

    /// Signs in as the operator; a wrong token counts as a failed
    /// authentication of the caller's address.
    pub async fn console_operator_sign_in(
        &self,
        key: &OperatorKey,
        presented: &str,
        client_address: &str,
        ttl: Duration,
    ) -> Result<(SessionSecret, ConsoleSession), PhoneError> {
        // Unlike an agent's token (256 random bits), the operator's is a
        // secret a person chose: once an address is over its limit, even a
        // right guess waits for the window to end.
        self.check_block(
            &super::limits::auth_bucket_for_address(client_address),
            super::limits::AUTH_FAILURES,
        )?;
        if !key.matches(presented) {
            self.auth_failed(client_address, None, "operator_token")
                .await?;
            return Err(PhoneError::Unauthenticated(
                "wrong operator token: use the value of PHONE_CONSOLE_ADMIN_TOKEN",
            ));
        }
        let owner = SessionOwner::Operator {
            admin_hash: key.0.to_vec(),
        };
        let (secret, csrf) = self.create_console_session(&owner, ttl).await?;
        Ok((
            secret,
            ConsoleSession {
                viewer: Viewer::Operator,
                csrf,
            },
        ))
    }

    async fn create_console_session(
        &self,
        owner: &SessionOwner,
        ttl: Duration,
    ) -> Result<(SessionSecret, String), PhoneError> {
        let secret = SessionSecret::generate();
        let csrf = random_text();
        let db = self.store.db().await?;
        store::console::create_session(&db, &secret.digest(), owner, &csrf, ttl.as_secs_f64())
            .await?;
        Ok((secret, csrf))
    }

    /// The live session `secret` opens, if any. An operator session holds
    /// only while the operator token it signed in with is still the one
    /// configured (`key`; `None`: the overview is off).
    pub async fn console_session(
        &self,
        secret: &SessionSecret,
        key: Option<&OperatorKey>,
    ) -> Result<Option<ConsoleSession>, PhoneError> {
        let db = self.store.db().await?;
        let Some(session) = store::console::session(&db, &secret.digest()).await? else {
            return Ok(None);
        };
        let viewer = match session.owner {
            SessionOwner::Agent {
                id,
                name,
                project,
                token_hash,
            } => {
                let name = AgentName::parse("name", &name).map_err(|_| PhoneError::Internal)?;
                let token = TokenHash(token_hash.try_into().map_err(|_| PhoneError::Internal)?);
                Viewer::Agent(AgentViewer {
                    caller: Caller {
                        id,
                        name,
                        project,
                        token,
                    },
                    token,
                })
            }
            SessionOwner::Operator { admin_hash } => match key {
                Some(key) if key.0.as_slice() == admin_hash.as_slice() => Viewer::Operator,
                _ => return Ok(None),
            },
        };
        Ok(Some(ConsoleSession {
            viewer,
            csrf: session.csrf,
        }))
    }

    /// Ends the session `secret` (on every replica: it is deleted).
    pub async fn console_sign_out(&self, secret: &SessionSecret) -> Result<(), PhoneError> {
        let db = self.store.db().await?;
        store::console::delete_session(&db, &secret.digest()).await?;
        Ok(())
    }

    /// The agent's received mail, newest first, `limit` before id `before`:
    /// read or not, changing nothing.
    pub async fn console_inbox(
        &self,
        me: &Caller,
        before: Option<i64>,
        limit: u32,
        unread_only: bool,
    ) -> Result<InboxPage, PhoneError> {
        let limit = limit.clamp(1, PAGE_MAX);
        let db = self.store.db().await?;
        let mut messages =
            store::console::inbox(&db, me.id, before, i64::from(limit) + 1, unread_only).await?;
        let older = older_than(&mut messages, limit, |m| m.message.id);
        let unread = store::console::unread(&db, me.id, UNREAD_SHOWN_MAX).await?;
        Ok(InboxPage {
            messages,
            older,
            unread,
        })
    }

    /// The agent's conversations, latest activity first.
    pub async fn console_threads(
        &self,
        me: &Caller,
        before: Option<i64>,
        limit: u32,
    ) -> Result<ThreadsPage, PhoneError> {
        let limit = limit.clamp(1, PAGE_MAX);
        let db = self.store.db().await?;
        let (mut threads, walk_bound) =
            store::console::threads(&db, me.id, before, i64::from(limit) + 1).await?;
        // A full page continues after its last thread; a page the bounded
        // walk cut short continues where the walk stopped.
        let older = older_than(&mut threads, limit, |t| t.last_id).or(walk_bound);
        Ok(ThreadsPage { threads, older })
    }

    /// The operator's overview of the last `days` days.
    pub async fn console_overview(&self, days: u32) -> Result<Overview, PhoneError> {
        let days = i32::try_from(days.clamp(1, 366)).unwrap_or(14);
        let db = self.store.db().await?;
        Ok(store::console::overview(&db, days, 10).await?)
    }
}

/// Keeps `limit` of `rows` (fetched one more than asked); the id to page on
/// from, when more exist.
fn older_than<T>(rows: &mut Vec<T>, limit: u32, id: impl Fn(&T) -> i64) -> Option<i64> {
    if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(id)
    } else {
        None
    }
}

/// A page's `before` parameter: a message id as the console links it.
pub fn parse_before(raw: Option<&str>) -> Result<Option<i64>, InvalidInput> {
    match raw.map(str::trim).filter(|r| !r.is_empty()) {
        None => Ok(None),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| {
                InvalidInput::new("before", "is not a page position; follow the Older link")
            }),
    }
}
