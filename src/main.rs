use std::process::ExitCode;

// Every request allocates and frees many small buffers (JSON, HTTP, rows);
// glibc malloc took ~17% of the server's CPU under load (perf, make bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    quiet_on_a_closed_pipe();
    let cli = phone::cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    // An invalid PHONE_WORKER_THREADS is refused by `serve`, which reads the
    // whole configuration; the other subcommands do not use it.
    if let Ok(Some(workers)) = phone::config::worker_threads_from_env() {
        runtime.worker_threads(workers);
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(phone::cli::run(cli)),
        Err(e) => {
            // 1, not 2: Claude Code reads a hook's 2 as "block this action".
            eprintln!("phone: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `phone inbox | head`: once the reader is gone, printing fails, and
/// `println!` panics with a stack trace. A command whose reader left has
/// nothing more to say: it ends quietly, with the status Unix tools end
/// with there (141: killed by SIGPIPE), not a success: `inbox --read` may
/// have marked mail read that nobody saw, and `set -o pipefail` must see it.
fn quiet_on_a_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}
