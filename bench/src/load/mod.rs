//! The load generators: MCP calls from the bench's agents over keep-alive
//! connections. The closed-loop send+poll mix and the requests that never
//! reach the database (`closed_loop`), the open-loop fixed rate
//! (`open_loop`), the popular inbox (`popular_inbox`), search (`search`);
//! the long polls' workloads (`long_poll`) and those of the webhook and
//! contact-policy phases (`hooks`). Every loop is bounded by a deadline and
//! by an iteration count.

mod closed_loop;
pub mod hooks;
pub mod long_poll;
mod open_loop;
mod popular_inbox;
mod search;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::mcp::{Conn, Target};
use crate::stats::Errors;

pub use closed_loop::{NoDb, mix, no_db};
pub use open_loop::{Plan, Planned, open_loop, open_loop_plan};
pub use popular_inbox::{HotMode, HotOutcome, drain, hot, message_number};
pub use search::{SearchQuery, search};

/// Same text in the mix and in the pgbench baseline (no quotes: it is
/// pasted into the pgbench script as a literal).
pub const BODY: &str = "Hi, the nightly report for project atlas is ready: 3 new invoices, 1 failed \
payment retry, nothing urgent. Reply if you need the CSV.";

/// Upper bound on calls per worker, whatever the clock says.
pub const MAX_CALLS_PER_WORKER: u64 = 5_000_000;

#[derive(Clone, Debug)]
pub struct Agent {
    pub name: String,
    pub token: String,
}

/// Registers agents one after another through `phone_register` on one
/// connection (sequentially, so their ids are consecutive).
pub async fn register(
    target: &Target,
    names: &[String],
    project: &str,
) -> Result<Vec<Agent>, String> {
    let mut conn = Conn::open(target)
        .await
        .map_err(|e| format!("open {target:?}: {e}"))?;
    let mut agents = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let out = conn
            .call_tool(
                "phone_register",
                json!({
                    "name": name,
                    "description": format!("Benchmark agent {i}: sends status reports to its partner and reads its inbox in a loop."),
                    "project": project,
                }),
                None,
            )
            .await
            .map_err(|e| format!("phone_register {name}: {e}"))?;
        let token = out
            .get("token")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("phone_register {name}: no token in {out}"))?;
        agents.push(Agent {
            name: name.clone(),
            token: token.to_owned(),
        });
    }
    Ok(agents)
}

/// Opens a connection, retrying (bounded) until `deadline`; failures are
/// tallied in `errors`.
pub async fn open_until(target: &Target, deadline: Instant, errors: &mut Errors) -> Option<Conn> {
    for _ in 0..100 {
        match Conn::open(target).await {
            Ok(c) => return Some(c),
            Err(e) => {
                errors.add("initialize", e.kind(), &e.to_string());
                if Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    None
}
