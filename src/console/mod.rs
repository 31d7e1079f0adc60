//! `/console`: web pages for the people behind the agents. Sign in with an
//! agent's name and token and read its inbox, sent mail and threads, write
//! as the agent, search the directory; operators see an overview of the
//! service. Server-rendered (maud), no script, every asset from this
//! binary. Sessions live in PostgreSQL, so any replica serves any page.
//! Reading here never consumes mail.
//!
//! - `guard`: Host and Origin rules, cookies, security headers.
//! - `pages`: the mailbox pages; `overview`: the operator's page and chart.

mod gate;
mod guard;
mod overview;
mod pages;

use std::{sync::Arc, time::Duration};

use axum::{
    Form, Router,
    extract::{
        FromRequest, Path, Query, Request, State,
        rejection::{FormRejection, PathRejection, QueryRejection},
    },
    http::{HeaderMap, HeaderValue, StatusCode, header},
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;

pub use guard::Rules;
use pages::{Chrome, Draft, Notice, problem, respond};

use crate::{
    domain::{
        Call, MessageId, Phone, PhoneError,
        console::{
            AgentViewer, ConsoleSession, OperatorKey, SessionSecret, Viewer, parse_before,
            random_text, same_secret,
        },
        messages::{SendRequest, decode_cursor},
        search::SearchRequest,
    },
    mcp::ClientAddress,
};

/// What the console needs to know of its deployment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `PHONE_CONSOLE_ADMIN_TOKEN`, as its digest; `None`: no overview.
    pub operator_key: Option<OperatorKey>,
    /// How long a sign-in lasts.
    pub session_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            operator_key: None,
            session_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

#[derive(Clone)]
struct Console {
    phone: Phone,
    settings: Arc<Settings>,
}

/// The console's routes, to be nested at `/console`.
pub fn router(phone: Phone, settings: Settings, rules: Rules) -> Router {
    let rules = Arc::new(rules);
    let gate = Arc::new(gate::Gate::new(phone.store().pool().status().max_size));
    Router::new()
        .route("/", get(home))
        .route("/sign-in", get(sign_in_form).post(sign_in))
        .route("/sign-out", post(sign_out))
        .route("/inbox", get(inbox))
        .route("/outbox", get(outbox))
        .route("/threads", get(threads))
        .route("/messages/{id}", get(message))
        .route("/compose", get(compose_form).post(compose))
        .route("/directory", get(directory))
        .route("/operator", get(operator))
        .route("/operator/sign-in", post(operator_sign_in))
        .route("/assets/console.css", get(stylesheet))
        .route("/assets/icon.svg", get(icon))
        .fallback(|| async {
            problem(
                StatusCode::NOT_FOUND,
                "Not found",
                "There is no such page in the console.",
            )
        })
        .method_not_allowed_fallback(|| async {
            problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "Not allowed",
                "This page does not take that kind of request; use the links and forms of the console.",
            )
        })
        .with_state(Console {
            phone,
            settings: Arc::new(settings),
        })
        .layer(middleware::from_fn(move |req: Request, next| {
            gate::admit(gate.clone(), req, next)
        }))
        .layer(middleware::from_fn(move |req: Request, next| {
            guard::check(rules.clone(), req, next)
        }))
}

/// The console's page for a form larger than the server takes
/// (`PHONE_MAX_BODY_BYTES`), for the 413 the body limit answers before the
/// console sees the request: a person pasting a long text gets a page that
/// says what to do, not a bare line of text.
pub fn too_large(max_body: usize) -> Response {
    guard::with_headers(problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "Too long",
        &format!(
            "The form is larger than this server takes ({} KiB as sent, which counts each non-ASCII character several times). Go back (your browser keeps what you typed) and shorten the message: a body holds at most 64 KiB.",
            max_body / 1024
        ),
    ))
}

/// The address rate limits count against (set by the HTTP layer).
fn client_address(headers_ext: &axum::http::Extensions) -> String {
    headers_ext
        .get::<ClientAddress>()
        .map(|a| a.0.clone())
        .unwrap_or_else(|| "unknown".into())
}

