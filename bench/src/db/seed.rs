//! Bulk seeding with generate_series, not through the API: the directory's
//! agents, agents with known tokens, a message history; in parallel
//! sessions, bounded by a deadline.

use tokio_postgres::Client;

use super::vocabulary::{CAPABILITIES, DOMAINS, EXTRAS, PROJECTS, RARE, ROLES, TOOLS};
use super::{connect, each, pg_err, scalar_i64};

fn sql_array(items: &[&str]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("'{}'", s.replace('\'', "''")))
        .collect();
    format!("ARRAY[{}]", quoted.join(","))
}

fn pick(items: &[&str]) -> String {
    format!(
        "({})[1 + floor(random() * {})::int]",
        sql_array(items),
        items.len()
    )
}

/// A token the bench can reconstruct for seeded agent `g` (prefix tells the
/// seeded sets apart).
pub fn seeded_token(prefix: char, g: i64) -> String {
    format!("phn_{prefix}{g:0>42}")
}

/// Directory agents g in [from, to]: realistic, varied descriptions.
pub async fn seed_directory(db: &Client, from: i64, to: i64) -> Result<(), String> {
    let sql = format!(
        "INSERT INTO agents (name, description, project, token_hash, registered_at, last_seen_at)
         SELECT lower(regexp_replace(role, '[^A-Za-z]+', '-', 'g')) || '-' || g,
                format('%s for the %s team. I %s and %s, working with %s and %s. %s%s',
                       role, domain, cap1, cap2, tool1, tool2, extra,
                       CASE WHEN rare_roll < 0.002 THEN ' Also knows ' || rare || '.' ELSE '' END),
                project,
                sha256(convert_to('phn_s' || lpad(g::text, 42, '0'), 'UTF8')),
                now() - random() * interval '365 days',
                CASE WHEN random() < 0.7 THEN now() - random() * interval '30 days' END
         FROM (SELECT g, {role} AS role, {domain} AS domain, {cap} AS cap1, {cap} AS cap2,
                      {tool} AS tool1, {tool} AS tool2, {extra} AS extra, random() AS rare_roll,
                      {rare} AS rare,
                      ({projects})[1 + floor(power(random(), 2) * {nprojects})::int] AS project
               FROM generate_series($1::bigint, $2::bigint) g) w",
        role = pick(ROLES),
        domain = pick(DOMAINS),
        cap = pick(CAPABILITIES),
        tool = pick(TOOLS),
        extra = pick(EXTRAS),
        rare = pick(RARE),
        projects = sql_array(PROJECTS),
        nprojects = PROJECTS.len(),
    );
    db.execute(&sql, &[&from, &to])
        .await
        .map_err(|e| format!("seed directory: {}", pg_err(&e)))?;
    Ok(())
}

/// `n` agents named `{prefix}-1` … `{prefix}-n` in `project`, with tokens
/// `seeded_token(prefix, g)`: registered in one statement instead of `n`
/// calls of `phone_register`.
pub async fn seed_agents(db: &Client, prefix: char, project: &str, n: i64) -> Result<(), String> {
    db.execute(
        "INSERT INTO agents (name, description, project, token_hash)
         SELECT $1 || '-' || g, 'Benchmark agent ' || g || ' of ' || $2 || ': reads its inbox in a loop.', $2,
                sha256(convert_to('phn_' || $1 || lpad(g::text, 42, '0'), 'UTF8'))
         FROM generate_series(1, $3::bigint) g",
        &[&prefix.to_string(), &project, &n],
    )
    .await
    .map_err(|e| format!("seed agents {prefix}-*: {}", pg_err(&e)))?;
    Ok(())
}

/// `n` mailbox owners for the growth test, named g-1..g-n, tokens known.
pub async fn seed_mailbox_agents(db: &Client, n: i64) -> Result<i64, String> {
    seed_agents(db, 'g', "growth", n).await?;
    scalar_i64(db, "SELECT min(id) FROM agents WHERE project = 'growth'").await
}

