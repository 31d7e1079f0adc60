//! The raw-SQL baselines: pgbench running the server's work as plain
//! statements (the mix, the popular inbox), and pg_test_fsync.

use std::{path::Path, process::Stdio, time::Duration};

use tokio::io::{AsyncBufReadExt, BufReader};

pub struct PgbenchResult {
    pub tps: f64,
    pub failed: u64,
    pub latency_ms: f64,
}

/// pgbench, prepared, `clients` clients: client k is agent base+k and
/// pairs with k^1 like the mix; each transaction is the mix's minimal SQL:
/// one INSERT (a send) and one UPDATE … SKIP LOCKED … RETURNING (a poll),
/// each its own autocommit transaction. Returns the running child; see
/// `pgbench_finish`.
#[allow(clippy::too_many_arguments)]
pub fn pgbench_start(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    base_id: i64,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    let body = crate::load::BODY;
    std::fs::write(
        script,
        format!(
            "\\set me {base_id} + :client_id\n\
             \\set peer {base_id} + (:client_id # 1)\n\
             INSERT INTO messages (id, sender_id, recipient_id, body, thread_id) SELECT n, :me, :peer, '{body}', n FROM nextval('messages_id_seq') AS n;\n\
             UPDATE messages SET read_at = now() WHERE id IN (SELECT id FROM messages WHERE recipient_id = :me AND read_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at;\n"
        ),
    )
    .map_err(|e| format!("write pgbench script: {e}"))?;
    pgbench_spawn(bin, host, port, database, clients, secs, script)
}

/// `pgbench -n -M prepared` of `script` with `clients` clients for `secs`.
fn pgbench_spawn(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    tokio::process::Command::new(bin.join("pgbench"))
        .args(["-n", "-M", "prepared", "-h", host, "-U", "postgres"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-c")
        .arg(clients.to_string())
        .arg("-j")
        .arg(clients.min(2).to_string())
        .arg("-T")
        .arg(secs.to_string())
        .arg("-f")
        .arg(script)
        .arg(database)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run pgbench: {e}"))
}

/// The popular inbox's baseline: `clients` pgbench clients on one
/// recipient `hot`, the even ones senders (client k is agent
/// `sender_base + (k/2) % senders`), the odd ones pollers, like the
/// bench's closed loop. A send is the mix baseline's INSERT; a poll its
/// `UPDATE … SKIP LOCKED … RETURNING` with the one recipient. With a lease
/// (`Some(seconds)`), the poll leases instead (`leased_until`,
/// `delivery_count`) and, when it took any, a second statement
/// acknowledges them by id (`acked_at`, `read_at`), as `phone_ack` does.
/// Each statement is its own autocommit transaction.
#[allow(clippy::too_many_arguments)]
pub fn pgbench_hot_start(
    bin: &Path,
    host: &str,
    port: u16,
    database: &str,
    hot: i64,
    sender_base: i64,
    senders: usize,
    lease: Option<u32>,
    clients: usize,
    secs: u64,
    script: &Path,
) -> Result<tokio::process::Child, String> {
    std::fs::write(script, hot_script(hot, sender_base, senders, lease))
        .map_err(|e| format!("write pgbench script: {e}"))?;
    pgbench_spawn(bin, host, port, database, clients, secs, script)
}

/// The pgbench script of `pgbench_hot_start`.
pub fn hot_script(hot: i64, sender_base: i64, senders: usize, lease: Option<u32>) -> String {
    let body = crate::load::BODY;
    let send = format!(
        "\\set s {sender_base} + (:client_id / 2) % {senders}\n\
         INSERT INTO messages (id, sender_id, recipient_id, body, thread_id) SELECT n, :s, {hot}, '{body}', n FROM nextval('messages_id_seq') AS n;\n"
    );
    let poll = match lease {
        None => format!(
            "UPDATE messages SET read_at = now() WHERE id IN (SELECT id FROM messages WHERE recipient_id = {hot} AND read_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at;\n"
        ),
        Some(secs) => format!(
            "WITH l AS (UPDATE messages SET leased_until = now() + interval '{secs} seconds', delivery_count = delivery_count + 1 WHERE id IN (SELECT id FROM messages WHERE recipient_id = {hot} AND read_at IS NULL AND dead_at IS NULL AND (leased_until IS NULL OR leased_until <= now()) ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING id, sender_id, subject, body, reply_to, thread_id, sent_at, delivery_count) SELECT count(*) AS n, coalesce(array_agg(id), '{{}}') AS ids FROM l \\gset\n\
             \\if :n > 0\n\
             UPDATE messages SET acked_at = now(), read_at = now(), leased_until = NULL WHERE id = ANY (:ids::bigint[]) AND recipient_id = {hot} AND acked_at IS NULL;\n\
             \\endif\n"
        ),
    };
    format!("\\if :client_id % 2 = 0\n{send}\\else\n{poll}\\endif\n")
}

pub async fn pgbench_finish(
    child: tokio::process::Child,
    secs: u64,
) -> Result<PgbenchResult, String> {
    let out = tokio::time::timeout(Duration::from_secs(secs + 60), child.wait_with_output())
        .await
        .map_err(|_| "pgbench did not finish in time".to_string())?
        .map_err(|e| format!("pgbench: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("pgbench failed: {text}"));
    }
    let number_after = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    Ok(PgbenchResult {
        tps: number_after("tps = ").ok_or_else(|| format!("no tps in pgbench output: {text}"))?,
        failed: number_after("number of failed transactions:").unwrap_or(0.0) as u64,
        latency_ms: number_after("latency average =").unwrap_or(0.0),
    })
}

/// pg_test_fsync's "one 8kB write" fdatasync rate; stops the tool as soon
/// as that line is out (the full run takes ~20 s even at -s 1).
pub async fn fdatasync_rate(bin: &Path, file: &Path) -> Result<f64, String> {
    let mut child = tokio::process::Command::new(bin.join("pg_test_fsync"))
        .args(["-s", "1", "-f"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("run pg_test_fsync: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("fdatasync")
                && let Some(n) = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<f64>().ok())
            {
                return Some(n);
            }
        }
        None
    })
    .await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = std::fs::remove_file(file);
    match found {
        Ok(Some(n)) => Ok(n),
        _ => Err("pg_test_fsync printed no fdatasync rate".into()),
    }
}
