//! The address book: registration, authentication, directory search.

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::limits::{self, AUTH_WINDOW, REGISTER_WINDOW};
use super::types::{self, AgentName, InvalidInput, Token};
use super::{Caller, Credentials, Phone, PhoneError};

/// A directory entry as other agents see it. Never carries the token hash.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub project: String,
    pub registered_at: String,
    pub last_seen_at: Option<String>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Registration {
    pub name: String,
    pub description: String,
    pub project: String,
    /// Present only when a new token was issued. Shown once: save it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// True when the name was new; false when an existing entry was updated.
    pub created: bool,
}

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

pub const SEARCH_LIMIT_MAX: u32 = 50;
pub const SEARCH_QUERY_MAX: usize = 200;
/// Deep pages are refused rather than served slowly; refine the query instead.
const SEARCH_OFFSET_MAX: i64 = 10_000;
const SEARCH_WORDS_MAX: usize = 16;
/// How many matches per tier are ranked; beyond that, a common word returns
/// a good page rather than a perfectly ranked one, in bounded time.
const SEARCH_CANDIDATES: i64 = 1000;

#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub query: Option<String>,
    pub project: Option<String>,
    pub limit: u32,
    pub offset: i64,
}

impl SearchRequest {
    pub fn parse(
        query: Option<&str>,
        project: Option<&str>,
        limit: Option<u32>,
        cursor: Option<&str>,
    ) -> Result<Self, InvalidInput> {
        let query = match query.map(str::trim).filter(|q| !q.is_empty()) {
            None => None,
            Some(q) if q.chars().count() > SEARCH_QUERY_MAX => {
                return Err(InvalidInput::new(
                    "query",
                    format!("is longer than {SEARCH_QUERY_MAX} characters; use a few keywords"),
                ));
            }
            Some(q) if q.contains('\0') => {
                return Err(InvalidInput::new(
                    "query",
                    "contains a NUL character (U+0000)",
                ));
            }
            Some(q) => Some(q.to_owned()),
        };
        let project = project
            .filter(|p| !p.trim().is_empty())
            .map(|p| types::single_line("project", p, types::PROJECT_MAX))
            .transpose()?;
        let limit = limit.unwrap_or(10);
        if !(1..=SEARCH_LIMIT_MAX).contains(&limit) {
            return Err(InvalidInput::new(
                "limit",
                format!("must be between 1 and {SEARCH_LIMIT_MAX}; got {limit}"),
            ));
        }
        let offset = cursor.map(decode_cursor).transpose()?.unwrap_or(0);
        Ok(Self {
            query,
            project,
            limit,
            offset,
        })
    }
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SearchResult {
    pub agents: Vec<AgentCard>,
    /// Pass back as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

fn encode_cursor(offset: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("o:{offset}"))
}

fn decode_cursor(raw: &str) -> Result<i64, InvalidInput> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .and_then(|s| s.strip_prefix("o:").and_then(|n| n.parse::<i64>().ok()))
        .filter(|n| (0..=SEARCH_OFFSET_MAX).contains(n))
        .ok_or_else(|| {
            InvalidInput::new(
                "cursor",
                "is not a cursor from this server; pass next_cursor from the previous phone_search unchanged",
            )
        })
}

/// Splits user text into plain words. Everything that is not a letter or a
/// digit separates words, so tsquery operators, quotes and SQL fragments are
/// just separators: the resulting query can never be malformed.
fn query_words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(SEARCH_WORDS_MAX)
        .map(|w| w.to_lowercase())
        .collect()
}

/// tsquery texts for the ranking tiers.
struct TsQueries {
    /// Every word, the last one as a prefix ("invoice & mail:*").
    all: String,
    /// Any word, the last one as a prefix: what qualifies a match.
    any: String,
    /// Any whole word: whole-word matches outrank prefix-only ones.
    any_whole: String,
}

fn tsqueries(words: &[String]) -> TsQueries {
    let prefixed: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i + 1 == words.len() {
                format!("{w}:*")
            } else {
                w.clone()
            }
        })
        .collect();
    TsQueries {
        all: prefixed.join(" & "),
        any: prefixed.join(" | "),
        any_whole: words.join(" | "),
    }
}

pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn card(row: &tokio_postgres::Row) -> AgentCard {
    AgentCard {
        name: row.get("name"),
        description: row.get("description"),
        project: row.get("project"),
        registered_at: timestamp(row.get("registered_at")),
        last_seen_at: row
            .get::<_, Option<DateTime<Utc>>>("last_seen_at")
            .map(timestamp),
    }
}

/// How long a released name stays reserved after phone_unregister.
pub const NAME_RESERVATION_DAYS: i32 = 30;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Rotated {
    pub name: String,
    /// The new token. The old one stopped working. Shown once: save it.
    pub token: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Unregistered {
    pub name: String,
    pub unregistered_at: String,
    /// Until then nobody can register this name again.
    pub name_reserved_until: String,
}

pub(crate) const AUTH_FAILURES: &str = "failed authentication attempts";

/// How often presence is written: at most once a minute per agent, so a
/// busy agent costs no write per call.
const PRESENCE_INTERVAL_SECS: f64 = 60.0;

impl Phone {
    /// `client_address` identifies the caller's network address, for rate limits.
    pub async fn register(
        &self,
        req: RegisterRequest,
        client_address: &str,
    ) -> Result<Registration, PhoneError> {
        match req.token {
            None => {
                let bucket = limits::register_bucket(client_address);
                self.check_block(&bucket, "registrations")?;
                self.count(
                    bucket,
                    REGISTER_WINDOW,
                    self.limits().registrations,
                    "registrations",
                )
                .await?;
                let client = self.pool().get().await?;
                let token = Token::generate();
                let hash = token.hash();
                // A name released by phone_unregister stays reserved for a
                // while, so nobody can step into a departed agent's
                // conversations straight away.
                let stmt = client
                    .prepare_cached(
                        "INSERT INTO agents (name, description, project, token_hash, last_seen_at)
                         SELECT $1, $2, $3, $4, now()
                         WHERE NOT EXISTS (
                             SELECT 1 FROM agents WHERE name = $1
                             AND unregistered_at > now() - make_interval(days => $5))
                         ON CONFLICT (name) WHERE unregistered_at IS NULL DO NOTHING
                         RETURNING id",
                    )
                    .await?;
                let inserted = client
                    .query_opt(
                        &stmt,
                        &[
                            &req.name.as_str(),
                            &req.description,
                            &req.project,
                            &hash.as_bytes(),
                            &NAME_RESERVATION_DAYS,
                        ],
                    )
                    .await?;
                if inserted.is_some() {
                    return Ok(Registration {
                        name: req.name.to_string(),
                        description: req.description,
                        project: req.project,
                        token: Some(token.reveal().to_owned()),
                        created: true,
                    });
                }
                let stmt = client
                    .prepare_cached(
                        "SELECT max(unregistered_at) + make_interval(days => $2) AS reserved_until,
                                bool_or(unregistered_at IS NULL) AS active
                         FROM agents WHERE name = $1",
                    )
                    .await?;
                let row = client
                    .query_one(&stmt, &[&req.name.as_str(), &NAME_RESERVATION_DAYS])
                    .await?;
                match row.get::<_, Option<DateTime<Utc>>>("reserved_until") {
                    Some(until) if !row.get::<_, Option<bool>>("active").unwrap_or(false) => {
                        Err(PhoneError::NameReserved(req.name, timestamp(until)))
                    }
                    _ => Err(PhoneError::NameTaken(req.name)),
                }
            }
            Some(token) => {
                self.check_address_block(client_address)?;
                let client = self.pool().get().await?;
                let stmt = client
                    .prepare_cached(
                        "UPDATE agents
                         SET description = $3, project = $4, updated_at = now(), last_seen_at = now()
                         WHERE name = $1 AND token_hash = $2 AND unregistered_at IS NULL
                         RETURNING id",
                    )
                    .await?;
                let hash = token.hash();
                let updated = client
                    .query_opt(
                        &stmt,
                        &[
                            &req.name.as_str(),
                            &hash.as_bytes(),
                            &req.description,
                            &req.project,
                        ],
                    )
                    .await?;
                if updated.is_some() {
                    return Ok(Registration {
                        name: req.name.to_string(),
                        description: req.description,
                        project: req.project,
                        token: None,
                        created: false,
                    });
                }
                let exists = client
                    .query_opt(
                        "SELECT 1 FROM agents WHERE name = $1 AND unregistered_at IS NULL",
                        &[&req.name.as_str()],
                    )
                    .await?
                    .is_some();
                drop(client);
                self.count_auth_failure(client_address, Some(&req.name))
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
        }
    }

    /// Resolves a token to its agent. The comparison is on SHA-256 digests
    /// through a unique index, so the plaintext is never compared.
    pub async fn authenticate(&self, creds: &Credentials) -> Result<Caller, PhoneError> {
        let (hash, claimed, client_address) = (
            creds.token,
            creds.claimed.as_ref(),
            creds.client_address.as_str(),
        );
        self.check_address_block(client_address)?;
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT id, name, project,
                        coalesce(last_seen_at < now() - make_interval(secs => $2), true) AS stale
                 FROM agents WHERE token_hash = $1 AND unregistered_at IS NULL",
            )
            .await?;
        let Some(row) = client
            .query_opt(&stmt, &[&hash.as_bytes(), &PRESENCE_INTERVAL_SECS])
            .await?
        else {
            drop(client);
            self.count_auth_failure(client_address, claimed).await?;
            return Err(PhoneError::Unauthenticated(
                "invalid token: no agent holds it. Use the token phone_register gave you (saved in your notes)",
            ));
        };
        let name = AgentName::parse("name", row.get("name")).map_err(|_| PhoneError::Internal)?;
        if let Some(claimed) = claimed
            && claimed != &name
        {
            drop(client);
            self.count_auth_failure(client_address, Some(claimed))
                .await?;
            return Err(PhoneError::Unauthenticated(
                "this token belongs to a different agent than `name`. Use each agent's own name and token together",
            ));
        }
        let caller = Caller {
            id: row.get("id"),
            name,
            project: row.get("project"),
        };
        if row.get::<_, bool>("stale") {
            let stmt = client
                .prepare_cached("UPDATE agents SET last_seen_at = now() WHERE id = $1")
                .await?;
            client.execute(&stmt, &[&caller.id]).await?;
        }
        Ok(caller)
    }

    pub async fn search(&self, req: SearchRequest) -> Result<SearchResult, PhoneError> {
        let client = self.pool().get().await?;
        // One row more than asked tells whether another page exists.
        let fetch = i64::from(req.limit) + 1;
        let rows = match &req.query {
            None => {
                let stmt = client
                    .prepare_cached(
                        "SELECT name, description, project, registered_at, last_seen_at
                         FROM agents
                         WHERE unregistered_at IS NULL
                           AND ($1::text IS NULL OR lower(project) = lower($1))
                         ORDER BY name
                         LIMIT $2 OFFSET $3",
                    )
                    .await?;
                client
                    .query(&stmt, &[&req.project, &fetch, &req.offset])
                    .await?
            }
            Some(query) => {
                let words = query_words(query);
                let q = tsqueries(&words);
                let exact_name = query.trim().to_ascii_lowercase();
                let stmt = client
                    .prepare_cached(
                        // Ranking every match of a common word costs time in
                        // proportion to the directory, so only a bounded set of
                        // candidates is ranked: the exact name, up to $8 agents
                        // matching all the words, and up to $8 matching any.
                        "WITH q AS (SELECT to_tsquery('english', $1) AS any_word,
                                           to_tsquery('english', $2) AS all_words,
                                           to_tsquery('english', $7) AS any_whole_word),
                              exact AS (
                                  SELECT id FROM agents
                                  WHERE name = $3 AND unregistered_at IS NULL
                                    AND ($4::text IS NULL OR lower(project) = lower($4))),
                              every_word AS (
                                  SELECT id FROM agents, q
                                  WHERE search @@ q.all_words AND unregistered_at IS NULL
                                    AND ($4::text IS NULL OR lower(project) = lower($4))
                                  LIMIT $8),
                              some_word AS (
                                  SELECT id FROM agents, q
                                  WHERE search @@ q.any_word AND unregistered_at IS NULL
                                    AND ($4::text IS NULL OR lower(project) = lower($4))
                                  LIMIT $8),
                              candidates AS (
                                  SELECT id FROM exact UNION SELECT id FROM every_word
                                  UNION SELECT id FROM some_word)
                         SELECT a.name, a.description, a.project, a.registered_at, a.last_seen_at
                         FROM candidates c JOIN agents a ON a.id = c.id, q
                         ORDER BY a.name = $3 DESC,
                                  a.search @@ q.all_words DESC,
                                  ts_rank(a.search, q.any_whole_word) DESC,
                                  ts_rank(a.search, q.any_word) DESC,
                                  a.name
                         LIMIT $5 OFFSET $6",
                    )
                    .await?;
                client
                    .query(
                        &stmt,
                        &[
                            &q.any,
                            &q.all,
                            &exact_name,
                            &req.project,
                            &fetch,
                            &req.offset,
                            &q.any_whole,
                            &SEARCH_CANDIDATES,
                        ],
                    )
                    .await?
            }
        };
        let mut agents: Vec<AgentCard> = rows.iter().map(card).collect();
        let next_cursor = if agents.len() as i64 > i64::from(req.limit) {
            agents.truncate(req.limit as usize);
            let next = req.offset + i64::from(req.limit);
            (next <= SEARCH_OFFSET_MAX).then(|| encode_cursor(next))
        } else {
            None
        };
        Ok(SearchResult {
            agents,
            next_cursor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_becomes_plain_words() {
        assert_eq!(
            query_words("foo & (bar | !baz):* 'x' -- ;DROP"),
            ["foo", "bar", "baz", "x", "drop"]
        );
        assert!(query_words("&|!():*<->").is_empty());
        let q = tsqueries(&query_words("Invoice mail"));
        assert_eq!(q.all, "invoice & mail:*");
        assert_eq!(q.any, "invoice | mail:*");
        assert_eq!(q.any_whole, "invoice | mail");
    }

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor(&encode_cursor(20)).unwrap(), 20);
        assert!(decode_cursor("garbage").is_err());
        assert!(decode_cursor(&encode_cursor(-1)).is_err());
        assert!(decode_cursor(&encode_cursor(SEARCH_OFFSET_MAX + 1)).is_err());
    }
}

impl Phone {
    /// Counts a failed authentication against the client's address and the
    /// name it claimed; returns the rate-limit error once either is over.
    pub(crate) async fn count_auth_failure(
        &self,
        client_address: &str,
        claimed: Option<&AgentName>,
    ) -> Result<(), PhoneError> {
        let limit = self.limits().auth_failures;
        self.count(
            limits::auth_bucket_for_address(client_address),
            AUTH_WINDOW,
            limit,
            AUTH_FAILURES,
        )
        .await?;
        if let Some(name) = claimed {
            self.count(
                limits::auth_bucket_for_name(name.as_str()),
                AUTH_WINDOW,
                limit,
                AUTH_FAILURES,
            )
            .await?;
        }
        Ok(())
    }

    /// Issues a new token; the old one stops working with this statement.
    pub async fn rotate_token(&self, me: &Caller) -> Result<Rotated, PhoneError> {
        let token = Token::generate();
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "UPDATE agents SET token_hash = $2, updated_at = now()
                 WHERE id = $1 AND unregistered_at IS NULL RETURNING name",
            )
            .await?;
        let row = client
            .query_opt(&stmt, &[&me.id, &token.hash().as_bytes()])
            .await?
            .ok_or(PhoneError::Unauthenticated(
                "this agent is no longer registered",
            ))?;
        Ok(Rotated {
            name: row.get("name"),
            token: token.reveal().to_owned(),
        })
    }

    /// Removes the agent from the directory and revokes its token. Its
    /// messages stay, for its correspondents and for analytics.
    pub async fn unregister(&self, me: &Caller) -> Result<Unregistered, PhoneError> {
        // The token hash is replaced by the digest of a token nobody holds.
        let revoked = Token::generate().hash();
        let client = self.pool().get().await?;
        let stmt = client
            .prepare_cached(
                "UPDATE agents SET unregistered_at = now(), token_hash = $2, updated_at = now()
                 WHERE id = $1 AND unregistered_at IS NULL
                 RETURNING name, unregistered_at,
                           unregistered_at + make_interval(days => $3) AS reserved_until",
            )
            .await?;
        let row = client
            .query_opt(
                &stmt,
                &[&me.id, &revoked.as_bytes(), &NAME_RESERVATION_DAYS],
            )
            .await?
            .ok_or(PhoneError::Unauthenticated(
                "this agent is no longer registered",
            ))?;
        Ok(Unregistered {
            name: row.get("name"),
            unregistered_at: timestamp(row.get("unregistered_at")),
            name_reserved_until: timestamp(row.get("reserved_until")),
        })
    }
}
