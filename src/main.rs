use std::process::ExitCode;

use phone::{Application, Config, startup, telemetry};

// Every request allocates and frees many small buffers (JSON, HTTP, rows);
// glibc malloc took ~17% of the server's CPU under load (perf, make bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("admin") {
        return admin(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("hook") {
        return hook(&args[1..]).await;
    }
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

/// `phone admin …`: the operator's commands, against `DATABASE_URL`.
async fn admin(args: &[String]) -> ExitCode {
    let Some(url) = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!("phone admin: DATABASE_URL is not set");
        return ExitCode::from(2);
    };
    match phone::admin::run(&url, args).await {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(phone::admin::AdminError::Usage(text)) => {
            eprintln!("phone admin: {text}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("phone admin: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `phone hook …`: Claude Code hooks, talking to `PHONE_URL` as the agent
/// of `PHONE_TOKEN`. Reads the hook's JSON input from stdin.
async fn hook(args: &[String]) -> ExitCode {
    use tokio::io::AsyncReadExt as _;
    let mut stdin = String::new();
    // Claude Code always sends input; by hand there may be none (a terminal).
    if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        let _ = tokio::io::stdin()
            .take(1 << 20)
            .read_to_string(&mut stdin)
            .await;
    }
    let outcome = phone::hook::run(args, &stdin, &|key| std::env::var(key).ok()).await;
    print!("{}", outcome.stdout);
    eprint!("{}", outcome.stderr);
    ExitCode::from(outcome.code)
}
