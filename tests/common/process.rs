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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::env::temp_dir().join(format!("phone-log-{port}.txt"));
        let out = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_phone"));
        command
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("PORT", port.to_string())
            .env("PHONE_BIND", "127.0.0.1")
            .env("NO_COLOR", "1")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out));
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("the phone binary starts");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if reqwest::get(format!("{url}/health"))
                .await
                .is_ok_and(|r| r.status() == 200)
            {
                return Self { child, log, url };
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
