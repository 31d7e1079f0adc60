//! The address book: registration, authentication, token rotation and
//! unregistering.

use chrono::{DateTime, Utc};

use super::limits::{self, REGISTER_WINDOW, REGISTRATIONS};
use super::types::{self, AgentName, InvalidInput, Token, timestamp};
use super::{Caller, Credentials, Phone, PhoneError};
use crate::store;

/// How long a released name stays reserved after phone_unregister, so that
/// nobody can step into a departed agent's conversations straight away.
pub const NAME_RESERVATION_DAYS: i32 = 30;

/// Names a new agent may not take: the service's own and its operator's,
/// which a model reading `from phone-notices` or `from system` would trust
/// as the service speaking (an outsider registered them all). Agents that
/// hold one already keep it.
const SERVICE_NAMES: [&str; 13] = [
    "phone",
    "system",
    "admin",
    "administrator",
    "operator",
    "root",
    "support",
    "security",
    "postmaster",
    "noreply",
    "no-reply",
    "mcp",
    "server",
];

/// Whether `name` (parsed: lower case) is the service's to use: one of
/// [`SERVICE_NAMES`] whatever its separators (`system.`, `admin_` and
/// `no_reply` read as the service's in a header: a stranger registered
/// them), or `phone` followed by a separator, after any leading ones.
fn is_service_name(name: &AgentName) -> bool {
    const SEPARATORS: [char; 3] = ['-', '_', '.'];
    let bare = |n: &str| n.replace(SEPARATORS, "");
    let name = name.as_str();
    SERVICE_NAMES.iter().any(|s| bare(s) == bare(name))
        || name
            .trim_start_matches(SEPARATORS)
            .strip_prefix("phone")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(SEPARATORS))
}

/// A change refused because the token that was verified for it is no
/// longer the agent's: replaced, revoked or suspended while the call ran
/// (a call in flight with the old token landed after a rotation had
/// answered, and left the owner's new token dead).
pub(crate) const TOKEN_CHANGED: &str = "this token stopped being the agent's while the call ran (rotated, unregistered or suspended): nothing was changed. Use the agent's current token";

#[derive(Debug, Clone)]
pub struct RegisterRequest {
    pub name: AgentName,
    pub description: String,
    pub project: String,
    pub token: Option<Token>,
}

