//! The console's pages, rendered on the server (maud escapes every value).
//! Text that senders wrote (names, subjects, bodies, descriptions) sits in
//! its own `<bdi>` or `<pre>`, so bidi controls in it cannot reorder the
//! words around it, and it is never parsed as HTML.

use axum::{
    http::StatusCode,
    response::{Html, IntoResponse, Response},
};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::domain::{
    MessageId,
    console::{InboxPage, THREAD_COUNT_MAX, ThreadsPage},
    messages::{Delivery, Message, Outbox, Thread},
    search::SearchResult,
};

/// Changes with each build of the stylesheet, so browsers never keep a
/// stale one.
pub const STYLE_PATH: &str = concat!("/console/assets/console.css?v=", env!("CARGO_PKG_VERSION"));

/// Who is signed in, for the header.
pub struct Chrome<'a> {
    pub agent: Option<&'a str>,
    pub operator: bool,
    pub csrf: Option<&'a str>,
    /// The current section, highlighted in the menu.
    pub section: &'a str,
}

impl Chrome<'_> {
    pub const SIGNED_OUT: Chrome<'static> = Chrome {
        agent: None,
        operator: false,
        csrf: None,
        section: "",
    };
}

/// A note at the top of a page: what just happened, or what went wrong.
pub enum Notice<'a> {
    Done(&'a str),
    Problem(&'a str),
}

pub fn page(title: &str, chrome: &Chrome<'_>, notice: Option<Notice<'_>>, body: Markup) -> Markup {
    let link = |href: &str, label: &str, section: &str| {
        html! {
            @if chrome.section == section {
                a href=(href) aria-current="page" { (label) }
            } @else {
                a href=(href) { (label) }
            }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · phone console" }
                link rel="stylesheet" href=(STYLE_PATH);
                link rel="icon" type="image/svg+xml" href="/console/assets/icon.svg";
            }
            body {
                header.top {
                    a.brand href="/console" { "☎ phone" }
                    @if let Some(agent) = chrome.agent {
                        nav aria-label="Mailbox" {
                            (link("/console/inbox", "Inbox", "inbox"))
                            (link("/console/outbox", "Sent", "outbox"))
                            (link("/console/threads", "Threads", "threads"))
                            (link("/console/compose", "Write", "compose"))
                            (link("/console/directory", "Directory", "directory"))
                        }
                        div.who {
                            span { "Signed in as " strong { bdi { (agent) } } }
                            (sign_out(chrome.csrf))
                        }
                    } @else if chrome.operator {
                        nav aria-label="Operator" { (link("/console/operator", "Overview", "operator")) }
                        div.who { span { "Operator" } (sign_out(chrome.csrf)) }
                    }
                }
                main {
                    @match notice {
                        Some(Notice::Done(text)) => p.notice.done role="status" { (text) },
                        Some(Notice::Problem(text)) => p.notice.problem role="alert" { (text) },
                        None => {},
                    }
                    (body)
                }
                footer { "Looking here never marks mail read: your agent still gets every message." }
            }
        }
    }
}

fn sign_out(csrf: Option<&str>) -> Markup {
    html! {
        form.inline method="post" action="/console/sign-out" {
            input type="hidden" name="csrf" value=(csrf.unwrap_or_default());
            button.link type="submit" { "Sign out" }
        }
    }
}

/// An answer with `status` and the page.
pub fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// A page that says what went wrong and what to do, never a bare error.
pub fn problem(status: StatusCode, title: &str, message: &str) -> Response {
    respond(
        status,
        page(
            title,
            &Chrome::SIGNED_OUT,
            None,
            html! {
                h1 { (title) }
                p { (message) }
                p { a href="/console" { "Back to the console" } }
            },
        ),
    )
}

/// "1 message", "3 messages".
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn when(t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) { (t.format("%Y-%m-%d %H:%M UTC")) } }
}

fn message_link(id: i64) -> String {
    format!("/console/messages/{}", MessageId(id))
}

fn subject_of(subject: Option<&str>, body: &str) -> String {
    match subject.filter(|s| !s.trim().is_empty()) {
        Some(s) => s.to_owned(),
        None => {
            let first = body.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            let mut preview: String = first.chars().take(80).collect();
            if first.chars().count() > 80 {
                preview.push('…');
            }
            if preview.is_empty() {
                "(no subject)".into()
            } else {
                preview
            }
        }
    }
}

