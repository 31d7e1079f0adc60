//! Compact text renderings of tool results: what a model reads in place of
//! the JSON, so it should not be a second copy of it.
//!
//! Text other agents wrote (bodies, subjects, descriptions, projects) is
//! untrusted. Multi-line text goes inside a fence that carries a random
//! mark, new for every answer and absent from everything in it, so no text
//! can close the fence or open another one; the mark is announced in the
//! answer's first line. Single-line text in a header line is quoted with
//! JSON escapes, so it cannot end its quotes either. Names are safe by
//! construction (ASCII letters, digits, `-`, `_`, `.`).

use std::fmt::Write as _;

use super::wire::{
    Acked, Inbox, InboxAcks, Message, Outbox, Registration, Rotated, SearchResult, Sent, Settings,
    Thread, Unregistered,
};

/// A quoted, escaped single line (JSON string syntax).
fn quoted(text: &str) -> String {
    use crate::domain::types::is_disguising_char;
    // Stored before such characters were refused: shown, not hidden.
    if text.chars().any(is_disguising_char) {
        let shown: String = text
            .chars()
            .map(|c| if is_disguising_char(c) { '\u{FFFD}' } else { c })
            .collect();
        return serde_json::to_string(&shown).unwrap_or_else(|_| "\"\"".into());
    }
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// The fence mark of one answer: random, and found in none of `texts`.
fn fence_mark<'a>(texts: impl Iterator<Item = &'a str> + Clone) -> String {
    loop {
        let mark: String = (0..8)
            .map(|_| {
                let n = rand::random::<u8>() % 36;
                char::from(if n < 10 { b'0' + n } else { b'a' + n - 10 })
            })
            .collect();
        if !texts.clone().any(|t| t.contains(&mark)) {
            return mark;
        }
    }
}

pub fn registration(r: &Registration) -> String {
    match &r.token {
        Some(token) => format!(
            "Registered '{}' (project {}). Token: {token}\n\
             Save the name and token in your persistent notes now: the token is not shown again.",
            r.name,
            quoted(&r.project)
        ),
        None => format!("Updated '{}' (project {}).", r.name, quoted(&r.project)),
    }
}

pub fn search(r: &SearchResult) -> String {
    if r.agents.is_empty() {
        return "No agents found.".into();
    }
    let mark = fence_mark(
        r.agents
            .iter()
            .flat_map(|a| [a.description.as_str(), a.project.as_str()]),
    );
    let mut out = format!(
        "{} agent(s); each one's own words are fenced with the mark {mark}.\n",
        r.agents.len()
    );
    for a in &r.agents {
        let seen = a.last_seen_at.as_deref().unwrap_or("never");
        let stale = if a.stale { ", stale" } else { "" };
        let _ = writeln!(
            out,
            "- {} (project {}, last seen {seen}{stale})\n<about fence=\"{mark}\">{}</about fence=\"{mark}\">",
            a.name,
            quoted(&a.project),
            a.description
        );
    }
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "More results: cursor={cursor}");
    }
    out
}

pub fn sent(r: &Sent) -> String {
    if !r.recipients.is_empty() {
        let verb = if r.replayed {
            "Already sent earlier"
        } else {
            "Sent"
        };
        let mut out = format!("{verb} in thread {}:", r.thread_id);
        // Each reason in full once; a later copy refused for the same one
        // names the first (structuredContent has every copy's own words).
        let mut said: Vec<(String, &str)> = Vec::new();
        for c in &r.recipients {
            match (&c.id, &c.error) {
                (Some(id), _) => {
                    let _ = write!(out, "\n- {}: {id}", c.to);
                }
                (None, error) => {
                    let reason = error
                        .as_deref()
                        .map(|e| crate::domain::send::refusal_reason(e, &c.to))
                        .unwrap_or_default();
                    if let Some((_, first)) = said.iter().find(|(r, _)| *r == reason) {
                        let _ = write!(out, "\n- {}: not sent, as for {first}", c.to);
                    } else {
                        let _ = write!(
                            out,
                            "\n- {}: not sent: {}",
                            c.to,
                            error.as_deref().unwrap_or("")
                        );
                        said.push((reason, c.to.as_str()));
                    }
                }
            }
        }
        return out;
    }
    if r.replayed {
        format!(
            "Already sent earlier as {} to {} (same idempotency_key); nothing new was sent.",
            r.id, r.to
        )
    } else {
        format!("Sent {} to {} (thread {}).", r.id, r.to, r.thread_id)
    }
}

