//! Direct PostgreSQL work, beside the server: the bench's settings of the
//! cluster (`cluster`), databases and plain statements (here), bulk
//! seeding with generate_series (`seed`, from the words of `vocabulary`),
//! the raw-SQL baselines (`baseline`: pgbench, pg_test_fsync), what the
//! statistics views say (`observe`) and what the server stored (`stored`).

mod baseline;
mod cluster;
mod observe;
mod seed;
mod stored;
mod vocabulary;

use tokio_postgres::{Client, NoTls};

pub use baseline::{fdatasync_rate, pgbench_finish, pgbench_hot_start, pgbench_start};
pub use cluster::Cluster;
pub use observe::{
    DbCounters, NotifyCounter, StmtStat, WaiterRows, counters, statements, statements_reset,
    wait_events,
};
pub use seed::{Seed, seed_agents, seed_mailbox_agents, seed_parallel, seeded_token};
pub use stored::{
    InboxRow, addressed_to, count_inbox_window, count_window, inbox_rows, mark_all_read,
    refused_since, webhook_states, webhooks_delivered, webhooks_pending,
};
pub use vocabulary::RARE;

/// tokio-postgres prints only "db error"; the server's message is inside.
pub fn pg_err(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

pub async fn connect(url: &str) -> Result<Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connect {url}: {}", pg_err(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub async fn recreate_database(admin: &Client, name: &str) -> Result<(), String> {
    // Neither statement may run in a transaction block: one at a time.
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("{sql}: {}", pg_err(&e)))?;
    }
    Ok(())
}

/// Drops a table's plain secondary indexes (not primary keys, not unique
/// ones) before a bulk load and returns their definitions for
/// `recreate_indexes`: one sorted build afterwards is several times cheaper
/// than maintaining them row by row. The definitions come from the
/// database itself, so the schema stays the server's own.
pub async fn drop_secondary_indexes(db: &Client, table: &str) -> Result<Vec<String>, String> {
    let rows = db
        .query(
            "SELECT i.relname::text, pg_get_indexdef(i.oid)
             FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
             WHERE x.indrelid = $1::text::regclass AND NOT x.indisunique AND NOT x.indisprimary",
            &[&table],
        )
        .await
        .map_err(|e| format!("list indexes of {table}: {}", pg_err(&e)))?;
    let mut defs = Vec::new();
    for r in &rows {
        let name: String = r.get(0);
        each(db, &[&format!("DROP INDEX {name}")]).await?;
        defs.push(r.get(1));
    }
    Ok(defs)
}

pub async fn recreate_indexes(db: &Client, defs: &[String]) -> Result<(), String> {
    each(db, &["SET maintenance_work_mem = '512MB'"]).await?;
    for d in defs {
        each(db, &[d.as_str()]).await?;
    }
    each(db, &["RESET maintenance_work_mem"]).await
}

/// Agents and messages of the prior history `settle` gives a database.
const PRIOR_AGENTS: i64 = 100;
const PRIOR_MESSAGES: i64 = 20_000;

/// `VACUUM (ANALYZE)` of the mail tables before a measured run, in a
/// database that holds a history of read mail, as one in use does, with
/// the quotas' hour and day started afresh. Of an
/// empty `messages` table, ANALYZE records zero rows, and every generic
/// plan made until the next ANALYZE prices its indexes as empty: the first
/// run of a fresh database then polled through `messages_inbox_cover_idx`
/// (each inbox's whole read history, ~200 blocks per call at c=16) where
/// the later ones used the partial unread index (~35), and its pgbench
/// baseline, planned after the server's mail was analyzed, did not pay it.
/// A database that was never analyzed, or one in use, plans right; only
/// this bench made the empty-analyzed state (bench/RESULTS.md, "Where the
/// time goes").
pub async fn settle(db: &Client) -> Result<(), String> {
    let held = scalar_i64(
        db,
        "SELECT count(*) FROM (SELECT 1 FROM messages LIMIT 10000) x",
    )
    .await?;
    if held < 10_000 {
        // Mailboxes of their own ('p-*'), every message read.
        seed_agents(db, 'p', "prior", PRIOR_AGENTS).await?;
        let base = scalar_i64(db, "SELECT min(id) FROM agents WHERE project = 'prior'").await?;
        seed::seed_history(db, base, PRIOR_AGENTS, PRIOR_AGENTS, 1, PRIOR_MESSAGES).await?;
    }
    // Each run starts a new hour and a new day of the quotas (on by
    // default: 1,000 sends an hour, 100 new recipients a day per sender):
    // the bench's agents send that many within a few runs (the webhook and
    // policy phases' senders each write to hundreds of agents), and the
    // refusals would then stand in for the sends measured. Pairs that met
    // stay known. The `quotas` phase measures what the quotas cost.
    each(
        db,
        &[
            "DELETE FROM send_counts",
            "UPDATE correspondents SET first_at = first_at - interval '1 day'
             WHERE first_at > now() - interval '1 day'",
            crate::mode::SETTLE,
        ],
    )
    .await
}

/// Statements that refuse transaction blocks (VACUUM), one by one.
pub async fn each(db: &Client, statements: &[&str]) -> Result<(), String> {
    for sql in statements {
        db.batch_execute(sql)
            .await
            .map_err(|e| format!("{sql}: {}", pg_err(&e)))?;
    }
    Ok(())
}

pub async fn scalar_i64(db: &Client, sql: &str) -> Result<i64, String> {
    db.query_one(sql, &[])
        .await
        .map(|r| r.get(0))
        .map_err(|e| format!("{sql}: {}", pg_err(&e)))
}

pub async fn show(db: &Client, setting: &str) -> String {
    db.query_one(&format!("SHOW {setting}"), &[])
        .await
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_else(|e| format!("? ({})", pg_err(&e)))
}

/// Agent ids in the order of `names`.
pub async fn ids_by_name(db: &Client, names: &[String]) -> Result<Vec<i64>, String> {
    let rows = db
        .query(
            "SELECT n.id FROM unnest($1::text[]) WITH ORDINALITY AS x(name, i)
             LEFT JOIN agents n ON n.name = x.name ORDER BY x.i",
            &[&names],
        )
        .await
        .map_err(|e| format!("agent ids: {}", pg_err(&e)))?;
    rows.iter()
        .zip(names)
        .map(|(r, n)| {
            r.get::<_, Option<i64>>(0)
                .ok_or_else(|| format!("agent {n} not found"))
        })
        .collect()
}

/// Ids of agents in the order of `names`; pgbench needs them consecutive.
pub async fn consecutive_ids(db: &Client, names: &[String]) -> Result<i64, String> {
    let rows = db
        .query(
            "SELECT name, id FROM agents WHERE name = ANY($1)",
            &[&names],
        )
        .await
        .map_err(|e| format!("agent ids: {}", pg_err(&e)))?;
    let id_of = |n: &String| {
        rows.iter()
            .find(|r| r.get::<_, &str>(0) == n)
            .map(|r| r.get::<_, i64>(1))
    };
    let base = id_of(&names[0]).ok_or("first agent missing")?;
    for (i, n) in names.iter().enumerate() {
        if id_of(n) != Some(base + i as i64) {
            return Err(format!(
                "agent ids are not consecutive ({n} is not {base}+{i}); pgbench pairing needs them"
            ));
        }
    }
    Ok(base)
}
