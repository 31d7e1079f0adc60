//! The abuse suite: one outsider against a server with its default settings
//! (the send quota included), while a few well-behaved agents go on with
//! their work. Each test measures what the attack cost the others (their
//! latency before and during it, their refusals, the database's statements a
//! second) and fails when any of them was refused or hurt; latency that grew
//! is a finding (`PHONE_CHAOS_STRICT=1` fails on it).
//!
//! - a stranger floods one agent's inbox, 32 sends at a time;
//! - a neighbour at the same address guesses tokens, 16 at a time;
//! - a webhook receiver that accepts connections and never answers, under a
//!   steady trickle of mail, then idle;
//! - a mailbox of a million messages opened in ten console tabs at once;
//! - webhook hosts looked up through a name server that never answers.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::json;

use crate::client::{self, Mcp, Outcome};
use crate::harness::{self, Replica};
use crate::workload::{self, Row};

/// The well-behaved agents' names.
const INNOCENTS: [&str; 4] = ["ann", "bob", "cat", "dan"];

struct Agent {
    name: String,
    token: String,
}

async fn register(mcp: &Mcp, bases: &[String], name: &str) -> Agent {
    Agent {
        name: name.to_owned(),
        token: client::register(mcp, bases, name).await,
    }
}

/// A test's stage: its own database, replicas with the server's own
/// defaults (the harness turns the send quota off for the fault loads; an
/// attack is measured against the default), the victim and the innocents.
struct Scene {
    db: String,
    rs: Vec<Replica>,
    bases: Vec<String>,
    mcp: Mcp,
    victim: Agent,
    innocents: Vec<Agent>,
}

impl Scene {
    async fn set_up(
        label: &str,
        replicas: usize,
        extra: &[(&str, &str)],
        victim: &str,
        timeout: Duration,
    ) -> Self {
        let db = harness::fresh_database(label).await;
        let mut env = vec![("PHONE_SEND_QUOTA_PER_HOUR", "1000")];
        env.extend_from_slice(extra);
        let mut rs: Vec<Replica> = (0..replicas)
            .map(|i| Replica::new(&format!("{}-{}", label.replace('_', "-"), i + 1), &db, &env))
            .collect();
        for r in &mut rs {
            r.start().await;
        }
        let bases: Vec<String> = rs.iter().map(Replica::base).collect();
        let mcp = Mcp::new(timeout);
        let victim = register(&mcp, &bases, victim).await;
        let mut innocents = Vec::new();
        for name in INNOCENTS {
            innocents.push(register(&mcp, &bases, name).await);
        }
        Self {
            db,
            rs,
            bases,
            mcp,
            victim,
            innocents,
        }
    }
}

// ---------------------------------------------------------------------------
// The others: each innocent sends to the victim and to its neighbour, then
// reads its own inbox, every 100 ms, through every replica in turn.

#[derive(Clone)]
struct Call {
    at: f64,
    latency: f64,
    failure: Option<String>,
}

struct Others {
    calls: Arc<Mutex<Vec<Call>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    t0: Instant,
}

