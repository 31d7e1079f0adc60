//! `teams`: mail for teams (issue 28). (1) Closed-loop sends from
//! `SENDERS` agents, alternated over rounds: (a) each send to one of 20
//! recipients, (b) each a group send to all 20; the target is a group send
//! costing at most 3× a single send, in sends (calls) per second of the same
//! run. (2) Search of one's own mail: a mailbox of `searcher_messages`
//! among `total_messages` stored, searched by `SEARCHERS` closed loops
//! (a) with one or two words of the seeded vocabulary (each word in about a
//! fifth of the mailbox: thousands of matches), (b) for a reference number
//! (each in 0.1% of the messages, alone or with a word); the target is p99
//! ≤ 20 ms.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use serde_json::json;

use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::{Agent, BODY, register};
use crate::mcp::{Conn, Target};
use crate::mode::Mode;
use crate::replicas::{start_replicas_env, stop_replicas, targets};
use crate::report::verdict;
use crate::stats::{self, Errors, Lat, Summary};

const DB_TEAMS: &str = "phone_bench_teams";
const SENDERS: usize = 8;
const RECIPIENTS: usize = 20;
const SEARCHERS: usize = 4;
const ROUNDS: usize = 3;
/// The words the seeded mail is written in (each body: five of them).
const WORDS: &[&str] = &[
    "invoice",
    "payment",
    "march",
    "april",
    "report",
    "deploy",
    "review",
    "contract",
    "budget",
    "meeting",
    "customer",
    "refund",
    "release",
    "incident",
    "backup",
    "travel",
    "hiring",
    "security",
    "audit",
    "roadmap",
    "translation",
    "calendar",
    "pricing",
    "shipment",
    "ticket",
];

#[derive(Default)]
pub(crate) struct TeamsReport {
    /// Per round: (single sends/s, group sends/s), calls answered as stored.
    rounds: Vec<(f64, f64)>,
    /// Per round: CPU per call of the single sends and of the group sends.
    cpu: Vec<(SendCpu, SendCpu)>,
    single_lat: Summary,
    group_lat: Summary,
    errors: String,
    total_messages: i64,
    mailbox: i64,
    seed_secs: f64,
    search: Summary,
    searches_per_s: f64,
    search_errors: String,
    selective: Summary,
    selective_per_s: f64,
    selective_errors: String,
    /// Common words in a mailbox of long messages ([`LONG_MAIL`]).
    long: Summary,
    long_per_s: f64,
    long_errors: String,
}

impl TeamsReport {
    /// The median of the rounds' single ÷ group ratios.
    fn ratio(&self) -> f64 {
        let mut v: Vec<f64> = self.rounds.iter().map(|(s, g)| s / g.max(1e-9)).collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }
}

/// Where a run of sends spent the machine's CPU, in µs per answered call:
/// the replica, PostgreSQL (postmaster and backends) and the bench itself
/// (its MCP client), which share the cores.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SendCpu {
    server_us: f64,
    postgres_us: f64,
    bench_us: f64,
    /// WAL written per call, and full-page images among it.
    wal_bytes: f64,
    wal_fpi: f64,
    /// The mail statements (batches) run, per call, and their mean time.
    batches_per_call: f64,
    batch_ms: f64,
    /// Plans made per execution of the mail statement (near 0: its generic
    /// plan; near 1: planned again every time).
    plans_per_batch: f64,
}

/// CPU ticks of (the replica, PostgreSQL, the bench) and the cluster's WAL
/// (bytes, full-page images) now.
struct Ticks(u64, u64, u64, i64, i64, i64, f64, i64);

