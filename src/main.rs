use std::process::ExitCode;

// Every request allocates and frees many small buffers (JSON, HTTP, rows);
// glibc malloc took ~17% of the server's CPU under load (perf, make bench).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = phone::cli::parse();
    phone::cli::run(cli).await
}
