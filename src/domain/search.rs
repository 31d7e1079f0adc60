//! Directory search: what a query may be, how user text becomes words, and
//! paging. The ranking itself is PostgreSQL full-text search
//! (`store::search`).

use base64::Engine as _;

use super::types::{self, InvalidInput};
use super::{Phone, PhoneError};
use crate::store;

pub use crate::store::rows::AgentCard;

pub const SEARCH_LIMIT_MAX: u32 = 50;
pub const SEARCH_QUERY_MAX: usize = 200;
/// Deep pages are refused rather than served slowly; refine the query instead.
const SEARCH_OFFSET_MAX: i64 = 10_000;
const SEARCH_WORDS_MAX: usize = 16;

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

#[derive(Debug, Clone)]
pub struct SearchResult {
    pub agents: Vec<AgentCard>,
    /// Pass back as `cursor` for the next page; absent on the last page.
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

impl Phone {
    pub async fn search(&self, req: SearchRequest) -> Result<SearchResult, PhoneError> {
        let db = self.store.db().await?;
        // One row more than asked tells whether another page exists.
        let fetch = i64::from(req.limit) + 1;
        let project = req.project.as_deref();
        let words = req.query.as_deref().map(query_words).unwrap_or_default();
        let stale = f64::from(self.mail_rules().stale_after_days) * 86_400.0;
        let mut agents = match &req.query {
            None => store::search::list(&db, project, fetch, req.offset, stale).await?,
            Some(query) => {
                let exact_name = query.trim().to_ascii_lowercase();
                store::search::search(&db, &words, &exact_name, project, fetch, req.offset, stale)
                    .await?
            }
        };
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
        assert_eq!(query_words("Invoice mail"), ["invoice", "mail"]);
    }

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor(&encode_cursor(20)).unwrap(), 20);
        assert!(decode_cursor("garbage").is_err());
        assert!(decode_cursor(&encode_cursor(-1)).is_err());
        assert!(decode_cursor(&encode_cursor(SEARCH_OFFSET_MAX + 1)).is_err());
    }
}