impl Ticks {
    /// `admin`: a connection to the database with pg_stat_statements.
    async fn now(server: u32, postmaster: u32, admin: &tokio_postgres::Client) -> Self {
        let own = |pid: u32| stats::proc_ticks(pid).map_or(0, |(own, _)| own);
        let (bytes, fpi) = admin
            .query_one("SELECT wal_bytes::bigint, wal_fpi FROM pg_stat_wal", &[])
            .await
            .map_or((0, 0), |r| (r.get(0), r.get(1)));
        // The mail statement begins with its wake-up check.
        let (batches, batch_ms, plans) = admin
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)::float8,
                        coalesce(sum(plans), 0)::bigint
                 FROM pg_stat_statements WHERE query LIKE 'WITH woken AS%'",
                &[],
            )
            .await
            .map_or((0, 0.0, 0), |r| (r.get(0), r.get(1), r.get(2)));
        Self(
            own(server),
            stats::tree_ticks(postmaster),
            own(std::process::id()),
            bytes,
            fpi,
            batches,
            batch_ms,
            plans,
        )
    }

    fn per_call(&self, later: &Ticks, calls: u64, hz: f64) -> SendCpu {
        let calls = calls.max(1) as f64;
        let us = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / hz * 1e6 / calls;
        SendCpu {
            server_us: us(self.0, later.0),
            postgres_us: us(self.1, later.1),
            bench_us: us(self.2, later.2),
            wal_bytes: (later.3 - self.3) as f64 / calls,
            wal_fpi: (later.4 - self.4) as f64 / calls,
            batches_per_call: (later.5 - self.5) as f64 / calls,
            batch_ms: (later.6 - self.6) / (later.5 - self.5).max(1) as f64,
            plans_per_batch: (later.7 - self.7) as f64 / (later.5 - self.5).max(1) as f64,
        }
    }
}

/// Whether the search part runs (`PHONE_BENCH_TEAMS_SEARCH=0` skips it:
/// the sends alone, for trying a change to them quickly).
fn with_search() -> bool {
    std::env::var("PHONE_BENCH_TEAMS_SEARCH").map_or(true, |v| v != "0")
}

pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    t0: Instant,
    postmaster: u32,
    hz: f64,
) -> Result<TeamsReport, String> {
    db::recreate_database(admin, DB_TEAMS).await?;
    // No quotas: the senders send far more than an hour's quota, and the
    // recipients read nothing until a run ends (each copy would count its
    // sender's share of the inbox).
    let replicas = start_replicas_env(
        opts,
        DB_TEAMS,
        1,
        opts.base_port + 80,
        "teams",
        &[
            ("PHONE_INBOX_UNREAD_MAX", "0"),
            ("PHONE_INBOX_UNREAD_PER_SENDER", "0"),
            ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
            ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "0"),
        ],
    )
    .await?;
    let outcome = async {
        let tdb = db::connect(&pg_url(opts, DB_TEAMS)).await?;
        let tg = targets(&replicas);
        let names: Vec<String> = (1..=SENDERS)
            .map(|i| format!("ts-{i}"))
            .chain((1..=RECIPIENTS).map(|i| format!("tr-{i}")))
            .collect();
        let agents = register(&tg[0], &names, "teams").await?;
        let (senders, recipients) = agents.split_at(SENDERS);
        let to: Vec<String> = recipients.iter().map(|a| a.name.clone()).collect();
        let secs = if mode.name == "quick" { 4 } else { 10 };
        let measure = Duration::from_secs(secs);
        let mut rounds = Vec::new();
        let mut cpu = Vec::new();
        let (mut single_lat, mut group_lat, mut errors) =
            (Lat::default(), Lat::default(), Errors::default());
        let server = replicas[0].pid;
        for round in 0..ROUNDS {
            settle(&tdb).await?;
            let before = Ticks::now(server, postmaster, admin).await;
            let (n, lat, e) = sends(&tg[0], senders, &to, false, measure).await;
            let single_cpu = before.per_call(&Ticks::now(server, postmaster, admin).await, n, hz);
            single_lat.merge(lat);
            errors.merge(e);
            settle(&tdb).await?;
            let before = Ticks::now(server, postmaster, admin).await;
            let (g, lat, e) = sends(&tg[0], senders, &to, true, measure).await;
            let group_cpu = before.per_call(&Ticks::now(server, postmaster, admin).await, g, hz);
            group_lat.merge(lat);
            errors.merge(e);
            let pair = (n as f64 / secs as f64, g as f64 / secs as f64);
            say!(
                t0,
                "teams round {}: {:.0} single sends/s, {:.0} group sends/s (×20 messages); \
                 CPU µs per call, server/PostgreSQL/bench: single {:.0}/{:.0}/{:.0}, group {:.0}/{:.0}/{:.0}; \
                 WAL bytes (full-page images) per call: single {:.0} ({:.2}), group {:.0} ({:.2}); \
                 calls per statement, its mean ms, plans per execution: single {:.1}, {:.2}, {:.2}, group {:.1}, {:.2}, {:.2}",
                round + 1,
                pair.0,
                pair.1,
                single_cpu.server_us,
                single_cpu.postgres_us,
                single_cpu.bench_us,
                group_cpu.server_us,
                group_cpu.postgres_us,
                group_cpu.bench_us,
                single_cpu.wal_bytes,
                single_cpu.wal_fpi,
                group_cpu.wal_bytes,
                group_cpu.wal_fpi,
                1.0 / single_cpu.batches_per_call.max(1e-9),
                single_cpu.batch_ms,
                single_cpu.plans_per_batch,
                1.0 / group_cpu.batches_per_call.max(1e-9),
                group_cpu.batch_ms,
                group_cpu.plans_per_batch,
            );
            rounds.push(pair);
            cpu.push((single_cpu, group_cpu));
        }
        if !with_search() {
            return Ok(TeamsReport {
                rounds,
                cpu,
                single_lat: single_lat.summary(),
                group_lat: group_lat.summary(),
                errors: errors.describe(),
                ..TeamsReport::default()
            });
        }

        // Search: seed a history, then search one mailbox of it.
        let (total, mailbox) = if mode.name == "quick" {
            (200_000, 20_000)
        } else {
            (1_000_000, 100_000)
        };
        let seeded = Instant::now();
        seed_history(&tdb, total, mailbox).await?;
        let seed_secs = seeded.elapsed().as_secs_f64();
        say!(t0, "teams: {total} messages seeded in {seed_secs:.0} s");
        let searcher = &recipients[0];
        let (done, lat, search_errors) = searches(&tg[0], searcher, measure, false).await;
        let (picked, picked_lat, picked_errors) = searches(&tg[0], searcher, measure, true).await;
        let reader = &recipients[RECIPIENTS - 1];
        let (long, long_lat, long_errors) = searches(&tg[0], reader, measure, false).await;
        let total_messages = db::scalar_i64(&tdb, "SELECT count(*) FROM messages").await?;
        Ok(TeamsReport {
            rounds,
            cpu,
            single_lat: single_lat.summary(),
            group_lat: group_lat.summary(),
            errors: errors.describe(),
            total_messages,
            mailbox,
            seed_secs,
            search: lat.summary(),
            searches_per_s: done as f64 / secs as f64,
            search_errors: search_errors.describe(),
            selective: picked_lat.summary(),
            selective_per_s: picked as f64 / secs as f64,
            selective_errors: picked_errors.describe(),
            long: long_lat.summary(),
            long_per_s: long as f64 / secs as f64,
            long_errors: long_errors.describe(),
        })
    }
    .await;
    stop_replicas(replicas).await;
    outcome
}

