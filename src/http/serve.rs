//! The accept loop. `axum::serve` has no timer, so it never times out a
//! client that sends its headers slowly or keeps an idle connection forever;
//! this loop serves HTTP/1.1 through hyper with a header-read timeout (which
//! also closes idle keep-alive connections), a cap on open connections, and a
//! graceful drain at shutdown.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, extract::ConnectInfo};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; further clients wait in the listen backlog.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers, how
    /// long an idle keep-alive connection stays open, and how long an answer
    /// may wait for a client that reads none of it (`stall`).
    pub idle_timeout: Duration,
}

/// Serves until `stop` is cancelled, then stops accepting and lets the
/// connections finish their requests for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
    grace: Duration,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    // Half-closes stay off (hyper's default): a client that closes its
    // sending side is gone, here and in `peer`, which must agree.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .keep_alive(true);

    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("semaphore is never closed"),
            _ = stop.cancelled() => break,
        };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors or a connection reset before accept:
                    // keep serving the others instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let stream = super::stall::StallGuard::new(stream, limits.idle_timeout);
        // Asked by the answer before it confirms mail, and by a long poll
        // before each look (one per connection; each request shares it).
        let hangup: Arc<dyn crate::domain::Hangup> = Arc::new(stream.peer());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request
                .extensions_mut()
                .insert(ConnectInfo::<SocketAddr>(remote));
            request.extensions_mut().insert(hangup.clone());
            router.clone().oneshot(request)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, %remote, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; dropping remaining connections");
    }
}
