//! The commands the documentation marks runnable run as written (issue 50, item 9).
//!
//! A fenced `sh` (or `bash`) block in README.md or docs/*.md right after a line
//! `<!-- runnable -->` is run whole, from the repository root, with `bash -euo pipefail`,
//! against a local cluster as the README's reader has one next to `kairos up`: a HOME of its own
//! whose current context is that cluster (its addresses and admin token file), and `kairos` on
//! PATH. The one liberty taken: a line `K=./target/release/kairos` (where the README's reader
//! built it) names the binary under test instead. Every block must succeed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::{Cluster, CALLER_SETTINGS};

const MARKER: &str = "<!-- runnable -->";

/// A marked block: where it is, and its text.
struct Block {
    at: String,
    text: String,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The marked blocks of one Markdown file. A marker that is not followed by a shell block is
/// an error: a marked command must not silently go unrun.
fn marked_blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != MARKER {
            i += 1;
            continue;
        }
        let at = format!("{}:{}", path.strip_prefix(repo()).unwrap_or(path).display(), i + 1);
        let fence = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        assert!(fence == "```sh" || fence == "```bash", "{at}: {MARKER} is not followed by a ```sh block");
        let end = (i + 2..lines.len())
            .find(|j| lines[*j].trim() == "```")
            .unwrap_or_else(|| panic!("{at}: the block does not end"));
        blocks.push(Block { at, text: lines[i + 2..end].join("\n") });
        i = end + 1;
    }
    blocks
}

fn all_marked_blocks() -> Vec<Block> {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files.iter().flat_map(|f| marked_blocks(f)).collect()
}

#[test]
fn the_markers_are_found_where_they_should_be() {
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("x.md");
    std::fs::write(&md, "text\n<!-- runnable -->\n```sh\necho a\necho b\n```\n\n```sh\nnot marked\n```\n")
        .unwrap();
    let blocks = marked_blocks(&md);
    assert_eq!(blocks.iter().map(|b| b.text.as_str()).collect::<Vec<_>>(), ["echo a\necho b"]);
    std::fs::write(&md, "<!-- runnable -->\nthe block is not here\n").unwrap();
    assert!(std::panic::catch_unwind(|| marked_blocks(&md)).is_err(), "a stray marker passed");
}

#[test]
fn every_command_marked_runnable_in_the_docs_runs() {
    let blocks = all_marked_blocks();
    // The README's Use block and the simulator's first steps at least: an empty list would pass
    // vacuously.
    let at: Vec<&str> = blocks.iter().map(|b| b.at.as_str()).collect();
    assert!(at.iter().any(|a| a.starts_with("README.md:")), "no runnable block in README.md: {at:?}");
    assert!(at.iter().any(|a| a.starts_with("docs/simulation.md:")), "none in docs/simulation.md: {at:?}");

    let c = Cluster::start(8);
    let home = c.path("docs-home");
    let config = home.join(".config/kairos");
    std::fs::create_dir_all(&config).unwrap();
    let context = format!(
        "current = \"local\"\n\n[contexts.local]\ncontrollers = [{}]\ntoken_file = \"{}\"\n",
        c.controllers.iter().map(|r| format!("\"{}\"", r.addr)).collect::<Vec<_>>().join(", "),
        c.token_file().display()
    );
    std::fs::write(config.join("config.toml"), context).unwrap();
    let kairos = PathBuf::from(env!("CARGO_BIN_EXE_kairos"));
    let bin_dir = kairos.parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for block in &blocks {
        let script: Vec<String> = block
            .text
            .lines()
            .map(|l| match l.trim() {
                "K=./target/release/kairos" => format!("K={}", kairos.display()),
                _ => l.to_string(),
            })
            .collect();
        let mut cmd = Command::new("timeout");
        cmd.args(["120", "bash", "-euo", "pipefail", "-c", &script.join("\n")])
            .current_dir(repo())
            .env("HOME", &home)
            .env("PATH", &path);
        for var in CALLER_SETTINGS {
            cmd.env_remove(var);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{} failed ({}):\n{}\nstdout:\n{}\nstderr:\n{}",
            block.at,
            out.status,
            block.text,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
