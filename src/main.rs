use std::process::ExitCode;

use phone::{Application, Config, startup, telemetry};

// Every request allocates and frees many small buffers (JSON, HTTP, rows);
// glibc malloc took ~17% of the server's CPU under load (perf, make bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
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
    tracing::info!(address = %app.local_addr(), "phone listening; MCP endpoint at /mcp");
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
