//! The web console over real HTTP, as a browser speaks it (forms, cookies,
//! Origin, redirects), against the real server and PostgreSQL; what the
//! agents see goes through the real MCP client. The headless-browser run is
//! tests/console_browser.rs.

mod common;

use common::browser::Browser;
use common::*;
use reqwest::{StatusCode, header};
use serde_json::json;

/// The body a message gets in the console: everything a hostile sender can
/// put in text (markup, a forged header line, bidi controls).
const HOSTILE: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>\n\
     From: admin\n\u{202E}evil\u{202C} & \"quotes\"";

#[tokio::test]
async fn looking_at_the_inbox_never_consumes_mail() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let hostile = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "<b>bold</b> plan", "body": HOSTILE})),
    )
    .await;
    ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "body": "second"})),
    )
    .await;

    let db = app.db().await;
    // As if bob's agent was last seen long ago.
    db.batch_execute(
        "UPDATE agents SET last_seen_at = now() - interval '1 day' WHERE name = 'bob'",
    )
    .await
    .unwrap();
    let bob_seen: Option<chrono::DateTime<chrono::Utc>> = db
        .query_one("SELECT last_seen_at FROM agents WHERE name = 'bob'", &[])
        .await
        .unwrap()
        .get(0);
    let mut browser = Browser::signed_in(&app, &bob).await;
    let inbox = browser.get("/console/inbox").await;
    assert_eq!(inbox.status, StatusCode::OK);
    assert!(
        inbox.body.contains("&lt;b&gt;bold&lt;/b&gt; plan"),
        "{}",
        inbox.body
    );
    assert!(inbox.body.contains("2 unread"), "{}", inbox.body);
    let link = format!("/console/messages/{}", hostile["id"].as_str().unwrap());
    assert!(inbox.body.contains(&link), "{}", inbox.body);
    let message = browser.get(&link).await;
    assert_eq!(message.status, StatusCode::OK, "{}", message.body);
    // Escaped, as text: no element, no attribute came from the body.
    assert!(!message.body.contains("<script>alert"), "{}", message.body);
    assert!(!message.body.contains("<img src=x"), "{}", message.body);
    assert!(
        message
            .body
            .contains("&lt;script&gt;alert(1)&lt;/script&gt;")
    );
    assert!(message.body.contains("<pre class=\"body\">"));
    let unread = browser.get("/console/inbox?view=unread").await;
    assert!(unread.body.contains("2 unread"));
    browser.get("/console/threads").await;
    browser.get("/console/outbox").await;

    let untouched: i64 = db
        .query_one(
            "SELECT count(*) FROM messages WHERE read_at IS NULL AND delivery_count = 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(untouched, 2, "the console marked mail read");
    // Neither signing in nor reading is the agent being online.
    let seen: Option<chrono::DateTime<chrono::Utc>> = db
        .query_one("SELECT last_seen_at FROM agents WHERE name = 'bob'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, bob_seen, "the console wrote bob's presence");
    let polled = ok(&c, "phone_inbox", bob.with(json!({"limit": 10}))).await;
    assert_eq!(polled["messages"].as_array().unwrap().len(), 2, "{polled}");
    app.stop().await;
}

#[tokio::test]
async fn a_session_works_on_every_replica_and_signing_out_ends_it_everywhere() {
    let database = fresh_database().await;
    let one = spawn_app_on(&database, &[]).await;
    let two = spawn_app_on(&database, &[]).await;
    let c = one.client().await;
    let bob = register(&c, "bob", "B", "p").await;

    let mut on_one = Browser::signed_in(&one, &bob).await;
    let cookie = on_one.cookies.clone();
    assert!(cookie.contains_key("phone_console"), "{cookie:?}");
    let set = on_one
        .set_cookies
        .iter()
        .find(|s| s.starts_with("phone_console="))
        .unwrap()
        .clone();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age="] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain http on loopback: {set}");

    let mut on_two = Browser::new(&two);
    on_two.cookies = cookie.clone();
    let inbox = on_two.get("/console/inbox").await;
    assert_eq!(inbox.status, StatusCode::OK, "{}", inbox.body);
    assert!(inbox.body.contains("Signed in as"));

    // Signing out on the second replica ends the session on the first.
    let csrf = inbox.field("csrf");
    let out = on_two.post("/console/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(out.location(), "/console/sign-in?signed_out=1");
    assert!(on_two.set_cookies.iter().any(|s| s.contains("Max-Age=0")));
    on_one.cookies = cookie;
    let after = on_one.get("/console/inbox").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert_eq!(after.location(), "/console/sign-in");
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn writing_sends_as_the_agent_and_replies_join_the_thread() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;

    let form = browser.get("/console/compose?to=alice").await;
    assert_eq!(form.field("to"), "alice");
    let csrf = form.field("csrf");
    let key = form.field("idempotency_key");
    let fields = [
        ("csrf", csrf.as_str()),
        ("idempotency_key", key.as_str()),
        ("to", "alice"),
        ("subject", "from the human"),
        ("body", "line one\r\nline two"),
    ];
    let sent = browser.post("/console/compose", &fields).await;
    assert_eq!(sent.status, StatusCode::SEE_OTHER, "{}", sent.body);
    assert!(sent.location().ends_with("?sent=1"), "{}", sent.location());
    // The same form sent twice (a double click, a reload) stores one message.
    let again = browser.post("/console/compose", &fields).await;
    assert_eq!(again.location(), sent.location());
    let shown = browser.get(sent.location()).await;
    assert!(shown.body.contains("Sent to alice."), "{}", shown.body);

    let got = ok(&c, "phone_inbox", alice.with(json!({}))).await;
    let messages = got["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{got}");
    assert_eq!(messages[0]["from"], "bob");
    assert_eq!(messages[0]["body"], "line one\nline two");
    let first = messages[0]["id"].as_str().unwrap().to_owned();

    let answer = ok(
        &c,
        "phone_send",
        alice.with(json!({"reply_to": first, "body": "got it"})),
    )
    .await;
    let reply_id = answer["id"].as_str().unwrap();
    let thread = browser.get(&format!("/console/messages/{reply_id}")).await;
    assert_eq!(thread.status, StatusCode::OK);
    assert!(thread.body.contains("got it") && thread.body.contains("line one"));
    assert_eq!(thread.field("reply_to"), reply_id);
    assert_eq!(thread.field("subject"), "Re: from the human");
    let reply = browser
        .post(
            "/console/compose",
            &[
                ("csrf", &thread.field("csrf")),
                ("idempotency_key", &thread.field("idempotency_key")),
                ("reply_to", reply_id),
                ("subject", "Re: from the human"),
                ("body", "thanks"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    let got = ok(&c, "phone_inbox", alice.with(json!({}))).await;
    assert_eq!(got["messages"][0]["reply_to"], reply_id, "{got}");
    assert_eq!(got["messages"][0]["body"], "thanks");

    let threads = browser.get("/console/threads").await;
    assert!(threads.body.contains("3 messages"), "{}", threads.body);
    let outbox = browser.get("/console/outbox").await;
    assert!(outbox.body.contains("badge read"), "{}", outbox.body);
    app.stop().await;
}

#[tokio::test]
async fn a_refused_send_keeps_what_was_typed() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    let form = browser.get("/console/compose").await;
    let answer = browser
        .post(
            "/console/compose",
            &[
                ("csrf", &form.field("csrf")),
                ("idempotency_key", &form.field("idempotency_key")),
                ("to", "nobody-here"),
                ("subject", "hello"),
                ("body", "my long careful text <kept>"),
            ],
        )
        .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.body);
    assert!(
        answer.body.contains("Not sent: no agent named"),
        "{}",
        answer.body
    );
    assert!(answer.body.contains("my long careful text &lt;kept&gt;"));
    assert_eq!(answer.field("to"), "nobody-here");

    let big = "x".repeat(70 * 1024);
    let answer = browser
        .post(
            "/console/compose",
            &[("csrf", &form.field("csrf")), ("to", "bob"), ("body", &big)],
        )
        .await;
    assert_eq!(
        answer.status,
        StatusCode::BAD_REQUEST,
        "{}",
        &answer.body[..200]
    );
    assert!(answer.body.contains("64 KiB"));
    let stored = app.count("SELECT count(*) FROM messages").await;
    assert_eq!(stored, 0);
    app.stop().await;
}

#[tokio::test]
async fn forms_need_their_csrf_token_and_this_servers_origin() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    let form = browser.get("/console/compose").await;
    let csrf = form.field("csrf");
    let wrong = [
        ("csrf", "not-the-token"),
        ("to", "alice"),
        ("body", "forged?"),
    ];
    let answer = browser.post("/console/compose", &wrong).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(answer.body.contains("Form expired"));

    let right = [
        ("csrf", csrf.as_str()),
        ("to", "alice"),
        ("body", "forged?"),
    ];
    for origin in [Some("http://evil.example"), Some("null"), None] {
        let answer = browser.post_from("/console/compose", &right, origin).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{origin:?}: {}",
            answer.body
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM messages").await, 0);

    // Sign-in has no session yet: its token rides in a cookie (double
    // submit), so a form posted from elsewhere cannot sign a browser in.
    let mut stranger = Browser::new(&app);
    let answer = stranger
        .post(
            "/console/sign-in",
            &[("name", "bob"), ("token", &bob.token), ("csrf", "guess")],
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.body);
    assert!(!stranger.cookies.contains_key("phone_console"));

    let answer = browser.post("/console/compose", &right).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    assert_eq!(app.count("SELECT count(*) FROM messages").await, 1);
    app.stop().await;
}

#[tokio::test]
async fn hosts_follow_the_mcp_rules_and_https_hosts_get_secure_cookies() {
    let app = spawn_app_with(&[("PHONE_ALLOWED_HOSTS", "phone.example")]).await;
    let http = reqwest::Client::new();
    let page = http
        .get(app.url("/console/sign-in"))
        .header(header::HOST, "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::FORBIDDEN);
    assert!(
        page.text()
            .await
            .unwrap()
            .contains("not one this server answers to")
    );

    let page = http
        .get(app.url("/console/sign-in"))
        .header(header::HOST, "phone.example")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let set = page.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(set.starts_with("__Host-phone_console_signin="), "{set}");
    assert!(set.contains("; Secure") && set.contains("Path=/;"), "{set}");
    app.stop().await;
}

#[tokio::test]
async fn every_console_page_carries_the_security_headers() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    for path in [
        "/console/inbox",
        "/console/outbox",
        "/console/messages/nope",
        "/console/no-such-page",
    ] {
        let page = browser.get(path).await;
        let csp = page.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap();
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY", "{path}");
        assert_eq!(page.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(page.headers[header::REFERRER_POLICY], "same-origin");
        assert_eq!(page.headers[header::CACHE_CONTROL], "no-store", "{path}");
        assert!(
            page.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}"
        );
    }
    let css = browser.get("/console/assets/console.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    // Nothing on the pages loads from elsewhere.
    let inbox = browser.get("/console/inbox").await;
    assert!(!inbox.body.contains("http://") && !inbox.body.contains("https://"));
    assert!(!inbox.body.contains("<script"));
    app.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_page_never_a_500() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let carol = register(&c, "carol", "C", "p").await;
    let theirs = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "carol", "body": "private"})),
    )
    .await;
    let _ = carol;
    let mut browser = Browser::signed_in(&app, &bob).await;
    let cases = [
        (
            "/console/messages/abc",
            StatusCode::BAD_REQUEST,
            "not a message id",
        ),
        (
            "/console/messages/msg_0",
            StatusCode::BAD_REQUEST,
            "not a message id",
        ),
        (
            "/console/messages/msg_99999999",
            StatusCode::NOT_FOUND,
            "not found",
        ),
        (
            "/console/inbox?before=x",
            StatusCode::BAD_REQUEST,
            "page position",
        ),
        (
            "/console/inbox?view=everything",
            StatusCode::BAD_REQUEST,
            "view must be",
        ),
        (
            "/console/outbox?cursor=zzz",
            StatusCode::BAD_REQUEST,
            "not a cursor",
        ),
        (
            "/console/threads?before=-1",
            StatusCode::BAD_REQUEST,
            "page position",
        ),
        (
            "/console/directory?cursor=%FF",
            StatusCode::BAD_REQUEST,
            "cursor",
        ),
        (
            "/console/inbox?view=%ZZ",
            StatusCode::BAD_REQUEST,
            "view must be",
        ),
        (
            "/console/inbox?before=1&before=2",
            StatusCode::BAD_REQUEST,
            "could not be read",
        ),
        ("/console/nowhere", StatusCode::NOT_FOUND, "no such page"),
        (
            "/console/messages/%FF",
            StatusCode::BAD_REQUEST,
            "could not be read",
        ),
        (
            "/console/operator",
            StatusCode::NOT_FOUND,
            "PHONE_CONSOLE_ADMIN_TOKEN",
        ),
    ];
    for (path, status, words) in cases {
        let page = browser.get(path).await;
        assert_eq!(page.status, status, "{path}: {}", page.body);
        assert!(page.body.contains(words), "{path}: {}", page.body);
    }
    // Someone else's message is not found, whatever its id.
    let id = theirs["id"].as_str().unwrap();
    let page = browser.get(&format!("/console/messages/{id}")).await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(!page.body.contains("private"));
    let slash = browser.get("/console/").await;
    assert_eq!(slash.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(slash.location(), "/console");
    let wrong_method = browser.post("/console/inbox", &[]).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        wrong_method
            .body
            .contains("does not take that kind of request")
    );
    let broken = browser.post("/console/compose", &[("csrf", "x")]).await;
    assert_eq!(broken.status, StatusCode::FORBIDDEN);
    app.stop().await;
}

