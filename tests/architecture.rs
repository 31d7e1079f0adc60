//! The shape of the code, checked: every `crate::` and `super::` path in
//! `src/` (in `use` trees and inline), resolved to the module it names.
//! Top-level modules import only the layers below them (docs/ARCHITECTURE.md,
//! "Layers"), and no two modules that share a parent import
//! each other, directly or around a loop. SQL text lives in `store` only.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Top to bottom; each may import only those after it.
const LAYERS: &[&str] = &[
    "main",
    "cli",
    "channel",
    "hook",
    "remote",
    "admin",
    "startup",
    "config",
    "http",
    "console",
    "mcp",
    "webhooks",
    "domain",
    "store",
    "telemetry",
];

#[derive(Debug)]
struct Module {
    path: Vec<String>,
    source: String,
}

fn modules() -> Vec<Module> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&root, &mut files);
    files
        .into_iter()
        .filter(|f| !f.starts_with(root.join("bin")))
        .map(|file| {
            let relative = file.strip_prefix(&root).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                path.pop();
            }
            let source = std::fs::read_to_string(&file).unwrap();
            // Unit tests are inline modules, whose `super` is this module.
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            Module {
                path,
                source: strip_comments_and_strings(code),
            }
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Source without comments, string and char literals (replaced by spaces),
/// so that only code is searched for paths.
fn strip_comments_and_strings(src: &str) -> String {
    let bytes = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if let Some(raw) = raw_string_len(rest) {
            out.push(' ');
            i += raw;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push(' ');
            i = j + 1;
        } else if bytes[i] == b'\'' && char_literal_len(rest).is_some() {
            out.push(' ');
            i += char_literal_len(rest).unwrap();
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn raw_string_len(rest: &str) -> Option<usize> {
    let after_r = rest.strip_prefix('r')?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    body.find(&close)
        .map(|end| 1 + hashes + 1 + end + close.len())
}

/// `'x'`, `'\n'`, `'\u{..}'`; not lifetimes.
fn char_literal_len(rest: &str) -> Option<usize> {
    let mut chars = rest.char_indices().skip(1);
    let (_, c) = chars.next()?;
    if c == '\\' {
        let close = rest[2..].find('\'')?;
        return Some(close + 3);
    }
    let (at, next) = chars.next()?;
    (next == '\'').then_some(at + 1)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path the module names that starts with `crate` or `super`, as
/// segments (`use` trees expanded).
fn paths(source: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = source;
    // `use` trees first, then inline paths outside them.
    let mut inline = String::new();
    while let Some(at) = find_word(rest, "use") {
        inline.push_str(&rest[..at]);
        let end = rest[at..].find(';').map_or(rest.len(), |e| at + e);
        expand(&normalize(&rest[at + 3..end]), Vec::new(), &mut found);
        rest = &rest[(end + 1).min(rest.len())..];
    }
    inline.push_str(rest);
    let chars: Vec<char> = inline.chars().collect();
    let text: String = chars.iter().collect();
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(offset) = text[from..].find(start) {
            let at = from + offset;
            from = at + start.len();
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let tail: String = text[at..]
                .chars()
                .take_while(|&c| is_ident(c) || c == ':')
                .collect();
            found.push(
                tail.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            );
        }
    }
    found
        .into_iter()
        .filter(|p: &Vec<String>| p.first().is_some_and(|s| s == "crate" || s == "super"))
        .collect()
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(offset) = text[from..].find(word) {
        let at = from + offset;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// A `use` tree with single spaces, and none around `::`, braces and commas.
fn normalize(tree: &str) -> String {
    let mut out = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    for token in ["::", "{", "}", ","] {
        out = out
            .replace(&format!(" {token}"), token)
            .replace(&format!("{token} "), token);
    }
    out
}

/// Expands a normalized `use` tree (`crate::a::{b,c::{d as e}}`).
fn expand(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    match tree.find('{') {
        Some(open) if !tree[..open].contains(',') => {
            let head: Vec<String> = tree[..open]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut prefix = prefix;
            prefix.extend(head);
            for part in split_top(inner) {
                expand(part, prefix.clone(), out);
            }
        }
        _ => {
            for part in split_top(tree) {
                let mut path = prefix.clone();
                path.extend(
                    part.split(" as ")
                        .next()
                        .unwrap()
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned),
                );
                if part.contains('{') {
                    expand(part, prefix.clone(), out);
                } else {
                    out.push(path);
                }
            }
        }
    }
}

fn split_top(text: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The module a path names: its longest prefix that is a module.
fn resolve(from: &[String], path: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut absolute: Vec<String> = Vec::new();
    let mut segments = path.iter().peekable();
    match segments.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segments.next();
        }
        Some("super") => {
            // `super` of a file module is its parent; so is `super` of
            // `dir/mod.rs`, whose module is the directory.
            absolute = from.to_vec();
            while segments.peek().is_some_and(|s| *s == "super") {
                segments.next();
                absolute.pop();
            }
        }
        _ => return None,
    }
    absolute.extend(segments.cloned());
    (0..=absolute.len())
        .rev()
        .map(|n| absolute[..n].to_vec())
        .find(|candidate| known.contains(candidate))
}

struct Graph {
    /// Module -> modules it names (resolved).
    edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
}

fn graph() -> Graph {
    let modules = modules();
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    let mut edges = BTreeMap::new();
    for m in &modules {
        let targets: BTreeSet<Vec<String>> = paths(&m.source)
            .iter()
            .filter_map(|p| resolve(&m.path, p, &known))
            .filter(|t| t != &m.path)
            .collect();
        edges.insert(m.path.clone(), targets);
    }
    Graph { edges }
}

#[test]
fn layers_import_only_the_layers_below_them() {
    let graph = graph();
    let rank = |module: &[String]| {
        let top = module.first().map_or("main", String::as_str);
        LAYERS.iter().position(|l| *l == top).unwrap_or_else(|| {
            panic!("module {top} is in no layer; add it to LAYERS and docs/ARCHITECTURE.md")
        })
    };
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        for to in targets {
            if from.first() != to.first() && rank(to) <= rank(from) {
                wrong.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering: {wrong:#?}");
}

#[test]
fn no_import_cycles_among_sibling_modules() {
    let graph = graph();
    // For each parent: the graph among its children, each child standing
    // for its whole subtree; edges to the parent itself (re-exports) and
    // within one subtree do not count.
    let parents: BTreeSet<Vec<String>> = graph
        .edges
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    let mut cycles = Vec::new();
    for parent in parents {
        let child_of = |m: &[String]| -> Option<String> {
            (m.len() > parent.len() && m[..parent.len()] == parent[..])
                .then(|| m[parent.len()].clone())
        };
        let mut sibling_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, targets) in &graph.edges {
            let Some(a) = child_of(from) else { continue };
            for to in targets {
                if let Some(b) = child_of(to)
                    && a != b
                {
                    sibling_edges.entry(a.clone()).or_default().insert(b);
                }
            }
        }
        if let Some(cycle) = find_cycle(&sibling_edges) {
            let at = if parent.is_empty() {
                "crate".to_owned()
            } else {
                parent.join("::")
            };
            cycles.push(format!("in {at}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn sql_lives_in_the_store() {
    // Statement keywords in string literals, outside `store` (and tests).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&root, &mut files);
    let statement = regex_free_sql_finder();
    let mut outside = Vec::new();
    for file in files {
        let relative = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if relative.starts_with("store") || relative.starts_with("bin") {
            continue;
        }
        let source = std::fs::read_to_string(&file).unwrap();
        let code = source.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            if !line.trim_start().starts_with("//") && statement(line) {
                outside.push(format!("{relative}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(outside.is_empty(), "SQL outside store/: {outside:#?}");
}

/// Whether a line holds a string literal that reads like SQL.
fn regex_free_sql_finder() -> impl Fn(&str) -> bool {
    const STARTS: [&str; 6] = [
        "SELECT ",
        "INSERT INTO",
        "UPDATE ",
        "DELETE FROM",
        "WITH ",
        "LISTEN ",
    ];
    move |line: &str| {
        line.split('"')
            .skip(1)
            .step_by(2)
            .any(|literal| STARTS.iter().any(|s| literal.trim_start().starts_with(s)))
    }
}

#[test]
fn the_path_finder_sees_use_trees_and_inline_paths() {
    let found = paths(&strip_comments_and_strings(
        "use crate::{config::Config, store::{self, Store}};\n\
         use super::limits::{self as l, X};\n\
         fn f() { let s = \"crate::not_code\"; crate::telemetry::metrics::enabled(); }\n\
         // crate::in_a_comment\n",
    ));
    let joined: BTreeSet<String> = found.iter().map(|p| p.join("::")).collect();
    for expected in [
        "crate::config::Config",
        "crate::store::self",
        "crate::store::Store",
        "super::limits::self",
        "super::limits::X",
        "crate::telemetry::metrics::enabled",
    ] {
        assert!(joined.contains(expected), "{expected} not in {joined:?}");
    }
    assert!(
        !joined
            .iter()
            .any(|p| p.contains("not_code") || p.contains("in_a_comment"))
    );
}
