//! Values that parse on the way in, so an invalid one never travels further.

use std::fmt;

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};

/// How every time is written for agents: RFC 3339, UTC, milliseconds.
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// A message's times, to the second: an inbox carries several per message,
/// and milliseconds tell an agent nothing (the order is the ids').
pub fn message_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// Why an argument was refused, phrased for the agent that sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}` {reason}")]
pub struct InvalidInput {
    pub field: &'static str,
    pub reason: String,
}

impl InvalidInput {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

pub const NAME_MAX: usize = 64;
pub const DESCRIPTION_MAX: usize = 1000;
pub const PROJECT_MAX: usize = 100;
pub const SUBJECT_MAX: usize = 200;
pub const BODY_MAX_BYTES: usize = 64 * 1024;
pub const IDEMPOTENCY_KEY_MAX: usize = 200;

/// An agent's unique name: ASCII letters, digits, `-`, `_`, `.`; 1–64 chars;
/// lowercased, so uniqueness is case-insensitive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentName(String);

impl AgentName {
    pub fn parse(field: &'static str, raw: &str) -> Result<Self, InvalidInput> {
        let name = raw.trim();
        if name.is_empty() {
            return Err(InvalidInput::new(field, "must not be empty"));
        }
        // Characters first: then the length in bytes is the length in
        // characters (40 'é' were "80 characters long").
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(InvalidInput::new(
                field,
                format!(
                    "may only contain ASCII letters, digits, '-', '_' and '.'; found {}",
                    describe_char(bad)
                ),
            ));
        }
        if name.len() > NAME_MAX {
            return Err(InvalidInput::new(
                field,
                format!("is {} characters long; the limit is {NAME_MAX}", name.len()),
            ));
        }
        Ok(Self(name.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Characters a reader does not see that change what it reads: line and
/// paragraph separators (a line break that no `\n` check finds), bidi
/// embeddings, overrides, isolates and marks (text shown in another order),
/// zero-width and filler characters, tags (U+E0000..: ASCII spelled
/// invisibly, which a model reads and a person reviewing the text does not),
/// variation selectors other than the emoji ones. Clients showing another
/// agent's text replace them all; text fields refuse the few that disguise
/// text ([`is_disguising_char`]), and keep the others, which legitimate
/// text uses.
pub fn is_hidden_char(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0D}' | '\u{FEFF}'
        | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}' | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E007F}' | '\u{E0100}'..='\u{E01EF}')
}

/// The hidden characters that change how text reads rather than how it
/// looks: line and paragraph separators (a line break no `\n` check finds:
/// a forged header line), bidi embeddings, overrides and isolates (words
/// shown in another order), interlinear annotations, the deprecated format
/// controls, and tags (ASCII spelled invisibly; the subdivision flags of
/// England, Scotland and Wales spell their region with them, and are
/// refused with them). Zero-width joiners (emoji, Persian, Indic scripts),
/// bidi marks (mixed right-to-left text), soft hyphens and variation
/// selectors (ideographs, Mongolian, emoji) stay.
pub fn is_disguising_char(c: char) -> bool {
    matches!(c,
        '\u{2028}'..='\u{202E}' | '\u{2066}'..='\u{206F}' | '\u{FFF9}'..='\u{FFFB}'
        | '\u{E0000}'..='\u{E007F}')
}

/// What text fields other agents read (subject, project, description)
/// refuse: control characters and [`is_disguising_char`]s.
fn refused_in_text(c: char) -> bool {
    c.is_control() || is_disguising_char(c)
}

/// Free text shown to other agents (description, project, subject): one line,
/// no control or hidden characters, bounded.
pub fn single_line(
    field: &'static str,
    raw: &str,
    max_chars: usize,
) -> Result<String, InvalidInput> {
    let text = raw.trim();
    if text.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    check_chars(field, text, refused_in_text)?;
    check_len(field, text, max_chars)?;
    Ok(text.to_owned())
}

/// A description may span lines, but carries no other control characters.
pub fn description(raw: &str) -> Result<String, InvalidInput> {
    let text = raw.trim();
    if text.is_empty() {
        return Err(InvalidInput::new(
            "description",
            "must not be empty; say what this agent can do, so others can find it",
        ));
    }
    check_chars("description", text, |c| {
        refused_in_text(c) && c != '\n' && c != '\t'
    })?;
    check_len("description", text, DESCRIPTION_MAX)?;
    Ok(text.to_owned())
}

/// A message body: any text but NUL (Postgres cannot store it), up to 64 KiB.
/// Kept exactly as sent, whitespace included.
pub fn body(raw: &str) -> Result<String, InvalidInput> {
    if raw.trim().is_empty() {
        return Err(InvalidInput::new("body", "must not be empty"));
    }
    check_chars("body", raw, |c| c == '\0')?;
    if raw.len() > BODY_MAX_BYTES {
        return Err(InvalidInput::new(
            "body",
            format!(
                "is {} bytes; the limit is {BODY_MAX_BYTES} bytes (64 KiB). Split it into several messages",
                raw.len()
            ),
        ));
    }
    Ok(raw.to_owned())
}

fn check_chars(
    field: &'static str,
    text: &str,
    bad: impl Fn(char) -> bool,
) -> Result<(), InvalidInput> {
    match text.chars().find(|&c| bad(c)) {
        Some(c) => Err(InvalidInput::new(
            field,
            format!("contains {}, which is not allowed here", describe_char(c)),
        )),
        None => Ok(()),
    }
}

fn check_len(field: &'static str, text: &str, max_chars: usize) -> Result<(), InvalidInput> {
    let n = text.chars().count();
    if n > max_chars {
        Err(InvalidInput::new(
            field,
            format!("is {n} characters long; the limit is {max_chars}"),
        ))
    } else {
        Ok(())
    }
}

fn describe_char(c: char) -> String {
    if c == '\0' {
        "a NUL character (U+0000)".into()
    } else if c.is_control() || c.is_whitespace() || is_disguising_char(c) {
        format!("the invisible character U+{:04X}", c as u32)
    } else {
        format!("'{c}' (U+{:04X})", c as u32)
    }
}

const TOKEN_PREFIX: &str = "phn_";
const TOKEN_RANDOM_BYTES: usize = 32;
/// `phn_` + 43 base64url characters (256 random bits).
const TOKEN_LEN: usize = 4 + 43;

/// A bearer token. Only its SHA-256 digest is ever stored or compared; the
/// plaintext is shown once, when issued. `Debug` never prints it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    pub fn generate() -> Self {
        let mut bytes = [0u8; TOKEN_RANDOM_BYTES];
        rand::fill(&mut bytes);
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        Self(format!("{TOKEN_PREFIX}{encoded}"))
    }

    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let raw = raw.trim();
        let well_formed = raw.len() == TOKEN_LEN
            && raw.starts_with(TOKEN_PREFIX)
            && raw[TOKEN_PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if well_formed {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput::new(
                "token",
                "is malformed: a phone token looks like phn_ followed by 43 letters, digits, '-' or '_' \
                 (use the token phone_register gave you, exactly as shown)",
            ))
        }
    }

    pub fn hash(&self) -> TokenHash {
        TokenHash(Sha256::digest(self.0.as_bytes()).into())
    }

    /// The plaintext, for the single response that issues it.
    pub fn reveal(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenHash(<redacted>)")
    }
}

