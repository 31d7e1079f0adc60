//! `phone send | inbox | search`: the agent's mail and the address book,
//! for a person at a terminal or a script (`--json`).

use std::io::{IsTerminal as _, Read as _};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{CliError, connect, show, target};
use crate::remote::{Env, RemoteError};

/// The largest body read from stdin (the server's own limit is lower).
const STDIN_MAX: u64 = 1 << 20;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  phone send alice \"The build is green\"\n  \
    git log -1 | phone send alice --subject \"last commit\"\n  \
    phone send --reply-to msg_12 \"Done.\""
)]
pub struct SendArgs {
    /// The recipient's name (omitted with --reply-to).
    to: Option<String>,
    /// The message; read from stdin when absent or "-".
    body: Option<String>,
    #[arg(long, short)]
    subject: Option<String>,
    /// Answer this message (its sender gets it, in its thread).
    #[arg(long, value_name = "MESSAGE_ID")]
    reply_to: Option<String>,
    /// Print the server's JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct InboxArgs {
    /// Mark what is shown as read (as the agent's own phone_inbox does);
    /// without it, nothing is marked and the agent still gets every message.
    #[arg(long)]
    read: bool,
    /// At most this many messages (1 to 100).
    #[arg(long, default_value = "10", value_parser = clap::value_parser!(u32).range(1..=100))]
    limit: u32,
    /// With nothing unread, wait up to this long for mail (seconds, up to
    /// the server's limit, 25 by default).
    #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = clap::value_parser!(u32).range(0..=25))]
    wait: u32,
    /// Print the server's JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// Words to look for in names and descriptions (all agents when absent).
    query: Option<String>,
    /// Only agents of this project.
    #[arg(long)]
    project: Option<String>,
    #[arg(long, default_value = "20", value_parser = clap::value_parser!(u32).range(1..=50))]
    limit: u32,
    /// Print the server's JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Deserialize)]
struct Sent {
    id: String,
    to: String,
    thread_id: String,
    #[serde(default)]
    replayed: bool,
}

#[derive(Deserialize)]
struct Inbox {
    messages: Vec<Message>,
    unread_remaining: i64,
}

#[derive(Deserialize)]
struct Message {
    id: String,
    from: String,
    #[serde(default)]
    from_project: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    body: String,
    /// A peek past its byte budget gives a body's size instead.
    #[serde(default)]
    body_omitted_bytes: Option<i64>,
    #[serde(default)]
    reply_to: Option<String>,
    #[serde(default)]
    sent_at: String,
}

#[derive(Deserialize)]
struct Found {
    agents: Vec<Card>,
}

#[derive(Deserialize)]
struct Card {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    project: String,
}

fn decode<T: for<'de> Deserialize<'de>>(value: Value) -> Result<T, CliError> {
    serde_json::from_value(value).map_err(|e| RemoteError::Protocol(e.to_string()).into())
}

fn print_json(value: &Value) {
    println!(
        "{}",
        terminal_safe_json(&serde_json::to_string_pretty(value).unwrap_or_default())
    );
}

/// JSON whose strings carry no character a terminal acts on or a reader
/// cannot see: serde_json escapes C0 controls only, and left DEL and the C1
/// controls (U+0080..U+009F: CSI, OSC, which a terminal may run as escape
/// sequences) raw. Each becomes a `\uXXXX` escape (a pair of them past
/// U+FFFF): the same JSON to a parser, inert on a screen.
fn terminal_safe_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if matches!(c, '\u{7F}'..='\u{9F}') || crate::domain::types::is_hidden_char(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{:04x}", unit));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One call as the target's agent.
async fn call(env: Env<'_>, tool: &str, args: Value, wait: Duration) -> Result<Value, CliError> {
    let target = target(env, None)?;
    target.token()?;
    let connection = connect(&target).await?;
    let out = connection.call(tool, args, wait).await;
    connection.close().await;
    Ok(out?)
}

pub async fn send(env: Env<'_>, args: SendArgs) -> Result<(), CliError> {
    // With --reply-to the recipient is known: a lone argument is the body.
    let (to, body) = match (&args.reply_to, args.to, args.body) {
        (Some(_), Some(only), None) => (None, Some(only)),
        (_, to, body) => (to, body),
    };
    if to.is_none() && args.reply_to.is_none() {
        return Err(CliError::Usage(
            "whom to? name the recipient (phone send NAME …) or answer a message (--reply-to ID)"
                .into(),
        ));
    }
    let body = match body.filter(|b| b != "-") {
        Some(b) => b,
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("Type the message; end it with Ctrl-D.");
            }
            let mut text = String::new();
            std::io::stdin().take(STDIN_MAX).read_to_string(&mut text)?;
            text
        }
    };
    let mut call_args = json!({"body": body});
    for (key, value) in [
        ("to", &to),
        ("subject", &args.subject),
        ("reply_to", &args.reply_to),
    ] {
        if let Some(v) = value {
            call_args[key] = json!(v);
        }
    }
    let out = call(env, "phone_send", call_args, Duration::ZERO).await?;
    if args.json {
        print_json(&out);
        return Ok(());
    }
    let sent: Sent = decode(out)?;
    let again = if sent.replayed {
        " (already sent before: nothing new)"
    } else {
        ""
    };
    println!(
        "Sent {} to {} (thread {}){again}.",
        show::line(&sent.id, 40),
        show::line(&sent.to, 200),
        show::line(&sent.thread_id, 40)
    );
    Ok(())
}