/// Each run starts from the same state: every message read, the tables
/// vacuumed and analysed, a checkpoint. Without, each run paid for the one
/// before (the index entries and dead rows of marking 100k copies read,
/// autovacuum, a checkpoint falling in it): single sends ran 1,600-3,000
/// per second from one run to the next.
async fn settle(db: &tokio_postgres::Client) -> Result<(), String> {
    db::mark_all_read(db).await?;
    db::each(db, &[crate::mode::SETTLE, "CHECKPOINT"]).await
}

/// Closed-loop sends for `measure`: each sender either to one recipient
/// after another, or (`group`) to all of them at once. Stored answers,
/// their latencies, the errors.
async fn sends(
    target: &Target,
    senders: &[Agent],
    to: &[String],
    group: bool,
    measure: Duration,
) -> (u64, Lat, Errors) {
    let until = tokio::time::Instant::now() + measure;
    let workers = senders.iter().enumerate().map(|(w, sender)| {
        let (target, sender, to) = (target.clone(), sender.clone(), to.to_vec());
        async move {
            let (mut n, mut lat, mut errors) = (0u64, Lat::default(), Errors::default());
            let Ok(mut conn) = Conn::open(&target).await else {
                errors.add("initialize", "connect", "could not open");
                return (n, lat, errors);
            };
            for i in 0..crate::load::MAX_CALLS_PER_WORKER {
                if tokio::time::Instant::now() >= until {
                    break;
                }
                let recipients = if group {
                    json!(to)
                } else {
                    json!(to[(w + i as usize) % to.len()])
                };
                let started = Instant::now();
                match conn
                    .call_tool(
                        "phone_send",
                        json!({"to": recipients, "body": BODY}),
                        Some(&sender.token),
                    )
                    .await
                {
                    Ok(_) => {
                        n += 1;
                        lat.record(started.elapsed());
                    }
                    Err(e) => errors.add("phone_send", e.kind(), &e.to_string()),
                }
            }
            (n, lat, errors)
        }
    });
    let mut total = (0, Lat::default(), Errors::default());
    for (n, lat, errors) in futures_util::future::join_all(workers).await {
        total.0 += n;
        total.1.merge(lat);
        total.2.merge(errors);
    }
    total
}