/// History messages g in [from, to] among `agents` agents starting at id
/// `base`: recipient g mod agents. Agents with slot < `all_read_slots` have
/// every history message read; the others leave 1 in 100 unread.
pub async fn seed_history(
    db: &Client,
    base: i64,
    agents: i64,
    all_read_slots: i64,
    from: i64,
    to: i64,
) -> Result<(), String> {
    // With the words a send stores (`store::fragments::stored_words`), so
    // that reads and searches of the history cost what they would; none on
    // the schema of a build from before them (the `before` phase).
    let has_words = scalar_i64(
        db,
        "SELECT count(*) FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = 'messages'
           AND column_name = 'words'",
    )
    .await?
        > 0;
    let (column, value) = if has_words {
        (
            ", words",
            ", setweight(to_tsvector('english'::regconfig, coalesce(m.subject, '')), 'A') ||
               setweight(to_tsvector('english'::regconfig, m.body), 'B')",
        )
    } else {
        ("", "")
    };
    db.execute(
        &format!(
            "INSERT INTO messages (id, sender_id, recipient_id, subject, body, thread_id, sent_at, read_at{column})
             SELECT m.*{value}
             FROM (
             SELECT id, $1 + (g * 7919 + 13) % $2, $1 + g % $2,
                    CASE WHEN g % 3 = 0 THEN 'Status update ' || g END AS subject,
                    'Progress note ' || g || ': the nightly import finished, 1423 rows merged, 2 rejected '
                      || '(bad dates). Details are in the usual bucket; tell me if you want a retry.' AS body,
                    id, ts,
                    CASE WHEN g % $2 < $3 OR g % 100 <> 0 THEN ts + interval '1 minute' END
             FROM (SELECT nextval('messages_id_seq') AS id, g,
                          timestamptz '2025-01-01' + g * interval '1 second' AS ts
                   FROM generate_series($4::bigint, $5::bigint) g) x) m"
        ),
        &[&base, &agents, &all_read_slots, &from, &to],
    )
    .await
    .map_err(|e| format!("seed history: {}", pg_err(&e)))?;
    Ok(())
}

#[derive(Clone, Copy, Debug)]
pub enum Seed {
    Directory,
    History {
        base: i64,
        agents: i64,
        all_read_slots: i64,
    },
}

/// Seeds g in [from, to] in chunks over `conns` parallel sessions, taking
/// no new chunk after `deadline`. Returns the last g loaded: chunks are
/// handed out in order and each one started is finished, so [from, result]
/// is complete. Sessions skip foreign-key triggers (the rows reference
/// agents that exist by construction) and commit asynchronously: this is
/// set-up, not measurement.
pub async fn seed_parallel(
    url: &str,
    what: Seed,
    from: i64,
    to: i64,
    chunk: i64,
    conns: usize,
    deadline: std::time::Instant,
) -> Result<i64, String> {
    use std::sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    };
    let next = Arc::new(AtomicI64::new(from));
    let done = Arc::new(AtomicI64::new(from - 1));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let client = connect(url).await?;
        let (next, done) = (next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            each(
                &client,
                &[
                    "SET session_replication_role = replica",
                    "SET synchronous_commit = off",
                ],
            )
            .await?;
            for _ in 0..1_000_000 {
                if std::time::Instant::now() >= deadline {
                    break;
                }
                let a = next.fetch_add(chunk, Ordering::SeqCst);
                if a > to {
                    break;
                }
                let b = (a + chunk - 1).min(to);
                match what {
                    Seed::Directory => seed_directory(&client, a, b).await?,
                    Seed::History {
                        base,
                        agents,
                        all_read_slots,
                    } => seed_history(&client, base, agents, all_read_slots, a, b).await?,
                }
                done.fetch_max(b, Ordering::SeqCst);
            }
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    // Every chunk handed out was finished, so the highest end is the prefix.
    Ok(done
        .load(Ordering::SeqCst)
        .min(next.load(Ordering::SeqCst) - 1)
        .min(to))
}
