//! What a poll took stays the caller's only once its answer has left the
//! server. Until then it is held here: the HTTP layer confirms it when the
//! response's last bytes were handed to the connection, and gives it back
//! (unread, lease released) when the response was dropped instead (the
//! caller disconnected, the request timed out) — also when that happened
//! before the poll even finished.

use std::sync::Mutex;

use crate::store::{Polled, Store};

enum State {
    /// Nothing taken yet.
    Open,
    /// Taken, its answer on the way.
    Held(Store, Polled),
    /// The answer left the server: nothing to do.
    Confirmed,
    /// The answer will never leave: whatever is taken goes back at once.
    Abandoned,
}

/// One request's taken mail, until its answer has left (see the module).
pub struct Handover(Mutex<State>);

impl Default for Handover {
    fn default() -> Self {
        Self(Mutex::new(State::Open))
    }
}

impl Handover {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The poll took `polled`; its answer is about to go out.
    pub(crate) fn hold(&self, store: &Store, polled: Polled) {
        let mut state = self.state();
        match *state {
            State::Open => *state = State::Held(store.clone(), polled),
            // The request is gone already: nobody will read this answer.
            State::Abandoned => give_back(store.clone(), polled),
            State::Held(..) | State::Confirmed => {}
        }
    }

    /// A poll took mail and handed it to this request's answer.
    pub fn holds_mail(&self) -> bool {
        matches!(*self.state(), State::Held(..))
    }

    /// The answer's last bytes were handed to the connection.
    pub fn confirm(&self) {
        let previous = std::mem::replace(&mut *self.state(), State::Confirmed);
        if let State::Held(_, polled) = previous {
            tracing::debug!(
                messages = polled.messages.len(),
                "a poll's answer left the server"
            );
        }
    }

    /// The answer will not go out: give back what was taken.
    pub fn abandon(&self) {
        let previous = std::mem::replace(&mut *self.state(), State::Abandoned);
        match previous {
            State::Held(store, polled) => give_back(store, polled),
            State::Confirmed => *self.state() = State::Confirmed,
            State::Open | State::Abandoned => {}
        }
    }
}

fn give_back(store: Store, polled: Polled) {
    // Off every request's path, retried until it lands.
    store.give_back(polled);
}