/// `total` messages between the phase's agents, `mailbox` of them to or
/// from the searcher (`tr-1`), each body five or six words of [`WORDS`]
/// and a reference, `ref` and its id modulo [`REFERENCES`]; [`LONG_MAIL`]
/// long messages to the last recipient; then 8,000 between the others
/// after the VACUUM.
async fn seed_history(db: &tokio_postgres::Client, total: i64, mailbox: i64) -> Result<(), String> {
    db.execute(
        &format!(
            "INSERT INTO messages (id, sender_id, recipient_id, body, thread_id, sent_at, read_at, words)
             SELECT m.*, {STORED_WORDS} FROM (
             SELECT x.n, s.id, r.id,
                    (SELECT string_agg(($3::text[])[1 + floor(random() * array_length($3::text[], 1))::int], ' ')
                     FROM generate_series(1, 5 + (x.n % 2)::int)) || ' ref' || x.n % $4::bigint AS body,
                    x.n, now(), now()
             FROM (SELECT nextval('messages_id_seq') AS n, g FROM generate_series(1, $1::bigint) g) x
             JOIN agents s ON s.name = 'ts-' || (1 + x.g % 8)
             JOIN agents r ON r.name = CASE WHEN x.g <= $2 THEN 'tr-1' ELSE 'tr-' || (2 + x.g % 19) END) m"
        ),
        &[&total, &mailbox, &WORDS, &REFERENCES],
    )
    .await
    .map_err(|e| format!("seed teams history: {}", db::pg_err(&e)))?;
    // Reports as agents write them: about 5 kB of words, every word of the
    // vocabulary in each.
    db.execute(
        &format!(
            "INSERT INTO messages (sender_id, recipient_id, body, thread_id, sent_at, read_at, words)
             SELECT m.*, {STORED_WORDS} FROM (
             SELECT s.id, r.id,
                    (SELECT string_agg(($1::text[])[1 + (g * 7 + w * 13) % array_length($1::text[], 1)]
                                       || ' and the status of it is ', ' ')
                     FROM generate_series(1, 150) w) AS body,
                    0, now(), now()
             FROM generate_series(1, $2::bigint) g
             JOIN agents s ON s.name = 'ts-' || (1 + g % 8)
             JOIN agents r ON r.name = 'tr-' || $3::bigint) m"
        ),
        &[&WORDS, &LONG_MAIL, &(RECIPIENTS as i64)],
    )
    .await
    .map_err(|e| format!("seed long mail: {}", db::pg_err(&e)))?;
    db.batch_execute("VACUUM (ANALYZE) messages")
        .await
        .map_err(|e| format!("analyze: {}", db::pg_err(&e)))?;
    // Mail that came after the last VACUUM, as on a live table: its entries
    // wait in the search index's pending list, which every search reads.
    // None to the last recipient, whose newest mail stays the long mail.
    db.execute(
        &format!(
            "INSERT INTO messages (sender_id, recipient_id, body, thread_id, words)
             SELECT m.*, {STORED_WORDS} FROM (
             SELECT s.id, r.id, ($1::text[])[1 + g % array_length($1::text[], 1)] || ' later ' || g AS body, 0
             FROM generate_series(1, 8000) g
             JOIN agents s ON s.name = 'ts-' || (1 + g % 8)
             JOIN agents r ON r.name = 'tr-' || (2 + g % 18)) m"
        ),
        &[&WORDS],
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("later mail: {}", db::pg_err(&e)))
}

/// The words a send stores for a message without a subject
/// (`store::fragments::stored_words`), of the seeded `m.body`: the seeded
/// mail is indexed and ranked as the server's own would be.
const STORED_WORDS: &str = "setweight(to_tsvector('english'::regconfig, ''), 'A') || \
     setweight(to_tsvector('english'::regconfig, m.body), 'B')";