impl Others {
    fn start(mcp: &Mcp, bases: &[String], innocents: &[Agent], victim: &str) -> Self {
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, me) in innocents.iter().enumerate() {
            let (mcp, bases, calls, stop) =
                (mcp.clone(), bases.to_vec(), calls.clone(), stop.clone());
            let (name, token) = (me.name.clone(), me.token.clone());
            let neighbour = innocents[(i + 1) % innocents.len()].name.clone();
            let victim = victim.to_owned();
            tasks.push(tokio::spawn(async move {
                // Bounded: at most 3,000 rounds (5 minutes at this pace).
                for n in 0..3_000usize {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let base = &bases[n % bases.len()];
                    let to = if n % 2 == 0 { &victim } else { &neighbour };
                    for (tool, args) in [
                        (
                            "phone_send",
                            json!({"name": name, "token": token, "to": to,
                                   "body": format!("{name} #{n}: the report is ready")}),
                        ),
                        ("phone_inbox", json!({"name": name, "token": token})),
                    ] {
                        let at = t0.elapsed().as_secs_f64();
                        let (out, took) = mcp.call(base, tool, args).await;
                        let failure = (!out.is_ok()).then(|| format!("{tool}: {}", out.detail()));
                        calls.lock().unwrap().push(Call {
                            at,
                            latency: took.as_secs_f64(),
                            failure,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        Self {
            calls,
            stop,
            tasks,
            t0,
        }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    async fn finish(self) -> Vec<Call> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = t.await;
        }
        Arc::try_unwrap(self.calls)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// Latency of the calls made in [from, to): p50, p99 (ms), count, failures.
struct Window {
    p50: f64,
    p99: f64,
    calls: usize,
    failures: Vec<String>,
}

fn window(calls: &[Call], from: f64, to: f64) -> Window {
    let mut inside: Vec<&Call> = calls.iter().filter(|c| c.at >= from && c.at < to).collect();
    inside.sort_by(|a, b| a.latency.total_cmp(&b.latency));
    let pick = |q: f64| {
        if inside.is_empty() {
            return 0.0;
        }
        let i = ((inside.len() as f64 - 1.0) * q).round() as usize;
        inside[i].latency * 1000.0
    };
    Window {
        p50: pick(0.5),
        p99: pick(0.99),
        calls: inside.len(),
        failures: inside.iter().filter_map(|c| c.failure.clone()).collect(),
    }
}

/// The others' verdict: no refusal in either window (a failure of the test),
/// p99 under attack at most three times the baseline's plus 20 ms (a finding
/// otherwise). Returns the row's text.
fn judge(label: &str, before: &Window, during: &Window) -> String {
    let text = format!(
        "others: {} calls before, p50 {:.1} / p99 {:.1} ms; {} during, p50 {:.1} / p99 {:.1} ms; {} refused or failed",
        before.calls,
        before.p50,
        before.p99,
        during.calls,
        during.p50,
        during.p99,
        before.failures.len() + during.failures.len()
    );
    println!("{label}: {text}");
    assert!(
        before.calls > 0 && during.calls > 0,
        "{label}: the others' load did not run"
    );
    let mut failures: Vec<&String> = before.failures.iter().chain(&during.failures).collect();
    failures.truncate(5);
    assert!(
        failures.is_empty(),
        "{label}: the attack refused or failed the others' calls: {failures:?}"
    );
    crate::finding(
        during.p99 <= 3.0 * before.p99 + 20.0,
        format!(
            "{label}: the others' p99 grew from {:.1} ms to {:.1} ms under the attack",
            before.p99, during.p99
        ),
    );
    text
}

/// Outcomes by kind, for the report: "ok 500, tool: inbox_share… 1,200".
fn tally(outcomes: &BTreeMap<String, usize>) -> String {
    outcomes
        .iter()
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn kind(out: &Outcome) -> String {
    match out {
        Outcome::Ok(_) => "ok".into(),
        // Digits masked: refusals that differ by a name or count tally as one.
        Outcome::Tool(text) => format!(
            "refused: {}",
            text.chars()
                .take(60)
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect::<String>()
        ),
        other => other.kind(),
    }
}

async fn stop_all(replicas: &mut [Replica]) {
    let refs: Vec<&Replica> = replicas.iter().collect();
    let panics = harness::panics_in_logs(&refs);
    assert!(panics.is_empty(), "panics in replica logs: {panics:?}");
    for r in replicas {
        r.stop(Duration::from_secs(5)).await;
    }
}

// ---------------------------------------------------------------------------

/// A stranger registers and sends 11,000 short messages to one agent, 32 at
/// a time (what once filled an inbox for everyone in nine seconds).
pub async fn stranger_floods_an_inbox() {
    let Scene {
        db,
        mut rs,
        bases,
        mcp,
        victim,
        innocents,
    } = Scene::set_up("abuse_flood", 2, &[], "victim", Duration::from_secs(10)).await;
    let stranger = register(&mcp, &bases, "stranger").await;

    let others = Others::start(&mcp, &bases, &innocents, &victim.name);
    let baseline = crate::secs("PHONE_CHAOS_ABUSE_BASELINE_SECS", 3.0);
    tokio::time::sleep(Duration::from_secs_f64(baseline)).await;
    let attack_from = others.now();
    let sent = Arc::new(AtomicUsize::new(0));
    let outcomes: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let deadline =
        Instant::now() + Duration::from_secs_f64(crate::secs("PHONE_CHAOS_ABUSE_SECS", 8.0));
    let mut flood = Vec::new();
    for w in 0..32usize {
        let (mcp, base, sent, outcomes) = (
            mcp.clone(),
            bases[w % 2].clone(),
            sent.clone(),
            outcomes.clone(),
        );
        let token = stranger.token.clone();
        flood.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let n = sent.fetch_add(1, Ordering::SeqCst);
                if n >= 11_000 {
                    break;
                }
                let (out, _) = mcp
                    .call(
                        &base,
                        "phone_send",
                        json!({"name": "stranger", "token": token, "to": "victim",
                               "body": format!("buy now {n}")}),
                    )
                    .await;
                *outcomes.lock().unwrap().entry(kind(&out)).or_default() += 1;
            }
        }));
    }
    for f in flood {
        f.await.unwrap();
    }
    let attack_to = others.now();
    // The others go on a little after the flood, as the victim would hear them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = others.finish().await;
    let before = window(&calls, 0.0, attack_from);
    let during = window(&calls, attack_from, attack_to + 1.0);

    // What the victim's inbox holds: everything the others sent it, and at
    // most the stranger's share.
    let check = harness::connect(&db).await;
    let unread: Vec<(String, i64)> = check
        .query(
            "SELECT s.name, count(*) FROM messages m JOIN agents s ON s.id = m.sender_id
             JOIN agents r ON r.id = m.recipient_id
             WHERE r.name = 'victim' AND m.read_at IS NULL AND m.dead_at IS NULL
             GROUP BY s.name ORDER BY s.name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let stranger_stored = unread
        .iter()
        .find(|(n, _)| n == "stranger")
        .map_or(0, |(_, c)| *c);
    let outcomes = outcomes.lock().unwrap().clone();
    let others_text = judge("stranger flood", &before, &during);
    workload::write_row(&Row {
        fault: "abuse: one stranger floods one inbox (default settings)".into(),
        load: format!(
            "{} sends by the stranger, 32 at a time over {:.1} s, 2 replicas; 4 others send to the victim and each other and read, every 100 ms",
            outcomes.values().sum::<usize>(),
            attack_to - attack_from
        ),
        acknowledged: format!("stranger: {}", tally(&outcomes)),
        delivered: format!("victim's unread by sender: {unread:?}"),
        lost: "0".into(),
        duplicated: "0".into(),
        recovery: others_text,
        notes: format!("the stranger holds {stranger_stored} of the victim's unread mail"),
    });
    // The share (500) is checked in each send statement's own snapshot, so
    // statements running at once on the two replicas may each store up to
    // what they carry: past the share by at most the stranger's sends in
    // flight (32), never more. Seen in CI: 509.
    assert!(
        stranger_stored <= 500 + 32,
        "the stranger holds {stranger_stored} unread messages of the victim's inbox, over its share and more than its 32 sends in flight"
    );
    if stranger_stored > 500 {
        workload::write_finding(&format!(
            "- a sender's share of an inbox is checked per statement: the stranger holds {stranger_stored} against a share of 500 (concurrent batches on two replicas)"
        ));
    }
    assert!(
        outcomes.keys().any(|k| k.starts_with("refused")),
        "the flood was never refused: nothing was tested"
    );
    stop_all(&mut rs).await;
}

/// A neighbour at the owner's address (the same NAT, or an edge without the
/// client's header) tries wrong tokens for the owner's name, 16 at a time;
/// the owner and the others go on, and the owner signs in to the console on
/// every replica during the attack.
pub async fn neighbour_guesses_tokens() {
    let Scene {
        db: _,
        mut rs,
        bases,
        mcp,
        victim,
        innocents,
    } = Scene::set_up("abuse_guess", 2, &[], "owner", Duration::from_secs(10)).await;

    let others = Others::start(&mcp, &bases, &innocents, &victim.name);
    tokio::time::sleep(Duration::from_secs_f64(crate::secs(
        "PHONE_CHAOS_ABUSE_BASELINE_SECS",
        3.0,
    )))
    .await;
    let attack_from = others.now();
    let tried = Arc::new(AtomicUsize::new(0));
    let outcomes: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let deadline =
        Instant::now() + Duration::from_secs_f64(crate::secs("PHONE_CHAOS_ABUSE_SECS", 8.0));
    let mut guesses = Vec::new();
    for w in 0..16usize {
        let (mcp, base, tried, outcomes) = (
            mcp.clone(),
            bases[w % 2].clone(),
            tried.clone(),
            outcomes.clone(),
        );
        guesses.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let n = tried.fetch_add(1, Ordering::SeqCst);
                if n >= 20_000 {
                    break;
                }
                let (out, _) = mcp
                    .call(
                        &base,
                        "phone_inbox",
                        json!({"name": "owner", "token": format!("phn_{n:0>43}")}),
                    )
                    .await;
                *outcomes.lock().unwrap().entry(kind(&out)).or_default() += 1;
            }
        }));
    }
    // The owner's own calls during the attack, once the guesses are over the
    // limit: served at once on every replica, through /mcp and the console.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut owner = Vec::new();
    for base in &bases {
        let (out, took) = mcp
            .call(
                base,
                "phone_inbox",
                json!({"name": "owner", "token": victim.token}),
            )
            .await;
        owner.push(format!(
            "/mcp {:.0} ms {}",
            took.as_secs_f64() * 1000.0,
            kind(&out)
        ));
        assert!(
            out.is_ok(),
            "the owner's right token was refused on {base}: {}",
            out.detail()
        );
        let t = Instant::now();
        let signed_in = console_sign_in(base, "owner", &victim.token).await;
        owner.push(format!(
            "console {:.0} ms",
            t.elapsed().as_secs_f64() * 1000.0
        ));
        assert!(
            signed_in.is_some(),
            "the owner could not sign in to the console on {base}"
        );
    }
    for g in guesses {
        g.await.unwrap();
    }
    let attack_to = others.now();
    let calls = others.finish().await;
    let before = window(&calls, 0.0, attack_from);
    let during = window(&calls, attack_from, attack_to);
    let outcomes = outcomes.lock().unwrap().clone();
    let total: usize = outcomes.values().sum();
    let others_text = judge("neighbour guessing", &before, &during);
    workload::write_row(&Row {
        fault: "abuse: a neighbour guesses the owner's token from the owner's address".into(),
        load: format!(
            "{total} wrong tokens, 16 at a time over {:.1} s ({:.0}/s: failures over the limit are answered late), 2 replicas",
            attack_to - attack_from,
            total as f64 / (attack_to - attack_from)
        ),
        acknowledged: format!("guesses: {}", tally(&outcomes)),
        delivered: format!("owner during the attack: {}", owner.join("; ")),
        lost: "0".into(),
        duplicated: "0".into(),
        recovery: others_text,
        notes: "the owner is served at once on every replica".into(),
    });
    assert!(
        outcomes.keys().all(|k| k != "ok"),
        "a wrong token was accepted: {outcomes:?}"
    );
    stop_all(&mut rs).await;
}

/// Signs in to the console the way a browser does: the form's csrf value and
/// cookie, then the POST with the page's Origin. Some(cookie) on success.
async fn console_sign_in(base: &str, name: &str, token: &str) -> Option<String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .unwrap();
    let form = http
        .get(format!("{base}/console/sign-in"))
        .send()
        .await
        .ok()?;
    let cookies = set_cookies(form.headers());
    let page = form.text().await.ok()?;
    let marker = "name=\"csrf\" value=\"";
    let start = page.find(marker)? + marker.len();
    let csrf = &page[start..start + page[start..].find('"')?];
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("name", name), ("token", token), ("csrf", csrf)])
        .finish();
    let answer = http
        .post(format!("{base}/console/sign-in"))
        .header("cookie", cookies)
        .header("origin", base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .ok()?;
    (answer.status().as_u16() == 303).then(|| set_cookies(answer.headers()))
}