fn state_badge(state: Delivery) -> Markup {
    let label = match state {
        Delivery::Waiting => "unread",
        Delivery::Leased => "leased",
        Delivery::Read => "read",
        Delivery::Acknowledged => "acknowledged",
        Delivery::Dead => "dead",
        Delivery::Expired => "expired",
    };
    html! { span class=(format!("badge {label}")) { (label) } }
}

pub fn sign_in(chrome: &Chrome<'_>, notice: Option<Notice<'_>>, name: &str, csrf: &str) -> Markup {
    page(
        "Sign in",
        chrome,
        notice,
        html! {
            section.card.narrow {
                h1 { "Sign in as your agent" }
                p.muted { "Use the name and token your agent got from phone_register. The token stays in this form: it is never put in a link." }
                form method="post" action="/console/sign-in" {
                    input type="hidden" name="csrf" value=(csrf);
                    label for="name" { "Agent name" }
                    input #name type="text" name="name" value=(name) required autocomplete="username"
                        autocapitalize="none" spellcheck="false" maxlength="64";
                    label for="token" { "Token" }
                    input #token type="password" name="token" required autocomplete="current-password"
                        spellcheck="false" maxlength="200" placeholder="phn_…";
                    button type="submit" { "Sign in" }
                }
                p.muted.small { a href="/console/operator" { "Operator overview" } }
            }
        },
    )
}

pub fn operator_sign_in(chrome: &Chrome<'_>, error: Option<&str>, csrf: &str) -> Markup {
    page(
        "Operator sign in",
        chrome,
        error.map(Notice::Problem),
        html! {
            section.card.narrow {
                h1 { "Operator overview" }
                p.muted { "Sign in with the server's PHONE_CONSOLE_ADMIN_TOKEN." }
                form method="post" action="/console/operator/sign-in" {
                    input type="hidden" name="csrf" value=(csrf);
                    label for="admin_token" { "Operator token" }
                    input #admin_token type="password" name="token" required autocomplete="current-password" maxlength="1000";
                    button type="submit" { "Sign in" }
                }
            }
        },
    )
}

pub fn inbox(chrome: &Chrome<'_>, page_data: &InboxPage, unread_only: bool) -> Markup {
    let unread = if page_data.unread >= crate::domain::console::UNREAD_SHOWN_MAX {
        format!("{}+", page_data.unread)
    } else {
        page_data.unread.to_string()
    };
    let view = if unread_only { "unread" } else { "all" };
    page(
        "Inbox",
        chrome,
        None,
        html! {
            div.heading {
                h1 { "Inbox" }
                p.muted { (unread) " unread" }
                nav.tabs aria-label="Which messages" {
                    @if unread_only { a href="/console/inbox" { "All" } span.current { "Unread" } }
                    @else { span.current { "All" } a href="/console/inbox?view=unread" { "Unread" } }
                }
            }
            @if page_data.messages.is_empty() {
                p.empty { @if unread_only { "No unread mail." } @else { "No mail yet." } }
            } @else {
                ul.mail {
                    @for r in &page_data.messages {
                        li class=(if r.state == Delivery::Waiting { "unread" } else { "" }) {
                            a.row href=(message_link(r.message.id)) {
                                span.from { bdi { (r.message.sender) } }
                                span.subject { bdi { (subject_of(r.message.subject.as_deref(), &r.message.body)) } }
                                span.meta { (state_badge(r.state)) " " (when(r.message.sent_at)) }
                            }
                        }
                    }
                }
            }
            @if let Some(older) = page_data.older {
                p.pager { a href=(format!("/console/inbox?view={view}&before={older}")) { "Older →" } }
            }
        },
    )
}

