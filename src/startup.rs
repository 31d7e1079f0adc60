//! Building and running the application: the composition root that hands
//! each layer its settings. Migrate, open the store, bind, serve, and shut
//! down gracefully.

use std::{future::Future, net::SocketAddr, time::Duration};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    config::Config,
    domain::{
        Phone,
        limits::Limits,
        messages::{ANSWER_BYTES_MAX, UNREAD_COUNT_CAP},
        webhook::Resolver,
    },
    http::{self, serve::ConnectionLimits},
    store::{self, Store},
};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    phone: Phone,
    grace: Duration,
    /// Ends long polls and the notification listener at shutdown.
    stopping: CancellationToken,
    connection_limits: ConnectionLimits,
}

impl Application {
    pub async fn build(config: &Config) -> Result<Self, StartupError> {
        for warning in &config.warnings {
            tracing::warn!("{warning}");
        }
        store::wait_for_database(&config.store).await?;
        store::migrate_with(&config.store).await?;
        let stopping = CancellationToken::new();
        let store = Store::open(
            &config.store,
            UNREAD_COUNT_CAP,
            ANSWER_BYTES_MAX,
            config.quotas,
            stopping.clone(),
        )?;
        if let Err(e) = store.check_sync_standby_guard().await {
            stopping.cancel();
            return Err(e.into());
        }
        let limits = Limits::new(config.auth_failure_limit, config.register_limit);
        tokio::spawn(store::prune::run(
            store.clone(),
            stopping.clone(),
            store::prune::retention(config.retention_days),
        ));
        tokio::spawn(store::prune::expire_run(store.clone(), stopping.clone()));
        let resolver = Resolver::new(&config.dns_servers, config.dns_timeout);
        tokio::spawn(crate::webhooks::run(
            store.clone(),
            config.webhooks.clone(),
            resolver.clone(),
            stopping.clone(),
        ));
        let phone = Phone::new(store, stopping.clone(), limits, config.mail, resolver);
        let addr = SocketAddr::new(config.bind_address, config.port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartupError::Bind { addr, source })?;
        Ok(Self {
            router: http::router(&config.http, phone.clone()),
            listener,
            phone,
            grace: config.shutdown_grace,
            stopping,
            connection_limits: config.connections,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("bound listener has an address")
    }

    /// Serves until `shutdown` resolves, then stops accepting, gives requests
    /// in flight up to the grace period, and closes the pool.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = CancellationToken::new();
        let serving = tokio::spawn(http::serve::serve(
            self.listener,
            self.router,
            self.connection_limits,
            stop.clone(),
            self.grace,
        ));
        shutdown.await;
        tracing::info!(
            grace_secs = self.grace.as_secs(),
            "shutting down: finishing requests in flight"
        );
        stop.cancel();
        // Long polls return at once instead of holding the drain.
        self.stopping.cancel();
        let outcome = serving.await.map_err(std::io::Error::other);
        // Statements in flight finish, and polls whose callers left give
        // their mail back, before the pool closes.
        self.phone.store().close(self.grace).await;
        outcome
    }
}

/// Resolves on SIGTERM (what Railway and docker send) or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