fn set_cookies(headers: &reqwest::header::HeaderMap) -> String {
    headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_owned))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Transactions the database has committed or rolled back, all sessions.
async fn transactions(check: &tokio_postgres::Client, database: &str) -> i64 {
    // The statistics are cached per transaction: a fresh snapshot each time.
    check
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    check
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
            &[&database],
        )
        .await
        .unwrap()
        .get(0)
}

/// Transactions a second over `secs`, less this probe's own two a sample.
async fn rate(check: &tokio_postgres::Client, database: &str, secs: f64) -> f64 {
    let a = transactions(check, database).await;
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let b = transactions(check, database).await;
    (b - a) as f64 / secs
}

/// One agent's webhook points at a receiver that accepts connections and
/// never answers, while mail for it arrives at a steady trickle; then all
/// sends stop. The database must be as idle as before the webhook existed.
pub async fn hanging_webhook_under_a_trickle() {
    // The receiver is on loopback: private destinations allowed, else defaults.
    let Scene {
        db,
        mut rs,
        bases,
        mcp,
        victim,
        innocents,
    } = Scene::set_up(
        "abuse_hang",
        2,
        &[("PHONE_WEBHOOK_ALLOW_PRIVATE", "true")],
        "hooked",
        Duration::from_secs(15),
    )
    .await;
    let database = harness::db_name(&db);
    let check = harness::connect(&db).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_before = rate(&check, &database, 5.0).await;

    // Accepts and holds every connection, reads nothing, answers nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = listener.local_addr().unwrap();
    let held = Arc::new(AtomicUsize::new(0));
    let held_in = held.clone();
    let receiver = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held_in.fetch_add(1, Ordering::SeqCst);
            sockets.push(socket);
        }
    });
    let (out, _) = mcp
        .call(
            &bases[0],
            "phone_settings",
            json!({"name": "hooked", "token": victim.token,
                   "webhook_url": format!("http://{hang_addr}/hook/s3cr3t-path")}),
        )
        .await;
    assert!(out.is_ok(), "set the webhook: {}", out.detail());

    let others = Others::start(&mcp, &bases, &innocents, &victim.name);
    tokio::time::sleep(Duration::from_secs_f64(crate::secs(
        "PHONE_CHAOS_ABUSE_SECS",
        8.0,
    )))
    .await;
    let calls = others.finish().await;
    let trickle_secs = calls.last().map_or(0.0, |c| c.at);
    // Everything stops; attempts in flight run out (10 s timeout), then the
    // idle database is measured again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_after = rate(&check, &database, 5.0).await;
    let states: Vec<(String, i64)> = check
        .query(
            "SELECT state, count(*) FROM webhook_deliveries GROUP BY state ORDER BY state",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let pending: i64 = states
        .iter()
        .filter(|(s, _)| s == "pending")
        .map(|(_, n)| n)
        .sum();
    receiver.abort();

    // Baseline for the others: the same trickle is the whole test; their
    // calls must all have succeeded, and their latency is reported.
    let all = window(&calls, 0.0, f64::MAX);
    let failures: Vec<&String> = all.failures.iter().take(5).collect();
    workload::write_row(&Row {
        fault: "abuse: a webhook receiver that never answers, under a trickle, then idle".into(),
        load: format!(
            "4 agents send every 100 ms for {trickle_secs:.1} s (half to the hooked agent), 2 replicas, webhook timeout 10 s (default)"
        ),
        acknowledged: format!(
            "others: {} calls, p50 {:.1} / p99 {:.1} ms, {} failed",
            all.calls,
            all.p50,
            all.p99,
            all.failures.len()
        ),
        delivered: format!(
            "deliveries by state: {states:?}; {} connections held by the receiver",
            held.load(Ordering::SeqCst)
        ),
        lost: "0".into(),
        duplicated: "0".into(),
        recovery: format!(
            "idle database: {idle_before:.1} transactions/s before the webhook, {idle_after:.1}/s after the sends stopped"
        ),
        notes:
            "the queue is capped per agent (PHONE_WEBHOOK_BACKLOG_MAX) and a failing host pauses"
                .into(),
    });
    assert!(
        failures.is_empty(),
        "the others' calls failed: {failures:?}"
    );
    assert!(
        held.load(Ordering::SeqCst) > 0,
        "the receiver was never called: nothing was tested"
    );
    assert!(
        idle_after <= idle_before * 1.5 + 3.0,
        "after the sends stopped the database ran {idle_after:.1} transactions/s against {idle_before:.1} before the hanging webhook"
    );
    // The cap (100) and the one summary; each send statement checks the cap
    // in its own snapshot, so batches committing at once on the two
    // replicas may each add one more: bounded, not exact.
    assert!(
        pending <= 101 + 4,
        "the hooked agent's backlog is not capped: {pending} pending deliveries"
    );
    if pending > 101 {
        workload::write_finding(&format!(
            "- the webhook backlog cap is per statement: {pending} pending against a cap of 100 and one summary (concurrent batches)"
        ));
    }
    stop_all(&mut rs).await;
}

