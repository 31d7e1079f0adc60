//! A client of a phone server, as the hooks, the channel and the client
//! commands are: where the server is and who the agent is (`target`, from
//! the environment, a Claude Code plugin's options and the profile that
//! `phone login` writes), and MCP calls over HTTP (`connection`). Nothing of
//! the server runs here.

mod connection;
pub mod profile;
mod target;

pub use connection::{Connection, Lifecycle, RemoteError};
pub use profile::{Profile, ProfileError, Secret};
pub use target::{Source, Target, TargetError, cleartext_warning, same_server, server_url};

/// Reads one environment variable (a function, so that tests and the hooks
/// can pass their own environment).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Where a client keeps its small state files: `override_var`, else
/// `$XDG_STATE_HOME/phone`, else `~/.local/state/phone`.
pub fn state_dir(env: Env<'_>, override_var: &str) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    var(env, override_var)
        .map(PathBuf::from)
        .or_else(|| var(env, "XDG_STATE_HOME").map(|d| PathBuf::from(d).join("phone")))
        .or_else(|| var(env, "HOME").map(|h| PathBuf::from(h).join(".local/state/phone")))
}

/// `key` from `env`, trimmed, when it is set and not blank.
pub fn var(env: Env<'_>, key: &str) -> Option<String> {
    env(key)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A folder of the clients' state (the hooks', the channel's), readable by
/// its owner only: what they keep (ids of the agent's mail) is nobody
/// else's business on a shared machine.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to `file` through a temporary file beside it, readable by
/// its owner only, then renamed: a reader sees the old or the new content.
pub fn write_private(file: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    out.write_all(bytes)?;
    drop(out);
    std::fs::rename(&tmp, file)
}