#[tokio::test]
async fn failed_sign_ins_count_against_the_same_limit_as_tools() {
    let app = spawn_app_with(&[("PHONE_AUTH_FAILURE_LIMIT", "3")]).await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::new(&app);
    let wrong = "phn_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    for _ in 0..3 {
        let answer = browser.sign_in("bob", wrong).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.body);
        assert!(answer.body.contains("invalid token"), "{}", answer.body);
        // The name is kept, the token never comes back.
        assert_eq!(answer.field("name"), "bob");
        assert!(!answer.body.contains(wrong));
    }
    let answer = browser.sign_in("bob", wrong).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        answer.body
    );
    // The same bucket as the tools: a wrong token is limited there too...
    let err = tool_err(&c, "phone_inbox", json!({"token": wrong})).await;
    assert!(err.contains("too many"), "{err}");
    // ...while bob's own token still works, in the console and the tools.
    ok(&c, "phone_inbox", bob.with(json!({}))).await;
    let answer = browser.sign_in("bob", &bob.token).await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    app.stop().await;
}

#[tokio::test]
async fn a_rotated_token_or_an_unregistered_agent_ends_its_sessions() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    assert_eq!(browser.get("/console/inbox").await.status, StatusCode::OK);
    let rotated = ok(&c, "phone_rotate_token", bob.with(json!({}))).await;
    let page = browser.get("/console/inbox").await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
    assert_eq!(page.location(), "/console/sign-in");

    let bob = Agent {
        name: "bob".into(),
        token: rotated["token"].as_str().unwrap().to_owned(),
    };
    let mut browser = Browser::signed_in(&app, &bob).await;
    ok(&c, "phone_unregister", bob.with(json!({}))).await;
    let page = browser.get("/console/inbox").await;
    assert_eq!(page.location(), "/console/sign-in");
    app.stop().await;
}

