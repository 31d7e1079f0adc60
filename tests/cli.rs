//! The command line, run as a person runs it: the `phone` binary with its
//! own config directory and nothing else of this process's environment,
//! against a real server. The profile is the user's only, and no command
//! prints a token except `register`, once.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// A home of its own: `XDG_CONFIG_HOME` and `XDG_STATE_HOME` inside it.
struct Home(PathBuf);

impl Home {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("phone-cli-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn profile(&self) -> PathBuf {
        self.0.join("config/phone/profile.json")
    }

    async fn run(&self, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Ran {
        run_in(Some(&self.0), args, env, stdin).await
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn run_in(home: Option<&Path>, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Ran {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_phone"));
    command.args(args).env_clear();
    if let Some(home) = home {
        command
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("XDG_STATE_HOME", home.join("state"));
    }
    let mut child = command
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the phone binary runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the command finishes")
        .unwrap();
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn register_saves_an_owner_only_profile_and_no_other_command_shows_the_token() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "receives", "q").await;
    let home = Home::new();
    let url = app.url("");

    let reg = home
        .run(
            &[
                "register",
                "alice",
                "-d",
                "Sends reports",
                "-p",
                "demo",
                "--url",
                &url,
            ],
            &[],
            "",
        )
        .await;
    assert_eq!(reg.code, 0, "{}", reg.all());
    let profile: Value = serde_json::from_slice(&std::fs::read(home.profile()).unwrap()).unwrap();
    let token = profile["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("phn_"));
    assert_eq!(
        reg.all().matches(&token).count(),
        1,
        "shown once: {}",
        reg.all()
    );
    assert!(reg.stdout.contains("Saved it in"), "{}", reg.stdout);
    assert_eq!(profile["name"], "alice");
    assert_eq!(
        mode(&home.profile()),
        0o600,
        "the profile is the user's only"
    );
    assert_eq!(mode(home.profile().parent().unwrap()), 0o700);

    // A second register would lose that token: refused unless --force.
    let again = home
        .run(
            &["register", "alice2", "-d", "x", "-p", "demo", "--url", &url],
            &[],
            "",
        )
        .await;
    assert_eq!(again.code, 2, "{}", again.all());
    assert!(again.stderr.contains("phone logout"), "{}", again.stderr);

    let mut outputs = Vec::new();
    let who = home.run(&["whoami"], &[], "").await;
    assert_eq!(who.code, 0, "{}", who.all());
    assert!(
        who.stdout
            .contains("agent:  alice (token from the profile)"),
        "{}",
        who.stdout
    );
    assert!(who.stdout.contains("accepted"), "{}", who.stdout);
    outputs.push(who);
    let sent = home
        .run(
            &["send", "bob", "hello from the terminal", "-s", "hi"],
            &[],
            "",
        )
        .await;
    assert_eq!(sent.code, 0, "{}", sent.all());
    assert!(sent.stdout.starts_with("Sent msg_"), "{}", sent.stdout);
    outputs.push(sent);
    let piped = home.run(&["send", "bob"], &[], "a body from stdin\n").await;
    assert_eq!(piped.code, 0, "{}", piped.all());
    outputs.push(piped);
    let found = home.run(&["search", "reports"], &[], "").await;
    assert!(
        found
            .stdout
            .contains("alice  (project demo)  Sends reports"),
        "{}",
        found.all()
    );
    outputs.push(found);
    outputs.push(home.run(&["inbox"], &[], "").await);
    outputs.push(home.run(&["inbox", "--json"], &[], "").await);
    outputs.push(home.run(&["search", "--json"], &[], "").await);
    outputs.push(home.run(&["--help"], &[], "").await);
    // A login prints nothing of the token it was given.
    let other = Home::new();
    let login = other
        .run(
            &["login", "--name", "bob", "--url", &url],
            &[],
            &format!("{}\n", bob.token),
        )
        .await;
    assert_eq!(login.code, 0, "{}", login.all());
    assert!(!login.all().contains(&bob.token), "{}", login.all());
    assert_eq!(mode(&other.profile()), 0o600);
    outputs.push(login);
    for ran in &outputs {
        assert!(
            !ran.all().contains(&token),
            "a token in the output: {}",
            ran.all()
        );
    }
    let received = ok(&c, "phone_inbox", bob.with(json!({}))).await;
    let bodies: Vec<&str> = received["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["hello from the terminal", "a body from stdin\n"]);

    let out = home.run(&["logout"], &[], "").await;
    assert_eq!(out.code, 0);
    assert!(!home.profile().exists());
}

#[tokio::test]
async fn the_inbox_peeks_unless_asked_to_read_and_hostile_text_cannot_drive_the_terminal() {
    let app = spawn_app().await;
    let c = app.client().await;
    let mallory = register(&c, "mallory", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    let escape = "hi\u{1b}]0;pwned\u{7}\u{1b}[2J\u{202E}gnp.exe";
    ok(
        &c,
        "phone_send",
        mallory.with(
            json!({"to": "bob", "subject": "gnp.exe", "body": format!("line one\n{escape}")}),
        ),
    )
    .await;
    // A subject stored before the server refused hidden characters in one
    // (or served by a hostile server): the client replaces them all the same.
    app.db()
        .await
        .execute("UPDATE messages SET subject = $1", &[&"\u{202E}gnp.exe"])
        .await
        .unwrap();
    let home = Home::new();
    let env = [
        ("PHONE_URL", app.url("")),
        ("PHONE_TOKEN", bob.token.clone()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let peek = home.run(&["inbox"], &env, "").await;
    assert_eq!(peek.code, 0, "{}", peek.all());
    assert!(
        peek.stdout.contains("from mallory (project p)"),
        "{}",
        peek.stdout
    );
    assert!(peek.stdout.contains("    line one"), "{}", peek.stdout);
    assert!(
        !peek.stdout.contains(['\u{1b}', '\u{7}', '\u{202E}']),
        "escape sequences reach the terminal: {:?}",
        peek.stdout
    );
    assert!(
        peek.stdout.contains("nothing was marked read"),
        "{}",
        peek.stdout
    );
    assert!(!peek.all().contains(&bob.token));
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE read_at IS NULL")
            .await,
        1,
        "a person looking does not consume the agent's mail"
    );

    let read = home.run(&["inbox", "--read"], &env, "").await;
    assert_eq!(read.code, 0, "{}", read.all());
    assert!(
        read.stdout.contains("Marked 1 message(s) read"),
        "{}",
        read.stdout
    );
    assert_eq!(
        app.count("SELECT count(*) FROM messages WHERE read_at IS NULL")
            .await,
        0
    );
    let empty = home.run(&["inbox"], &env, "").await;
    assert!(empty.stdout.contains("No unread mail"), "{}", empty.stdout);
}

#[tokio::test]
async fn a_wrong_token_or_an_exposed_profile_is_refused_with_a_clear_message() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "receives", "q").await;
    let home = Home::new();
    let url = app.url("");
    let wrong = "phn_0000000000000000000000000000000000000000000";
    let login = home
        .run(
            &["login", "--name", "bob", "--url", &url],
            &[],
            &format!("{wrong}\n"),
        )
        .await;
    assert_eq!(login.code, 1, "{}", login.all());
    assert!(
        login.stderr.contains("refused the token"),
        "{}",
        login.stderr
    );
    assert!(!home.profile().exists(), "nothing saved");
    // A name that is not the token's agent: refused too.
    let mismatch = home
        .run(
            &["login", "--name", "someone-else", "--url", &url],
            &[],
            &bob.token,
        )
        .await;
    assert_eq!(mismatch.code, 1, "{}", mismatch.all());
    assert!(!home.profile().exists());

    let login = home
        .run(&["login", "--name", "bob", "--url", &url], &[], &bob.token)
        .await;
    assert_eq!(login.code, 0, "{}", login.all());
    std::fs::set_permissions(home.profile(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let exposed = home.run(&["whoami"], &[], "").await;
    assert_eq!(exposed.code, 1, "{}", exposed.all());
    assert!(exposed.stderr.contains("chmod 600"), "{}", exposed.stderr);
    assert!(!exposed.all().contains(&bob.token));

    let nothing = run_in(None, &["whoami"], &[], "").await;
    assert_eq!(nothing.code, 2);
    assert!(
        nothing.stderr.contains("PHONE_URL is not set"),
        "{}",
        nothing.stderr
    );
}

#[tokio::test]
async fn plain_http_to_another_host_is_warned_about_by_every_client() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "receives", "q").await;
    // 0.0.0.0 reaches this machine, but it is not a loopback name: the
    // clients cannot know the traffic stays here.
    let far = format!("http://0.0.0.0:{}", app.addr.port());
    let near = app.url("");
    let home = Home::new();
    for (url, warned) in [(far.as_str(), true), (near.as_str(), false)] {
        let env = [("PHONE_URL", url), ("PHONE_TOKEN", bob.token.as_str())];
        let who = home.run(&["whoami"], &env, "").await;
        let hook = home
            .run(
                &["hook", "claude-session-start"],
                &[
                    ("PHONE_URL", url),
                    ("PHONE_TOKEN", bob.token.as_str()),
                    ("PHONE_HOOK_STATE_DIR", "/tmp"),
                ],
                "{}",
            )
            .await;
        assert_eq!(hook.code, 0, "{}", hook.all());
        for (what, ran) in [("whoami", &who), ("hook", &hook)] {
            assert_eq!(
                ran.stderr.contains("plain http") && ran.stderr.contains("unencrypted"),
                warned,
                "{what} at {url}: {}",
                ran.stderr
            );
            assert!(!ran.all().contains(&bob.token));
        }
    }
}

#[tokio::test]
async fn the_plugin_headers_helper_gives_the_profile_token_to_its_own_server_only() {
    let app = spawn_app().await;
    let c = app.client().await;
    let bob = register(&c, "bob", "receives", "q").await;
    let home = Home::new();
    let url = app.url("");
    let login = home
        .run(&["login", "--name", "bob", "--url", &url], &[], &bob.token)
        .await;
    assert_eq!(login.code, 0, "{}", login.all());
    let own = home
        .run(
            &["mcp-headers"],
            &[("CLAUDE_CODE_MCP_SERVER_URL", &app.mcp_url())],
            "",
        )
        .await;
    let headers: Value = serde_json::from_str(own.stdout.trim()).unwrap();
    assert_eq!(headers["Authorization"], format!("Bearer {}", bob.token));
    let other = home
        .run(
            &["mcp-headers"],
            &[(
                "CLAUDE_CODE_MCP_SERVER_URL",
                "https://elsewhere.example/mcp",
            )],
            "",
        )
        .await;
    assert_eq!(other.stdout.trim(), "{}", "no token for another server");
    let env_token = home
        .run(
            &["mcp-headers"],
            &[
                ("CLAUDE_CODE_MCP_SERVER_URL", &app.mcp_url()),
                ("PHONE_TOKEN", "phn_from_env"),
            ],
            "",
        )
        .await;
    assert!(
        env_token.stdout.contains("Bearer phn_from_env"),
        "{}",
        env_token.stdout
    );
    let none = Home::new()
        .run(
            &["mcp-headers"],
            &[("CLAUDE_CODE_MCP_SERVER_URL", &app.mcp_url())],
            "",
        )
        .await;
    assert_eq!(none.stdout.trim(), "{}");
}

#[tokio::test]
async fn phone_alone_still_serves() {
    let database_url = fresh_database().await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_phone"))
        .env_clear()
        .env("DATABASE_URL", &database_url)
        .env("PORT", &port)
        .env("PHONE_BIND", "127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let health = format!("http://127.0.0.1:{port}/health");
    let mut up = false;
    for _ in 0..150 {
        if reqwest::get(&health)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "`phone` without a command serves");
    let pid = server.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), server.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "SIGTERM ends it cleanly: {status}");
    let version = run_in(None, &["--version"], &[], "").await;
    assert_eq!(
        version.stdout.trim(),
        format!("phone {}", env!("CARGO_PKG_VERSION"))
    );
}

/// `PHONE_WORKER_THREADS` is checked like every setting: a bad value stops
/// `serve` at once with the variable's name (exit 2, before any database
/// is reached), and commands that do not serve are not affected by it.
#[tokio::test]
async fn a_bad_worker_thread_count_stops_serve_with_its_name() {
    for bad in ["abc", "0", "100000"] {
        let served = run_in(
            None,
            &["serve"],
            &[
                ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
                ("PHONE_WORKER_THREADS", bad),
            ],
            "",
        )
        .await;
        assert_eq!(served.code, 2, "{bad}: {}", served.stderr);
        assert!(
            served
                .stderr
                .contains(&format!("PHONE_WORKER_THREADS=\"{bad}\" is invalid")),
            "{bad}: {}",
            served.stderr
        );
    }
    let version = run_in(None, &["--version"], &[("PHONE_WORKER_THREADS", "abc")], "").await;
    assert_eq!(version.code, 0, "{}", version.stderr);
}

/// `phone inbox | head`: a reader that leaves early ends the command
/// quietly (it printed a panic and a stack trace).
#[tokio::test]
async fn a_reader_that_leaves_early_ends_the_command_quietly() {
    let app = spawn_app().await;
    let c = app.client().await;
    let alice = register(&c, "alice", "sends", "p").await;
    let bob = register(&c, "bob", "receives", "q").await;
    for i in 0..20 {
        ok(
            &c,
            "phone_send",
            alice.with(
                json!({"to": "bob", "body": format!("message {i}\n{}", "text ".repeat(2_000))}),
            ),
        )
        .await;
    }
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_phone"))
        .args(["inbox", "--limit", "20"])
        .env_clear()
        .env("PHONE_URL", app.url(""))
        .env("PHONE_TOKEN", &bob.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the phone binary runs");
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the command finishes")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // As a Unix tool killed by SIGPIPE, not a success.
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}
