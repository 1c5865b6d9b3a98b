//! #37 item 1: the docs and `--help` cannot drift apart. The docs point at `--help` for the
//! command line's flags instead of repeating them; what they do name must be a flag that
//! `gridrelay` (some command of it) takes.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Every `--flag` in the help of `path` and of every command under it.
fn flags_of(path: &mut Vec<String>, into: &mut BTreeSet<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_gridrelay"))
        .args(path.iter())
        .arg("--help")
        .output()
        .expect("gridrelay runs");
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    into.extend(flags_in(&help));
    let commands = help
        .split_once("Commands:\n")
        .map(|(_, rest)| rest.split("\n\n").next().unwrap_or_default().to_string())
        .unwrap_or_default();
    for line in commands.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if name != "help" {
            path.push(name.to_string());
            flags_of(path, into);
            path.pop();
        }
    }
}

/// The `--flag` words of a text.
fn flags_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start + 2;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'-')
        {
            end += 1;
        }
        let standalone = !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-');
        if standalone && end > start + 2 && bytes[start + 2].is_ascii_lowercase() {
            found.push(text[start..end].trim_end_matches('-').to_string());
        }
        i = end.max(start + 2);
    }
    found
}

/// The flags a document gives as gridrelay's: in code spans that are a flag or a `gridrelay`
/// command (not `cargo …`, `sam …`, `curl …`), and on `gridrelay` lines of code blocks; with
/// where each is.
fn flags_named_in(doc: &str) -> Vec<(String, usize)> {
    let ours = |code: &str| {
        let first = code.split_whitespace().next().unwrap_or_default();
        first == "gridrelay" || first.starts_with("--")
    };
    let mut named = Vec::new();
    let mut in_block = false;
    // In a code block: whether the command a line continues (after `\`) is gridrelay.
    let mut continued: Option<bool> = None;
    for (n, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continued = None;
            continue;
        }
        if in_block {
            let is_ours = continued.unwrap_or_else(|| ours(line.trim_start()));
            if is_ours {
                named.extend(flags_in(line).into_iter().map(|f| (f, n + 1)));
            }
            continued = line.trim_end().ends_with('\\').then_some(is_ours);
            continue;
        }
        for (k, span) in line.split('`').enumerate() {
            if k % 2 == 1 && ours(span) {
                named.extend(flags_in(span).into_iter().map(|f| (f, n + 1)));
            }
        }
    }
    named
}

#[test]
fn every_flag_the_docs_name_is_one_gridrelay_takes() {
    let mut flags = BTreeSet::new();
    flags_of(&mut Vec::new(), &mut flags);
    assert!(
        flags.contains("--max-delivery-attempts") && flags.contains("--queue-key-secret"),
        "the help of every command was read: {flags:?}"
    );

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut documents = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            documents.push(path);
        }
    }
    let mut unknown = Vec::new();
    let mut checked = 0;
    for path in &documents {
        let text = std::fs::read_to_string(path).expect("a document");
        for (flag, line) in flags_named_in(&text) {
            checked += 1;
            if !flags.contains(&flag) {
                unknown.push(format!("{}:{line}: {flag}", path.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} flags named in the docs: is the scan right?"
    );
    assert!(
        unknown.is_empty(),
        "the docs name flags gridrelay does not take (see `gridrelay … --help`):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_scan_finds_flags_only_where_they_are_gridrelays() {
    let doc = "Set `--topic-name` or `gridrelay topic create --name x`; `cargo test --release` \
               is not ours, nor is a-- or x--y.\n```sh\ngridrelay local --listen 1 \\\n    \
               --prefix p\ncurl -X POST \\\n    --data 1\n```\n";
    let named: Vec<String> = flags_named_in(doc).into_iter().map(|(f, _)| f).collect();
    assert_eq!(named, ["--topic-name", "--name", "--listen", "--prefix"]);
}