const OPERATOR: &str = "operator-token-long-enough-for-tests-0001";

#[tokio::test]
async fn the_operator_overview_needs_its_own_token() {
    let app = spawn_app_with(&[("PHONE_CONSOLE_ADMIN_TOKEN", OPERATOR)]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "red").await;
    let bob = register(&c, "bob", "B", "blue").await;
    for i in 0..3 {
        ok(
            &c,
            "phone_send",
            alice.with(json!({"to": "bob", "body": format!("secret body {i}")})),
        )
        .await;
    }

    // An agent's session does not open the overview.
    let mut as_bob = Browser::signed_in(&app, &bob).await;
    let page = as_bob.get("/console/operator").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("Operator token") && !page.body.contains("<svg"));

    let mut operator = Browser::new(&app);
    let form = operator.get("/console/operator").await;
    let answer = operator
        .post(
            "/console/operator/sign-in",
            &[
                ("token", "wrong-wrong-wrong-wrong-wrong"),
                ("csrf", &form.field("csrf")),
            ],
        )
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.body);
    let answer = operator
        .post(
            "/console/operator/sign-in",
            &[("token", OPERATOR), ("csrf", &answer.field("csrf"))],
        )
        .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
    let overview = operator.get("/console/operator").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    let body = &overview.body;
    assert!(body.contains("<svg"), "{body}");
    assert_eq!(body.matches("<rect").count(), 14, "a bar per day");
    // Summed over the bars, not read from today's: three sends that
    // straddle midnight (UTC) land on two days.
    let charted: u64 = body
        .split(" messages</title>")
        .filter_map(|before| before.rsplit(": ").next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(charted, 3, "the bars: {body}");
    assert!(body.contains(">red<") && body.contains(">blue<"), "{body}");
    assert!(body.contains("Largest unread backlogs"));
    // Bodies never appear on the overview. (Not "m1": a random CSRF token
    // on the page held those two characters about once in a hundred runs.)
    assert!(!body.contains("secret body"), "{body}");
    let month = operator.get("/console/operator?days=30").await;
    assert_eq!(month.body.matches("<rect").count(), 30);
    let bad = operator.get("/console/operator?days=1000").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    // The operator's session is not an agent's.
    let page = operator.get("/console/inbox").await;
    assert_eq!(page.location(), "/console/sign-in");
    app.stop().await;
}