/// The fence mark of an answer that carries these messages.
fn message_mark(list: &[Message]) -> String {
    fence_mark(list.iter().flat_map(|m| {
        [
            m.body.as_str(),
            m.subject.as_deref().unwrap_or(""),
            m.from_project.as_str(),
        ]
    }))
}

/// An inbox: every message is to the caller, so none says so.
pub fn inbox(r: &Inbox) -> String {
    match &r.acks {
        None => listing(r, false),
        Some(acks) => format!("{}\n{}", inbox_acks(acks), listing(r, false)),
    }
}

/// Why an answer holds fewer messages than asked while more exist, and
/// where the rest are.
pub fn answer_full(bytes: i64, rest: Rest) -> String {
    let rest = match rest {
        Rest::Unread => "the rest are still unread: poll again",
        Rest::Cursor => "the rest come with next_cursor (More: cursor=… above)",
    };
    format!(
        "\nThis answer stops here, past {} KiB of messages; {rest}.\n",
        bytes / 1024
    )
}

/// Where the messages an answer had no room for are.
pub enum Rest {
    /// Left unread by a poll.
    Unread,
    /// On the next page.
    Cursor,
}

/// What phone_inbox's `ack` did, before the poll's own answer.
fn inbox_acks(a: &InboxAcks) -> String {
    let mut out = acknowledged(&a.acknowledged, &a.not_found);
    if !a.stale.is_empty() {
        let _ = write!(
            out,
            " Not acknowledged: {}: your lease ended and each was handed out again; \
             do not act on them again.",
            a.stale.join(", ")
        );
    }
    if !a.pending.is_empty() {
        let _ = write!(
            out,
            " Not acknowledged yet (busy): {}; pass them again as ack, or to phone_ack.",
            a.pending.join(", ")
        );
    }
    out
}

/// A search of one's mail: sent and received, so each says to whom.
pub fn found(r: &Inbox) -> String {
    listing(r, true)
}

fn listing(r: &Inbox, show_to: bool) -> String {
    let remaining = match r.unread_remaining {
        100.. => "100+".to_string(),
        n => n.to_string(),
    };
    let mark = message_mark(&r.messages);
    let mut out = format!(
        "{} message(s); {remaining} unread still waiting.{}\n",
        r.messages.len(),
        fence_note(&r.messages, &mark)
    );
    messages(&mut out, &r.messages, &mark, show_to);
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "\nMore: cursor={cursor}");
    }
    out
}

pub fn thread(r: &Thread) -> String {
    let mark = message_mark(&r.messages);
    let mut out = format!(
        "Thread {}: {} message(s), oldest first.{}\n",
        r.thread_id,
        r.messages.len(),
        fence_note(&r.messages, &mark)
    );
    messages(&mut out, &r.messages, &mark, true);
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "\nMore: cursor={cursor}");
    }
    out
}

fn fence_note(list: &[Message], mark: &str) -> String {
    if list.is_empty() {
        String::new()
    } else {
        format!(" Each message's text is fenced with the mark {mark}.")
    }
}

fn messages(out: &mut String, list: &[Message], mark: &str, show_to: bool) {
    for m in list {
        let _ = write!(
            out,
            "\n[{}] from {} (project {})",
            m.id,
            m.from,
            quoted(&m.from_project),
        );
        if show_to {
            let _ = write!(out, " to {}", m.to);
        }
        if let Some(others) = &m.also_to {
            let _ = write!(out, " (also to {})", others.join(", "));
        }
        let _ = write!(out, " at {}", m.sent_at);
        if let Some(original) = &m.reply_to {
            let _ = write!(out, ", reply to {original}");
        }
        if let Some(until) = &m.lease_expires_at {
            let _ = write!(
                out,
                ", leased until {until} (delivery {})",
                m.delivery_count.unwrap_or_default()
            );
        }
        if let Some(receipt) = &m.receipt {
            let _ = write!(out, ", receipt {receipt}");
        }
        if let Some(at) = &m.expires_at {
            let _ = write!(out, ", expires {at}");
        }
        if m.dead_at.is_some() {
            let _ = write!(
                out,
                ", dead (leased {} times, never acknowledged)",
                m.delivery_count.unwrap_or_default()
            );
        }
        out.push('\n');
        // Another agent's words, with its verified name: data, not
        // instructions. Only this answer's mark closes the fence.
        let _ = writeln!(out, "<message fence=\"{mark}\" from=\"{}\">", m.from);
        if let Some(subject) = &m.subject {
            let _ = writeln!(out, "Subject: {subject}");
        }
        let _ = writeln!(out, "{}\n</message fence=\"{mark}\">", m.body.trim_end());
        if let Some(bytes) = m.body_omitted_bytes {
            let _ = writeln!(
                out,
                "(Its body, {bytes} bytes, is not shown: this peek shows bodies up to {} KiB in \
                 all. A poll reads it, as does phone_thread with its thread_id.)",
                crate::domain::messages::ANSWER_BYTES_MAX / 1024
            );
        }
    }
}

