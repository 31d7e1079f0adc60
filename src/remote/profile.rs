//! The profile: the server, the agent's name and its token, saved by
//! `phone register` / `phone login` in the user's config directory
//! (`$XDG_CONFIG_HOME/phone/profile.json`, else `~/.config/phone/…`),
//! readable by the user only: the directory is 0700, the file 0600, and a
//! file that others can read is refused rather than used.

use std::fmt;
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Env, var};

/// A token: never shown by `Debug`, only by [`Secret::expose`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into().trim().to_owned())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// The server, as given (its root or its /mcp endpoint).
    pub url: String,
    /// The agent's name.
    pub name: String,
    pub token: Secret,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "no place for the profile: neither XDG_CONFIG_HOME nor HOME is set (or set PHONE_URL and PHONE_TOKEN instead)"
    )]
    NoConfigDir,
    #[error(
        "{path} can be read by other users (mode {mode:o}); it holds a token: `chmod 600 {path}` (or delete it and run phone login)"
    )]
    Exposed { path: String, mode: u32 },
    #[error("{path} is not a phone profile ({detail}); delete it and run phone login")]
    Unreadable { path: String, detail: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Where the profile lives, from `XDG_CONFIG_HOME` or `HOME`.
pub fn path(env: Env<'_>) -> Option<PathBuf> {
    var(env, "XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var(env, "HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|dir| dir.join("phone").join("profile.json"))
}

/// The saved profile; `None` when there is none.
pub fn load(env: Env<'_>) -> Result<Option<Profile>, ProfileError> {
    let Some(path) = path(env) else {
        return Ok(None);
    };
    load_from(&path)
}

fn load_from(path: &Path) -> Result<Option<Profile>, ProfileError> {
    let shown = path.display().to_string();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ProfileError::Unreadable {
                path: shown,
                detail: e.to_string(),
            });
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ProfileError::Exposed { path: shown, mode });
    }
    let bytes = std::fs::read(path).map_err(|e| ProfileError::Unreadable {
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ProfileError::Unreadable {
            path: shown,
            detail: e.to_string(),
        })
}

/// Saves `profile` (replacing any), owner-only; returns where.
pub fn save(env: Env<'_>, profile: &Profile) -> Result<PathBuf, ProfileError> {
    let path = path(env).ok_or(ProfileError::NoConfigDir)?;
    let write_error = |source| ProfileError::Write {
        path: path.display().to_string(),
        source,
    };
    let dir = path.parent().ok_or(ProfileError::NoConfigDir)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(write_error)?;
    // The directory is ours: tighten it if it was made by hand.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(write_error)?;
    let tmp = dir.join(format!(".profile.json.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        // Created 0600: the token is never readable by others, not even
        // for the moment between writing and renaming.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&serde_json::to_vec_pretty(profile)?)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(write_error(e));
    }
    Ok(path)
}

/// Deletes the profile; false when there was none.
pub fn remove(env: Env<'_>) -> Result<bool, ProfileError> {
    let path = path(env).ok_or(ProfileError::NoConfigDir)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(ProfileError::Write {
            path: path.display().to_string(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let p = Profile {
            url: "https://p.example".into(),
            name: "bob".into(),
            token: Secret::new("phn_secret"),
        };
        assert!(!format!("{p:?}").contains("phn_secret"));
    }

    #[test]
    fn the_config_dir_comes_from_xdg_or_home() {
        let xdg = |k: &str| (k == "XDG_CONFIG_HOME").then(|| "/x".to_owned());
        assert_eq!(path(&xdg).unwrap(), PathBuf::from("/x/phone/profile.json"));
        let home = |k: &str| (k == "HOME").then(|| "/h".to_owned());
        assert_eq!(
            path(&home).unwrap(),
            PathBuf::from("/h/.config/phone/profile.json")
        );
        assert!(path(&|_| None).is_none());
    }
}