#[tokio::test]
async fn the_directory_finds_agents_to_write_to() {
    let app = spawn_app().await;
    let c = app.client().await;
    register(
        &c,
        "invoice-bot",
        "Reads invoices and extracts totals",
        "books",
    )
    .await;
    let bob = register(&c, "bob", "B", "p").await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    let page = browser.get("/console/directory?q=invoices").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("invoice-bot"), "{}", page.body);
    assert!(page.body.contains("/console/compose?to=invoice-bot"));
    app.stop().await;
}

#[tokio::test]
async fn wrong_operator_tokens_count_against_the_same_limit() {
    let app = spawn_app_with(&[
        ("PHONE_CONSOLE_ADMIN_TOKEN", OPERATOR),
        ("PHONE_AUTH_FAILURE_LIMIT", "2"),
    ])
    .await;
    let mut browser = Browser::new(&app);
    let mut form = browser.get("/console/operator").await;
    for expected in [
        StatusCode::UNAUTHORIZED,
        StatusCode::UNAUTHORIZED,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let answer = browser
            .post(
                "/console/operator/sign-in",
                &[
                    ("token", "a-guess-that-is-long-enough-1234"),
                    ("csrf", &form.field("csrf")),
                ],
            )
            .await;
        assert_eq!(answer.status, expected, "{}", answer.body);
        form = answer;
    }
    // Blocked means blocked: the right token waits for the window too.
    let answer = browser
        .post(
            "/console/operator/sign-in",
            &[("token", OPERATOR), ("csrf", &form.field("csrf"))],
        )
        .await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    app.stop().await;
}