/// Message ids travel as opaque strings (`msg_<n>`); the number is internal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub i64);

impl MessageId {
    pub fn parse(field: &'static str, raw: &str) -> Result<Self, InvalidInput> {
        raw.trim()
            .strip_prefix("msg_")
            .and_then(|n| n.parse::<i64>().ok())
            .filter(|&n| n > 0)
            .map(Self)
            .ok_or_else(|| {
                InvalidInput::new(
                    field,
                    format!("{raw:?} is not a message id; ids look like msg_123, copy one from phone_inbox or phone_send"),
                )
            })
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "msg_{}", self.0)
    }
}

/// The receipt of one lease delivery: the message, and which of its
/// deliveries (its delivery count when handed out). Opaque to the agent:
/// `rcpt_` + base64url of `<id>.<delivery>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub message: MessageId,
    pub delivery: i32,
}

impl Receipt {
    pub const PREFIX: &'static str = "rcpt_";

    pub fn parse(field: &'static str, raw: &str) -> Result<Self, InvalidInput> {
        let invalid = || {
            InvalidInput::new(
                field,
                format!(
                    "{:?} is not a receipt; receipts look like rcpt_… and come with each message phone_inbox mode=lease hands out",
                    raw.chars().take(80).collect::<String>()
                ),
            )
        };
        let encoded = raw.trim().strip_prefix(Self::PREFIX).ok_or_else(invalid)?;
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(invalid)?;
        let (id, delivery) = decoded.split_once('.').ok_or_else(invalid)?;
        let id = id
            .parse::<i64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(invalid)?;
        let delivery = delivery
            .parse::<i32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(invalid)?;
        Ok(Self {
            message: MessageId(id),
            delivery,
        })
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{}.{}", self.message.0, self.delivery));
        write!(f, "{}{encoded}", Self::PREFIX)
    }
}