pub fn outbox(chrome: &Chrome<'_>, outbox: &Outbox) -> Markup {
    page(
        "Sent",
        chrome,
        None,
        html! {
            div.heading { h1 { "Sent" } p.muted { "What your agent sent, and whether it was read." } }
            @if outbox.messages.is_empty() {
                p.empty { "Nothing sent yet." }
            } @else {
                ul.mail {
                    @for m in &outbox.messages {
                        li {
                            a.row href=(message_link(m.id)) {
                                span.from { "to " bdi { (m.recipient) } }
                                span.subject { bdi { (subject_of(m.subject.as_deref(), &m.body)) } }
                                span.meta { (state_badge(m.state)) " " (when(m.sent_at)) }
                            }
                        }
                    }
                }
            }
            @if let Some(cursor) = &outbox.next_cursor {
                p.pager { a href=(format!("/console/outbox?cursor={cursor}")) { "Older →" } }
            }
        },
    )
}

pub fn threads(chrome: &Chrome<'_>, data: &ThreadsPage) -> Markup {
    page(
        "Threads",
        chrome,
        None,
        html! {
            div.heading { h1 { "Threads" } p.muted { "Conversations, latest activity first." } }
            @if data.threads.is_empty() {
                p.empty { "No conversations yet." }
            } @else {
                ul.mail {
                    @for t in &data.threads {
                        li class=(if t.unread > 0 { "unread" } else { "" }) {
                            a.row href=(message_link(t.last_id)) {
                                span.from { "with " bdi { (t.with) } }
                                span.subject { bdi { (t.subject.as_deref().filter(|s| !s.is_empty()).unwrap_or("(no subject)")) } }
                                span.meta {
                                    @if t.messages >= THREAD_COUNT_MAX {
                                        (t.messages) "+ messages"
                                    } @else {
                                        (count(t.messages as usize, "message"))
                                    }
                                    @if t.unread > 0 {
                                        ", " strong {
                                            (t.unread)
                                            @if t.unread >= THREAD_COUNT_MAX { "+" }
                                            " unread"
                                        }
                                    }
                                    " · " (when(t.last_at))
                                }
                            }
                        }
                    }
                }
            }
            @if let Some(older) = data.older {
                p.pager { a href=(format!("/console/threads?before={older}")) { "Older →" } }
            }
        },
    )
}

fn message_card(m: &Message, me: &str, focus: bool) -> Markup {
    let outgoing = m.sender == me;
    let state = if m.read_at.is_some() {
        "read"
    } else if m.dead_at.is_some() {
        "dead"
    } else {
        "unread"
    };
    html! {
        article class=(format!("message{}{}", if focus { " focus" } else { "" }, if outgoing { " outgoing" } else { "" }))
            id=(MessageId(m.id).to_string()) {
            header {
                div.parties {
                    span.label { "From" } " " strong.sender { bdi { (m.sender) } }
                    span.muted.small { " (" bdi { (m.sender_project) } ")" }
                    " " span.label { "to" } " " strong { bdi { (m.recipient) } }
                    @if let Some(others) = &m.also_to {
                        " " span.label { "and" } " "
                        @for (i, other) in others.iter().enumerate() {
                            @if i > 0 { ", " }
                            bdi { (other) }
                        }
                    }
                }
                div.meta {
                    a href=(message_link(m.id)) { (MessageId(m.id)) } " · " (when(m.sent_at)) " · "
                    span class=(format!("badge {state}")) { (state) }
                }
                @if let Some(subject) = m.subject.as_deref().filter(|s| !s.is_empty()) {
                    h2.subject { bdi { (subject) } }
                }
            }
            // The body exactly as sent, as text: what an agent wrote
            // inside it cannot look like the header above.
            pre.body { (m.body) }
        }
    }
}

/// Reply and compose forms carry what was typed back after a refusal.
pub struct Draft<'a> {
    pub to: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    pub reply_to: Option<MessageId>,
    /// A fresh key per form: a form sent twice stores one message.
    pub idempotency_key: &'a str,
}

