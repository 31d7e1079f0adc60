//! The phases of a run, one module each, in the order `main` runs them
//! (`--only` picks some by these names):
//!
//! - `fsync`: the disk's fdatasync rate (pg_test_fsync);
//! - `mix`: send+poll between pairs of agents, closed loop, against the
//!   same SQL in pgbench (1 and 3 replicas), and the server's cost per
//!   request without the database;
//! - `rate`: the mix's requests at a fixed rate, half of its peak;
//! - `hot`: one popular inbox, many senders and pollers, read and lease
//!   mode, against pgbench of the same shape;
//! - `wake`: long polls: wake-ups across replicas, sends beside waiters,
//!   what 1,000 waiting agents cost;
//! - `webhooks` and `policy`: sends to agents with webhooks or contact
//!   policies against sends to agents without (sharing `ab`);
//! - `quotas`: send+poll pairs with the quotas on against off;
//! - `search`: the directory at 10k to 1M agents;
//! - `growth`: inbox latency at a small and a large message history;
//! - `teams`: group sends against single sends, and search of one's mail.
//!
//! Each module holds what its phase measures (`run`), its results, and its
//! rows of the table of targets and its section of `RESULTS.md`.

pub(crate) mod ab;
pub(crate) mod fsync;
pub(crate) mod growth;
pub(crate) mod hot;
pub(crate) mod mix;
pub(crate) mod policy;
pub(crate) mod quotas;
pub(crate) mod rate;
pub(crate) mod search;
pub(crate) mod teams;
pub(crate) mod wake;
pub(crate) mod webhooks;

use crate::db;
use crate::load::Agent;

/// Seeded agents `{prefix}-1` … `{prefix}-n` (see `db::seed_agents`).
pub(crate) fn seeded_agents(prefix: char, n: usize) -> Vec<Agent> {
    (1..=n as i64)
        .map(|g| Agent {
            name: format!("{prefix}-{g}"),
            token: db::seeded_token(prefix, g),
        })
        .collect()
}

pub(crate) fn names_of(agents: &[Agent]) -> Vec<String> {
    agents.iter().map(|a| a.name.clone()).collect()
}