/// The page for a domain error: its words, with the status it deserves.
fn failure(err: &PhoneError) -> (StatusCode, String) {
    let status = match err {
        PhoneError::Invalid(_) | PhoneError::ReplyToOtherParty { .. } => StatusCode::BAD_REQUEST,
        PhoneError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        PhoneError::UnknownAgent(_) | PhoneError::UnknownMessage(_) | PhoneError::PartyLeft(_) => {
            StatusCode::NOT_FOUND
        }
        PhoneError::Refused(_) | PhoneError::NothingSent(_) => StatusCode::FORBIDDEN,
        PhoneError::NameTaken(_)
        | PhoneError::NameReserved(..)
        | PhoneError::IdempotencyConflict(_)
        | PhoneError::InboxFull(_)
        | PhoneError::InboxShare(_) => StatusCode::CONFLICT,
        PhoneError::RateLimited { .. } | PhoneError::Quota { .. } => StatusCode::TOO_MANY_REQUESTS,
        PhoneError::Unavailable(_) | PhoneError::CallerGone => StatusCode::SERVICE_UNAVAILABLE,
        PhoneError::StaleReceipts { .. } => StatusCode::CONFLICT,
        PhoneError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, err.to_string())
}

fn error_page(err: PhoneError) -> Response {
    let (status, text) = failure(&err);
    problem(status, "Something went wrong", &text)
}

/// The signed-in agent of a page, or where to go instead.
struct AgentPage {
    viewer: AgentViewer,
    csrf: String,
}

impl AgentPage {
    fn chrome<'a>(&'a self, section: &'a str) -> Chrome<'a> {
        Chrome {
            agent: Some(self.viewer.caller.name.as_str()),
            operator: false,
            csrf: Some(&self.csrf),
            section,
        }
    }
}

impl Console {
    async fn session(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<(SessionSecret, ConsoleSession)>, Response> {
        let Some(secret) = guard::session_cookie(headers).and_then(SessionSecret::parse) else {
            return Ok(None);
        };
        match self
            .phone
            .console_session(&secret, self.settings.operator_key.as_ref())
            .await
        {
            Ok(session) => Ok(session.map(|s| (secret, s))),
            Err(e) => Err(error_page(e)),
        }
    }

    /// The agent signed in, or a redirect to the sign-in page.
    async fn agent(&self, headers: &HeaderMap) -> Result<AgentPage, Response> {
        match self.session(headers).await? {
            Some((
                _,
                ConsoleSession {
                    viewer: Viewer::Agent(viewer),
                    csrf,
                },
            )) => Ok(AgentPage { viewer, csrf }),
            _ => Err(guard::see_other("/console/sign-in")),
        }
    }

    /// A form's CSRF token must be its session's.
    fn csrf_holds(session_csrf: &str, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| same_secret(p, session_csrf))
    }
}

fn expired_form() -> Response {
    problem(
        StatusCode::FORBIDDEN,
        "Form expired",
        "This form does not belong to your current session (it is old, or came from elsewhere). Go back, reload the page and send it again.",
    )
}

fn bad_form(rejection: FormRejection) -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "Unreadable form",
        &format!("The form could not be read: {}.", rejection.body_text()),
    )
}

async fn home(State(console): State<Console>, headers: HeaderMap) -> Response {
    match console.session(&headers).await {
        Ok(Some((_, s))) => match s.viewer {
            Viewer::Agent(_) => guard::see_other("/console/inbox"),
            Viewer::Operator => guard::see_other("/console/operator"),
        },
        Ok(None) => guard::see_other("/console/sign-in"),
        Err(page) => page,
    }
}

#[derive(Debug, Deserialize)]
struct SignInQuery {
    signed_out: Option<String>,
}

async fn sign_in_form(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<SignInQuery>, QueryRejection>,
) -> Response {
    if let Ok(Some((_, s))) = console.session(&headers).await
        && matches!(s.viewer, Viewer::Agent(_))
    {
        return guard::see_other("/console/inbox");
    }
    let signed_out = query.is_ok_and(|q| q.signed_out.is_some());
    let csrf = random_text();
    let notice = signed_out.then_some(Notice::Done("Signed out."));
    let mut response = respond(
        StatusCode::OK,
        pages::sign_in(&Chrome::SIGNED_OUT, notice, "", &csrf),
    );
    response
        .headers_mut()
        .append(header::SET_COOKIE, guard::sign_in_set(&headers, &csrf));
    response
}

