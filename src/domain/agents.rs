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
/// How many matches of each tier are ranked (see `build_search_sql`);
/// beyond that, a common word returns a good page rather than a perfectly
/// ranked one, in bounded time. The tiers' candidates together are what a
/// query can page through: a few hundred agents at most.
const SEARCH_CANDIDATES: u32 = 100;
/// A sample level with at least this many matches of a tier stops the
/// tier's descent to the larger levels.
const SEARCH_ENOUGH: u32 = 25;
/// Candidates from the index of names (and project names), so that the few
/// agents *named* after a word are not lost among the many that mention it.
const SEARCH_NAME_CANDIDATES: u32 = 20;
const SEARCH_NAME_ENOUGH: u32 = 10;
/// The sample levels of the directory, every 256th and every 32nd agent by
/// id, each with its own small GIN indexes (V5; the numbers must match the
/// indexes' predicates).
const SEARCH_SAMPLES: [u32; 2] = [256, 32];
/// With a project filter, the project's first agents by name that are read
/// to find prefix matches the whole-directory level leaves out.
const SEARCH_PROJECT_SCAN: u32 = 1000;
/// How many agents of the smallest sample must match the last word's prefix
/// for it to count as common (about 2,000 in the directory).
const SEARCH_PREFIX_COMMON: u32 = 8;

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
    /// Every word, whole: for the whole directory when the last word is the
    /// prefix of common words (see `build_search_sql`).
    all_whole: String,
    /// The last word as a prefix alone.
    last: String,
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
        all_whole: words.join(" & "),
        last: prefixed.last().cloned().unwrap_or_default(),
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
        // One statement per shape, each with a plan that fits it: a
        // `$n IS NULL OR …` filter would leave a generic plan unable to use
        // the project index.
        let rows = match (&req.query, &req.project) {
            (None, None) => {
                let stmt = client
                    .prepare_cached(
                        "SELECT name, description, project, registered_at, last_seen_at
                         FROM agents WHERE unregistered_at IS NULL
                         ORDER BY name LIMIT $1 OFFSET $2",
                    )
                    .await?;
                client.query(&stmt, &[&fetch, &req.offset]).await?
            }
            (None, Some(project)) => {
                let stmt = client
                    .prepare_cached(
                        "SELECT name, description, project, registered_at, last_seen_at
                         FROM agents WHERE unregistered_at IS NULL AND lower(project) = lower($1)
                         ORDER BY name LIMIT $2 OFFSET $3",
                    )
                    .await?;
                client.query(&stmt, &[project, &fetch, &req.offset]).await?
            }
            (Some(query), project) => {
                let words = query_words(query);
                let q = tsqueries(&words);
                let exact_name = query.trim().to_ascii_lowercase();
                let stmt = client
                    .prepare_cached(search_sql(project.is_some(), words.len() > 1))
                    .await?;
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
                    &q.any,
                    &q.all,
                    &q.any_whole,
                    &q.all_whole,
                    &q.last,
                    &exact_name,
                    &fetch,
                    &req.offset,
                ];
                if let Some(project) = project {
                    params.push(project);
                }
                client.query(&stmt, &params).await?
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

/// The search statement for a query, with and without a project filter, for
/// one word and for several; built once.
fn search_sql(project: bool, several_words: bool) -> &'static str {
    static SQL: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
        [
            build_search_sql(false, false),
            build_search_sql(false, true),
            build_search_sql(true, false),
            build_search_sql(true, true),
        ]
    });
    &SQL[usize::from(project) * 2 + usize::from(several_words)]
}