/// Long messages (about 5 kB each) to the last recipient, searched for
/// common words: ranking reads each candidate's text again.
const LONG_MAIL: i64 = 2_000;

/// Distinct references in the seeded mail: each in 0.1% of it.
const REFERENCES: i64 = 1_000;

/// `SEARCHERS` closed loops of `phone_inbox {query}` by `searcher` for
/// `measure`, one or two words each, or (`selective`) a reference, alone
/// or with a word.
async fn searches(
    target: &Target,
    searcher: &Agent,
    measure: Duration,
    selective: bool,
) -> (u64, Lat, Errors) {
    let until = tokio::time::Instant::now() + measure;
    let workers = (0..SEARCHERS).map(|w| {
        let (target, searcher) = (target.clone(), searcher.clone());
        async move {
            let (mut n, mut lat, mut errors) = (0u64, Lat::default(), Errors::default());
            let Ok(mut conn) = Conn::open(&target).await else {
                errors.add("initialize", "connect", "could not open");
                return (n, lat, errors);
            };
            for i in 0..crate::load::MAX_CALLS_PER_WORKER {
                if tokio::time::Instant::now() >= until {
                    break;
                }
                let k = w * 7 + i as usize;
                let query = if selective {
                    let reference = format!("ref{}", (k * 37) % REFERENCES as usize);
                    if k % 2 == 0 {
                        reference
                    } else {
                        format!("{} {reference}", WORDS[k % WORDS.len()])
                    }
                } else if k % 2 == 0 {
                    WORDS[k % WORDS.len()].to_owned()
                } else {
                    format!(
                        "{} {}",
                        WORDS[k % WORDS.len()],
                        WORDS[(k / 3) % WORDS.len()]
                    )
                };
                let started = Instant::now();
                match conn
                    .call_tool(
                        "phone_inbox",
                        json!({"query": query}),
                        Some(&searcher.token),
                    )
                    .await
                {
                    Ok(_) => {
                        n += 1;
                        lat.record(started.elapsed());
                    }
                    Err(e) => errors.add("phone_inbox query", e.kind(), &e.to_string()),
                }
            }
            (n, lat, errors)
        }
    });
    let mut total = (0, Lat::default(), Errors::default());
    for (n, lat, errors) in futures_util::future::join_all(workers).await {
        total.0 += n;
        total.1.merge(lat);
        total.2.merge(errors);
    }
    total
}

/// The phase's rows of the table of targets.
pub(crate) fn target_rows(w: &mut String, x: &TeamsReport) {
    let ratio = x.ratio();
    let _ = writeln!(
        w,
        "| a group send to 20 costs ≤ 3× a single send (sends/s, same run) | {ratio:.2}× | {} |",
        verdict(ratio <= 3.0)
    );
    if x.total_messages == 0 {
        let _ = writeln!(
            w,
            "| search of one's own mail p99 ≤ 20 ms | not run (PHONE_BENCH_TEAMS_SEARCH=0) | — |"
        );
        return;
    }
    let _ = writeln!(
        w,
        "| search of one's own mail p99 ≤ 20 ms ({} messages stored, a mailbox of {}): common words (thousands of matches) | {:.1} ms | {} |",
        x.total_messages,
        x.mailbox,
        x.search.p99,
        verdict(x.search.p99 <= 20.0)
    );
    let _ = writeln!(
        w,
        "| the same: a reference in 0.1% of the mail, alone or with a word | {:.1} ms | {} |",
        x.selective.p99,
        verdict(x.selective.p99 <= 20.0)
    );
    let _ = writeln!(
        w,
        "| the same: common words in a mailbox of {LONG_MAIL} long messages (about 5 kB each) | {:.1} ms | {} |",
        x.long.p99,
        verdict(x.long.p99 <= 20.0)
    );
}

