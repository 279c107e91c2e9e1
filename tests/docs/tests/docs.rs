//! The documentation as it is in the repository: README.md and every `docs/**/*.md` link only
//! to files inside the repository (relative paths that exist, anchors that a heading of the
//! linked file produces), the README stays an introduction that links every file of the manual,
//! and its set-up commands stay the two that CI and newcomers run.

use std::path::{Path, PathBuf};

use pagewarden_docs::{check_file, links, markdown_files};

/// The repository root: this crate lives in `tests/docs`.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Largest README.md, in bytes: an introduction that links into docs/, not the manual.
const README_MAX_BYTES: u64 = 12_000;

/// The files docs/ must hold.
const DOCS: [&str; 10] = [
    "README.md",
    "architecture.md",
    "style.md",
    "configuration.md",
    "security.md",
    "prefix-cache.md",
    "deploy.md",
    "invariants.md",
    "api.md",
    "benchmarks.md",
];

#[test]
fn every_link_stays_in_the_repository_and_resolves() {
    let root = root();
    let mut files = vec![PathBuf::from("README.md")];
    files.extend(markdown_files(&root, Path::new("docs")).expect("reading docs/"));
    let mut offenders = Vec::new();
    for f in &files {
        offenders.extend(check_file(&root, f).unwrap_or_else(|e| panic!("{}: {e}", f.display())));
    }
    assert!(
        offenders.is_empty(),
        "{} link(s) that do not resolve inside the repository:\n{}",
        offenders.len(),
        offenders
            .iter()
            .map(|o| format!("  {o}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_readme_is_an_introduction() {
    let size = std::fs::metadata(root().join("README.md"))
        .expect("README.md")
        .len();
    assert!(
        size <= README_MAX_BYTES,
        "README.md is {size} bytes, more than {README_MAX_BYTES}: move the detail into docs/"
    );
}

#[test]
fn docs_holds_the_manual() {
    let missing: Vec<&str> = DOCS
        .iter()
        .copied()
        .filter(|f| !root().join("docs").join(f).is_file())
        .collect();
    assert!(missing.is_empty(), "docs/ lacks {missing:?}");
}

#[test]
fn the_readme_links_every_file_of_the_manual() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let linked: Vec<String> = links(&text)
        .into_iter()
        .map(|l| l.target.split('#').next().unwrap_or("").to_string())
        .collect();
    let unlinked: Vec<&str> = DOCS
        .iter()
        .copied()
        .filter(|f| !linked.contains(&format!("docs/{f}")))
        .collect();
    assert!(unlinked.is_empty(), "README.md links no docs/{unlinked:?}");
}

#[test]
fn the_readme_keeps_the_two_set_up_commands() {
    let text = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    for command in ["cargo run --release -p pagewarden -- up", "scripts/test.sh"] {
        let block = format!("```sh\n{command}\n```\n");
        assert!(
            text.contains(&block),
            "README.md lost its set-up block:\n{block}"
        );
    }
}
