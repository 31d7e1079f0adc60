//! The command line: `phone` (serves, as the container image and Railway
//! run it), `phone serve`, the client commands a person or a script uses
//! (`register`, `login`, `logout`, `whoami`, `send`, `inbox`, `search`),
//! the Claude Code parts (`hook …`, `channel`, and `mcp-headers` for the
//! plugin's HTTP server) and the operator's `admin …`.
//!
//! The client commands are MCP clients of a phone server like any agent
//! (`remote`); the server and token come from `PHONE_URL` / `PHONE_TOKEN`
//! or the profile that `register` / `login` save. No command prints a
//! token, except `register`, which shows the new one once.

mod account;
mod mail;
mod serve;
mod show;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::remote::{
    self, Connection, Env, Lifecycle, ProfileError, RemoteError, Target, TargetError,
};
use crate::{admin, channel, hook};

#[derive(Debug, Parser)]
#[command(
    name = "phone",
    version,
    about = "A mailbox and address book for AI agents: the MCP server, and its command-line client",
    long_about = "A mailbox and address book for AI agents.\n\n\
        Without a command, `phone` serves the MCP server (configured by environment \
        variables: DATABASE_URL, PORT, …; see docs/CONFIGURATION.md).\n\n\
        The client commands talk to a server as an agent: the server and the agent's token come \
        from PHONE_URL and PHONE_TOKEN, else from the profile that `phone register` or \
        `phone login` saved (~/.config/phone/profile.json, readable by you only)."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the MCP server (the same as `phone` alone).
    Serve,
    /// Register a new agent; saves the profile and shows its token once.
    Register(account::RegisterArgs),
    /// Save the profile of an agent that is already registered (the token is
    /// read from stdin or PHONE_TOKEN, never from the command line).
    Login(account::LoginArgs),
    /// Delete the saved profile.
    Logout,
    /// Which server and agent the client commands use, and whether the
    /// token works.
    Whoami,
    /// Send a message (the body from stdin when not given).
    Send(mail::SendArgs),
    /// Show unread mail without marking it read (--read marks it read).
    Inbox(mail::InboxArgs),
    /// Search the address book.
    Search(mail::SearchArgs),
    /// Claude Code hooks (SessionStart, Stop).
    #[command(subcommand)]
    Hook(hook::Command),
    /// A Claude Code channel: an MCP server on stdio that tells the session
    /// when mail arrives (started by Claude Code).
    Channel,
    /// The operator's commands, against DATABASE_URL.
    #[command(subcommand)]
    Admin(admin::Command),
    /// Prints the Authorization header for the Claude Code plugin's HTTP
    /// server (its headersHelper), from PHONE_TOKEN or the profile.
    #[command(hide = true)]
    McpHeaders,
}

/// Parses the command line. On a mistake it prints clap's message and
/// exits: 2, except for `phone hook …`, which exits 1 (Claude Code would
/// read 2 as "blocking error" and hand stderr to the model).
pub fn parse() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let is_hook = std::env::args().nth(1).as_deref() == Some("hook");
            let _ = e.print();
            let code = if !e.use_stderr() {
                0
            } else if is_hook {
                1
            } else {
                2
            };
            std::process::exit(code);
        }
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> ExitCode {
    let env = |key: &str| std::env::var(key).ok();
    let outcome = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => return serve::serve().await,
        Command::Admin(command) => return admin_command(&command).await,
        Command::Hook(command) => return hook_command(command, &env).await,
        Command::Channel => return channel_command(&env).await,
        Command::McpHeaders => account::mcp_headers(&env),
        Command::Register(args) => account::register(&env, args).await,
        Command::Login(args) => account::login(&env, args).await,
        Command::Logout => account::logout(&env),
        Command::Whoami => account::whoami(&env).await,
        Command::Send(args) => mail::send(&env, args).await,
        Command::Inbox(args) => mail::inbox(&env, args).await,
        Command::Search(args) => mail::search(&env, args).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("phone: {}", e.shown());
            ExitCode::from(e.exit_code())
        }
    }
}

/// What a client command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl CliError {
    /// The error as the terminal shows it: a server's words (its errors,
    /// or what it sent where a field was expected) on one line, without the
    /// characters a terminal acts on (a hostile server cleared the screen
    /// and forged a line of output through them); this client's own
    /// messages as written.
    fn shown(&self) -> String {
        match self {
            Self::Remote(e) => show::clean(&e.to_string(), false),
            other => other.to_string(),
        }
    }

    fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Target(_) => 2,
            _ => 1,
        }
    }
}

/// The target the client commands use (`flag`: a `--url`), with the
/// warning about plain http on stderr.
fn target(env: Env<'_>, flag: Option<&str>) -> Result<Target, CliError> {
    let profile = remote::profile::load(env)?;
    let target = Target::resolve(env, flag, profile.as_ref())?;
    if let Some(warning) = remote::cleartext_warning(&target.mcp_url) {
        eprintln!("phone: {warning}");
    }
    Ok(target)
}

/// A connection as the target's agent.
async fn connect(target: &Target) -> Result<Connection, CliError> {
    Ok(Connection::open(target, "phone-cli", Lifecycle::Handshake).await?)
}

async fn admin_command(command: &admin::Command) -> ExitCode {
    let Some(url) = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!("phone admin: DATABASE_URL is not set");
        return ExitCode::from(2);
    };
    match admin::run(&url, command).await {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(admin::AdminError::Usage(text)) => {
            eprintln!("phone admin: {text}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("phone admin: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `phone hook …`: reads the hook's JSON input from stdin.
async fn hook_command(command: hook::Command, env: Env<'_>) -> ExitCode {
    use tokio::io::AsyncReadExt as _;
    let mut stdin = String::new();
    // Claude Code always sends input; by hand there may be none (a terminal).
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        let _ = tokio::io::stdin()
            .take(1 << 20)
            .read_to_string(&mut stdin)
            .await;
    }
    let outcome = hook::run(command, &stdin, env).await;
    print!("{}", outcome.stdout);
    eprint!("{}", outcome.stderr);
    ExitCode::from(outcome.code)
}

/// `phone channel`. Exits the process itself: a read of stdin still
/// pending on the runtime's blocking pool would otherwise hold the exit.
async fn channel_command(env: Env<'_>) -> ExitCode {
    let code = match channel::run(env).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("phone channel: {}", show::clean(&e.to_string(), false));
            1
        }
    };
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hostile server's error text cleared the terminal and forged a line
    /// of output ("Sent … to boss") under the real one.
    #[test]
    fn a_servers_words_reach_the_terminal_on_one_line_without_escapes() {
        let error = CliError::Remote(RemoteError::Refused(
            "no\u{1b}[2J\u{1b}]0;title\u{7}\nphone: Sent 7 to boss\r".into(),
        ));
        let shown = error.shown();
        assert!(shown.starts_with("the server answered: no"), "{shown:?}");
        assert!(
            !shown.contains(['\u{1b}', '\u{7}', '\n', '\r']),
            "{shown:?}"
        );
        // The client's own words stay as written.
        let usage = CliError::Usage("line one\nline two".into());
        assert_eq!(usage.shown(), "line one\nline two");
    }
}