/// Its messages are 1 kB each: a page of the console is not cut at a
/// model's 32 KiB, as phone_thread's answer is.
#[tokio::test]
async fn a_long_thread_pages_on_and_every_message_opens() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    let root = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "long one", "body": "first"})),
    )
    .await;
    let root_id: i64 = root["id"].as_str().unwrap()[4..].parse().unwrap();
    app.db()
        .await
        .execute(
            "INSERT INTO messages (sender_id, recipient_id, body, reply_to, thread_id)
             SELECT b.id, a.id, repeat('words ', 170) || 'reply ' || g, $1, $1
             FROM agents a, agents b, generate_series(1, 107) g
             WHERE a.name = 'alice' AND b.name = 'bob'",
            &[&root_id],
        )
        .await
        .unwrap();
    let mut browser = Browser::signed_in(&app, &bob).await;
    let first = browser
        .get(&format!("/console/messages/msg_{root_id}"))
        .await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(
        first.body.contains("100 messages, oldest first"),
        "{}",
        first.body
    );
    let marker = "?cursor=";
    let at = first.body.find(marker).expect("a link to later messages");
    let start = first.body[..at].rfind('"').unwrap() + 1;
    let end = at + first.body[at..].find('"').unwrap();
    let later = first.body[start..end].replace("&amp;", "&");
    let next = browser.get(&later).await;
    assert_eq!(next.status, StatusCode::OK, "{later}: {}", next.body);
    assert!(
        next.body.contains("8 messages, oldest first"),
        "{}",
        next.body
    );
    assert!(next.body.contains("reply 107"));
    assert!(next.body.contains("From the start of the thread"));
    // A late message opens on a page that starts with it.
    let late = browser
        .get(&format!("/console/messages/msg_{}", root_id + 105))
        .await;
    assert_eq!(late.status, StatusCode::OK);
    assert!(late.body.contains("reply 105") && !late.body.contains("reply 104<"));
    // A link cannot claim a send that did not happen.
    let fake = browser
        .get(&format!("/console/messages/msg_{root_id}?sent=1"))
        .await;
    assert!(!fake.body.contains("Sent to"), "{}", fake.body);
    app.stop().await;
}