/// A client-chosen key that makes a send safe to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        // ASCII spaces only: trimmed of any Unicode space, "w1\u{2028}" and
        // "\u{3000}w1" were one key, and the second send was refused as
        // reusing a key the caller never sent.
        let key = raw.trim_ascii();
        if key.is_empty() {
            return Err(InvalidInput::new(
                "idempotency_key",
                "must not be empty when given",
            ));
        }
        // Errors quote a key back: no line separator or bidi control in it.
        check_chars("idempotency_key", key, refused_in_text)?;
        check_len("idempotency_key", key, IDEMPOTENCY_KEY_MAX)?;
        Ok(Self(key.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `text` spelled in tag characters (U+E0000 + each ASCII code): invisible,
/// and read by a model all the same. For tests of what hides it.
#[cfg(test)]
pub fn spelled_in_tags(text: &str) -> String {
    text.chars()
        .map(|c| char::from_u32(0xE0000 + c as u32).expect("ASCII"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_any_character_but_ascii_spaces_at_their_ends() {
        let key = |raw: &str| IdempotencyKey::parse(raw).unwrap().as_str().to_owned();
        assert_eq!(key(" k1\t"), "k1");
        for raw in ["k1\u{a0}", "\u{3000}k1"] {
            assert_eq!(key(raw), raw, "{raw:?}");
        }
        assert!(IdempotencyKey::parse("k1\u{2028}").is_err());
        assert!(IdempotencyKey::parse("k1\u{202E}").is_err());
        assert!(IdempotencyKey::parse("\u{3000}").is_ok());
        assert!(IdempotencyKey::parse("  ").is_err());
    }

    #[test]
    fn names_are_lowercased_and_checked() {
        assert_eq!(
            AgentName::parse("name", " Email.Bot_2 ").unwrap().as_str(),
            "email.bot_2"
        );
        assert!(AgentName::parse("name", "").is_err());
        assert!(AgentName::parse("name", &"a".repeat(65)).is_err());
        assert!(AgentName::parse("name", &"a".repeat(64)).is_ok());
        for bad in [
            "a b", "émail", "a/b", "a\0b", "аdmin", /* Cyrillic а */
        ] {
            assert!(
                AgentName::parse("name", bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn tokens_round_trip_and_hide() {
        let token = Token::generate();
        assert_eq!(token.reveal().len(), TOKEN_LEN);
        assert_eq!(
            Token::parse(token.reveal()).unwrap().reveal(),
            token.reveal()
        );
        assert_ne!(Token::generate().reveal(), token.reveal());
        assert!(!format!("{token:?}").contains(token.reveal()));
        assert!(Token::parse("phn_short").is_err());
        assert!(Token::parse(&format!("xyz_{}", &token.reveal()[4..])).is_err());
        assert_eq!(
            token.hash().0,
            <[u8; 32]>::from(Sha256::digest(token.reveal().as_bytes()))
        );
    }

    #[test]
    fn message_ids_are_opaque_strings() {
        assert_eq!(
            MessageId::parse("reply_to", "msg_42").unwrap(),
            MessageId(42)
        );
        assert_eq!(MessageId(42).to_string(), "msg_42");
        for bad in [
            "42",
            "msg_",
            "msg_-1",
            "msg_0",
            "msg_1x",
            "msg_99999999999999999999",
        ] {
            assert!(MessageId::parse("reply_to", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn receipts_round_trip_and_reject_forgeries() {
        let r = Receipt {
            message: MessageId(42),
            delivery: 3,
        };
        let text = r.to_string();
        assert!(text.starts_with("rcpt_"), "{text}");
        assert_eq!(Receipt::parse("ids", &text).unwrap(), r);
        for bad in [
            "rcpt_",
            "rcpt_!!",
            "msg_42",
            "rcpt_NDI",
            "rcpt_MC4x",
            "rcpt_NDIuMA",
        ] {
            assert!(Receipt::parse("ids", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bodies_keep_whitespace_refuse_nul_and_oversize() {
        assert_eq!(body("  hi\n").unwrap(), "  hi\n");
        assert!(body("a\0b").unwrap_err().reason.contains("NUL"));
        assert!(body(" \n ").is_err());
        assert!(body(&"x".repeat(BODY_MAX_BYTES + 1)).is_err());
        assert!(body(&"x".repeat(BODY_MAX_BYTES)).is_ok());
    }
}
