//! `phone register | login | logout | whoami`, and `phone mcp-headers` (the
//! plugin's headersHelper): who the client commands act as.

use std::io::{BufRead as _, IsTerminal as _};

use serde::Deserialize;
use serde_json::json;

use super::{CliError, connect, show, target};
use crate::remote::{self, Env, Profile, Secret, Source, Target};

#[derive(Debug, clap::Args)]
pub struct RegisterArgs {
    /// The agent's name: letters, digits, '-', '_' and '.'.
    name: String,
    /// What the agent can do (others find it by this).
    #[arg(long, short)]
    description: String,
    /// The project it works on.
    #[arg(long, short)]
    project: String,
    /// The server (else PHONE_URL, else the profile's).
    #[arg(long)]
    url: Option<String>,
    /// Replace an existing profile (its token is then gone from this
    /// machine).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// The agent's name.
    #[arg(long)]
    name: String,
    /// The server (else PHONE_URL, else the profile's).
    #[arg(long)]
    url: Option<String>,
}

#[derive(Deserialize)]
struct Registered {
    name: String,
    project: String,
    token: Option<String>,
}

#[derive(Deserialize)]
struct Peeked {
    #[serde(default)]
    messages: Vec<Addressed>,
    unread_remaining: i64,
}

#[derive(Deserialize)]
struct Addressed {
    to: String,
}

fn existing_profile(env: Env<'_>) -> Result<Option<Profile>, CliError> {
    Ok(remote::profile::load(env)?)
}

pub async fn register(env: Env<'_>, args: RegisterArgs) -> Result<(), CliError> {
    if let Some(old) = existing_profile(env)?
        && !args.force
    {
        return Err(CliError::Usage(format!(
            "a profile for '{}' at {} exists; its token would be lost. Run `phone logout` first, \
             or pass --force",
            old.name, old.url
        )));
    }
    // A new agent: no token of another one goes along.
    let target = Target {
        token: None,
        token_from: None,
        name: None,
        ..target(env, args.url.as_deref())?
    };
    let connection = connect(&target).await?;
    let out = connection
        .call(
            "phone_register",
            json!({"name": args.name, "description": args.description, "project": args.project}),
            std::time::Duration::ZERO,
        )
        .await;
    connection.close().await;
    let registered: Registered = serde_json::from_value(out?)
        .map_err(|e| CliError::Remote(remote::RemoteError::Protocol(e.to_string())))?;
    let token = registered.token.ok_or_else(|| {
        CliError::Usage("the server issued no token (was the name registered already?)".into())
    })?;
    // The token first: should saving fail, it is not lost.
    println!(
        "Registered '{}' (project {}) at {}.",
        show::line(&registered.name, 64),
        show::line(&registered.project, 80),
        target.mcp_url
    );
    println!("Token (shown this once): {token}");
    let profile = Profile {
        url: target.mcp_url.clone(),
        name: registered.name,
        token: Secret::new(token),
    };
    let path = remote::profile::save(env, &profile)?;
    println!(
        "Saved it in {} (readable by you only); the client commands, hooks and channel use it.",
        path.display()
    );
    Ok(())
}

pub async fn login(env: Env<'_>, args: LoginArgs) -> Result<(), CliError> {
    let token = match remote::var(env, "PHONE_TOKEN") {
        Some(t) => t,
        None => read_token()?,
    };
    let mut target = target(env, args.url.as_deref())?;
    target.token = Some(Secret::new(token));
    target.token_from = Some(Source::Flag);
    target.token()?;
    let connection = connect(&target).await?;
    // Naming the agent makes the server check that the token is its token.
    let out = connection
        .call(
            "phone_inbox",
            json!({"name": args.name, "peek": true, "limit": 1}),
            std::time::Duration::ZERO,
        )
        .await;
    connection.close().await;
    let peeked: Peeked = serde_json::from_value(out?)
        .map_err(|e| CliError::Remote(remote::RemoteError::Protocol(e.to_string())))?;
    let profile = Profile {
        url: target.mcp_url.clone(),
        name: args.name.trim().to_ascii_lowercase(),
        token: target.token.clone().expect("set above"),
    };
    let path = remote::profile::save(env, &profile)?;
    println!(
        "Logged in as '{}' at {}: {} unread message(s). Saved the profile in {} (readable by you only).",
        profile.name,
        profile.url,
        unread(peeked.unread_remaining),
        path.display()
    );
    Ok(())
}