#[tokio::test]
async fn subjects_with_any_characters_open() {
    let app = spawn_app_with(&[("PHONE_CONSOLE_ADMIN_TOKEN", OPERATOR)]).await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let bob = register(&c, "bob", "B", "p").await;
    // The third byte falls inside "€": a byte slice there panicked.
    let first = ok(
        &c,
        "phone_send",
        alice.with(json!({"to": "bob", "subject": "ab€ invoice", "body": "x"})),
    )
    .await;
    let reply = ok(
        &c,
        "phone_send",
        alice.with(json!({"reply_to": first["id"], "body": "no subject here"})),
    )
    .await;
    let mut browser = Browser::signed_in(&app, &bob).await;
    for id in [&first["id"], &reply["id"]] {
        let page = browser
            .get(&format!("/console/messages/{}", id.as_str().unwrap()))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert_eq!(page.field("subject"), "Re: ab€ invoice");
    }
    // A failed sign-in keeps the session the browser had.
    let form = browser.get("/console/operator").await;
    assert_eq!(form.status, StatusCode::OK);
    let wrong = browser
        .post(
            "/console/operator/sign-in",
            &[
                ("token", "not-the-operator-token-at-all"),
                ("csrf", &form.field("csrf")),
            ],
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(browser.get("/console/inbox").await.status, StatusCode::OK);
    app.stop().await;
}

/// Index entries and rows of `messages` read so far (every index of the
/// table, index-only scans included, and sequential scans).
async fn messages_reads(db: &tokio_postgres::Client) -> i64 {
    db.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    db.query_one(
        "SELECT ((SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes WHERE relname = 'messages')
              + (SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = 'messages'))::bigint",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// The Threads page of a big mailbox (20,000 messages in 2,000 threads)
/// reads a bounded part of it, not all of its mail per view (0.41 s at
/// 200k messages when it did); its pages continue without repeating a
/// thread.
#[tokio::test]
async fn the_threads_page_of_a_big_mailbox_reads_a_bounded_part_of_it() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    register(&c, "bob", "B", "p").await;
    let db = app.db().await;
    db.batch_execute(
        "WITH a AS (SELECT id FROM agents WHERE name = 'alice'),
              b AS (SELECT id FROM agents WHERE name = 'bob'),
              base AS (SELECT nextval('messages_id_seq') AS n)
         INSERT INTO messages (id, sender_id, recipient_id, subject, body, thread_id, sent_at, read_at)
         SELECT base.n + g,
                CASE WHEN g % 2 = 0 THEN a.id ELSE b.id END,
                CASE WHEN g % 2 = 0 THEN b.id ELSE a.id END,
                'thread ' || (g / 10), 'body ' || g, base.n + (g / 10) * 10,
                now() - make_interval(secs => 20000 - g), now()
         FROM generate_series(0, 19999) g, a, b, base;
         SELECT setval('messages_id_seq', (SELECT max(id) FROM messages));",
    )
    .await
    .unwrap();
    db.batch_execute("VACUUM ANALYZE messages").await.unwrap();
    let mut browser = Browser::signed_in(&app, &alice).await;
    // Counters reach the statistics up to a second after a backend idles.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let before = messages_reads(&db).await;
    let first = browser.get("/console/threads").await;
    assert_eq!(first.status, StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let read = messages_reads(&db).await - before;
    assert!(
        read < 6000,
        "one view of the threads page read {read} entries of a 20,000-message mailbox"
    );
    assert!(
        first.body.contains("thread 1999"),
        "the latest thread first"
    );
    assert_eq!(first.body.matches("with <bdi>bob</bdi>").count(), 50);
    // The next pages go on where this one stopped, never repeating a thread.
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut page = first;
    for _ in 0..3 {
        for subject in page.body.split("<bdi>thread ").skip(1) {
            let n = subject.split('<').next().unwrap().to_owned();
            assert!(seen.insert(n.clone()), "thread {n} shown twice");
        }
        let older = page
            .body
            .split("href=\"/console/threads?before=")
            .nth(1)
            .expect("an Older link")
            .split('"')
            .next()
            .unwrap()
            .to_owned();
        page = browser
            .get(&format!("/console/threads?before={older}"))
            .await;
        assert_eq!(page.status, StatusCode::OK);
    }
    assert!(seen.len() >= 150, "{}", seen.len());
    app.stop().await;
}

/// Console pages cannot take the agents' connections: with the database
/// stalled under the console (its sessions table locked), ten page loads
/// from five signed-in browsers hold at most half of the pool, and an
/// agent's call is still served meanwhile. Without the console's gate all
/// four connections wait on the lock and the agent gets "busy".
#[tokio::test]
async fn console_tabs_leave_the_agents_their_connections() {
    let app = spawn_app_with(&[("PHONE_POOL_SIZE", "4"), ("PHONE_POOL_TIMEOUT_MS", "500")]).await;
    let c = app.client().await;
    let owner = register(&c, "hoarder", "H", "p").await;
    let other = register(&c, "other", "O", "p").await;
    let mut browsers = Vec::new();
    for _ in 0..5 {
        browsers.push(Browser::signed_in(&app, &owner).await);
    }
    let lock = app.db().await;
    lock.batch_execute("BEGIN; LOCK TABLE console_sessions IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let mut tabs = Vec::new();
    for browser in &browsers {
        for _ in 0..2 {
            let (http, url, cookie) = (
                browser.http.clone(),
                format!("{}/console/inbox", browser.base),
                browser.cookie_header(),
            );
            tabs.push(tokio::spawn(async move {
                http.get(url)
                    .header(header::COOKIE, cookie)
                    .send()
                    .await
                    .map(|r| r.status())
            }));
        }
    }
    // The tabs are in, waiting on the lock (or on their turn).
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let waiting: i64 = app
        .db()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let served = call(
        &c,
        "phone_send",
        other.with(json!({"to": "hoarder", "body": "still here"})),
    )
    .await;
    lock.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        served.is_error != Some(true),
        "an agent's send failed while console tabs waited ({waiting} sessions waiting on the lock): {}",
        text(&served)
    );
    assert!(
        waiting <= 2,
        "{waiting} console requests held connections at once; half the pool is 2"
    );
    for tab in tabs {
        assert_eq!(tab.await.unwrap().unwrap(), StatusCode::OK);
    }
}

/// A copy of a group send shows its recipient who else it went to on the
/// message's page.
#[tokio::test]
async fn a_group_send_names_the_other_recipients() {
    let app = spawn_app().await;
    let c = app.client().await;
    let boss = register(&c, "boss", "B", "p").await;
    let w1 = register(&c, "w1", "W", "p").await;
    register(&c, "w2", "W", "p").await;
    register(&c, "w3", "W", "p").await;
    let sent = ok(
        &c,
        "phone_send",
        boss.with(json!({"to": ["w1", "w2", "w3"], "body": "split it"})),
    )
    .await;
    let mine = sent["recipients"][0]["id"].as_str().unwrap().to_owned();
    let mut browser = Browser::signed_in(&app, &w1).await;
    let page = browser.get(&format!("/console/messages/{mine}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body
            .contains("<span class=\"label\">and</span> <bdi>w2</bdi>, <bdi>w3</bdi>"),
        "{}",
        page.body
    );
    app.stop().await;
}

/// Clients that send a form's headers and then nothing (an outsider's
/// attack: five such connections made the console answer "busy" to
/// everyone on the replica for as long as they kept reconnecting) hold no
/// console slot: the gate takes a request only once its body is in.
#[tokio::test]
async fn forms_that_never_arrive_hold_no_console_slot() {
    use tokio::io::AsyncWriteExt;
    // Half of a pool of 4: two console requests at once.
    let app = spawn_app_with(&[("PHONE_POOL_SIZE", "4")]).await;
    let c = app.client().await;
    let owner = register(&c, "owner", "O", "p").await;
    let mut browser = Browser::signed_in(&app, &owner).await;
    let mut stalled = Vec::new();
    for _ in 0..6 {
        let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
        let head = format!(
            "POST /console/compose HTTP/1.1\r\nHost: {}\r\nOrigin: http://{}\r\n\
             Cookie: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: 1000\r\n\r\nx",
            app.addr,
            app.addr,
            browser.cookie_header()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    // The stalled requests are in (their bytes read) before the page's.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for path in ["/console/inbox", "/console/outbox"] {
        let page = browser.get(path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
    }
    drop(stalled);
    app.stop().await;
}

/// Wrong sign-ins over the limit are answered a second late; that second
/// is spent outside the console's share of the replica, so a guesser slows
/// itself, not the pages of everyone signed in (an outsider's attack: 30
/// guesses at once made pages take 6 s). The page is answered while every
/// guess still waits.
#[tokio::test]
async fn a_slowed_guesser_holds_no_console_slot() {
    let app = spawn_app_with(&[("PHONE_POOL_SIZE", "4"), ("PHONE_AUTH_FAILURE_LIMIT", "1")]).await;
    let c = app.client().await;
    let owner = register(&c, "owner", "O", "p").await;
    let mut browser = Browser::signed_in(&app, &owner).await;
    let wrong = "phn_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let mut guesser = Browser::new(&app);
    for _ in 0..2 {
        guesser.sign_in("owner", wrong).await;
    }
    let form = guesser.get("/console/sign-in").await;
    let csrf = form.field("csrf");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let guesses: Vec<_> = (0..8)
        .map(|_| {
            let (http, base, cookie, csrf, done) = (
                guesser.http.clone(),
                guesser.base.clone(),
                guesser.cookie_header(),
                csrf.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                let answer = http
                    .post(format!("{base}/console/sign-in"))
                    .header(header::COOKIE, cookie)
                    .header(header::ORIGIN, &base)
                    .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(format!("name=owner&token={wrong}&csrf={csrf}"))
                    .send()
                    .await
                    .unwrap();
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                answer.status()
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let page = browser.get("/console/inbox").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let answered_before = done.load(std::sync::atomic::Ordering::SeqCst);
    for guess in guesses {
        assert_eq!(guess.await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(
        answered_before, 0,
        "the page waited for {answered_before} slowed guesses to be answered"
    );
    app.stop().await;
}

/// A second session cookie of the console's name (planted by a page on
/// another port of the same host, on a narrower path, which the browser
/// sends first) is no session at all: the person is not made to write in
/// a stranger's session.
#[tokio::test]
async fn two_session_cookies_are_no_session() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "A", "p").await;
    let mallory = register(&c, "mallory", "M", "p").await;
    let alices = Browser::signed_in(&app, &alice).await;
    let mallorys = Browser::signed_in(&app, &mallory).await;
    let session = |b: &Browser| {
        let (k, v) = b
            .cookies
            .iter()
            .find(|(k, _)| k.contains("console"))
            .unwrap();
        format!("{k}={v}")
    };
    let planted = format!("{}; {}", session(&mallorys), session(&alices));
    let answer = alices
        .http
        .get(format!("{}/console/compose", alices.base))
        .header(header::COOKIE, planted)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let page = answer.text().await.unwrap();
    assert!(!page.contains("mallory"), "{page}");
    // Each alone is its own session.
    let answer = alices
        .http
        .get(format!("{}/console/compose", alices.base))
        .header(header::COOKIE, session(&alices))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    app.stop().await;
}

/// A form over the server's body limit (40,000 CJK characters are over
/// 300 KB once form-encoded) gets a console page that says what to do, with
/// the console's headers, not the body limit's bare line of text.
#[tokio::test]
async fn a_form_over_the_body_limit_gets_a_page() {
    let app = spawn_app().await;
    let c = app.client().await;
    let owner = register(&c, "owner", "O", "p").await;
    let mut browser = Browser::signed_in(&app, &owner).await;
    let form = browser.get("/console/compose").await;
    let csrf = form.field("csrf");
    let body = "漢".repeat(40_000);
    let page = browser
        .post(
            "/console/compose",
            &[("to", "owner"), ("body", &body), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(page.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        page.body.contains("Too long") && page.body.contains("Go back"),
        "{}",
        page.body
    );
    assert!(
        page.headers.get(header::CONTENT_SECURITY_POLICY).is_some(),
        "{:?}",
        page.headers
    );
    // The same form sent in chunks, its length undeclared: the same page.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let head = format!(
        "POST /console/compose HTTP/1.1\r\nHost: {}\r\nOrigin: http://{}\r\nCookie: {}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n",
        app.addr,
        app.addr,
        browser.cookie_header()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let chunk = "x".repeat(16 * 1024);
    for _ in 0..40 {
        let framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
        if s.write_all(framed.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("Too long"), "{answer}");
    app.stop().await;
}

/// One stranger, registered once, signed in again and again (~87 a
/// second): each sign-in a row kept for the session's hours. An agent
/// keeps its newest 20 sessions; a sign-in beyond ends the oldest.
#[tokio::test]
async fn an_agent_keeps_its_newest_twenty_sessions() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "B", "p").await;
    let carol = register(&c, "carol", "C", "p").await;
    let mut carols = Browser::signed_in(&app, &carol).await;
    let mut first = Browser::signed_in(&app, &bob).await;
    let mut browsers = Vec::new();
    for _ in 0..24 {
        browsers.push(Browser::signed_in(&app, &bob).await);
    }
    let kept = app
        .count(
            "SELECT count(*) FROM console_sessions s JOIN agents a ON a.id = s.agent_id
             WHERE a.name = 'bob'",
        )
        .await;
    assert_eq!(kept, 20);
    let page = first.get("/console/inbox").await;
    assert_eq!(page.location(), "/console/sign-in", "the oldest ended");
    for browser in browsers.iter_mut().rev().take(20) {
        let page = browser.get("/console/inbox").await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    }
    // Another agent's session is no part of bob's count.
    assert_eq!(carols.get("/console/inbox").await.status, StatusCode::OK);
    app.stop().await;
}
