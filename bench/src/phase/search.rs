//! `search`: the directory (`phone_search`) bulk-loaded to 10k and 100k
//! agents (and 1M in full mode, after `growth`, if the time budget allows),
//! queried by category (common and rare words, prefixes, projects, exact
//! names) on 1 replica, closed loop. Target: p99 ≤ 20 ms at 1M agents.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use crate::cli::{Opts, pg_url};
use crate::db;
use crate::load::{self, SearchQuery};
use crate::mcp::Target;
use crate::mode::Mode;
use crate::replicas::{start_replicas, stop_replicas};
use crate::report::{Report, memory::MemRow, verdict};
use crate::stats::{self, Summary};

const DB_SEARCH: &str = "phone_bench_search";
const SEARCH_WORKERS: usize = 2;

pub(crate) struct SearchRow {
    size: i64,
    category: &'static str,
    example: String,
    lat: Summary,
    avg_results: f64,
    empty: u64,
    errors: String,
}

fn search_categories(sample_names: &[String]) -> Vec<(&'static str, Vec<SearchQuery>)> {
    let q = |query: &str, project: Option<&str>| SearchQuery {
        query: (!query.is_empty()).then(|| query.to_owned()),
        project: project.map(str::to_owned),
    };
    vec![
        (
            "common word",
            [
                "email", "invoices", "reports", "data", "customer", "meetings",
            ]
            .iter()
            .map(|w| q(w, None))
            .collect(),
        ),
        (
            "two common words",
            [
                "invoice email",
                "support tickets",
                "sales data",
                "meeting notes",
            ]
            .iter()
            .map(|w| q(w, None))
            .collect(),
        ),
        (
            "rare word",
            db::RARE[..8].iter().map(|w| q(w, None)).collect(),
        ),
        (
            "prefix",
            ["inv", "sched", "kube", "transl", "reconc", "calli"]
                .iter()
                .map(|w| q(w, None))
                .collect(),
        ),
        (
            "word + project",
            [
                ("reports", "atlas"),
                ("invoices", "kepler"),
                ("kubernetes", "orion"),
                ("email", "zenith"),
            ]
            .iter()
            .map(|(w, p)| q(w, Some(p)))
            .collect(),
        ),
        (
            "exact name",
            sample_names.iter().map(|n| q(n, None)).collect(),
        ),
        (
            "project listing",
            ["atlas", "kepler", "zenith", "krusty"]
                .iter()
                .map(|p| q("", Some(p)))
                .collect(),
        ),
    ]
}

