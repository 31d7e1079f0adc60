//! Whether a caller's connection was closed at its far end, asked of the
//! socket itself. hyper stops watching a connection for its close while
//! unread input waits on it (a pipelined second request, even a stray line
//! break): a long poll whose caller left that way went on waiting, and the
//! mail that woke it was taken for nobody (read, or leased until it died of
//! max_deliveries; an outsider's attack). The answer's handover asks here
//! before it confirms what a poll took (`handover::Delivering`).
//!
//! Behind a proxy that speaks HTTP to the replica (nginx, an edge), the
//! peer is the proxy, which does not pipeline: hyper sees its close by
//! itself, and this check finds nothing more.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::{Arc, RwLock, Weak},
};

/// A connection's socket descriptor, for as long as the socket is open:
/// `StallGuard` holds it ahead of the socket, so it is cleared (under the
/// lock) before the descriptor closes, and no probe can ask a descriptor
/// number that a later connection reuses.
pub(super) struct Peer(Arc<RwLock<Option<RawFd>>>);

/// What the connection's requests keep of its [`Peer`].
pub(super) struct PeerProbe(Weak<RwLock<Option<RawFd>>>);

impl Peer {
    pub(super) fn of(socket: &impl AsRawFd) -> Self {
        Self(Arc::new(RwLock::new(Some(socket.as_raw_fd()))))
    }

    pub(super) fn probe(&self) -> PeerProbe {
        PeerProbe(Arc::downgrade(&self.0))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Waits for a probe asking right now; none asks after this.
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl crate::domain::Hangup for PeerProbe {
    /// The caller closed its end (or reset it), or the connection is over.
    /// A client that shuts down only its sending side counts as gone, as
    /// hyper treats it when no input waits (half-closes are off in
    /// `serve`).
    fn hung_up(&self) -> bool {
        let Some(slot) = self.0.upgrade() else {
            return true;
        };
        let fd = slot.read().unwrap_or_else(|p| p.into_inner());
        match *fd {
            Some(fd) => hung_up(fd),
            None => true,
        }
    }
}

/// `poll` with `POLLRDHUP` and no wait. The caller holds the slot's read
/// lock, so the descriptor is open (see [`Peer`]).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn hung_up(fd: RawFd) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    // SAFETY: the descriptor stays open while the slot's read lock is
    // held: `Peer` clears the slot under the write lock before the socket
    // it belongs to is closed (it is dropped ahead of the socket).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::RDHUP)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&now)) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
        Err(_) => false,
    }
}

/// Not built elsewhere (kqueue's `EV_EOF` would see it): the connection
/// counts as open, as hyper sees it.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn hung_up(_: RawFd) -> bool {
    false
}
