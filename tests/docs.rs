//! The documentation against the code, so that it cannot drift where a test
//! can see it:
//! - the tools of docs/TOOLS.md (one `## `name`` section each, with an
//!   `| argument |` table) and of README.md's `| tool |` table are the
//!   server's `tools/list`, and each tool's documented arguments are its
//!   `inputSchema` properties;
//! - every environment variable the code and scripts read has a row in a
//!   table of docs/CONFIGURATION.md (first column `` `NAME` ``), every
//!   variable the docs name has one too, and every row names a variable
//!   that something in the repository reads;
//! - wherever the docs quote the tool surface's size ("tool surface … N
//!   bytes"), N is what the running server measures (printed here);
//! - the protocol versions of docs/PROTOCOL.md are those `server/discover`
//!   lists;
//! - README.md fits in 12 KB;
//! - every relative link in README.md and docs/ points at a file that exists,
//!   and at a heading of it when it names one.
//!
//! The parsing is deliberately plain: lines, table rows, backticks.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every docs/*.md, as (path, text).
fn documents() -> Vec<(String, String)> {
    let mut docs = vec![("README.md".to_owned(), read("README.md"))];
    let mut names: Vec<_> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    for name in names {
        let path = format!("docs/{name}");
        let text = read(&path);
        docs.push((path, text));
    }
    docs
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut inside = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                inside = !inside;
                return false;
            }
            !inside
        })
        .collect()
}

/// The cells of a table row (`| a | b |`), trimmed; `None` for other lines.
fn cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_owned()).collect())
}

/// `` `x` `` → `x`; anything else → None.
fn code(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.is_empty() && !inner.contains('`')).then_some(inner)
}

/// The first cells (`` `x` ``) of the rows of every table whose header's
/// first cell is `header`, in `lines`.
fn first_column(lines: &[&str], header: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_table = false;
    let mut header_seen = false;
    for line in lines {
        match cells(line) {
            None => {
                in_table = false;
                header_seen = false;
            }
            Some(row) if !header_seen => {
                header_seen = true;
                in_table = row[0].eq_ignore_ascii_case(header);
            }
            Some(row) if in_table => {
                if row[0].starts_with("---") || row[0].starts_with(":--") {
                    continue;
                }
                if let Some(name) = code(&row[0]) {
                    out.push(name.to_owned());
                }
            }
            Some(_) => {}
        }
    }
    out
}

/// docs/TOOLS.md: each `` ## `tool` `` section and the first column of its
/// `| argument |` tables.
fn documented_tools(text: &str) -> Vec<(String, BTreeSet<String>)> {
    let lines = prose(text);
    let mut tools: Vec<(String, Vec<&str>)> = Vec::new();
    for line in lines {
        if let Some(heading) = line.strip_prefix("## ") {
            if let Some(name) = code(heading.trim()) {
                tools.push((name.to_owned(), Vec::new()));
                continue;
            }
            // Another section ends the tool's.
            tools.push((String::new(), Vec::new()));
            continue;
        }
        if let Some((_, body)) = tools.last_mut() {
            body.push(line);
        }
    }
    tools
        .into_iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, body)| {
            let args = first_column(&body, "argument").into_iter().collect();
            (name, args)
        })
        .collect()
}