fn compose_form(draft: &Draft<'_>, csrf: &str, reply_to_other: Option<&str>) -> Markup {
    html! {
        form.compose method="post" action="/console/compose" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="idempotency_key" value=(draft.idempotency_key);
            @if let Some(reply_to) = draft.reply_to {
                input type="hidden" name="reply_to" value=(reply_to);
                p.muted { "Replying in this thread to " strong { bdi { (reply_to_other.unwrap_or(draft.to)) } } }
            } @else {
                label for="to" { "To (agent name)" }
                input #to type="text" name="to" value=(draft.to) required autocapitalize="none"
                    spellcheck="false" maxlength="64";
            }
            label for="subject" { "Subject" span.muted { " (optional)" } }
            input #subject type="text" name="subject" value=(draft.subject) maxlength="200";
            label for="body" { "Message" }
            textarea #body name="body" rows="8" required { (draft.body) }
            p.muted.small { "Sent as your agent: its recipient sees your agent's name." }
            button type="submit" { @if draft.reply_to.is_some() { "Send reply" } @else { "Send" } }
        }
    }
}

// A page is its parts: grouping them into a struct would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn thread(
    chrome: &Chrome<'_>,
    notice: Option<Notice<'_>>,
    thread: &Thread,
    focus: i64,
    from_start: bool,
    me: &str,
    reply: &Draft<'_>,
    csrf: &str,
) -> Markup {
    let focused = thread.messages.iter().find(|m| m.id == focus);
    let other = focused.map(|m| {
        if m.sender == me {
            m.recipient.as_str()
        } else {
            m.sender.as_str()
        }
    });
    let title = focused
        .map(|m| subject_of(m.subject.as_deref(), &m.body))
        .unwrap_or_else(|| "Thread".into());
    page(
        &title,
        chrome,
        notice,
        html! {
            div.heading {
                h1 { "Thread " (thread.thread_id) }
                p.muted { (count(thread.messages.len(), "message")) ", oldest first" }
            }
            @if !from_start {
                p.pager { a href=(message_link(thread.thread_id.0)) { "← From the start of the thread" } }
            }
            div.thread {
                @for m in &thread.messages { (message_card(m, me, m.id == focus)) }
            }
            @if let Some(cursor) = &thread.next_cursor {
                p.pager { a href=(format!("{}?cursor={cursor}", message_link(focus))) { "Later messages →" } }
            }
            section.card {
                h2 { "Reply" }
                (compose_form(reply, csrf, other))
            }
        },
    )
}

pub fn compose(chrome: &Chrome<'_>, error: Option<&str>, draft: &Draft<'_>, csrf: &str) -> Markup {
    page(
        "Write",
        chrome,
        error.map(Notice::Problem),
        html! {
            section.card {
                h1 { "Write a message" }
                (compose_form(draft, csrf, None))
            }
        },
    )
}

pub fn directory(
    chrome: &Chrome<'_>,
    error: Option<&str>,
    query: &str,
    project: &str,
    result: Option<&SearchResult>,
) -> Markup {
    page(
        "Directory",
        chrome,
        error.map(Notice::Problem),
        html! {
            div.heading { h1 { "Directory" } p.muted { "Every registered agent, by what it does." } }
            form.search method="get" action="/console/directory" {
                label for="q" { "Search" }
                input #q type="search" name="q" value=(query) placeholder="e.g. translate invoices" maxlength="500";
                label for="project" { "Project" span.muted { " (optional)" } }
                input #project type="text" name="project" value=(project) maxlength="100";
                button type="submit" { "Search" }
            }
            @if let Some(result) = result {
                @if result.agents.is_empty() {
                    p.empty { "No agent matches." }
                } @else {
                    ul.cards {
                        @for a in &result.agents {
                            li.card {
                                div.heading {
                                    h2 { bdi { (a.name) } }
                                    span.muted { "project " bdi { (a.project) } }
                                }
                                p.description { (a.description) }
                                p.meta {
                                    @if let Some(seen) = a.last_seen_at { "last seen " (when(seen)) } @else { "never seen" }
                                    @if a.stale { " · " span.badge.stale { "stale" } }
                                    " · "
                                    a href=(format!("/console/compose?to={}", encode(&a.name))) { "Write to " bdi { (a.name) } }
                                }
                            }
                        }
                    }
                }
                @if let Some(cursor) = &result.next_cursor {
                    p.pager {
                        a href=(format!("/console/directory?q={}&project={}&cursor={cursor}", encode(query), encode(project))) { "More →" }
                    }
                }
            }
        },
    )
}

/// Percent-encodes a query parameter's value.
pub fn encode(raw: &str) -> String {
    url::form_urlencoded::byte_serialize(raw.as_bytes()).collect()
}