#[derive(Debug, Deserialize)]
struct SignInForm {
    name: Option<String>,
    token: Option<String>,
    csrf: Option<String>,
}

/// The sign-in form again, with what went wrong (the name kept, never the
/// token), under a fresh CSRF token.
fn sign_in_again(headers: &HeaderMap, status: StatusCode, error: &str, name: &str) -> Response {
    let csrf = random_text();
    let mut response = respond(
        status,
        pages::sign_in(
            &Chrome::SIGNED_OUT,
            Some(Notice::Problem(error)),
            name,
            &csrf,
        ),
    );
    response
        .headers_mut()
        .append(header::SET_COOKIE, guard::sign_in_set(headers, &csrf));
    response
}

async fn sign_in(State(console): State<Console>, headers: HeaderMap, request: Request) -> Response {
    let address = client_address(request.extensions());
    let form = Form::<SignInForm>::from_request(request, &()).await;
    let Form(form) = match form {
        Ok(form) => form,
        Err(rejection) => return bad_form(rejection),
    };
    let name = form.name.as_deref().unwrap_or_default().trim().to_owned();
    let csrf_ok = sign_in_csrf_holds(&headers, form.csrf.as_deref());
    if !csrf_ok {
        return sign_in_again(
            &headers,
            StatusCode::FORBIDDEN,
            "This sign-in form had expired (or came from another page). It is renewed below: sign in again.",
            &name,
        );
    }
    let token = form.token.as_deref().unwrap_or_default();
    if name.is_empty() || token.trim().is_empty() {
        return sign_in_again(
            &headers,
            StatusCode::BAD_REQUEST,
            "Enter both the agent's name and its token.",
            &name,
        );
    }
    match console
        .phone
        .console_sign_in(&name, token, &address, console.settings.session_ttl)
        .await
    {
        Ok((secret, _)) => {
            // A new session each time (a session id planted before sign-in
            // is never promoted); the one it replaces ends, but only once
            // the new one exists.
            end_previous(&console, &headers).await;
            tracing::info!(agent = %name, "console: signed in");
            signed_in(&headers, &secret, &console.settings, "/console/inbox")
        }
        Err(e) => {
            let (status, text) = failure(&e);
            sign_in_again(&headers, status, &text, &name)
        }
    }
}

/// A sign-in form's token must be the one its cookie carries (double
/// submit: there is no session yet to bind it to).
fn sign_in_csrf_holds(headers: &HeaderMap, presented: Option<&str>) -> bool {
    match (guard::sign_in_cookie(headers), presented) {
        (Some(cookie), Some(presented)) => same_secret(cookie, presented),
        _ => false,
    }
}

/// Ends the session the browser held before a successful sign-in.
async fn end_previous(console: &Console, headers: &HeaderMap) {
    if let Some(old) = guard::session_cookie(headers).and_then(SessionSecret::parse) {
        let _ = console.phone.console_sign_out(&old).await;
    }
}

fn signed_in(
    headers: &HeaderMap,
    secret: &SessionSecret,
    settings: &Settings,
    to: &str,
) -> Response {
    let mut response = guard::see_other(to);
    let max_age = settings.session_ttl.as_secs() as i64;
    let h = response.headers_mut();
    h.append(
        header::SET_COOKIE,
        guard::session_set(headers, secret.reveal(), max_age),
    );
    h.append(header::SET_COOKIE, guard::sign_in_clear(headers));
    response
}

#[derive(Debug, Deserialize)]
struct CsrfForm {
    csrf: Option<String>,
}

async fn sign_out(
    State(console): State<Console>,
    headers: HeaderMap,
    form: Result<Form<CsrfForm>, FormRejection>,
) -> Response {
    let Form(form) = match form {
        Ok(form) => form,
        Err(rejection) => return bad_form(rejection),
    };
    let session = match console.session(&headers).await {
        Ok(session) => session,
        Err(page) => return page,
    };
    if let Some((secret, session)) = session {
        if !Console::csrf_holds(&session.csrf, form.csrf.as_deref()) {
            return expired_form();
        }
        if let Err(e) = console.phone.console_sign_out(&secret).await {
            return error_page(e);
        }
    }
    let mut response = guard::see_other("/console/sign-in?signed_out=1");
    response
        .headers_mut()
        .append(header::SET_COOKIE, guard::session_clear(&headers));
    response
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    view: Option<String>,
    before: Option<String>,
    cursor: Option<String>,
}

