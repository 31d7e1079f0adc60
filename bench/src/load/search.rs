//! Directory searches (`phone_search`), closed loop.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::Target;
use crate::stats::{Errors, Lat};

#[derive(Clone, Debug)]
pub struct SearchQuery {
    pub query: Option<String>,
    pub project: Option<String>,
}

#[derive(Default, Debug)]
pub struct SearchOutcome {
    pub lat: Lat,
    pub errors: Errors,
    pub results: u64,
    pub empty: u64,
}

/// Closed loop over `queries` (round-robin) with `workers` connections, for
/// `duration`, and on until at least `min_calls` were measured (slow
/// queries), but never past `hard_stop`.
pub async fn search(
    target: &Target,
    queries: &[SearchQuery],
    workers: usize,
    duration: Duration,
    min_calls: usize,
    hard_stop: Duration,
) -> SearchOutcome {
    let queries = Arc::new(queries.to_vec());
    let start = Instant::now();
    let (soft_stop, hard_stop) = (start + duration, start + hard_stop);
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (target, queries, done) = (target.clone(), queries.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = SearchOutcome::default();
            let Some(mut conn) = open_until(&target, hard_stop, &mut out.errors).await else {
                return out;
            };
            // One unrecorded call warms this connection's path.
            let _ = conn
                .call_tool("phone_search", args(&queries[w % queries.len()]), None)
                .await;
            for i in 0..MAX_CALLS_PER_WORKER as usize {
                let now = Instant::now();
                if now >= hard_stop
                    || (now >= soft_stop && done.load(Ordering::Relaxed) >= min_calls as u64)
                {
                    break;
                }
                let q = &queries[(i * workers + w) % queries.len()];
                let t = Instant::now();
                match conn.call_tool("phone_search", args(q), None).await {
                    Ok(v) => {
                        out.lat.record(t.elapsed());
                        done.fetch_add(1, Ordering::Relaxed);
                        let n = v
                            .get("agents")
                            .and_then(Value::as_array)
                            .map_or(0, |a| a.len() as u64);
                        out.results += n;
                        out.empty += u64::from(n == 0);
                    }
                    Err(e) => {
                        out.errors.add("phone_search", e.kind(), &e.to_string());
                        if e.needs_reconnect() {
                            match open_until(&target, hard_stop, &mut out.errors).await {
                                Some(c) => conn = c,
                                None => return out,
                            }
                        }
                    }
                }
            }
            out
        }));
    }
    let mut total = SearchOutcome::default();
    for t in tasks {
        if let Ok(o) = t.await {
            total.lat.merge(o.lat);
            total.errors.merge(o.errors);
            total.results += o.results;
            total.empty += o.empty;
        }
    }
    total
}

fn args(q: &SearchQuery) -> Value {
    let mut a = json!({"limit": 10});
    if let Some(query) = &q.query {
        a["query"] = json!(query);
    }
    if let Some(p) = &q.project {
        a["project"] = json!(p);
    }
    a
}