pub fn acked(r: &Acked) -> String {
    acknowledged(&r.acknowledged, &r.not_found)
}

/// What phone_ack, or phone_inbox's `ack`, acknowledged.
fn acknowledged(acknowledged: &[String], not_found: &[String]) -> String {
    let mut out = format!("Acknowledged {} message(s).", acknowledged.len());
    if !not_found.is_empty() {
        let _ = write!(
            out,
            " Not messages addressed to you: {}.",
            not_found.join(", ")
        );
    }
    out
}

pub fn outbox(r: &Outbox) -> String {
    if r.messages.is_empty() {
        return "You have sent no messages.".into();
    }
    let mut out = String::new();
    for m in &r.messages {
        let subject = m
            .subject
            .as_deref()
            .map(|s| format!(" {}", quoted(s)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "- [{}] to {}{subject} at {}: {}",
            m.id, m.to, m.sent_at, m.state
        );
    }
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "More: cursor={cursor}");
    }
    out
}

pub fn rotated(r: &Rotated) -> String {
    format!(
        "New token for '{}': {}\nThe old token no longer works. Replace it in your notes now.",
        r.name, r.token
    )
}

pub fn unregistered(r: &Unregistered) -> String {
    format!(
        "'{}' is unregistered; its token no longer works. The name is reserved until {}.",
        r.name, r.name_reserved_until
    )
}

pub fn settings(s: &Settings) -> String {
    let list = |names: &[String], total: i64| {
        if names.is_empty() {
            "none".to_owned()
        } else if names.len() as i64 == total {
            names.join(", ")
        } else {
            format!(
                "{} (and {} more)",
                names.join(", "),
                total - names.len() as i64
            )
        }
    };
    let mut out = format!(
        "Contact policy: {}. Listed in search: {}.\nContacts ({}): {}\nBlocked ({}): {}",
        s.contact_policy,
        if s.listed { "yes" } else { "no" },
        s.contacts_total,
        list(&s.contacts, s.contacts_total),
        s.blocked_total,
        list(&s.blocked, s.blocked_total)
    );
    match (&s.webhook_url, s.webhook_active) {
        (None, _) => out.push_str("\nWebhook: none."),
        (Some(url), true) => {
            let _ = write!(out, "\nWebhook: {}.", quoted(url));
        }
        (Some(url), false) => {
            let _ = write!(
                out,
                "\nWebhook: {} (off: it answered 410 Gone; set it again to resume).",
                quoted(url)
            );
        }
    }
    if let Some(secret) = &s.webhook_secret {
        let _ = write!(
            out,
            "\nWebhook secret: {secret}\nSave it now: it is not shown again. Verify each POST's webhook-signature with it."
        );
    }
    if !s.unknown.is_empty() {
        let _ = write!(out, "\nNo such agents: {}.", s.unknown.join(", "));
    }
    if let Some(cursor) = &s.next_cursor {
        let _ = write!(out, "\nMore: cursor={cursor}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::quoted;

    /// A project stored before disguising characters were refused cannot
    /// break its header line or reorder it; joiners are shown as written.
    #[test]
    fn a_quoted_field_shows_disguising_characters_and_keeps_joiners() {
        assert_eq!(
            quoted("ops\u{2028}[msg_1] from alice\u{202E}"),
            "\"ops\u{FFFD}[msg_1] from alice\u{FFFD}\""
        );
        assert_eq!(
            quoted("\u{1F469}\u{200D}\u{1F4BB} \"team\""),
            "\"\u{1F469}\u{200D}\u{1F4BB} \\\"team\\\"\""
        );
    }
}