fn bad_query() -> Response {
    problem(
        StatusCode::BAD_REQUEST,
        "Bad link",
        "This link's parameters could not be read; use the console's own links.",
    )
}

async fn inbox(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let unread_only = match query.view.as_deref() {
        None | Some("") | Some("all") => false,
        Some("unread") => true,
        Some(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Bad link",
                "view must be all or unread.",
            );
        }
    };
    let before = match parse_before(query.before.as_deref()) {
        Ok(before) => before,
        Err(e) => return error_page(e.into()),
    };
    match console
        .phone
        .console_inbox(&me.viewer.caller, before, 50, unread_only)
        .await
    {
        Ok(page) => respond(
            StatusCode::OK,
            pages::inbox(&me.chrome("inbox"), &page, unread_only),
        ),
        Err(e) => error_page(e),
    }
}

async fn outbox(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let before = match query.cursor.as_deref().map(decode_cursor).transpose() {
        Ok(before) => before,
        Err(e) => return error_page(e.into()),
    };
    match console.phone.outbox(&me.viewer.caller, 50, before).await {
        Ok(outbox) => respond(StatusCode::OK, pages::outbox(&me.chrome("outbox"), &outbox)),
        Err(e) => error_page(e),
    }
}

async fn threads(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let before = match parse_before(query.before.as_deref()) {
        Ok(before) => before,
        Err(e) => return error_page(e.into()),
    };
    match console
        .phone
        .console_threads(&me.viewer.caller, before, 50)
        .await
    {
        Ok(page) => respond(StatusCode::OK, pages::threads(&me.chrome("threads"), &page)),
        Err(e) => error_page(e),
    }
}

/// A message id as the console links it (`msg_12`), or its bare number.
fn message_id(raw: &str) -> Result<MessageId, PhoneError> {
    if let Ok(n) = raw.trim().parse::<i64>()
        && n > 0
    {
        return Ok(MessageId(n));
    }
    Ok(MessageId::parse("message", raw)?)
}

#[derive(Debug, Deserialize)]
struct MessageQuery {
    cursor: Option<String>,
    sent: Option<String>,
}

/// Subject for a reply: the original's, with one "Re: ".
fn reply_subject(subject: Option<&str>) -> String {
    match subject.map(str::trim).filter(|s| !s.is_empty()) {
        None => String::new(),
        // `get`: the third byte may fall inside a character ("ab€").
        Some(s) if s.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("re:")) => s.to_owned(),
        Some(s) => format!("Re: {s}"),
    }
}

async fn message(
    State(console): State<Console>,
    headers: HeaderMap,
    raw_id: Result<Path<String>, PathRejection>,
    query: Result<Query<MessageQuery>, QueryRejection>,
) -> Response {
    let Ok(Path(raw_id)) = raw_id else {
        return bad_query();
    };
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let id = match message_id(&raw_id) {
        Ok(id) => id,
        Err(e) => return error_page(e),
    };
    let after = match query.cursor.as_deref().map(decode_cursor).transpose() {
        Ok(after) => after,
        Err(e) => return error_page(e.into()),
    };
    let caller = &me.viewer.caller;
    let mut thread = match console.phone.thread(caller, id, 100, after).await {
        Ok(thread) => thread,
        Err(e) => return error_page(e),
    };
    // A long thread: start the page at the message asked for.
    let mut from_start = after.is_none();
    if after.is_none() && !thread.messages.iter().any(|m| m.id == id.0) {
        thread = match console.phone.thread(caller, id, 100, Some(id.0 - 1)).await {
            Ok(thread) => thread,
            Err(e) => return error_page(e),
        };
        from_start = false;
    }
    // The message asked for, or on a later page of its thread the last one
    // shown: what the reply answers and the pager continues from.
    let Some(focus) = thread
        .messages
        .iter()
        .find(|m| m.id == id.0)
        .or(thread.messages.last())
    else {
        return error_page(PhoneError::UnknownMessage(id));
    };
    let id = MessageId(focus.id);
    let me_name = caller.name.as_str();
    let other = if focus.sender == me_name {
        focus.recipient.clone()
    } else {
        focus.sender.clone()
    };
    // The subject the conversation goes by: the message's own, or the
    // latest one before it (replies often carry none).
    let subject = reply_subject(
        thread
            .messages
            .iter()
            .filter(|m| m.id <= focus.id)
            .filter_map(|m| m.subject.as_deref().filter(|s| !s.trim().is_empty()))
            .next_back(),
    );
    let key = random_text();
    let draft = Draft {
        to: &other,
        subject: &subject,
        body: "",
        reply_to: Some(id),
        idempotency_key: &key,
    };
    let sent_note = format!("Sent to {other}.");
    // Only for a message this agent sent: a link cannot make it up.
    let notice = (query.sent.is_some() && focus.sender == me_name)
        .then_some(Notice::Done(sent_note.as_str()));
    respond(
        StatusCode::OK,
        pages::thread(
            &me.chrome(""),
            notice,
            &thread,
            id.0,
            from_start,
            me_name,
            &draft,
            &me.csrf,
        ),
    )
}