pub(crate) fn section(w: &mut String, x: &TeamsReport) {
    let _ = writeln!(
        w,
        "\n## Mail for teams: group sends and search of one's mail\n"
    );
    let _ = writeln!(
        w,
        "{SENDERS} closed-loop senders on 1 replica, alternated: (a) each send to one of \
         {RECIPIENTS} recipients in turn, (b) each a group send to all {RECIPIENTS} (one message \
         per recipient), {ROUNDS} rounds. Each run starts with every message marked read, \
         `VACUUM (ANALYZE)` and a `CHECKPOINT`. Sends/s are calls answered as stored; the \
         headline is the median of the rounds' ratios.\n"
    );
    let _ = writeln!(
        w,
        "| round | single sends/s | group sends/s (messages/s) | single ÷ group | per single send: CPU µs server / PostgreSQL / bench; WAL bytes (full-page images) | per group send |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    let cpu = |c: &SendCpu| {
        format!(
            "{:.0} / {:.0} / {:.0}; {:.0} ({:.2})",
            c.server_us, c.postgres_us, c.bench_us, c.wal_bytes, c.wal_fpi
        )
    };
    for (i, (s, g)) in x.rounds.iter().enumerate() {
        let (single, group) = x.cpu.get(i).copied().unwrap_or_default();
        let _ = writeln!(
            w,
            "| {} | {s:.0} | {g:.0} ({:.0}) | {:.2}× | {} | {} |",
            i + 1,
            g * RECIPIENTS as f64,
            s / g.max(1e-9),
            cpu(&single),
            cpu(&group)
        );
    }
    let _ = writeln!(
        w,
        "\nLatency p50 / p99: single {:.1} / {:.1} ms, group {:.1} / {:.1} ms. Errors: {}.\n",
        x.single_lat.p50, x.single_lat.p99, x.group_lat.p50, x.group_lat.p99, x.errors
    );
    if x.total_messages == 0 {
        let _ = writeln!(w, "Search: not run (`PHONE_BENCH_TEAMS_SEARCH=0`).");
        return;
    }
    let _ = writeln!(
        w,
        "Search: {} messages seeded in {:.0} s ({} to or from the searcher, five or six words \
         of a {}-word vocabulary each; 8,000 more between others after the VACUUM, in the search \
         index's pending list as on a live table), then {SEARCHERS} closed loops of `phone_inbox {{query}}` \
         (one or two words): {:.0} searches/s, p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms. Errors: {}. \
         Each body also carries a reference (`ref` and its id modulo {REFERENCES}); searched for \
         one, alone or with a word: {:.0} searches/s, p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms. \
         Errors: {}. A search asks the searcher's newest 1, 2, 4 and 8 id windows (4,096 ids \
         each), then the whole mailbox, until one step holds 100 matches (the server's \
         `SEARCH_CANDIDATES`): the newest 100, which are then ranked. Common words in the \
         mailbox of the last recipient, whose newest mail is {LONG_MAIL} reports of about 5 kB \
         (every word of the vocabulary in each): {:.0} searches/s, p50 {:.1} ms, p90 {:.1} ms, \
         p99 {:.1} ms. Errors: {}.",
        x.total_messages,
        x.seed_secs,
        x.mailbox,
        WORDS.len(),
        x.searches_per_s,
        x.search.p50,
        x.search.p90,
        x.search.p99,
        x.search_errors,
        x.selective_per_s,
        x.selective.p50,
        x.selective.p90,
        x.selective.p99,
        x.selective_errors,
        x.long_per_s,
        x.long.p50,
        x.long.p90,
        x.long.p99,
        x.long_errors
    );
}

/// `before`'s team part: the single and the group sends of (1) on a replica
/// of the older build and one of this build (quotas off on both, each on
/// its own database), alternated over rounds, the first build of each round
/// alternating. Per round and build: (single sends/s, group sends/s).
pub(crate) struct TeamsVersus {
    /// (round, this build?, single/s, group/s), in the order run.
    runs: Vec<(usize, bool, f64, f64)>,
    /// Errors of the older build, then of this one.
    errors: [String; 2],
}

impl TeamsVersus {
    fn of(&self, after: bool) -> Vec<(f64, f64)> {
        self.runs
            .iter()
            .filter(|r| r.1 == after)
            .map(|r| (r.2, r.3))
            .collect()
    }

    /// The median of one build's rounds' single ÷ group ratios.
    fn ratio(&self, after: bool) -> f64 {
        median(
            self.of(after)
                .iter()
                .map(|(s, g)| s / g.max(1e-9))
                .collect(),
        )
    }

