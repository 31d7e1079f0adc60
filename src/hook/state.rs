//! What the stop hook blocked for last time, per Claude Code session and
//! agent: one small JSON file, replaced atomically.

use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub struct Memory {
    file: PathBuf,
}

impl Memory {
    /// None without a session id or a state directory: nothing to key on.
    pub fn open(
        env: &dyn Fn(&str) -> Option<String>,
        session_id: Option<&str>,
        token: &str,
    ) -> Option<Memory> {
        let session = session_id.filter(|s| !s.is_empty())?;
        let dir = super::state_dir(env)?;
        // Hashed: the file name shows neither the session nor the token.
        let mut key = Sha256::new();
        key.update(session.as_bytes());
        key.update([0]);
        key.update(token.as_bytes());
        let key = key.finalize();
        let name: String = key[..12].iter().map(|b| format!("{b:02x}")).collect();
        Some(Memory {
            file: dir.join(format!("claude-stop-{name}.json")),
        })
    }

    /// The ids blocked for last time; empty when unknown or unreadable, or
    /// kept in a folder other users can write (their ids would silence it).
    pub fn load(&self) -> BTreeSet<String> {
        let dir = self.file.parent().unwrap_or(self.file.as_path());
        if crate::remote::private_dir(dir).is_err() {
            return BTreeSet::new();
        }
        std::fs::read(&self.file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    pub fn save(&self, ids: &BTreeSet<String>) -> io::Result<()> {
        let dir = self.file.parent().unwrap_or(self.file.as_path());
        crate::remote::private_dir(dir)?;
        crate::remote::write_private(&self.file, &serde_json::to_vec(ids)?)
    }
}