/// One tier of candidates: up to `candidates` agents matching `sampled`,
/// from the first of the sample levels that has `enough` of them, else from
/// the whole directory, matching the first of `full` whose gate holds. With
/// `after`, the tier runs only when that tier found fewer than its
/// `candidates`: its matches would rank below that tier's anyway.
struct Tier {
    name: &'static str,
    sampled: String,
    full: Vec<(String, &'static str)>,
    after: Option<&'static str>,
    candidates: u32,
    enough: u32,
}

/// `$1` any word, `$2` all words, `$3` any whole word, `$4` all words whole,
/// `$5` the last word's prefix (the tsquery texts of [`tsqueries`]), `$6`
/// the query as an exact name, `$7` limit, `$8` offset, `$9` project (when
/// filtered).
///
/// A GIN scan enumerates every match before the first row comes out: a word
/// in one description of ten is ~100,000 matches at 1M agents and 20-60 ms,
/// however few rows are wanted. So only a bounded set of candidates is
/// ranked: the exact name, and per tier (every word; any whole word; any
/// word; any word in the name or project name) up to [`SEARCH_CANDIDATES`]
/// matches ([`SEARCH_NAME_CANDIDATES`] for names), taken from the smallest
/// sample of the directory (every 256th, every 32nd agent:
/// [`SEARCH_SAMPLES`], with their own small indexes) that has
/// [`SEARCH_ENOUGH`] of them. A common word is answered from the sample; a
/// rare one falls through to the whole directory, where it has few matches
/// (fewer than ~32 × 25 to get there). A level that is not needed costs
/// nothing: its gate is evaluated once, before its scan.
///
/// The tsqueries come from a CTE, so the planner sees parameters, not
/// values, and every execution gets the same plan, the sample indexes first.
/// A plan for the values might pick a sequential scan for a word the
/// statistics call common, which is ruinous on a level that only runs
/// because the word is in fact rare.
///
/// GIN enumerates a prefix (`inv:*`) in full even inside a conjunction, so
/// where a conjunction reaches the whole directory, the last word is a
/// prefix only when that prefix is rare in the smallest sample; otherwise
/// it is taken whole there (prefix-only matches of a common prefix then come
/// from the samples).
///
/// A project filter joins the project's own words to each tier's tsquery
/// (the project is in `search` too, weight B), so the GIN scan intersects
/// instead of enumerating every match of the word; the exact comparison
/// then keeps that project only. Prefix matches in a small project, and
/// projects with no words to search by ("the"), come from reading the
/// project's first agents by name ([`SEARCH_PROJECT_SCAN`]).
fn build_search_sql(project: bool, several_words: bool) -> String {
    // `IS TRUE` keeps the planner from ANDing the project index into the
    // GIN scans: that would read every agent of a big project. The project
    // comes from `q` like the tsqueries: a plan for the value would be
    // re-planned (~1 ms) on most executions and gain nothing.
    let (in_project, project_words, and_project) = if project {
        (
            " AND (lower(project) = (SELECT project FROM q)) IS TRUE",
            ",\n        lower($9) AS project,
        plainto_tsquery('english', translate($9, '._-', '   ')) AS project_words",
            " && project_words",
        )
    } else {
        ("", "", "")
    };
    let matching = |tsquery: &str| format!("search @@ (SELECT {tsquery}{and_project} FROM q)");
    // Names (with the project's words, so that a project filter can
    // intersect in the index too).
    let named = |tsquery: &str| {
        format!(
            "to_tsvector('english', translate(name || ' ' || project, '._-', '   '))
             @@ (SELECT {tsquery}{and_project} FROM q)"
        )
    };
    const RARE_PREFIX: &str = " AND (SELECT rare FROM prefix)";
    const COMMON_PREFIX: &str = " AND NOT (SELECT rare FROM prefix)";
    let conjunction = several_words || project;
    let mut tiers = vec![Tier {
        name: "named",
        sampled: named("any_word"),
        full: if project {
            vec![
                (named("any_word"), RARE_PREFIX),
                (named("any_whole_word"), COMMON_PREFIX),
            ]
        } else {
            vec![(named("any_word"), "")]
        },
        after: None,
        candidates: SEARCH_NAME_CANDIDATES,
        enough: SEARCH_NAME_ENOUGH,
    }];
    let tier = |name, sampled: String, full, after| Tier {
        name,
        sampled,
        full,
        after,
        candidates: SEARCH_CANDIDATES,
        enough: SEARCH_ENOUGH,
    };
    let every_word = tier(
        "every_word",
        matching("all_words"),
        if conjunction {
            vec![
                (matching("all_words"), RARE_PREFIX),
                (matching("all_whole_words"), COMMON_PREFIX),
            ]
        } else {
            vec![(matching("all_words"), "")]
        },
        // With one word, "every word" is the word as a prefix: it adds
        // prefix-only matches, which rank below whole-word ones.
        (!several_words).then_some("whole_word"),
    );
    let whole_word = tier(
        "whole_word",
        matching("any_whole_word"),
        // With one word and a project, "every word whole" is the
        // every-word tier's already.
        if several_words || !project {
            vec![(matching("any_whole_word"), "")]
        } else {
            Vec::new()
        },
        None,
    );
    if several_words {
        tiers.extend([every_word, whole_word]);
        tiers.push(tier(
            "some_word",
            matching("any_word"),
            vec![(matching("any_word"), if project { RARE_PREFIX } else { "" })],
            Some("whole_word"),
        ));
    } else {
        tiers.extend([whole_word, every_word]);
    }

    let mut ctes = vec![
        format!(
            "q AS (SELECT to_tsquery('english', $1) AS any_word,
        to_tsquery('english', $2) AS all_words,
        to_tsquery('english', $3) AS any_whole_word,
        to_tsquery('english', $4) AS all_whole_words,
        to_tsquery('english', $5) AS last_word{project_words})"
        ),
        // Computed only when a gate asks.
        format!(
            "prefix AS (SELECT count(*) < {SEARCH_PREFIX_COMMON} AS rare FROM (
        SELECT 1 FROM agents WHERE search @@ (SELECT last_word FROM q)
        AND id % {} = 0 AND unregistered_at IS NULL LIMIT {SEARCH_PREFIX_COMMON}) s)",
            SEARCH_SAMPLES[0]
        ),
        format!(
            "exact AS (SELECT id FROM agents WHERE name = $6 AND unregistered_at IS NULL{in_project})"
        ),
    ];
    let mut pools = vec!["exact".to_owned()];
    // Per tier: the condition that it ran and came up short of `enough` at
    // every level, and the condition that it did not fill its `candidates`.
    let mut outcomes: Vec<(&str, String, String)> = Vec::new();
    // Without project words ("the"), the GIN scans would enumerate the
    // word's matches in the whole directory; the project scan answers. And
    // without words to search for (only stop words), `&&` would leave the
    // project's words alone, which match the whole project.
    let has_project_words = if project {
        " AND (SELECT numnode(project_words) > 0 AND numnode(any_word) > 0 FROM q)"
    } else {
        ""
    };
    for t in &tiers {
        // A level runs while the levels before it are all short of `enough`.
        let mut rare = match t.after {
            Some(after) => outcomes
                .iter()
                .find(|(name, ..)| *name == after)
                .map(|(.., not_full)| not_full.clone())
                .expect("a tier follows one built before it"),
            None => String::new(),
        };
        // Defines a level; returns its count of matches.
        let mut level = |name: String, matches: &str, in_sample: &str, gates: &str| {
            ctes.push(format!(
                "{name} AS (SELECT id FROM agents
        WHERE {matches}{in_sample} AND unregistered_at IS NULL{in_project}{has_project_words}{gates}
        LIMIT {})",
                t.candidates
            ));
            let count = format!("(SELECT count(*) FROM {name})");
            pools.push(name);
            count
        };
        let mut counts = Vec::new();
        for n in SEARCH_SAMPLES {
            let count = level(
                format!("{}_{n}", t.name),
                &t.sampled,
                &format!(" AND id % {n} = 0"),
                &rare,
            );
            rare.push_str(&format!(" AND {count} < {}", t.enough));
            counts.push(count);
        }
        // The whole directory's alternatives exclude each other.
        let full_gate = rare.clone();
        for (i, (matches, gate)) in t.full.iter().enumerate() {
            let count = level(
                format!("{}_all{i}", t.name),
                matches,
                "",
                &format!("{full_gate}{gate}"),
            );
            rare.push_str(&format!(" AND {count} < {}", t.enough));
            counts.push(count);
        }
        let not_full = format!(" AND {} < {}", counts.join(" + "), t.candidates);
        outcomes.push((t.name, rare, not_full));
    }
    // The project scan runs when the every-word tier came up short.
    let every_word_short = &outcomes
        .iter()
        .find(|(name, ..)| *name == "every_word")
        .expect("an every-word tier")
        .1;
    if project {
        ctes.push(format!(
            "in_project AS (SELECT id FROM (
        SELECT id, search FROM agents
        WHERE lower(project) = (SELECT project FROM q) AND unregistered_at IS NULL
        ORDER BY lower(project), name LIMIT {SEARCH_PROJECT_SCAN}) head
        WHERE search @@ (SELECT any_word FROM q){every_word_short}
        LIMIT {SEARCH_CANDIDATES})"
        ));
        pools.push("in_project".to_owned());
    }
    // The candidates are fetched by id from an array: primary-key lookups,
    // whatever the planner guesses their number to be (a join picked a hash
    // join over the whole table on a small directory).
    let candidates = pools
        .iter()
        .map(|t| format!("SELECT id FROM {t}"))
        .collect::<Vec<_>>()
        .join("\n        UNION ");
    format!(
        "WITH {},
    candidates AS ({candidates})
SELECT a.name, a.description, a.project, a.registered_at, a.last_seen_at
FROM agents a, q
WHERE a.id = ANY (ARRAY(SELECT id FROM candidates))
ORDER BY a.name = $6 DESC,
         a.search @@ q.all_words DESC,
         ts_rank(a.search, q.any_whole_word) DESC,
         ts_rank(a.search, q.any_word) DESC,
         a.name
LIMIT $7 OFFSET $8",
        ctes.join(",\n    ")
    )
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
        assert_eq!(q.all_whole, "invoice & mail");
        assert_eq!(q.last, "mail:*");
    }

    #[test]
    fn search_samples_have_their_indexes() {
        // A sample level without its partial index would scan the whole GIN.
        let migration = include_str!("../../migrations/V5__search_speed.sql");
        for n in SEARCH_SAMPLES {
            assert!(
                migration.contains(&format!("USING gin (search)\n    WHERE id % {n} = 0")),
                "no search index for 1 in {n}"
            );
            assert!(
                migration.contains(&format!("'   ')))\n    WHERE id % {n} = 0")),
                "no names index for 1 in {n}"
            );
        }
        for (project, several) in [(false, false), (false, true), (true, false), (true, true)] {
            let sql = search_sql(project, several);
            assert_eq!(sql.contains("$9"), project);
            assert_eq!(sql.contains("some_word"), several);
        }
    }

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor(&encode_cursor(20)).unwrap(), 20);
        assert!(decode_cursor("garbage").is_err());
        assert!(decode_cursor(&encode_cursor(-1)).is_err());
        assert!(decode_cursor(&encode_cursor(SEARCH_OFFSET_MAX + 1)).is_err());
    }
}