/// Ten console tabs on a mailbox of a million messages (bulk-loaded), each
/// cycling its pages, while the others work; /health must stay 200.
pub async fn a_million_message_mailbox_in_the_console() {
    let Scene {
        db,
        mut rs,
        bases,
        mcp,
        victim: owner,
        innocents,
    } = Scene::set_up("abuse_big", 1, &[], "hoarder", Duration::from_secs(10)).await;
    let size = crate::secs("PHONE_CHAOS_BIG_MAILBOX", 1_000_000.0) as i64;
    let load_started = Instant::now();
    let check = harness::connect(&db).await;
    // From the four others in turn, in threads of ten, one in ten thousand
    // unread (the others' own mail must fit the inbox's shares); set-up, not
    // measurement: asynchronous commit.
    check
        .batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    check
        .execute(
            "INSERT INTO messages (id, sender_id, recipient_id, subject, body, thread_id, sent_at, read_at)
             SELECT x.id, s.id, r.id, 'Status ' || g, 'Progress note ' || g || ': the nightly import finished.',
                    x.id - (g - 1) % 10, now() - (($1::bigint - g) * interval '1 second'),
                    CASE WHEN g % 10000 <> 0 THEN now() END
             FROM (SELECT nextval('messages_id_seq') AS id, g
                   FROM generate_series(1, $1::bigint) g) x
             JOIN agents r ON r.name = 'hoarder'
             JOIN agents s ON s.name = (ARRAY['ann','bob','cat','dan'])[1 + (g % 4)::int]",
            &[&size],
        )
        .await
        .unwrap();
    check
        .batch_execute("VACUUM ANALYZE messages")
        .await
        .unwrap();
    let loaded_in = load_started.elapsed().as_secs_f64();

    let pages = [
        "/console/inbox",
        "/console/inbox?view=unread",
        "/console/threads",
        "/console/outbox",
    ];
    // What a page costs: one tab alone, ten views of each page in turn.
    let alone: Arc<Mutex<Vec<(usize, f64, u16)>>> = Arc::default();
    {
        let cookie = console_sign_in(&bases[0], "hoarder", &owner.token)
            .await
            .expect("the owner signs in");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .unwrap();
        for n in 0..10 * pages.len() {
            let which = n % pages.len();
            let (ms, status) = view(&http, &bases[0], &cookie, pages[which]).await;
            alone.lock().unwrap().push((which, ms, status));
        }
    }
    let alone = alone.lock().unwrap().clone();
    let (alone_text, alone_p99) = page_latencies(&pages, &alone);

    let others = Others::start(&mcp, &bases, &innocents, "hoarder");
    tokio::time::sleep(Duration::from_secs_f64(crate::secs(
        "PHONE_CHAOS_ABUSE_BASELINE_SECS",
        3.0,
    )))
    .await;
    let attack_from = others.now();
    let deadline =
        Instant::now() + Duration::from_secs_f64(crate::secs("PHONE_CHAOS_ABUSE_SECS", 8.0));
    let page_times: Arc<Mutex<Vec<(usize, f64, u16)>>> = Arc::default();
    let mut tabs = Vec::new();
    for tab in 0..10usize {
        let cookie = console_sign_in(&bases[0], "hoarder", &owner.token)
            .await
            .expect("the owner signs in");
        let (base, page_times) = (bases[0].clone(), page_times.clone());
        tabs.push(tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .no_proxy()
                .build()
                .unwrap();
            for n in 0..10_000usize {
                if Instant::now() > deadline {
                    break;
                }
                let which = (tab + n) % pages.len();
                let (ms, status) = view(&http, &base, &cookie, pages[which]).await;
                page_times.lock().unwrap().push((which, ms, status));
            }
        }));
    }
    let mut health = Vec::new();
    while Instant::now() < deadline {
        health.push(harness::health(&bases[0]).await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for t in tabs {
        t.await.unwrap();
    }
    let attack_to = others.now();
    let calls = others.finish().await;
    let before = window(&calls, 0.0, attack_from);
    let during = window(&calls, attack_from, attack_to);
    let page_times = page_times.lock().unwrap().clone();
    let (per_page, _) = page_latencies(&pages, &page_times);
    let bad_pages: Vec<u16> = page_times
        .iter()
        .chain(&alone)
        .map(|(.., s)| *s)
        .filter(|s| *s != 200)
        .collect();
    let not_ok = health.iter().filter(|h| **h != Some(200)).count();
    let others_text = judge("million-message mailbox", &before, &during);
    workload::write_row(&Row {
        fault: format!("abuse: a mailbox of {size} messages opened in ten console tabs"),
        load: format!(
            "{} page views over {:.1} s, 1 replica (pool 8); bulk load took {loaded_in:.0} s",
            page_times.len(),
            attack_to - attack_from
        ),
        acknowledged: format!("one tab alone: {alone_text}; ten tabs: {per_page}"),
        delivered: format!("{} pages not 200", bad_pages.len()),
        lost: "0".into(),
        duplicated: "0".into(),
        recovery: others_text,
        notes: format!("/health not 200 in {not_ok} of {} samples", health.len()),
    });
    assert!(bad_pages.is_empty(), "console pages answered {bad_pages:?}");
    assert_eq!(
        not_ok, 0,
        "/health was not 200 while the console was read: {health:?}"
    );
    crate::finding(
        alone_p99 <= 50.0,
        format!(
            "a console page of a {size}-message mailbox took {alone_p99:.0} ms at p99 in one tab (target 50 ms): {alone_text}"
        ),
    );
    stop_all(&mut rs).await;
}

/// One page view: milliseconds to the last byte, and the status (0: failed).
async fn view(http: &reqwest::Client, base: &str, cookie: &str, page: &str) -> (f64, u16) {
    let t = Instant::now();
    let status = match http
        .get(format!("{base}{page}"))
        .header("cookie", cookie)
        .send()
        .await
    {
        Ok(r) => {
            let s = r.status().as_u16();
            let _ = r.bytes().await;
            s
        }
        Err(_) => 0,
    };
    (t.elapsed().as_secs_f64() * 1000.0, status)
}

/// Per page: "page ×n: p50 / p99 ms", and the worst p99.
fn page_latencies(pages: &[&str], views: &[(usize, f64, u16)]) -> (String, f64) {
    let mut text = Vec::new();
    let mut worst: f64 = 0.0;
    for (i, page) in pages.iter().enumerate() {
        let mut ms: Vec<f64> = views
            .iter()
            .filter(|(w, ..)| *w == i)
            .map(|(_, t, _)| *t)
            .collect();
        ms.sort_by(f64::total_cmp);
        if ms.is_empty() {
            continue;
        }
        let p = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
        worst = worst.max(p(0.99));
        text.push(format!(
            "{page} ×{}: p50 {:.0} / p99 {:.0} ms",
            ms.len(),
            p(0.5),
            p(0.99)
        ));
    }
    (text.join("; "), worst)
}

/// Webhook hosts looked up through a name server that takes every question
/// and never answers: agents set webhooks naming fresh hosts, 32 at a time,
/// while the others work and a replica's pool has to reconnect.
pub async fn a_name_server_that_never_answers() {
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dns = silent.local_addr().unwrap().to_string();
    let questions = Arc::new(AtomicUsize::new(0));
    let questions_in = questions.clone();
    let name_server = tokio::spawn(async move {
        let mut buf = [0u8; 1500];
        while silent.recv_from(&mut buf).await.is_ok() {
            questions_in.fetch_add(1, Ordering::SeqCst);
        }
    });
    let Scene {
        db,
        mut rs,
        bases,
        mcp,
        victim,
        innocents,
    } = Scene::set_up(
        "abuse_dns",
        2,
        &[("PHONE_DNS_SERVERS", &dns)],
        "quiet",
        Duration::from_secs(30),
    )
    .await;
    let mut attackers = Vec::new();
    for i in 0..4 {
        attackers.push(register(&mcp, &bases, &format!("resolver-{i}")).await);
    }

    let others = Others::start(&mcp, &bases, &innocents, &victim.name);
    tokio::time::sleep(Duration::from_secs_f64(crate::secs(
        "PHONE_CHAOS_ABUSE_BASELINE_SECS",
        3.0,
    )))
    .await;
    let attack_from = others.now();
    let deadline =
        Instant::now() + Duration::from_secs_f64(crate::secs("PHONE_CHAOS_ABUSE_SECS", 8.0));
    let outcomes: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let tried = Arc::new(AtomicUsize::new(0));
    let mut calls_to_settings = Vec::new();
    for w in 0..32usize {
        let a = &attackers[w % attackers.len()];
        let (mcp, base, outcomes, tried) = (
            mcp.clone(),
            bases[w % 2].clone(),
            outcomes.clone(),
            tried.clone(),
        );
        let (name, token) = (a.name.clone(), a.token.clone());
        calls_to_settings.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let n = tried.fetch_add(1, Ordering::SeqCst);
                if n >= 5_000 {
                    break;
                }
                let (out, _) = mcp
                    .call(
                        &base,
                        "phone_settings",
                        json!({"name": name, "token": token,
                               "webhook_url": format!("https://h{n}.slow-resolver.example/hook")}),
                    )
                    .await;
                *outcomes.lock().unwrap().entry(kind(&out)).or_default() += 1;
            }
        }));
    }
    // Midway, one replica's pool must open new connections: its database
    // sessions are ended from outside.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let check = harness::connect(&db).await;
    let ended: i64 = check
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = $1 AND pid <> pg_backend_pid()) t",
            &[&harness::db_name(&db)],
        )
        .await
        .unwrap()
        .get(0);
    let mut health = Vec::new();
    while Instant::now() < deadline {
        for b in &bases {
            health.push(harness::health(b).await);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for c in calls_to_settings {
        c.await.unwrap();
    }
    let attack_to = others.now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = others.finish().await;
    name_server.abort();
    let before = window(&calls, 0.0, attack_from);
    // The sessions ended from outside fail the calls that held them: counted
    // from a second after that.
    let during = window(&calls, attack_from + 3.0, attack_to + 1.0);
    let outcomes = outcomes.lock().unwrap().clone();
    let not_ok = health.iter().filter(|h| **h != Some(200)).count();
    let others_text = judge("silent name server", &before, &during);
    workload::write_row(&Row {
        fault: "abuse: webhook hosts looked up through a name server that never answers".into(),
        load: format!(
            "{} phone_settings calls naming fresh hosts, 32 at a time over {:.1} s, 2 replicas; {ended} database sessions ended from outside at 2 s",
            outcomes.values().sum::<usize>(),
            attack_to - attack_from
        ),
        acknowledged: format!("settings: {}", tally(&outcomes)),
        delivered: format!(
            "{} questions reached the name server",
            questions.load(Ordering::SeqCst)
        ),
        lost: "0".into(),
        duplicated: "0".into(),
        recovery: others_text,
        notes: format!("/health not 200 in {not_ok} of {} samples", health.len()),
    });
    assert!(
        outcomes.keys().all(|k| k != "ok"),
        "a webhook naming a host that cannot be resolved was accepted: {outcomes:?}"
    );
    assert!(
        questions.load(Ordering::SeqCst) > 0,
        "no lookup reached the name server: nothing was tested"
    );
    assert_eq!(
        not_ok, 0,
        "/health was not 200 during the lookups: {health:?}"
    );
    stop_all(&mut rs).await;
}
