//! The real `phone` binary as a child process, for what only a process
//! shows: its log output, signals.

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::Duration,
};

/// The server binary on a free port with `env`, its output to a file.
pub struct Process {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
    pub url: String,
}

impl Process {
    pub async fn start(database_url: &str, env: &[(&str, &str)]) -> Self {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("phone-log-{}-{n}.txt", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_phone"));
        // Port 0: the server binds a free port itself and logs it. A port
        // found free here and bound by the child seconds later (after its
        // migrations) could be taken meanwhile by a test running beside.
        command
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("PORT", "0")
            .env("PHONE_BIND", "127.0.0.1")
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out));
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the phone binary starts");
        let mut url = None;
        for _ in 0..200 {
            if url.is_none() {
                url = listening_on(&log);
            }
            if let Some(url) = &url
                && reqwest::get(format!("{url}/health"))
                    .await
                    .is_ok_and(|r| r.status() == 200)
            {
                let url = url.clone();
                return Self { child, log, url };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut text = String::new();
                let _ = std::fs::File::open(&log).map(|mut f| f.read_to_string(&mut text));
                panic!("the server exited ({status}): {text}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the server did not become healthy");
    }

    pub fn stop(mut self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let mut text = String::new();
        std::fs::File::open(&self.log)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        let _ = std::fs::remove_file(&self.log);
        text
    }
}

/// The server's URL, once its log says where it listens.
fn listening_on(log: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    let port = text.lines().find_map(listening_port)?;
    Some(format!("http://127.0.0.1:{port}"))
}

/// The port of the server's "phone listening" log line (started with
/// `PORT=0`, it binds a free port itself), in either log format:
/// `address=127.0.0.1:N` or `"address":"127.0.0.1:N"`.
pub fn listening_port(line: &str) -> Option<u16> {
    if !line.contains("phone listening") {
        return None;
    }
    let at = line.find("127.0.0.1:")? + "127.0.0.1:".len();
    let port: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    port.parse().ok()
}