#[derive(Debug, Deserialize)]
struct ComposeQuery {
    to: Option<String>,
}

async fn compose_form(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<ComposeQuery>, QueryRejection>,
) -> Response {
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let to = query.ok().and_then(|q| q.0.to).unwrap_or_default();
    let key = random_text();
    let draft = Draft {
        to: &to,
        subject: "",
        body: "",
        reply_to: None,
        idempotency_key: &key,
    };
    respond(
        StatusCode::OK,
        pages::compose(&me.chrome("compose"), None, &draft, &me.csrf),
    )
}

#[derive(Debug, Deserialize)]
struct ComposeForm {
    csrf: Option<String>,
    to: Option<String>,
    subject: Option<String>,
    body: Option<String>,
    reply_to: Option<String>,
    idempotency_key: Option<String>,
}

async fn compose(State(console): State<Console>, headers: HeaderMap, request: Request) -> Response {
    let address = client_address(request.extensions());
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let form = Form::<ComposeForm>::from_request(request, &()).await;
    let Form(form) = match form {
        Ok(form) => form,
        Err(rejection) => return bad_form(rejection),
    };
    if !Console::csrf_holds(&me.csrf, form.csrf.as_deref()) {
        return expired_form();
    }
    let to = form.to.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let reply_to = form
        .reply_to
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty());
    let body = form.body.as_deref().unwrap_or_default();
    // Browsers send a textarea's line breaks as CRLF; agents write LF.
    let body = body.replace("\r\n", "\n");
    let subject = form.subject.as_deref().unwrap_or_default();
    let key = form
        .idempotency_key
        .clone()
        .filter(|k| !k.is_empty())
        .unwrap_or_else(random_text);
    let outcome = async {
        if body.trim().is_empty() {
            return Err(PhoneError::Invalid(crate::domain::InvalidInput::new(
                "body",
                "is empty: write the message first",
            )));
        }
        let req = SendRequest::parse(
            if reply_to.is_some() { None } else { to },
            &body,
            Some(subject),
            reply_to,
            Some(&key),
        )?;
        let creds = me.viewer.credentials(&address);
        console.phone.send(&creds, req, &Call::default()).await
    }
    .await;
    match outcome {
        Ok(sent) => {
            tracing::info!(agent = %me.viewer.caller.name, message = %sent.id, "console: sent");
            guard::see_other(&format!("/console/messages/{}?sent=1", sent.id))
        }
        Err(e) => {
            let (status, text) = failure(&e);
            let reply_to = reply_to.and_then(|r| message_id(r).ok());
            let draft = Draft {
                to: to.unwrap_or_default(),
                subject,
                body: &body,
                reply_to,
                idempotency_key: &key,
            };
            let text = format!("Not sent: {text}");
            respond(
                status,
                pages::compose(&me.chrome("compose"), Some(&text), &draft, &me.csrf),
            )
        }
    }
}

#[derive(Debug, Deserialize)]
struct DirectoryQuery {
    q: Option<String>,
    project: Option<String>,
    cursor: Option<String>,
}

