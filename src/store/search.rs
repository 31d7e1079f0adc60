//! Directory search: PostgreSQL full-text search over the stored, GIN-indexed
//! `agents.search` tsvector (name weight A, project B, description C).
//! User text arrives here as plain words (see `domain::search`), so no
//! tsquery operator from a user ever reaches the parser; every text is a
//! bound parameter anyway.

use super::rows::AgentCard;
use super::{Client, StoreError};

/// How many matches of each tier are ranked (see `build_search_sql`);
/// beyond that, a common word returns a good page rather than a perfectly
/// ranked one, in bounded time. The tiers' candidates together are what a
/// query can page through: a few hundred agents at most.
const SEARCH_CANDIDATES: u32 = 100;
/// A sample level with at least this many matches of a tier stops the
/// tier's descent to the larger levels.
const SEARCH_ENOUGH: u32 = 25;
/// Candidates from the index of names (and project names), so that the few
/// agents *named* after a word are not lost among the many that mention it.
const SEARCH_NAME_CANDIDATES: u32 = 20;
const SEARCH_NAME_ENOUGH: u32 = 10;
/// The sample levels of the directory, every 256th and every 32nd agent by
/// id, each with its own small GIN indexes (V5; the numbers must match the
/// indexes' predicates).
const SEARCH_SAMPLES: [u32; 2] = [256, 32];
/// With a project filter, the project's first agents by name that are read
/// to find prefix matches the whole-directory level leaves out.
const SEARCH_PROJECT_SCAN: u32 = 1000;
/// How many agents of the smallest sample must match the last word's prefix
/// for it to count as common (about 2,000 in the directory).
const SEARCH_PREFIX_COMMON: u32 = 8;

/// The agents a search may show (of `agents`, unqualified), tested in each
/// level before its `LIMIT`: the levels take a bounded number of matches in
/// no order, so matches that are then not shown would take the places of
/// those that would be. 110 unlisted agents mentioning a word hid every
/// other agent that mentions it (an outsider's attack). Stale agents are
/// left out only after the levels: about a fifth of a directory (the
/// bench's), filtered here they sent the common words' levels on to the
/// larger ones, +40% on a search of two common words (bench/RESULTS.md).
const SHOWN: &str = "unregistered_at IS NULL AND listed AND suspended_at IS NULL";

/// tsquery texts for the ranking tiers.
struct TsQueries {
    /// Every word, the last one as a prefix ("invoice & mail:*").
    all: String,
    /// Any word, the last one as a prefix: what qualifies a match.
    any: String,
    /// Any whole word: whole-word matches outrank prefix-only ones.
    any_whole: String,
    /// Every word, whole: for the whole directory when the last word is the
    /// prefix of common words (see `build_search_sql`).
    all_whole: String,
    /// The last word as a prefix alone.
    last: String,
}

fn tsqueries(words: &[String]) -> TsQueries {
    let prefixed: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i + 1 == words.len() {
                format!("{w}:*")
            } else {
                w.clone()
            }
        })
        .collect();
    TsQueries {
        all: prefixed.join(" & "),
        any: prefixed.join(" | "),
        any_whole: words.join(" | "),
        all_whole: words.join(" & "),
        last: prefixed.last().cloned().unwrap_or_default(),
    }
}

/// A page of the whole directory (`project` None) or of one project, by
/// name; agents that are unlisted or suspended are not shown. Indexes: `agents_active_name_idx`, `agents_project_idx`.
/// `$3` (`$4` with a project) the seconds after which an unseen agent is
/// stale and left out (0: never). A stale agent comes back the moment it is
/// seen (any authenticated call writes `last_seen_at`).
const LIST_ALL: &str = "SELECT name, description, project, registered_at, last_seen_at, false AS stale
     FROM agents WHERE unregistered_at IS NULL AND listed AND suspended_at IS NULL
       AND ($3::float8 = 0 OR coalesce(last_seen_at, registered_at) > now() - make_interval(secs => $3::float8))
     ORDER BY name LIMIT $1 OFFSET $2";
const LIST_PROJECT: &str = "SELECT name, description, project, registered_at, last_seen_at, false AS stale
     FROM agents WHERE unregistered_at IS NULL AND listed AND suspended_at IS NULL
       AND lower(project) = lower($1)
       AND ($4::float8 = 0 OR coalesce(last_seen_at, registered_at) > now() - make_interval(secs => $4::float8))
     ORDER BY name LIMIT $2 OFFSET $3";

