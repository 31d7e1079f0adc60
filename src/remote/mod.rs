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

/// A name or id the server sent, as the clients show it to a model: the
/// characters of agent names and ids only, each other one a `?`, at most 64
/// (a hostile server, or one in the middle of plain http, cannot smuggle
/// text through it).
pub fn shown_token(text: &str) -> String {
    let t: String = text
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '+') {
                c
            } else {
                '?'
            }
        })
        .collect();
    if t.is_empty() { "?".to_owned() } else { t }
}

/// `key` from `env`, trimmed, when it is set and not blank.
pub fn var(env: Env<'_>, key: &str) -> Option<String> {
    env(key)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A folder of the clients' state (the hooks', the channel's), readable by
/// its owner only: what they keep (ids of the agent's mail) is nobody
/// else's business on a shared machine. One that other users can write
/// (a shared folder named by `PHONE_HOOK_STATE_DIR`, say) is refused: they
/// could plant links where the client writes, or ids that silence its
/// announcements (an outsider's attack). One made before keeps its mode.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} can be written by other users (mode {mode:o}): the client keeps its state only in a folder only you can write; choose another, or `chmod go-w` it",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Writes `bytes` to `file` through a new temporary file beside it (a
/// name nobody can guess, never an existing file: no link planted there is
/// followed), readable by its owner only, then renamed over `file` (which
/// replaces a link there, never writes through it): a reader sees the old
/// or the new content.
pub fn write_private(file: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = file.with_extension(format!(
        "tmp{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut out = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = out.write_all(bytes).and_then(|()| {
        drop(out);
        std::fs::rename(&tmp, file)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("phone-remote-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_state_folder_others_can_write_is_refused() {
        let dir = scratch("shared");
        private_dir(&dir).unwrap();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = private_dir(&dir).unwrap_err();
        assert!(err.to_string().contains("written by other users"), "{err}");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn writing_state_replaces_a_link_and_never_writes_through_one() {
        let dir = scratch("links");
        private_dir(&dir).unwrap();
        let victim = dir.join("important.txt");
        std::fs::write(&victim, "keep").unwrap();
        let file = dir.join("channel-x.json");
        // Links where the client writes: its old temporary name, and the file.
        let old_tmp = file.with_extension(format!("tmp{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old_tmp).unwrap();
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        write_private(&file, b"[\"msg_1\"]").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(
            !std::fs::symlink_metadata(&file)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "[\"msg_1\"]");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