impl RegisterRequest {
    pub fn parse(
        name: &str,
        description: &str,
        project: &str,
        token: Option<&str>,
    ) -> Result<Self, InvalidInput> {
        Ok(Self {
            name: AgentName::parse("name", name)?,
            description: types::description(description)?,
            project: types::single_line("project", project, types::PROJECT_MAX)?,
            token: token.map(Token::parse).transpose()?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Registration {
    pub name: AgentName,
    pub description: String,
    pub project: String,
    /// Present only when a new token was issued (shown once).
    pub token: Option<Token>,
    /// True when the name was new; false when an existing entry was updated.
    pub created: bool,
}

#[derive(Debug, Clone)]
pub struct Rotated {
    pub name: String,
    /// The new token; the old one stopped working.
    pub token: Token,
}

#[derive(Debug, Clone)]
pub struct Unregistered {
    pub name: String,
    pub unregistered_at: DateTime<Utc>,
    /// Until then nobody can register this name again.
    pub name_reserved_until: DateTime<Utc>,
}

impl Phone {
    /// `client_address` identifies the caller's network address, for rate limits.
    pub async fn register(
        &self,
        req: RegisterRequest,
        client_address: &str,
    ) -> Result<Registration, PhoneError> {
        match req.token.clone() {
            None => self.register_new(req, client_address).await,
            Some(token) => self.update_entry(req, &token, client_address).await,
        }
    }

    async fn register_new(
        &self,
        req: RegisterRequest,
        client_address: &str,
    ) -> Result<Registration, PhoneError> {
        if is_service_name(&req.name) {
            return Err(InvalidInput::new(
                "name",
                format!(
                    "'{}' is kept for the service and its operator, so that no agent can speak as them; choose another name",
                    req.name
                ),
            )
            .into());
        }
        // `.`, `-`, `_` or `admin.` read as no name or as the one beside
        // it in a header. Names already registered keep working.
        let alphanumeric = |c: char| c.is_ascii_alphanumeric();
        let name = req.name.as_str();
        if !name.starts_with(alphanumeric) || !name.ends_with(alphanumeric) {
            return Err(InvalidInput::new(
                "name",
                format!(
                    "'{}' must begin and end with a letter or digit ('-', '_' and '.' go between)",
                    req.name
                ),
            )
            .into());
        }
        let bucket = limits::register_bucket(client_address);
        self.check_block(&bucket, REGISTRATIONS)?;
        self.count(
            bucket,
            REGISTER_WINDOW,
            self.limits().registrations,
            REGISTRATIONS,
        )
        .await?;
        let db = self.store.db().await?;
        let token = Token::generate();
        let inserted = store::agents::insert_new(
            &db,
            req.name.as_str(),
            &req.description,
            &req.project,
            token.hash().as_bytes(),
            NAME_RESERVATION_DAYS,
        )
        .await?;
        if inserted.is_some() {
            return Ok(Registration {
                name: req.name,
                description: req.description,
                project: req.project,
                token: Some(token),
                created: true,
            });
        }
        let status =
            store::agents::name_status(&db, req.name.as_str(), NAME_RESERVATION_DAYS).await?;
        match status.reserved_until {
            Some(until) if !status.active => {
                Err(PhoneError::NameReserved(req.name, timestamp(until)))
            }
            _ => Err(PhoneError::NameTaken(req.name)),
        }
    }

    async fn update_entry(
        &self,
        req: RegisterRequest,
        token: &Token,
        client_address: &str,
    ) -> Result<Registration, PhoneError> {
        // The token decides first: a right token is never refused because
        // others at the same address failed (see `limits`).
        let db = self.store.db().await?;
        let updated = store::agents::update_entry(
            &db,
            req.name.as_str(),
            token.hash().as_bytes(),
            &req.description,
            &req.project,
        )
        .await?;
        if updated {
            return Ok(Registration {
                name: req.name,
                description: req.description,
                project: req.project,
                token: None,
                created: false,
            });
        }
        let exists = store::agents::is_registered(&db, req.name.as_str()).await?;
        drop(db);
        self.auth_failed(client_address, Some(&req.name), "wrong_token_for_name")
            .await?;
        if exists {
            Err(PhoneError::Unauthenticated(
                "name already registered, and this token is not its token. Use the token issued for this name, or pick another name",
            ))
        } else {
            Err(PhoneError::Unauthenticated(
                "this token does not belong to that name. To register a new name, call phone_register without a token",
            ))
        }
    }

    /// Resolves a token to its agent. The comparison is on SHA-256 digests
    /// through a unique index, so the plaintext is never compared.
    pub async fn authenticate(&self, creds: &Credentials) -> Result<Caller, PhoneError> {
        self.verify(creds, true).await
    }

    /// [`Phone::authenticate`] without counting as the agent being seen (the
    /// console's sign-in: a person, not the agent).
    pub async fn authenticate_quietly(&self, creds: &Credentials) -> Result<Caller, PhoneError> {
        self.verify(creds, false).await
    }

    /// The token decides before the address's counter: a right token is
    /// served whatever others at its address tried; only failures count,
    /// and once an address is over its limit its failures are refused
    /// (and slowed) without counting further.
    async fn verify(&self, creds: &Credentials, presence: bool) -> Result<Caller, PhoneError> {
        let client_address = creds.client_address.as_str();
        let db = self.store.db().await?;
        let holder = if presence {
            store::agents::holder_of(&db, creds.token.as_bytes(), creds.claimed_name()).await?
        } else {
            store::agents::holder_quietly(&db, creds.token.as_bytes()).await?
        };
        drop(db);
        let Some(holder) = holder else {
            self.auth_failed(client_address, creds.claimed.as_ref(), "unknown_token")
                .await?;
            return Err(PhoneError::Unauthenticated(
                "invalid token: no agent holds it. Use the token phone_register gave you (saved in your notes)",
            ));
        };
        let name = AgentName::parse("name", &holder.name).map_err(|_| PhoneError::Internal)?;
        if let Some(claimed) = &creds.claimed
            && claimed != &name
        {
            self.auth_failed(client_address, Some(claimed), "name_mismatch")
                .await?;
            return Err(PhoneError::Unauthenticated(
                "this token belongs to a different agent than `name`. Use each agent's own name and token together",
            ));
        }
        Ok(Caller {
            id: holder.id,
            name,
            project: holder.project,
            token: creds.token,
        })
    }

    /// The precise error for credentials a one-round-trip statement did not
    /// accept (and the failure counted for rate limits).
    pub(crate) async fn authentication_error(&self, creds: &Credentials) -> PhoneError {
        match self.authenticate(creds).await {
            Err(e) => e,
            // Valid now, but not a moment ago: rotated or unregistered meanwhile.
            Ok(_) => PhoneError::Unauthenticated("the token changed during this call; retry"),
        }
    }

    /// Issues a new token; the old one stops working with this statement.
    pub async fn rotate_token(&self, me: &Caller) -> Result<Rotated, PhoneError> {
        let token = Token::generate();
        let db = self.store.db().await?;
        let name =
            store::agents::replace_token(&db, me.id, me.token.as_bytes(), token.hash().as_bytes())
                .await?
                .ok_or(PhoneError::Unauthenticated(TOKEN_CHANGED))?;
        Ok(Rotated { name, token })
    }

    /// Removes the agent from the directory and revokes its token. Its
    /// messages stay, for its correspondents and for analytics.
    pub async fn unregister(&self, me: &Caller) -> Result<Unregistered, PhoneError> {
        // The token hash is replaced by the digest of a token nobody holds.
        let revoked = Token::generate().hash();
        let db = self.store.db().await?;
        let row = store::agents::unregister(
            &db,
            me.id,
            Some(me.token.as_bytes()),
            revoked.as_bytes(),
            NAME_RESERVATION_DAYS,
        )
        .await?
        .ok_or(PhoneError::Unauthenticated(TOKEN_CHANGED))?;
        Ok(Unregistered {
            name: row.name,
            unregistered_at: row.unregistered_at,
            name_reserved_until: row.reserved_until,
        })
    }
}