    /// The median of the rounds' group sends/s, this build ÷ the older one.
    fn group_gain(&self) -> f64 {
        let (a, b) = (self.of(false), self.of(true));
        median(a.iter().zip(&b).map(|(a, b)| b.1 / a.1.max(1e-9)).collect())
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) async fn versus(
    opts: &Opts,
    mode: &Mode,
    t0: Instant,
    before: &std::path::Path,
    databases: [&str; 2],
) -> Result<TeamsVersus, String> {
    let env = [
        ("PHONE_INBOX_UNREAD_MAX", "0"),
        ("PHONE_INBOX_UNREAD_PER_SENDER", "0"),
        ("PHONE_SEND_QUOTA_PER_HOUR", "0"),
        ("PHONE_NEW_RECIPIENT_QUOTA_PER_DAY", "0"),
    ];
    let port = opts.base_port + 84;
    let a = crate::replicas::start_replicas_bin(
        opts,
        databases[0],
        1,
        port,
        "teams-before",
        &env,
        Some(before),
    )
    .await?;
    let b = start_replicas_env(opts, databases[1], 1, port + 1, "teams-after", &env).await?;
    let outcome = async {
        let names: Vec<String> = (1..=SENDERS)
            .map(|i| format!("ts-{i}"))
            .chain((1..=RECIPIENTS).map(|i| format!("tr-{i}")))
            .collect();
        let mut sides = Vec::new();
        for (replicas, database) in [(&a, databases[0]), (&b, databases[1])] {
            let tg = targets(replicas);
            let agents = register(&tg[0], &names, "teams").await?;
            sides.push((tg, agents, db::connect(&pg_url(opts, database)).await?));
        }
        let secs = if mode.name == "quick" { 4 } else { 10 };
        let measure = Duration::from_secs(secs);
        let mut out = TeamsVersus {
            runs: Vec::new(),
            errors: Default::default(),
        };
        let mut errors = [Errors::default(), Errors::default()];
        for round in 1..=ROUNDS {
            let order = if round % 2 == 1 {
                [false, true]
            } else {
                [true, false]
            };
            for after in order {
                let (tg, agents, tdb) = &sides[usize::from(after)];
                let (senders, recipients) = agents.split_at(SENDERS);
                let to: Vec<String> = recipients.iter().map(|a| a.name.clone()).collect();
                settle(tdb).await?;
                let (n, _, e) = sends(&tg[0], senders, &to, false, measure).await;
                errors[usize::from(after)].merge(e);
                settle(tdb).await?;
                let (g, _, e) = sends(&tg[0], senders, &to, true, measure).await;
                errors[usize::from(after)].merge(e);
                let (single, group) = (n as f64 / secs as f64, g as f64 / secs as f64);
                say!(
                    t0,
                    "teams {} round {round}: {single:.0} single sends/s, {group:.0} group sends/s",
                    if after { "this build" } else { "before" },
                );
                out.runs.push((round, after, single, group));
            }
        }
        out.errors = errors.map(|e| e.describe());
        Ok(out)
    }
    .await;
    stop_replicas(a).await;
    stop_replicas(b).await;
    outcome
}

pub(crate) fn versus_target_row(w: &mut String, x: &TeamsVersus) {
    let _ = writeln!(
        w,
        "| this build against the one before (group sends to {RECIPIENTS}, no target: after ÷ before) | {:.2}× group sends/s; single ÷ group {:.2}× before, {:.2}× this build | — |",
        x.group_gain(),
        x.ratio(false),
        x.ratio(true),
    );
}

pub(crate) fn versus_section(w: &mut String, x: &TeamsVersus) {
    let _ = writeln!(
        w,
        "\nThe sends of the teams phase ({SENDERS} closed-loop senders; (a) each send to one of {RECIPIENTS} recipients in turn, (b) each a group send to all {RECIPIENTS}) against a replica of each build, quotas off, each on its own database; every run settled first (all mail read, `VACUUM (ANALYZE)`, `CHECKPOINT`). Group sends/s, this build ÷ before: **{:.2}×** (median of the rounds). Single ÷ group: before **{:.2}×**, this build **{:.2}×** (medians).\n",
        x.group_gain(),
        x.ratio(false),
        x.ratio(true),
    );
    let _ = writeln!(
        w,
        "| round | server | single sends/s | group sends/s | single ÷ group |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|");
    for (round, after, s, g) in &x.runs {
        let _ = writeln!(
            w,
            "| {round} | {} | {s:.0} | {g:.0} | {:.2}× |",
            if *after { "this build" } else { "before" },
            s / g.max(1e-9)
        );
    }
    let _ = writeln!(
        w,
        "\nErrors: before {}; this build {}.",
        x.errors[0], x.errors[1]
    );
}