#[tokio::test]
async fn the_documented_tools_and_arguments_are_the_servers() {
    let app = spawn_app().await;
    let c = app.client().await;
    let tools = c.list_all_tools().await.unwrap();
    let served: Vec<(String, BTreeSet<String>)> = tools
        .iter()
        .map(|t| {
            let props = t
                .input_schema
                .get("properties")
                .and_then(|p| p.as_object())
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            (t.name.to_string(), props)
        })
        .collect();
    let served_names: BTreeSet<&str> = served.iter().map(|(n, _)| n.as_str()).collect();

    let documented = documented_tools(&read("docs/TOOLS.md"));
    let documented_names: BTreeSet<&str> = documented.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        documented_names, served_names,
        "docs/TOOLS.md's `## `tool`` sections against tools/list"
    );
    for (name, args) in &served {
        let (_, doc_args) = documented.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(
            doc_args, args,
            "docs/TOOLS.md, {name}: the `| argument |` table against its inputSchema properties"
        );
    }

    let readme = read("README.md");
    let at_a_glance: BTreeSet<String> = first_column(&prose(&readme), "tool").into_iter().collect();
    let at_a_glance: BTreeSet<&str> = at_a_glance.iter().map(String::as_str).collect();
    assert_eq!(
        at_a_glance, served_names,
        "README.md's `| tool |` table against tools/list"
    );
    app.stop().await;
}