/// One line from stdin: piped, or typed at a prompt.
fn read_token() -> Result<String, CliError> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("The agent's token (phn_…; it is shown as you type): ");
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line)?;
    let token = line.trim().to_owned();
    if token.is_empty() {
        return Err(CliError::Usage(
            "no token: pipe it to stdin (phone login --name NAME < token-file) or set PHONE_TOKEN"
                .into(),
        ));
    }
    Ok(token)
}

pub fn logout(env: Env<'_>) -> Result<(), CliError> {
    let path = remote::profile::path(env).ok_or(remote::ProfileError::NoConfigDir)?;
    if remote::profile::remove(env)? {
        println!("Deleted {}.", path.display());
    } else {
        println!("No profile at {}.", path.display());
    }
    Ok(())
}

pub async fn whoami(env: Env<'_>) -> Result<(), CliError> {
    let target = target(env, None)?;
    target.token()?;
    println!("server: {} (from {})", target.mcp_url, target.url_from);
    let connection = connect(&target).await?;
    let out = connection
        .call(
            "phone_inbox",
            json!({"peek": true, "limit": 1}),
            std::time::Duration::ZERO,
        )
        .await;
    connection.close().await;
    let peeked: Peeked = serde_json::from_value(out?)
        .map_err(|e| CliError::Remote(remote::RemoteError::Protocol(e.to_string())))?;
    let name = target
        .name
        .clone()
        .or_else(|| peeked.messages.first().map(|m| show::line(&m.to, 64)));
    let from = target.token_from.map(|s| s.to_string()).unwrap_or_default();
    match name {
        Some(name) => println!("agent:  {name} (token from {from})"),
        None => println!("agent:  name not known here (token from {from})"),
    }
    println!(
        "token:  accepted; {} unread message(s)",
        unread(peeked.unread_remaining)
    );
    Ok(())
}

fn unread(n: i64) -> String {
    if n >= 100 {
        "100 or more".into()
    } else {
        n.to_string()
    }
}

/// `phone mcp-headers`: Claude Code runs it (the plugin's `headersHelper`)
/// before connecting to the server in `CLAUDE_CODE_MCP_SERVER_URL`, and
/// sends the headers it prints. It prints the token of `PHONE_TOKEN` or of
/// the profile (only when the profile is for that server), else `{}`, so
/// that the plugin's own token option, in its static header, applies.
/// The one command besides `register` that prints a token: to Claude Code.
pub fn mcp_headers(env: Env<'_>) -> Result<(), CliError> {
    let server = remote::var(env, "CLAUDE_CODE_MCP_SERVER_URL");
    let token = remote::var(env, "PHONE_TOKEN")
        .map(Secret::new)
        .or_else(|| {
            let profile = match remote::profile::load(env) {
                Ok(p) => p?,
                Err(e) => {
                    eprintln!("phone mcp-headers: {e}");
                    return None;
                }
            };
            let ours = server
                .as_deref()
                .is_none_or(|s| remote::same_server(&profile.url, s));
            ours.then_some(profile.token)
        });
    if let Some(warning) = server.as_deref().and_then(remote::cleartext_warning) {
        eprintln!("phone mcp-headers: {warning}");
    }
    let headers = match token {
        Some(t) => json!({"Authorization": format!("Bearer {}", t.expose())}),
        None => json!({}),
    };
    println!("{headers}");
    Ok(())
}
