//! `phone channel`: a Claude Code channel. Claude Code starts it over stdio
//! (a plugin's MCP server, or `.mcp.json`) and loads it with
//! `--dangerously-load-development-channels plugin:phone@phone` (or
//! `server:NAME`); it then tells the session, idle or not, when mail
//! arrives for the agent, as `notifications/claude/channel` events
//! (`announce`), from a watch on the agent's inbox on the phone server
//! (`watch`). It only peeks: the agent's own `phone_inbox` still gets every
//! message. It remembers what it announced per agent (`memory`), so a
//! restart announces nothing twice.
//!
//! Stdout carries the protocol only; every word for a person goes to
//! stderr, which Claude Code keeps in its MCP log.

mod announce;
mod memory;
mod server;
mod watch;

use rmcp::ServiceExt as _;

pub use server::{CAPABILITY, NOTIFICATION};

use crate::remote::{self, Env, Target};

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("{0}")]
    Setup(String),
    #[error("the MCP client did not start a session on stdin: {0}")]
    Handshake(String),
    #[error(
        "the phone server refused this agent's token ({0}): it was mistyped, rotated or revoked. \
         Run `phone login` with the agent's current token (or fix PHONE_TOKEN / the plugin's token option), \
         then restart Claude Code"
    )]
    TokenRefused(String),
}

/// Runs until Claude Code closes stdin or the token is refused.
pub async fn run(env: Env<'_>) -> Result<(), ChannelError> {
    let setup = |e: &dyn std::fmt::Display| ChannelError::Setup(e.to_string());
    let profile = remote::profile::load(env).map_err(|e| setup(&e))?;
    let target = Target::resolve(env, None, profile.as_ref()).map_err(|e| setup(&e))?;
    let token = target.token().map_err(|e| setup(&e))?.expose().to_owned();
    if let Some(warning) = remote::cleartext_warning(&target.mcp_url) {
        eprintln!("phone channel: {warning}");
    }
    let memory = remote::state_dir(env, "PHONE_CHANNEL_STATE_DIR")
        .map(|dir| memory::Memory::new(dir, &target.mcp_url, &token));
    if memory.is_none() {
        eprintln!(
            "phone channel: no state directory (HOME, XDG_STATE_HOME or PHONE_CHANNEL_STATE_DIR): \
             a restart may announce unread mail again"
        );
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        eprintln!(
            "phone channel speaks MCP on stdin and stdout: Claude Code starts it (see docs/CLAUDE-CODE.md)"
        );
    }

    let server = server::ChannelServer::new();
    let initialized = server.initialized.clone();
    let running = server
        .serve(rmcp::transport::io::stdio_pipes())
        .await
        .map_err(|e| ChannelError::Handshake(e.to_string()))?;
    let peer = running.peer().clone();
    let stop = running.cancellation_token();
    eprintln!(
        "phone channel: watching the inbox of {} at {}",
        target.name.as_deref().unwrap_or("this agent"),
        target.mcp_url
    );
    let mut watching = tokio::spawn(async move {
        // Events go out once the client finished its handshake (or after a
        // moment, for a client that never says so).
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(2), initialized.notified()).await;
        watch::run(target, memory, peer).await
    });
    tokio::select! {
        _ = running.waiting() => {
            // Claude Code closed stdin: the session is over.
            watching.abort();
            Ok(())
        }
        stopped = &mut watching => {
            stop.cancel();
            match stopped {
                Ok(watch::Stop::TokenRefused(challenge)) => Err(ChannelError::TokenRefused(challenge)),
                Ok(watch::Stop::ClientGone) | Err(_) => Ok(()),
            }
        }
    }
}