/// Agents by name, `fetch` rows from `offset` (one statement per shape, each
/// with a plan that fits it: a `$n IS NULL OR …` filter would leave a generic
/// plan unable to use the project index).
pub async fn list(
    db: &Client,
    project: Option<&str>,
    fetch: i64,
    offset: i64,
    stale_after_secs: f64,
) -> Result<Vec<AgentCard>, StoreError> {
    let rows = match project {
        None => {
            let stmt = db.prepare_cached(LIST_ALL).await?;
            db.query(&stmt, &[&fetch, &offset, &stale_after_secs])
                .await?
        }
        Some(project) => {
            let stmt = db.prepare_cached(LIST_PROJECT).await?;
            db.query(&stmt, &[&project, &fetch, &offset, &stale_after_secs])
                .await?
        }
    };
    Ok(rows.iter().map(AgentCard::from_row).collect())
}

/// Agents matching `words` (at least one), ranked: `exact_name` first, then
/// agents matching every word, whole-word matches before prefix-only ones,
/// then by `ts_rank`; `fetch` rows from `offset`. Stale agents (unseen for
/// `stale_after_secs`, 0: never) are left out unless named exactly.
pub async fn search(
    db: &Client,
    words: &[String],
    exact_name: &str,
    project: Option<&str>,
    fetch: i64,
    offset: i64,
    stale_after_secs: f64,
) -> Result<Vec<AgentCard>, StoreError> {
    let q = tsqueries(words);
    let stmt = db
        .prepare_cached(search_sql(project.is_some(), words.len() > 1))
        .await?;
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &q.any,
        &q.all,
        &q.any_whole,
        &q.all_whole,
        &q.last,
        &exact_name,
        &fetch,
        &offset,
        &stale_after_secs,
    ];
    if let Some(project) = &project {
        params.push(project);
    }
    let rows = db.query(&stmt, &params).await?;
    Ok(rows.iter().map(AgentCard::from_row).collect())
}

/// The search statement for a query, with and without a project filter, for
/// one word and for several; built once.
fn search_sql(project: bool, several_words: bool) -> &'static str {
    static SQL: std::sync::LazyLock<[String; 4]> = std::sync::LazyLock::new(|| {
        [
            build_search_sql(false, false),
            build_search_sql(false, true),
            build_search_sql(true, false),
            build_search_sql(true, true),
        ]
    });
    &SQL[usize::from(project) * 2 + usize::from(several_words)]
}

