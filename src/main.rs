use std::process::ExitCode;

// Every request allocates and frees many small buffers (JSON, HTTP, rows);
// glibc malloc took ~17% of the server's CPU under load (perf, make bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
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
