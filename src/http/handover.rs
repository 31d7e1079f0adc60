//! Mail a poll took belongs to its caller once the answer has left the
//! server: this layer gives each `/mcp` request a `Handover`, confirms it
//! when the response's last bytes are handed to the connection, and
//! abandons it (the mail goes back) when the response is dropped instead
//! (the client disconnected, the request timed out), or when the caller
//! turns out to have closed its end of the connection (`peer`).

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::{
    body::{Body, Bytes, HttpBody},
    extract::Request,
    middleware::Next,
    response::Response,
};

use crate::domain::{Hangup, handover::Handover};

/// Abandons the handover unless disarmed: the request's future was dropped
/// before it had a response.
struct Unanswered(Option<Arc<Handover>>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(handover) = self.0.take() {
            handover.abandon();
        }
    }
}

pub(super) async fn attach(mut req: Request, next: Next) -> Response {
    let handover = Arc::new(Handover::default());
    req.extensions_mut().insert(handover.clone());
    let hangup = req.extensions().get::<Arc<dyn Hangup>>().cloned();
    let mut unanswered = Unanswered(Some(handover.clone()));
    let response = next.run(req).await;
    unanswered.0 = None;
    response.map(|body| {
        Body::new(Delivering {
            body,
            handover: Some(handover),
            hangup,
        })
    })
}

/// A response body that confirms the handover once its last frame was
/// taken by the connection, and abandons it when dropped before that.
struct Delivering {
    body: Body,
    /// `None` once confirmed.
    handover: Option<Arc<Handover>>,
    /// The caller's connection, asked before mail is confirmed as
    /// delivered (`http::peer`).
    hangup: Option<Arc<dyn Hangup>>,
}

impl HttpBody for Delivering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        let done = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.body.is_end_stream(),
            _ => false,
        };
        if done && let Some(handover) = self.handover.take() {
            // Its caller closed the connection and will never read this
            // answer: what the poll took goes back, and the answer fails.
            if handover.holds_mail() && self.hangup.as_ref().is_some_and(|h| h.hung_up()) {
                handover.abandon();
                return Poll::Ready(Some(Err(axum::Error::new(
                    "the caller closed its connection before its answer",
                ))));
            }
            handover.confirm();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Delivering {
    fn drop(&mut self) {
        if let Some(handover) = self.handover.take() {
            handover.abandon();
        }
    }
}
