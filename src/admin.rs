//! `phone admin …`: the operator's controls, straight against
//! `DATABASE_URL` (no network surface of their own).
//!
//! ```text
//! phone admin suspend NAME      its token stops working at once on every replica, it leaves
//!                               search, mail to it is refused; its history stays
//! phone admin unsuspend NAME
//! phone admin top-senders [HOURS]   who sent most (and was refused most) lately; default 1
//! phone admin refused [HOURS]       refused sends by sender, recipient and reason
//! phone admin stale [DAYS]          agents unseen for DAYS (default 90), longest unseen first
//! phone admin unregister-stale DAYS unregisters them (names reserved 30 days; mail kept)
//! ```

use std::fmt::Write as _;

use crate::domain::agents::NAME_RESERVATION_DAYS;
use crate::domain::types::timestamp;
use crate::domain::{AgentName, Token};
use crate::store::{self, Settings, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One operator command.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum Command {
    /// Its token stops working at once on every replica, it leaves search,
    /// mail to it is refused; its history stays.
    Suspend {
        name: String,
    },
    Unsuspend {
        name: String,
    },
    /// Who sent most (and was refused most) lately.
    TopSenders {
        #[arg(default_value = "1", value_parser = clap::value_parser!(i32).range(1..=2160))]
        hours: i32,
    },
    /// Refused sends by sender, recipient and reason.
    Refused {
        #[arg(default_value = "1", value_parser = clap::value_parser!(i32).range(1..=2160))]
        hours: i32,
    },
    /// Agents unseen for DAYS (never seen: since they registered), longest
    /// unseen first.
    Stale {
        #[arg(default_value = "90", value_parser = clap::value_parser!(i32).range(1..=36500))]
        days: i32,
    },
    /// Unregisters the agents unseen for DAYS, as each would itself: its
    /// token stops working, its name stays reserved 30 days, its mail is
    /// kept (history, analytics).
    UnregisterStale {
        #[arg(value_parser = clap::value_parser!(i32).range(1..=36500))]
        days: i32,
    },
}

/// Stale agents listed or unregistered by one command, at most.
const STALE_BATCH: i64 = 1000;

/// Runs one command; returns what to print.
pub async fn run(database_url: &str, command: &Command) -> Result<String, AdminError> {
    let settings = Settings::for_url(database_url);
    store::migrate_with(&settings).await?;
    let pool = store::pool::connect(&Settings {
        pool_size: 1,
        ..settings
    })?;
    let db = pool.get().await.map_err(StoreError::from)?;
    let out = match command {
        Command::Suspend { name: raw } | Command::Unsuspend { name: raw } => {
            let name =
                AgentName::parse("NAME", raw).map_err(|e| AdminError::Usage(e.to_string()))?;
            let suspend = matches!(command, Command::Suspend { .. });
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
        Command::TopSenders { hours } => {
            let h = *hours;
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
        Command::Refused { hours } => {
            let h = *hours;
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
        Command::Stale { days } => {
            let stale = store::admin::stale(&db, *days, STALE_BATCH).await?;
            let mut out = format!(
                "{} agent(s) unseen for {days} day(s): name, project, last seen\n",
                stale.len()
            );
            for a in &stale {
                let seen = a.last_seen_at.map_or_else(|| "never".into(), timestamp);
                let _ = writeln!(out, "{:<32} {:<24} {seen}", a.name, a.project);
            }
            out
        }
        Command::UnregisterStale { days } => {
            let stale = store::admin::stale(&db, *days, STALE_BATCH).await?;
            let mut out = String::new();
            let mut done = 0;
            for a in &stale {
                let revoked = Token::generate().hash();
                if let Some(u) = store::agents::unregister(
                    &db,
                    a.id,
                    None,
                    revoked.as_bytes(),
                    NAME_RESERVATION_DAYS,
                )
                .await?
                {
                    done += 1;
                    let _ = writeln!(
                        out,
                        "{}: unregistered, name reserved until {}",
                        u.name,
                        timestamp(u.reserved_until)
                    );
                }
            }
            let _ = write!(
                out,
                "{done} agent(s) unseen for {days} day(s) unregistered; their mail is kept."
            );
            out
        }
    };
    pool.close();
    Ok(out)
}