/// One tier of candidates: up to `candidates` agents matching `sampled`,
/// from the first of the sample levels that has `enough` of them, else from
/// the whole directory, matching the first of `full` whose gate holds. With
/// `after`, the tier runs only when that tier found fewer than its
/// `candidates`: its matches would rank below that tier's anyway.
struct Tier {
    name: &'static str,
    sampled: String,
    full: Vec<(String, &'static str)>,
    after: Option<&'static str>,
    candidates: u32,
    enough: u32,
}

/// `$1` any word, `$2` all words, `$3` any whole word, `$4` all words whole,
/// `$5` the last word's prefix (the tsquery texts of [`tsqueries`]), `$6`
/// the query as an exact name, `$7` limit, `$8` offset, `$9` seconds unseen
/// after which an agent is stale (0: never; a stale agent is found by its
/// exact name only), `$10` project (when filtered).
///
/// A GIN scan enumerates every match before the first row comes out: a word
/// in one description of ten is ~100,000 matches at 1M agents and 20-60 ms,
/// however few rows are wanted. So only a bounded set of candidates is
/// ranked: the exact name, and per tier (every word; any whole word; any
/// word; any word in the name or project name) up to [`SEARCH_CANDIDATES`]
/// matches ([`SEARCH_NAME_CANDIDATES`] for names), taken from the smallest
/// sample of the directory (every 256th, every 32nd agent:
/// [`SEARCH_SAMPLES`], with their own small indexes) that has
/// [`SEARCH_ENOUGH`] of them. A common word is answered from the sample; a
/// rare one falls through to the whole directory, where it has few matches
/// (fewer than ~32 × 25 to get there). A level that is not needed costs
/// nothing: its gate is evaluated once, before its scan.
///
/// The tsqueries come from a CTE, so the planner sees parameters, not
/// values, and every execution gets the same plan, the sample indexes first.
/// A plan for the values might pick a sequential scan for a word the
/// statistics call common, which is ruinous on a level that only runs
/// because the word is in fact rare.
///
/// GIN enumerates a prefix (`inv:*`) in full even inside a conjunction, so
/// where a conjunction reaches the whole directory, the last word is a
/// prefix only when that prefix is rare in the smallest sample; otherwise
/// it is taken whole there (prefix-only matches of a common prefix then come
/// from the samples).
///
/// A project filter joins the project's own words to each tier's tsquery
/// (the project is in `search` too, weight B), so the GIN scan intersects
/// instead of enumerating every match of the word; the exact comparison
/// then keeps that project only. Prefix matches in a small project, and
/// projects with no words to search by ("the"), come from reading the
/// project's first agents by name ([`SEARCH_PROJECT_SCAN`]).
fn build_search_sql(project: bool, several_words: bool) -> String {
    // `IS TRUE` keeps the planner from ANDing the project index into the
    // GIN scans: that would read every agent of a big project. The project
    // comes from `q` like the tsqueries: a plan for the value would be
    // re-planned (~1 ms) on most executions and gain nothing.
    let (in_project, project_words, and_project) = if project {
        (
            " AND (lower(project) = (SELECT project FROM q)) IS TRUE",
            ",\n        lower($10) AS project,
        plainto_tsquery('english', translate($10, '._-', '   ')) AS project_words",
            " && project_words",
        )
    } else {
        ("", "", "")
    };
    let matching = |tsquery: &str| format!("search @@ (SELECT {tsquery}{and_project} FROM q)");
    // Names (with the project's words, so that a project filter can
    // intersect in the index too).
    let named = |tsquery: &str| {
        format!(
            "to_tsvector('english', translate(name || ' ' || project, '._-', '   '))
             @@ (SELECT {tsquery}{and_project} FROM q)"
        )
    };
    const RARE_PREFIX: &str = " AND (SELECT rare FROM prefix)";
    const COMMON_PREFIX: &str = " AND NOT (SELECT rare FROM prefix)";
    let conjunction = several_words || project;
    let mut tiers = vec![Tier {
        name: "named",
        sampled: named("any_word"),
        full: if project {
            vec![
                (named("any_word"), RARE_PREFIX),
                (named("any_whole_word"), COMMON_PREFIX),
            ]
        } else {
            vec![(named("any_word"), "")]
        },
        after: None,
        candidates: SEARCH_NAME_CANDIDATES,
        enough: SEARCH_NAME_ENOUGH,
    }];
    let tier = |name, sampled: String, full, after| Tier {
        name,
        sampled,
        full,
        after,
        candidates: SEARCH_CANDIDATES,
        enough: SEARCH_ENOUGH,
    };
    let every_word = tier(
        "every_word",
        matching("all_words"),
        if conjunction {
            vec![
                (matching("all_words"), RARE_PREFIX),
                (matching("all_whole_words"), COMMON_PREFIX),
            ]
        } else {
            vec![(matching("all_words"), "")]
        },
        // With one word, "every word" is the word as a prefix: it adds
        // prefix-only matches, which rank below whole-word ones.
        (!several_words).then_some("whole_word"),
    );
    let whole_word = tier(
        "whole_word",
        matching("any_whole_word"),
        // With one word and a project, "every word whole" is the
        // every-word tier's already.
        if several_words || !project {
            vec![(matching("any_whole_word"), "")]
        } else {
            Vec::new()
        },
        None,
    );
    if several_words {
        tiers.extend([every_word, whole_word]);
        tiers.push(tier(
            "some_word",
            matching("any_word"),
            vec![(matching("any_word"), if project { RARE_PREFIX } else { "" })],
            Some("whole_word"),
        ));
    } else {
        tiers.extend([whole_word, every_word]);
    }

    let mut ctes = vec![
        format!(
            "q AS (SELECT to_tsquery('english', $1) AS any_word,
        to_tsquery('english', $2) AS all_words,
        to_tsquery('english', $3) AS any_whole_word,
        to_tsquery('english', $4) AS all_whole_words,
        to_tsquery('english', $5) AS last_word{project_words})"
        ),
        // Computed only when a gate asks.
        format!(
            "prefix AS (SELECT count(*) < {SEARCH_PREFIX_COMMON} AS rare FROM (
        SELECT 1 FROM agents WHERE search @@ (SELECT last_word FROM q)
        AND id % {} = 0 AND unregistered_at IS NULL LIMIT {SEARCH_PREFIX_COMMON}) s)",
            SEARCH_SAMPLES[0]
        ),
        format!(
            "exact AS (SELECT id FROM agents WHERE name = $6 AND unregistered_at IS NULL{in_project})"
        ),
    ];
    let mut pools = vec!["exact".to_owned()];
    // Per tier: the condition that it ran and came up short of `enough` at
    // every level, and the condition that it did not fill its `candidates`.
    let mut outcomes: Vec<(&str, String, String)> = Vec::new();
    // Without project words ("the"), the GIN scans would enumerate the
    // word's matches in the whole directory; the project scan answers. And
    // without words to search for (only stop words), `&&` would leave the
    // project's words alone, which match the whole project.
    let has_project_words = if project {
        " AND (SELECT numnode(project_words) > 0 AND numnode(any_word) > 0 FROM q)"
    } else {
        ""
    };
    for t in &tiers {
        // A level runs while the levels before it are all short of `enough`.
        let mut rare = match t.after {
            Some(after) => outcomes
                .iter()
                .find(|(name, ..)| *name == after)
                .map(|(.., not_full)| not_full.clone())
                .expect("a tier follows one built before it"),
            None => String::new(),
        };
        // Defines a level; returns its count of matches.
        let mut level = |name: String, matches: &str, in_sample: &str, gates: &str| {
            ctes.push(format!(
                "{name} AS (SELECT id FROM agents
        WHERE {matches}{in_sample} AND {SHOWN}{in_project}{has_project_words}{gates}
        LIMIT {})",
                t.candidates
            ));
            let count = format!("(SELECT count(*) FROM {name})");
            pools.push(name);
            count
        };
        let mut counts = Vec::new();
        for n in SEARCH_SAMPLES {
            let count = level(
                format!("{}_{n}", t.name),
                &t.sampled,
                &format!(" AND id % {n} = 0"),
                &rare,
            );
            rare.push_str(&format!(" AND {count} < {}", t.enough));
            counts.push(count);
        }
        // The whole directory's alternatives exclude each other.
        let full_gate = rare.clone();
        for (i, (matches, gate)) in t.full.iter().enumerate() {
            let count = level(
                format!("{}_all{i}", t.name),
                matches,
                "",
                &format!("{full_gate}{gate}"),
            );
            rare.push_str(&format!(" AND {count} < {}", t.enough));
            counts.push(count);
        }
        let not_full = format!(" AND {} < {}", counts.join(" + "), t.candidates);
        outcomes.push((t.name, rare, not_full));
    }
    // The project scan runs when the every-word tier came up short.
    let every_word_short = &outcomes
        .iter()
        .find(|(name, ..)| *name == "every_word")
        .expect("an every-word tier")
        .1;
    if project {
        ctes.push(format!(
            "in_project AS (SELECT id FROM (
        SELECT id, search FROM agents
        WHERE lower(project) = (SELECT project FROM q) AND {SHOWN}
        ORDER BY lower(project), name LIMIT {SEARCH_PROJECT_SCAN}) head
        WHERE search @@ (SELECT any_word FROM q){every_word_short}
        LIMIT {SEARCH_CANDIDATES})"
        ));
        pools.push("in_project".to_owned());
    }
    // The candidates are fetched by id from an array: primary-key lookups,
    // whatever the planner guesses their number to be (a join picked a hash
    // join over the whole table on a small directory).
    let candidates = pools
        .iter()
        .map(|t| format!("SELECT id FROM {t}"))
        .collect::<Vec<_>>()
        .join("\n        UNION ");
    format!(
        "WITH {},
    candidates AS ({candidates})
SELECT a.name, a.description, a.project, a.registered_at, a.last_seen_at,
       $9::float8 > 0 AND coalesce(a.last_seen_at, a.registered_at)
           <= now() - make_interval(secs => $9::float8) AS stale
FROM agents a, q
WHERE a.id = ANY (ARRAY(SELECT id FROM candidates)) AND a.listed AND a.suspended_at IS NULL
  AND ($9::float8 = 0 OR a.name = $6
       OR coalesce(a.last_seen_at, a.registered_at) > now() - make_interval(secs => $9::float8))
ORDER BY a.name = $6 DESC,
         a.search @@ q.all_words DESC,
         ts_rank(a.search, q.any_whole_word) DESC,
         ts_rank(a.search, q.any_word) DESC,
         a.name
LIMIT $7 OFFSET $8",
        ctes.join(",\n    ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_become_tsqueries_for_each_tier() {
        let q = tsqueries(&["invoice".to_owned(), "mail".to_owned()]);
        assert_eq!(q.all, "invoice & mail:*");
        assert_eq!(q.any, "invoice | mail:*");
        assert_eq!(q.any_whole, "invoice | mail");
        assert_eq!(q.all_whole, "invoice & mail");
        assert_eq!(q.last, "mail:*");
    }

    #[test]
    fn search_samples_have_their_indexes() {
        // A sample level without its partial index would scan the whole GIN.
        let migration = include_str!("../../migrations/V5__search_speed.sql");
        for n in SEARCH_SAMPLES {
            assert!(
                migration.contains(&format!("USING gin (search)\n    WHERE id % {n} = 0")),
                "no search index for 1 in {n}"
            );
            assert!(
                migration.contains(&format!("'   ')))\n    WHERE id % {n} = 0")),
                "no names index for 1 in {n}"
            );
        }
        for (project, several) in [(false, false), (false, true), (true, false), (true, true)] {
            let sql = search_sql(project, several);
            assert_eq!(sql.contains("$10"), project);
            assert_eq!(sql.contains("some_word"), several);
        }
    }
}