/// Names in `text` that start with one of `prefixes` and go on in
/// `[A-Z0-9_]`, at word boundaries.
fn names_with_prefixes(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_';
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < bytes.len() {
        if word(bytes[i]) && (i == 0 || !(word(bytes[i - 1]) || bytes[i - 1].is_ascii_lowercase()))
        {
            let start = i;
            while i < bytes.len() && word(bytes[i]) {
                i += 1;
            }
            let boundary_after = i == bytes.len() || !bytes[i].is_ascii_lowercase();
            let name = &text[start..i];
            if boundary_after
                && prefixes
                    .iter()
                    .any(|p| name.starts_with(p) && name.len() > p.len())
                && !name.ends_with('_')
            {
                out.insert(name.to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Whether `name` occurs in `text` with no name character on either side.
fn occurs_as_word(text: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// Every file under `dir` (recursively) whose name ends with one of `exts`.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("node_modules") && !path.ends_with("target") {
                files(&path, exts, out);
            }
        } else if exts.iter().any(|e| path.to_string_lossy().ends_with(e)) {
            out.push(path);
        }
    }
}

fn text_of(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The variables the repository reads: string literals in src/ (the server,
/// CLI, hooks, channel) with the prefixes the code uses or one of the plain
/// names it reads, and the PHONE_*, CLUSTER_*, DEMO_* variables of the
/// scripts, the Makefile and the tests.
fn variables_read() -> BTreeSet<String> {
    let mut src = Vec::new();
    files(&root().join("src"), &[".rs"], &mut src);
    let src = text_of(&src);
    let mut read = BTreeSet::new();
    for literal in src.split('"').skip(1).step_by(2) {
        let env_like = literal
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        let prefixed = ["PHONE_", "OTEL_", "RAILWAY_", "CLAUDE_"]
            .iter()
            .any(|p| literal.starts_with(p));
        let plain = [
            "DATABASE_URL",
            "PORT",
            "RUST_LOG",
            "NO_COLOR",
            "XDG_STATE_HOME",
            "XDG_CONFIG_HOME",
        ]
        .contains(&literal);
        if env_like && (prefixed || plain) {
            read.insert(literal.to_owned());
        }
    }
    let mut scripts = Vec::new();
    files(&root().join("scripts"), &[".sh"], &mut scripts);
    files(&root().join("tests"), &[".sh", ".rs"], &mut scripts);
    // This file's own examples are not variables.
    scripts.retain(|p| !p.ends_with("tests/docs.rs"));
    scripts.push(root().join("Makefile"));
    scripts.push(root().join("bench/run.sh"));
    let scripts = text_of(&scripts);
    read.extend(names_with_prefixes(
        &scripts,
        &["PHONE_", "CLUSTER_", "DEMO_"],
    ));
    read
}

/// Where a documented variable may be read: the code, the scripts, the
/// image and the tests (a name that occurs nowhere is a stale row).
fn repository_text() -> String {
    let mut paths = Vec::new();
    for dir in ["src", "scripts", "tests", "bench"] {
        files(
            &root().join(dir),
            &[".rs", ".sh", ".py", ".mjs"],
            &mut paths,
        );
    }
    paths.push(root().join("Makefile"));
    paths.push(root().join("Dockerfile"));
    text_of(&paths)
}

#[test]
fn every_variable_read_is_in_the_configuration_table_and_back() {
    let configuration = read("docs/CONFIGURATION.md");
    let lines = prose(&configuration);
    let documented: BTreeSet<String> = first_column(&lines, "variable").into_iter().collect();
    assert!(
        documented.len() > 20,
        "docs/CONFIGURATION.md has `| variable |` tables"
    );
    let read_by_code = variables_read();
    let missing: Vec<_> = read_by_code.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "read by the code or scripts but not in docs/CONFIGURATION.md: {missing:?}"
    );
    let mentioned: BTreeSet<String> = documents()
        .iter()
        .flat_map(|(path, text)| {
            names_with_prefixes(text, &["PHONE_", "OTEL_", "RAILWAY_", "CLUSTER_", "DEMO_"])
                .into_iter()
                .map(move |name| (path.clone(), name))
        })
        .filter(|(_, name)| !documented.contains(name))
        .map(|(path, name)| format!("{path}: {name}"))
        .collect();
    assert!(
        mentioned.is_empty(),
        "named in the docs but not in docs/CONFIGURATION.md's tables: {mentioned:?}"
    );
    let everything = repository_text();
    let stale: Vec<_> = documented
        .iter()
        .filter(|name| !occurs_as_word(&everything, name))
        .collect();
    assert!(
        stale.is_empty(),
        "in docs/CONFIGURATION.md but read nowhere in src/, scripts/, tests/, bench/, Makefile, Dockerfile: {stale:?}"
    );
}

/// Numbers followed by " bytes" on lines that mention the tool surface.
fn quoted_surface_sizes(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for line in prose(text) {
        if !line.to_lowercase().contains("tool surface") {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            if pair[1].trim_matches(|c: char| !c.is_alphanumeric()) == "bytes" {
                let digits: String = pair[0]
                    .trim_matches(|c: char| !c.is_ascii_digit())
                    .chars()
                    .filter(|c| *c != ',')
                    .collect();
                if let Ok(n) = digits.parse() {
                    out.push(n);
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn the_quoted_tool_surface_size_is_the_measured_one() {
    let app = spawn_app().await;
    let c = app.client().await;
    let tools = c.list_all_tools().await.unwrap();
    // What a model reads of the tools: names, descriptions, input schemas
    // (the same sum as tests/http_surface.rs).
    let measured: usize = tools
        .iter()
        .map(|t| {
            t.name.len()
                + t.description.as_deref().unwrap_or("").len()
                + serde_json::to_string(&*t.input_schema).unwrap().len()
        })
        .sum();
    println!("tool surface a model reads: {measured} bytes");
    let mut quotes = 0;
    for (path, text) in documents() {
        for quoted in quoted_surface_sizes(&text) {
            quotes += 1;
            assert_eq!(
                quoted, measured,
                "{path} quotes the tool surface as {quoted} bytes; the server's is {measured}"
            );
        }
    }
    assert!(
        quotes > 0,
        "docs/TOOLS.md quotes the tool surface's size (\"tool surface … N bytes\")"
    );
    app.stop().await;
}

/// The dates (`YYYY-MM-DD`) in `text`.
fn dates(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    for at in 0..bytes.len().saturating_sub(9) {
        let candidate = &bytes[at..at + 10];
        let shape = candidate.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        });
        let alone = (at == 0 || !bytes[at - 1].is_ascii_alphanumeric())
            && bytes
                .get(at + 10)
                .is_none_or(|b| !b.is_ascii_alphanumeric());
        if shape && alone {
            out.insert(String::from_utf8(candidate.to_vec()).unwrap());
        }
    }
    out
}

#[tokio::test]
async fn the_documented_protocol_versions_are_the_discovered_ones() {
    let app = spawn_app().await;
    let discover = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "docs-test", "version": "0"}}}});
    let answer: serde_json::Value = reqwest::Client::new()
        .post(app.mcp_url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "server/discover")
        .json(&discover)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let served: BTreeSet<String> = answer["result"]["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("server/discover: {answer}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let protocol = read("docs/PROTOCOL.md");
    let section = protocol
        .split("\n## ")
        .find(|s| s.starts_with("Protocol versions"))
        .expect("docs/PROTOCOL.md has a \"## Protocol versions\" section");
    assert_eq!(
        dates(section),
        served,
        "the versions docs/PROTOCOL.md's \"Protocol versions\" names against server/discover's supportedVersions"
    );
    app.stop().await;
}

#[test]
fn the_readme_fits_in_12_kb() {
    let size = read("README.md").len();
    println!("README.md: {size} bytes");
    assert!(size <= 12 * 1024, "README.md is {size} bytes, over 12,288");
}

/// Files that other work in flight adds; a link to one may wait for it.
const LANDING_LATER: &[&str] = &[];

#[test]
fn relative_links_point_at_files_that_exist() {
    let mut broken = Vec::new();
    for (path, text) in documents() {
        let dir = Path::new(&path).parent().unwrap().to_path_buf();
        for line in prose(&text) {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let link = rest[..end].split_whitespace().next().unwrap_or("");
                let (target, anchor) = link.split_once('#').unwrap_or((link, ""));
                if link.contains("://") || link.starts_with("mailto:") {
                    continue;
                }
                let resolved = if target.is_empty() {
                    PathBuf::from(&path)
                } else {
                    normalize(&dir.join(target))
                };
                let shown = resolved.to_string_lossy().into_owned();
                if LANDING_LATER.contains(&shown.as_str()) {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(root().join(&resolved)) else {
                    if !root().join(&resolved).exists() {
                        broken.push(format!("{path}: {link}"));
                    }
                    continue;
                };
                if !anchor.is_empty()
                    && shown.ends_with(".md")
                    && !prose(&text)
                        .iter()
                        .any(|l| heading_anchor(l).as_deref() == Some(anchor))
                {
                    broken.push(format!("{path}: {link} (no such heading)"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:?}");
}

/// The anchor GitHub gives a heading line (`## Deploy on Railway` →
/// `deploy-on-railway`); `None` for other lines.
fn heading_anchor(line: &str) -> Option<String> {
    let title = line.trim_start_matches('#');
    if title.len() == line.len() || !title.starts_with(' ') {
        return None;
    }
    Some(
        title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect(),
    )
}

/// `a/b/../c` → `a/c` (without touching the file system).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn the_parsers_read_what_they_should() {
    let tools = documented_tools(
        "# Tools\n## `a`\ntext\n| argument | meaning |\n|---|---|\n| `x` | y |\n| `z` | w |\n\n\
         | field | meaning |\n|---|---|\n| `r` | s |\n## Errors\n| argument |\n|---|\n| `no` |\n",
    );
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].0, "a");
    assert_eq!(
        tools[0].1,
        ["x", "z"].iter().map(|s| s.to_string()).collect()
    );
    assert_eq!(
        quoted_surface_sizes("The tool surface is 4,711 bytes (printed).\nother 12 bytes"),
        [4711]
    );
    assert_eq!(
        heading_anchor("## MCP subscriptions (protocol 2026-07-28)").as_deref(),
        Some("mcp-subscriptions-protocol-2026-07-28")
    );
    assert_eq!(
        heading_anchor("## `phone_register`").as_deref(),
        Some("phone_register")
    );
    assert_eq!(heading_anchor("#no heading"), None);
    assert_eq!(
        dates("2025-03-26, x2025-06-18 and 2025-11-25."),
        ["2025-03-26", "2025-11-25"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
    assert_eq!(
        names_with_prefixes("${PHONE_X:-1} $PHONE_Y PHONE_ Zphone_PHONE_Q", &["PHONE_"]),
        ["PHONE_X", "PHONE_Y"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    );
}