async fn directory(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<DirectoryQuery>, QueryRejection>,
) -> Response {
    let me = match console.agent(&headers).await {
        Ok(me) => me,
        Err(page) => return page,
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let q = query.q.unwrap_or_default();
    let project = query.project.unwrap_or_default();
    let chrome = me.chrome("directory");
    let result = async {
        let req = SearchRequest::parse(
            Some(&q),
            Some(&project),
            Some(20),
            query.cursor.as_deref().filter(|c| !c.is_empty()),
        )?;
        console.phone.search(req).await
    }
    .await;
    match result {
        Ok(result) => respond(
            StatusCode::OK,
            pages::directory(&chrome, None, &q, &project, Some(&result)),
        ),
        Err(e) => {
            let (status, text) = failure(&e);
            respond(
                status,
                pages::directory(&chrome, Some(&text), &q, &project, None),
            )
        }
    }
}

#[derive(Debug, Deserialize)]
struct OverviewQuery {
    days: Option<String>,
}

fn overview_off() -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "Overview is off",
        "The operator overview is off on this server: set PHONE_CONSOLE_ADMIN_TOKEN to turn it on.",
    )
}

async fn operator(
    State(console): State<Console>,
    headers: HeaderMap,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Response {
    if console.settings.operator_key.is_none() {
        return overview_off();
    }
    let session = match console.session(&headers).await {
        Ok(session) => session,
        Err(page) => return page,
    };
    let Some((
        _,
        ConsoleSession {
            viewer: Viewer::Operator,
            csrf,
        },
    )) = session
    else {
        return operator_form(&headers, StatusCode::OK, None);
    };
    let Ok(Query(query)) = query else {
        return bad_query();
    };
    let days = match query.days {
        None => 14,
        Some(raw) => match raw.trim().parse::<u32>() {
            Ok(d) if (1..=90).contains(&d) => d,
            _ => {
                return problem(
                    StatusCode::BAD_REQUEST,
                    "Bad link",
                    "days must be a whole number from 1 to 90.",
                );
            }
        },
    };
    let chrome = Chrome {
        agent: None,
        operator: true,
        csrf: Some(&csrf),
        section: "operator",
    };
    match console.phone.console_overview(days).await {
        Ok(o) => respond(StatusCode::OK, overview::page_for(&chrome, &o, days)),
        Err(e) => error_page(e),
    }
}

fn operator_form(headers: &HeaderMap, status: StatusCode, error: Option<&str>) -> Response {
    let csrf = random_text();
    let mut response = respond(
        status,
        pages::operator_sign_in(&Chrome::SIGNED_OUT, error, &csrf),
    );
    response
        .headers_mut()
        .append(header::SET_COOKIE, guard::sign_in_set(headers, &csrf));
    response
}

async fn operator_sign_in(
    State(console): State<Console>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let Some(key) = console.settings.operator_key.clone() else {
        return overview_off();
    };
    let address = client_address(request.extensions());
    let form = Form::<SignInForm>::from_request(request, &()).await;
    let Form(form) = match form {
        Ok(form) => form,
        Err(rejection) => return bad_form(rejection),
    };
    let csrf_ok = sign_in_csrf_holds(&headers, form.csrf.as_deref());
    if !csrf_ok {
        return operator_form(
            &headers,
            StatusCode::FORBIDDEN,
            Some(
                "This sign-in form had expired (or came from another page). It is renewed below: sign in again.",
            ),
        );
    }
    let token = form.token.unwrap_or_default();
    match console
        .phone
        .console_operator_sign_in(&key, &token, &address, console.settings.session_ttl)
        .await
    {
        Ok((secret, _)) => {
            end_previous(&console, &headers).await;
            tracing::info!("console: operator signed in");
            signed_in(&headers, &secret, &console.settings, "/console/operator")
        }
        Err(e) => {
            let (status, text) = failure(&e);
            operator_form(&headers, status, Some(&text))
        }
    }
}

/// The tab's icon (without one, browsers ask for /favicon.ico).
async fn icon() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("image/svg+xml"),
            ),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=86400"),
            ),
        ],
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 32 32\">\
         <rect width=\"32\" height=\"32\" rx=\"7\" fill=\"#0b5cad\"/>\
         <text x=\"16\" y=\"23\" font-size=\"18\" text-anchor=\"middle\" fill=\"#fff\" \
         font-family=\"sans-serif\">p</text></svg>",
    )
        .into_response()
}

async fn stylesheet() -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/css; charset=utf-8"),
            ),
            // The link carries the version: a new build is a new URL.
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=86400, immutable"),
            ),
        ],
        include_str!("console.css"),
    )
        .into_response()
}
