//! How much of a replica the console may use at once. Its pages are for
//! people and can be opened in many tabs; the pool's connections are the
//! agents' mail first. So console requests run at most half the pool's size
//! at a time on a replica, and at most two per browser session, so ten tabs
//! of one mailbox wait for each other, not for everyone else's mail.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Body,
    extract::Request,
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse as _, Response},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{guard, pages::problem};

/// Console requests of one session (its cookie) running at once.
const PER_SESSION: usize = 2;
/// The sign-in forms' routes, as the nested router sees them (exactly:
/// `/messages/sign-in` is no sign-in).
const SIGN_INS: [&str; 2] = ["/sign-in", "/operator/sign-in"];
/// How long a request waits for its turn before "busy".
const WAIT: Duration = Duration::from_secs(10);

pub struct Gate {
    all: Arc<Semaphore>,
    sessions: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Gate {
    /// A gate for a replica whose pool holds `pool_size` connections.
    pub fn new(pool_size: usize) -> Self {
        Self {
            all: Arc::new(Semaphore::new((pool_size / 2).max(1))),
            sessions: Mutex::default(),
        }
    }

    fn session(&self, key: &str) -> Arc<Semaphore> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        // Sessions nobody is waiting on are forgotten, so the map holds
        // only the sessions with requests in flight.
        if sessions.len() > 1024 {
            sessions.retain(|_, s| Arc::strong_count(s) > 1);
        }
        sessions
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(PER_SESSION)))
            .clone()
    }

    async fn enter(&self, session: Option<&str>) -> Option<Vec<OwnedSemaphorePermit>> {
        let mut permits = Vec::with_capacity(2);
        let wait = async {
            // The session's turn first: a session's own queue never holds
            // a slot of the replica's share while it waits.
            if let Some(key) = session {
                permits.push(self.session(key).acquire_owned().await.ok()?);
            }
            permits.push(self.all.clone().acquire_owned().await.ok()?);
            Some(())
        };
        tokio::time::timeout(WAIT, wait).await.ok()??;
        Some(permits)
    }
}

/// The middleware: reads the request's body, then waits for the request's
/// turn, or answers 503.
pub async fn admit(gate: Arc<Gate>, req: Request, next: Next) -> Response {
    // Stylesheet and icon touch no database; a sign-in costs what a tool
    // call does (a token's look-up), and an over-the-limit one waits a
    // second: in the gate, a guesser's waits held everyone's slots.
    let path = req.uri().path();
    if path.contains("/assets/") || SIGN_INS.contains(&path) {
        return next.run(req).await;
    }
    // The whole body first: a client that sends a form's headers and then
    // nothing held a slot until the request timed out (five such
    // connections made the console "busy" for everyone on the replica).
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => Body::from(bytes),
        Err(e) => return unreadable(&e),
    };
    let req = Request::from_parts(parts, body);
    let session = guard::session_cookie(req.headers()).map(str::to_owned);
    match gate.enter(session.as_deref()).await {
        Some(_permits) => next.run(req).await,
        None => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Busy",
            "The console is busy on this server; reload the page in a moment.",
        ),
    }
}

/// The answer for a body that could not be read: over the server's limit
/// (`PHONE_MAX_BODY_BYTES`: a 413, which the console's body-limit layer
/// turns into its "Too long" page, as for one that declares its length),
/// or broken off.
fn unreadable(e: &axum::Error) -> Response {
    if e.to_string().contains("length limit") {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    problem(
        StatusCode::BAD_REQUEST,
        "Incomplete request",
        "The form did not arrive whole; send it again.",
    )
}
