//! What the channel already announced, per agent (server and token), in a
//! small file, so that a restart announces nothing twice. Two channels of
//! one agent (two Claude Code sessions) share it: a lock file serialises
//! their look-and-announce, so one message wakes one session, once.
//!
//! Bounded: once a look has seen the whole unread backlog, ids that are no
//! longer unread are forgotten (read mail does not come back; a lease that
//! ran out does, and is announced again: it is waiting again), and never
//! more than [`KEPT_MAX`] ids are kept.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The most ids kept, newest first.
pub const KEPT_MAX: usize = 2000;
/// How long a look waits for another channel of the same agent: longer
/// than a look holds the lock (a peek, 10 s at most, then up to three
/// notifications of 10 s at most each), so that only a channel that hangs
/// outside its own timeouts is passed by. One that went on unlocked saved
/// its view over the other's, and a message was announced twice.
const LOCK_WAIT: Duration = Duration::from_secs(45);

pub struct Memory {
    file: PathBuf,
}

/// The memory, locked against the agent's other channels until dropped.
pub struct Locked<'a> {
    memory: &'a Memory,
    _lock: Option<File>,
}

impl Memory {
    /// The memory of the agent holding `token` on the server at `mcp_url`,
    /// in `dir`.
    pub fn new(dir: PathBuf, mcp_url: &str, token: &str) -> Self {
        // Hashed: the file name shows neither the server nor the token.
        let mut key = Sha256::new();
        key.update(mcp_url.as_bytes());
        key.update([0]);
        key.update(token.as_bytes());
        let key = key.finalize();
        let name: String = key[..12].iter().map(|b| format!("{b:02x}")).collect();
        Self {
            file: dir.join(format!("channel-{name}.json")),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.file
    }

    /// Locks the memory (waiting for another channel of the same agent up
    /// to a few seconds; then it goes on unlocked rather than stall).
    pub async fn lock(&self) -> io::Result<Locked<'_>> {
        let dir = self.file.parent().unwrap_or(self.file.as_path());
        crate::remote::private_dir(dir)?;
        let lock = {
            use std::os::unix::fs::OpenOptionsExt as _;
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(self.file.with_extension("lock"))?
        };
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        loop {
            match lock.try_lock() {
                Ok(()) => {
                    return Ok(Locked {
                        memory: self,
                        _lock: Some(lock),
                    });
                }
                Err(std::fs::TryLockError::WouldBlock)
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Ok(Locked {
                        memory: self,
                        _lock: None,
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

impl Locked<'_> {
    /// The ids announced so far; empty when unknown or unreadable.
    pub fn load(&self) -> BTreeSet<String> {
        std::fs::read(&self.memory.file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Replaces the ids, keeping the newest [`KEPT_MAX`].
    pub fn save(&self, ids: &BTreeSet<String>) -> io::Result<()> {
        let mut kept: Vec<&String> = ids.iter().collect();
        kept.sort_by_key(|id| std::cmp::Reverse(number(id)));
        kept.truncate(KEPT_MAX);
        crate::remote::write_private(&self.memory.file, &serde_json::to_vec(&kept)?)
    }
}

/// A message id's number (`msg_12` → 12), for keeping the newest.
fn number(id: &str) -> i64 {
    id.strip_prefix("msg_")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn it_keeps_the_newest_ids_and_survives_a_new_process() {
        let dir = std::env::temp_dir().join(format!("phone-memory-{:016x}", rand::random::<u64>()));
        let memory = Memory::new(dir.clone(), "http://x/mcp", "phn_t");
        let ids: BTreeSet<String> = (1..=KEPT_MAX + 5).map(|i| format!("msg_{i}")).collect();
        memory.lock().await.unwrap().save(&ids).unwrap();
        let again = Memory::new(dir.clone(), "http://x/mcp", "phn_t");
        let loaded = again.lock().await.unwrap().load();
        assert_eq!(loaded.len(), KEPT_MAX);
        assert!(loaded.contains(&format!("msg_{}", KEPT_MAX + 5)));
        assert!(!loaded.contains("msg_5"));
        let other = Memory::new(dir.clone(), "http://x/mcp", "phn_other");
        assert!(other.lock().await.unwrap().load().is_empty(), "per agent");
        assert!(!other.path().to_string_lossy().contains("phn_"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
