//! Whether a caller's connection was closed at its far end, asked of the
//! socket itself. hyper stops watching a connection for its close while
//! unread input waits on it (a pipelined second request, even a stray line
//! break): a long poll whose caller left that way went on waiting, and the
//! mail that woke it was taken for nobody (read, or leased until it died of
//! max_deliveries; an outsider's attack). The answer's handover asks here
//! before it confirms what a poll took (`handover::Delivering`).

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{Arc, Weak},
};

/// A connection's socket, for as long as the connection is served: a
/// duplicate of its descriptor, closed with the connection.
pub(super) struct Peer(Arc<OwnedFd>);

/// What a request keeps of its connection's [`Peer`]: the socket while the
/// connection lasts.
#[derive(Clone)]
pub(super) struct PeerProbe(Weak<OwnedFd>);

impl Peer {
    /// `None` when the descriptor cannot be duplicated (out of
    /// descriptors): the connection is served without the check.
    pub(super) fn of(socket: &impl AsFd) -> Option<Self> {
        match socket.as_fd().try_clone_to_owned() {
            Ok(fd) => Some(Self(Arc::new(fd))),
            Err(e) => {
                tracing::debug!(error = %e, "no duplicate of a connection's socket");
                None
            }
        }
    }

    pub(super) fn probe(&self) -> PeerProbe {
        PeerProbe(Arc::downgrade(&self.0))
    }
}

impl PeerProbe {
    /// The caller closed its end (or reset it), or the connection is over.
    /// A client that shuts down only its sending side counts as gone, as
    /// hyper treats it when no input waits (half-closes are off).
    pub(super) fn hung_up(&self) -> bool {
        let Some(fd) = self.0.upgrade() else {
            return true;
        };
        hung_up(&fd)
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn hung_up(fd: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut fds = [PollFd::new(fd, PollFlags::RDHUP)];
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

/// Elsewhere there is no way to see a close past unread input: the
/// connection counts as open.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn hung_up(_: &OwnedFd) -> bool {
    false
}
