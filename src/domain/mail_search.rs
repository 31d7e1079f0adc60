//! Search of one's own mail (`phone_inbox` with `query`): words, ranked,
//! with filters written into the query (`with:NAME`, `thread:ID`,
//! `since:DATE`) so that they cost the tool surface no arguments.

use base64::Engine as _;
use chrono::{DateTime, Datelike, NaiveDate, Utc};

use super::messages::{Inbox, UNREAD_COUNT_CAP, fit_answer};
use super::types::{AgentName, InvalidInput, MessageId};
use super::{Credentials, Phone, PhoneError};
use crate::store::{self, mail_search::MailQuery};

/// The longest query.
pub const QUERY_MAX: usize = 500;
/// Results a search pages through, at most: the candidates it ranks.
pub const SEARCH_DEPTH_MAX: u32 = store::mail_search::SEARCH_CANDIDATES as u32;

#[derive(Debug, Clone, PartialEq)]
pub struct MailSearch {
    /// The words, as given (the database parses them as plain text).
    pub words: String,
    pub with: Option<AgentName>,
    pub thread: Option<MessageId>,
    pub since: Option<DateTime<Utc>>,
    pub limit: u32,
    pub offset: u32,
}

impl MailSearch {
    pub fn parse(query: &str, limit: u32, cursor: Option<&str>) -> Result<Self, InvalidInput> {
        if query.len() > QUERY_MAX {
            return Err(InvalidInput::new(
                "query",
                format!("is {} bytes; at most {QUERY_MAX}", query.len()),
            ));
        }
        // PostgreSQL refuses a NUL in text: it was "internal error".
        if query.contains('\0') {
            return Err(InvalidInput::new(
                "query",
                "contains a NUL character (U+0000)",
            ));
        }
        let mut search = Self {
            words: String::new(),
            with: None,
            thread: None,
            since: None,
            limit,
            offset: cursor.map(decode_cursor).transpose()?.unwrap_or(0),
        };
        let mut words = Vec::new();
        for part in query.split_whitespace() {
            if let Some(name) = part.strip_prefix("with:") {
                search.with = Some(AgentName::parse("query", name)?);
            } else if let Some(id) = part.strip_prefix("thread:") {
                search.thread = Some(MessageId::parse("query", id)?);
            } else if let Some(date) = part.strip_prefix("since:") {
                search.since = Some(parse_since(date)?);
            } else {
                words.push(part);
            }
        }
        if words.is_empty() {
            return Err(InvalidInput::new(
                "query",
                "needs at least one word to search for (with:, thread: and since: only narrow it)",
            ));
        }
        search.words = words.join(" ");
        Ok(search)
    }
}

fn parse_since(raw: &str) -> Result<DateTime<Utc>, InvalidInput> {
    let parsed = DateTime::parse_from_rfc3339(raw)
        .ok()
        .map(|at| at.with_timezone(&Utc))
        .or_else(|| {
            NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .map(|d| d.and_utc())
        });
    // Years 1 to 9999: chrono reads dates far outside PostgreSQL's range
    // (4713 BC on), which failed the statement as an internal error.
    if let Some(at) = parsed
        && !(1..=9999).contains(&at.year())
    {
        return Err(InvalidInput::new(
            "query",
            format!(
                "since:{} is out of range; write a date from year 1 to 9999, e.g. since:2026-03-01",
                raw.chars().take(40).collect::<String>()
            ),
        ));
    }
    parsed.ok_or_else(|| {
        InvalidInput::new(
            "query",
            format!(
                "since:{} is not a date; write since:2026-03-01 or an RFC 3339 time",
                raw.chars().take(40).collect::<String>()
            ),
        )
    })
}

/// A cursor of a search: how many results came before, opaque to the agent.
fn encode_cursor(offset: u32) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("s:{offset}"))
}

fn decode_cursor(raw: &str) -> Result<u32, InvalidInput> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(raw.trim())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix("s:").and_then(|n| n.parse::<u32>().ok()))
        .filter(|n| *n < SEARCH_DEPTH_MAX)
        .ok_or_else(|| {
            InvalidInput::new(
                "cursor",
                "is not a cursor of this search; pass next_cursor back unchanged",
            )
        })
}

/// What a search found, best first.
#[derive(Debug, Clone)]
pub struct Found {
    pub inbox: Inbox,
    pub next_cursor: Option<String>,
}

impl Phone {
    /// The caller's own mail (sent or received) matching `search`.
    pub async fn search_mail(
        &self,
        creds: &Credentials,
        search: &MailSearch,
    ) -> Result<Found, PhoneError> {
        let db = self.store.db().await?;
        let limit = search.limit.min(SEARCH_DEPTH_MAX - search.offset);
        let found = store::mail_search::search(
            &db,
            creds.token.as_bytes(),
            creds.claimed.as_ref().map(AgentName::as_str),
            &MailQuery {
                words: &search.words,
                with: search.with.as_ref().map(AgentName::as_str),
                thread_id: search.thread.map(|t| t.0),
                since: search.since,
                // One more than asked: whether a next page exists.
                limit: i64::from(limit) + 1,
                offset: i64::from(search.offset),
            },
            UNREAD_COUNT_CAP,
        )
        .await?;
        drop(db);
        let Some(_) = found.me_id else {
            return Err(self.authentication_error(creds).await);
        };
        let mut messages = found.messages;
        let more = messages.len() > limit as usize;
        messages.truncate(limit as usize);
        let full = fit_answer(&mut messages, super::messages::Message::text_bytes);
        // The next page starts after the last message shown.
        let shown = messages.len() as u32;
        let next_cursor = (more || full)
            .then(|| encode_cursor(search.offset + shown))
            .filter(|_| search.offset + shown < SEARCH_DEPTH_MAX);
        for m in &mut messages {
            m.leased_until = None;
        }
        Ok(Found {
            inbox: Inbox {
                messages,
                unread_remaining: found.waiting.clamp(0, UNREAD_COUNT_CAP),
                acked: None,
                full,
                next_cursor: None,
            },
            next_cursor,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_taken_out_of_the_words() {
        let s = MailSearch::parse(
            "March invoice with:Email since:2026-03-01 thread:msg_7",
            10,
            None,
        )
        .unwrap();
        assert_eq!(s.words, "March invoice");
        assert_eq!(s.with.unwrap().as_str(), "email");
        assert_eq!(s.thread, Some(MessageId(7)));
        assert_eq!(s.since.unwrap().to_rfc3339(), "2026-03-01T00:00:00+00:00");
        for (bad, says) in [
            ("with:email", "at least one word"),
            ("x since:yesterday", "not a date"),
            ("x since:-4714-01-01", "out of range"),
            ("x since:0000-12-31T00:00:00Z", "out of range"),
            ("x thread:7x", "query"),
        ] {
            let err = MailSearch::parse(bad, 10, None).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let next = encode_cursor(20);
        assert_eq!(MailSearch::parse("x", 10, Some(&next)).unwrap().offset, 20);
        assert!(MailSearch::parse("x", 10, Some("bogus")).is_err());
    }
}
