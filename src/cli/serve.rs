//! `phone` / `phone serve`: the server, configured by the environment.

use std::process::ExitCode;

use crate::config::Config;
use crate::startup::{self, Application};
use crate::telemetry;

pub async fn serve() -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("phone: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let telemetry =
        match telemetry::TelemetryConfig::from_env(&config.log_filter, config.log_format)
            .and_then(telemetry::init_with)
        {
            Ok(telemetry) => telemetry,
            Err(e) => {
                eprintln!("phone: configuration error: {e}");
                return ExitCode::from(2);
            }
        };
    let app = match Application::build(&config).await {
        Ok(app) => app,
        Err(e) => {
            tracing::error!(error = %e, "startup failed");
            eprintln!("phone: startup failed: {e}");
            return ExitCode::from(1);
        }
    };
    tracing::info!(
        address = %app.local_addr(),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "phone listening; MCP endpoint at /mcp"
    );
    let outcome = match app.run_until(startup::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server error");
            ExitCode::FAILURE
        }
    };
    // Export what is still buffered (blocking: off the async workers).
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    outcome
}
