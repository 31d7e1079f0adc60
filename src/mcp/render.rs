//! Compact text renderings of tool results: what a model reads in place of
//! the JSON, so it should not be a second copy of it.

use std::fmt::Write as _;

use super::wire::{
    Acked, Inbox, Message, Outbox, Registration, Rotated, SearchResult, Sent, Thread, Unregistered,
};

pub fn registration(r: &Registration) -> String {
    match &r.token {
        Some(token) => format!(
            "Registered '{}' (project {}). Token: {token}\n\
             Save the name and token in your persistent notes now: the token is not shown again.",
            r.name, r.project
        ),
        None => format!("Updated '{}' (project {}).", r.name, r.project),
    }
}

pub fn search(r: &SearchResult) -> String {
    if r.agents.is_empty() {
        return "No agents found.".into();
    }
    let mut out = String::new();
    for a in &r.agents {
        let seen = a.last_seen_at.as_deref().unwrap_or("never");
        let _ = writeln!(
            out,
            "- {} (project {}, last seen {seen}): {}",
            a.name, a.project, a.description
        );
    }
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "More results: cursor={cursor}");
    }
    out
}

pub fn sent(r: &Sent) -> String {
    if r.replayed {
        format!(
            "Already sent earlier as {} to {} (same idempotency_key); nothing new was sent.",
            r.id, r.to
        )
    } else {
        format!("Sent {} to {} (thread {}).", r.id, r.to, r.thread_id)
    }
}

pub fn inbox(r: &Inbox) -> String {
    let mut out = String::new();
    let remaining = match r.unread_remaining {
        100.. => "100+".to_string(),
        n => n.to_string(),
    };
    let _ = writeln!(
        out,
        "{} message(s); {remaining} unread still waiting.",
        r.messages.len()
    );
    messages(&mut out, &r.messages);
    out
}

pub fn thread(r: &Thread) -> String {
    let mut out = format!(
        "Thread {}: {} message(s), oldest first.\n",
        r.thread_id,
        r.messages.len()
    );
    messages(&mut out, &r.messages);
    if let Some(cursor) = &r.next_cursor {
        let _ = writeln!(out, "\nMore: cursor={cursor}");
    }
    out
}

fn messages(out: &mut String, list: &[Message]) {
    for m in list {
        let _ = write!(
            out,
            "\n[{}] from {} (project {}) to {} at {}",
            m.id, m.from, m.from_project, m.to, m.sent_at
        );
        if let Some(original) = &m.reply_to {
            let _ = write!(out, ", reply to {original}");
        }
        if let Some(until) = &m.lease_expires_at {
            let _ = write!(
                out,
                ", leased until {until} (delivery {})",
                m.delivery_count
            );
        }
        if let Some(receipt) = &m.receipt {
            let _ = write!(out, ", receipt {receipt}");
        }
        if m.dead_at.is_some() {
            let _ = write!(
                out,
                ", dead (leased {} times, never acknowledged)",
                m.delivery_count
            );
        }
        out.push('\n');
        if let Some(subject) = &m.subject {
            let _ = writeln!(out, "Subject: {subject}");
        }
        // The fence marks where another agent's words begin and end, with
        // its verified name, so they are read as data, not as instructions.
        let _ = writeln!(
            out,
            "<message from=\"{}\">\n{}\n</message>",
            m.from,
            m.body.trim_end()
        );
    }
}

pub fn acked(r: &Acked) -> String {
    let mut out = format!("Acknowledged {} message(s).", r.acknowledged.len());
    if !r.not_found.is_empty() {
        let _ = write!(
            out,
            " Not messages addressed to you: {}.",
            r.not_found.join(", ")
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
            .map(|s| format!(" \"{s}\""))
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