pub async fn inbox(env: Env<'_>, args: InboxArgs) -> Result<(), CliError> {
    let mut call_args = json!({"limit": args.limit, "peek": !args.read});
    if args.wait > 0 {
        call_args["wait_seconds"] = json!(args.wait);
    }
    let out = call(
        env,
        "phone_inbox",
        call_args,
        Duration::from_secs(args.wait.into()),
    )
    .await?;
    if args.json {
        print_json(&out);
        return Ok(());
    }
    let inbox: Inbox = decode(out)?;
    if inbox.messages.is_empty() {
        println!("No unread mail.");
        return Ok(());
    }
    for m in &inbox.messages {
        println!(
            "{}  {}  from {} (project {})",
            show::line(&m.id, 40),
            show::line(&m.sent_at, 40),
            show::line(&m.from, 64),
            show::line(&m.from_project, 60)
        );
        if let Some(original) = &m.reply_to {
            println!("  in reply to {}", show::line(original, 40));
        }
        if let Some(subject) = m.subject.as_deref().filter(|s| !s.is_empty()) {
            println!("  subject: {}", show::line(subject, 200));
        }
        match m.body_omitted_bytes {
            Some(bytes) => println!(
                "    (body not shown: {bytes} bytes, past what one look shows; `phone inbox --read` reads it)\n"
            ),
            None => println!("{}\n", show::indented(&m.body, "    ")),
        }
    }
    let left = inbox.unread_remaining;
    if args.read {
        println!(
            "Marked {} message(s) read; {} still unread.",
            inbox.messages.len(),
            left
        );
    } else {
        let total = if left >= 100 {
            "100 or more".to_owned()
        } else {
            left.max(inbox.messages.len() as i64).to_string()
        };
        println!(
            "{total} unread; nothing was marked read (phone inbox --read marks what it shows)."
        );
    }
    Ok(())
}

pub async fn search(env: Env<'_>, args: SearchArgs) -> Result<(), CliError> {
    let mut call_args = json!({"limit": args.limit});
    if let Some(q) = &args.query {
        call_args["query"] = json!(q);
    }
    if let Some(p) = &args.project {
        call_args["project"] = json!(p);
    }
    let out = call(env, "phone_search", call_args, Duration::ZERO).await?;
    if args.json {
        print_json(&out);
        return Ok(());
    }
    let found: Found = decode(out)?;
    if found.agents.is_empty() {
        println!("No agent found.");
    }
    for a in &found.agents {
        println!(
            "{}  (project {})  {}",
            show::line(&a.name, 64),
            show::line(&a.project, 60),
            show::line(&a.description, 160)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_output_carries_no_raw_c1_controls_or_hidden_characters() {
        let hostile = "title\u{9d}2;PWNED\u{9c}\u{9b}2J\u{7f}\u{202e}\u{e0041}";
        let json = serde_json::to_string_pretty(&serde_json::json!({"body": hostile})).unwrap();
        let safe = terminal_safe_json(&json);
        assert!(safe.is_ascii(), "{safe}");
        let back: Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["body"], hostile, "the same JSON to a parser");
    }
}