/// The directory at each of `sizes` (cumulative: the database and what it
/// holds persist between calls, in `report.search_seeded`).
pub(crate) async fn run(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    sizes: &[i64],
    deadline: Instant,
) -> Result<(), String> {
    if report.search_seeded == 0 {
        db::recreate_database(admin, DB_SEARCH).await?;
    }
    let replicas = start_replicas(opts, DB_SEARCH, 1, opts.base_port + 10, "search").await?;
    let target = Target::local(replicas[0].port);
    let sdb = db::connect(&pg_url(opts, DB_SEARCH)).await?;
    for &size in sizes {
        let seeded = report.search_seeded;
        if Instant::now() >= deadline {
            report.skipped.push(format!(
                "search at {size} agents: no time left in the budget"
            ));
            break;
        }
        let started = Instant::now();
        // Big loads rebuild the directory's plain indexes (GIN, project,
        // name) once at the end instead of maintaining them row by row.
        let deferred = if size - seeded >= 500_000 {
            db::drop_secondary_indexes(&sdb, "agents").await?
        } else {
            Vec::new()
        };
        let reached = db::seed_parallel(
            &pg_url(opts, DB_SEARCH),
            db::Seed::Directory,
            seeded + 1,
            size,
            50_000,
            2,
            deadline,
        )
        .await?;
        db::recreate_indexes(&sdb, &deferred).await?;
        db::each(&sdb, &["VACUUM (ANALYZE) agents", "CHECKPOINT"]).await?;
        let took = started.elapsed().as_secs_f64();
        if reached < size {
            report.skipped.push(format!("search at {size} agents: the time budget ran out after seeding {reached}; measured there"));
        }
        let size = reached;
        report.search_seed.push((size, took, !deferred.is_empty()));
        report.search_seeded = size;
        say!(t0, "directory seeded to {size} agents in {took:.1} s");

        let names: Vec<String> = sdb
            .query(
                "SELECT name FROM agents TABLESAMPLE SYSTEM (1) LIMIT 8",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for (category, queries) in search_categories(&names) {
            if queries.is_empty() {
                continue;
            }
            let out = load::search(
                &target,
                &queries,
                SEARCH_WORKERS,
                mode.search_secs,
                10,
                mode.search_secs * 3,
            )
            .await;
            let calls = out.lat.len().max(1) as f64;
            report.search.push(SearchRow {
                size,
                category,
                example: describe_query(&queries[0]),
                lat: out.lat.summary(),
                avg_results: out.results as f64 / calls,
                empty: out.empty,
                errors: out.errors.describe(),
            });
        }
        let worst = report
            .search
            .iter()
            .filter(|s| s.size == size)
            .map(|s| s.lat.p99)
            .fold(0.0, f64::max);
        say!(t0, "search at {size}: worst category p99 {worst:.1} ms");
    }
    for rep in &replicas {
        report.mem.push(MemRow {
            role: rep.role.clone(),
            idle: rep.idle,
            loaded: stats::mem(rep.pid).unwrap_or_default(),
            phase: format!("search up to {} agents", report.search_seeded),
        });
    }
    stop_replicas(replicas).await;
    Ok(())
}

/// The sizes above 100k (full mode: 1M), run after the growth phase: only
/// if seeding to them at the rate measured so far, plus a minute of
/// queries, fits what is left of the time budget.
pub(crate) async fn run_large(
    opts: &Opts,
    mode: &Mode,
    admin: &tokio_postgres::Client,
    report: &mut Report,
    t0: Instant,
    big: &[i64],
) -> Result<(), String> {
    // Seeding rate so far, to judge whether 1M fits: seeding plus ~60 s of queries.
    let rate = report
        .search_seed
        .last()
        .map_or(5_000.0, |&(n, secs, _)| (n as f64 / secs.max(0.1)).max(1.0));
    let need = (big[big.len() - 1] - report.search_seeded) as f64 / rate * 0.8 + 60.0;
    let left = mode.budget.as_secs_f64() - t0.elapsed().as_secs_f64();
    if need > left {
        report.skipped.push(format!(
            "search at {} agents: needs ~{need:.0} s (seeding at the rate measured so far, plus queries), {left:.0} s left of the budget",
            big[big.len() - 1]
        ));
    } else {
        let deadline = t0 + mode.budget - Duration::from_secs(50);
        run(opts, mode, admin, report, t0, big, deadline).await?;
    }
    Ok(())
}

fn describe_query(q: &SearchQuery) -> String {
    match (&q.query, &q.project) {
        (Some(w), Some(p)) => format!("\"{w}\" in {p}"),
        (Some(w), None) => format!("\"{w}\""),
        (None, Some(p)) => format!("project={p}"),
        (None, None) => "(all)".into(),
    }
}

/// Search p99 ≤ 20 ms at 1M agents (at the largest size measured).
pub(crate) fn target_rows(w: &mut String, r: &Report) {
    if let Some(max_size) = r.search.iter().map(|s| s.size).max() {
        let worst = r
            .search
            .iter()
            .filter(|s| s.size == max_size)
            .max_by(|a, b| a.lat.p99.total_cmp(&b.lat.p99));
        if let Some(worst) = worst {
            let scope = if max_size >= 1_000_000 {
                "".to_string()
            } else {
                format!(" — measured at {max_size} only, 1M not run in this mode")
            };
            let _ = writeln!(
                w,
                "| search p99 ≤ 20 ms at 1M agents{scope} | worst p99 {:.1} ms ({} at {}) | {} |",
                worst.lat.p99,
                worst.category,
                max_size,
                if max_size >= 1_000_000 {
                    verdict(worst.lat.p99 <= 20.0)
                } else if worst.lat.p99 > 20.0 {
                    "FAIL (already at a smaller size)"
                } else {
                    "not measured at 1M"
                }
            );
        }
    }
}

/// Section 4.
pub(crate) fn section(w: &mut String, r: &Report) {
    let _ = writeln!(w, "\n## 4. Search\n");
    let seeds: Vec<String> = r
        .search_seed
        .iter()
        .map(|(n, t, rebuilt)| {
            format!(
                "{n} in {t:.0} s{}",
                if *rebuilt {
                    " (plain indexes dropped for the load and rebuilt from their own definitions)"
                } else {
                    ""
                }
            )
        })
        .collect();
    let _ = writeln!(
        w,
        "Directory bulk-loaded with `generate_series` (not through the API): names like `invoice-assistant-123`, descriptions composed from 20 roles, 20 teams, 40 capabilities, 20 tools and extra sentences, 60 projects with a skewed distribution; 20 rare words, each in ~1 of 10,000 descriptions. Then `VACUUM ANALYZE`. {SEARCH_WORKERS} closed-loop connections, one replica, queries rotated within a category, `limit` 10. Seeding (cumulative): {}.\n",
        seeds.join(", ")
    );
    let _ = writeln!(
        w,
        "| agents | category | e.g. | p50 ms | p90 ms | p99 ms | max ms | calls | avg results | empty | errors |"
    );
    let _ = writeln!(w, "|---|---|---|---|---|---|---|---|---|---|---|");
    for x in &r.search {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.1} | {} | {} |",
            x.size,
            x.category,
            x.example,
            x.lat.p50,
            x.lat.p90,
            x.lat.p99,
            x.lat.max,
            x.lat.count,
            x.avg_results,
            x.empty,
            x.errors
        );
    }
}
