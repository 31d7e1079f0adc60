//! `phone admin …`: the operator's controls, straight against
//! `DATABASE_URL` (no network surface of their own).
//!
//! ```text
//! phone admin suspend NAME      its token stops working at once on every replica, it leaves
//!                               search, mail to it is refused; its history stays
//! phone admin unsuspend NAME
//! phone admin top-senders [HOURS]   who sent most (and was refused most) lately; default 1
//! phone admin refused [HOURS]       refused sends by sender, recipient and reason
//! ```

use std::fmt::Write as _;

use crate::domain::AgentName;
use crate::domain::types::timestamp;
use crate::store::{self, Settings, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

const USAGE: &str =
    "usage: phone admin suspend NAME | unsuspend NAME | top-senders [HOURS] | refused [HOURS]";

/// Runs one command (`args` after `admin`); returns what to print.
pub async fn run(database_url: &str, args: &[String]) -> Result<String, AdminError> {
    let usage = || AdminError::Usage(USAGE.into());
    let settings = Settings::for_url(database_url);
    store::migrate_with(&settings).await?;
    let pool = store::pool::connect(&Settings {
        pool_size: 1,
        ..settings
    })?;
    let db = pool.get().await.map_err(StoreError::from)?;
    let hours = |at: usize| -> Result<i32, AdminError> {
        match args.get(at) {
            None => Ok(1),
            Some(h) => h
                .parse::<i32>()
                .ok()
                .filter(|h| (1..=24 * 90).contains(h))
                .ok_or_else(|| {
                    AdminError::Usage(format!("HOURS must be from 1 to 2160; got {h:?}"))
                }),
        }
    };
    let out = match args.first().map(String::as_str) {
        Some(cmd @ ("suspend" | "unsuspend")) => {
            let raw = args.get(1).ok_or_else(usage)?;
            let name =
                AgentName::parse("NAME", raw).map_err(|e| AdminError::Usage(e.to_string()))?;
            let suspend = cmd == "suspend";
            let changed = store::admin::suspend(&db, name.as_str(), suspend).await?;
            match (changed, store::admin::suspended(&db, name.as_str()).await?) {
                (_, None) => {
                    return Err(AdminError::Usage(format!(
                        "no registered agent named '{name}'"
                    )));
                }
                (true, Some(true)) => format!(
                    "'{name}' is suspended: its token no longer works, it is out of search, mail to it is refused."
                ),
                (true, Some(false)) => format!("'{name}' is no longer suspended."),
                (false, Some(true)) => format!("'{name}' was suspended already."),
                (false, Some(false)) => format!("'{name}' was not suspended."),
            }
        }
        Some("top-senders") => {
            let h = hours(1)?;
            let mut out = format!("Senders of the last {h} hour(s): sent, refused\n");
            for line in store::admin::top_senders(&db, h, 20).await? {
                let _ = writeln!(
                    out,
                    "{:<32} {:>8} {:>8}{}",
                    line.name,
                    line.sent,
                    line.refused,
                    if line.suspended { "  (suspended)" } else { "" }
                );
            }
            out
        }
        Some("refused") => {
            let h = hours(1)?;
            let mut out = format!(
                "Refused sends of the last {h} hour(s): sender -> recipient, reason, count, last\n"
            );
            for line in store::admin::refused(&db, h, 50).await? {
                let _ = writeln!(
                    out,
                    "{} -> {}  {}  {}  {}",
                    line.sender,
                    line.recipient,
                    line.reason,
                    line.count,
                    timestamp(line.last)
                );
            }
            out
        }
        _ => return Err(usage()),
    };
    pool.close();
    Ok(out)
}
