//! The docs stand alone: code comments, doc comments, `--help` text, error messages and docs point
//! at the project's own docs (README.md, `docs/`, the chart's README), never at sections of a
//! specification that is not part of the repository. This test walks the sources, tests, docs
//! and chart and fails listing every `file:line` that cites one, so a new citation cannot creep
//! back in.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// The citation looked for, built from two parts so this file does not contain it itself.
fn citation() -> String {
    ["SPEC", " \u{a7}"].concat()
}

/// Files and directories walked, relative to the repository root.
const ROOTS: &[&str] = &[
    "src",
    "crates",
    "tests",
    "docs",
    "helm",
    "scripts",
    "clients",
    "console/src",
    "proto",
    "README.md",
    "Cargo.toml",
    "build.rs",
];

/// Directories never walked: build output, installed tools and dependencies, hidden ones
/// (`.git`, virtual environments).
fn skipped(dir: &Path) -> bool {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    matches!(name, "target" | "node_modules" | ".tools") || name.starts_with('.')
}

fn walk(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_dir() {
        if skipped(path) {
            return;
        }
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        entries.sort();
        for entry in entries {
            walk(&entry, files);
        }
    } else if path.is_file() {
        files.push(path.to_path_buf());
    }
}

#[test]
fn no_file_cites_a_specification_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for relative in ROOTS {
        walk(&root.join(relative), &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with("src/lib.rs")),
        "the walk found the sources"
    );

    let needle = citation();
    let mut found = Vec::new();
    for file in &files {
        // Images and other binary files are not text to cite anything in.
        let Ok(text) = fs::read_to_string(file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (index, line) in text.lines().enumerate() {
            if line.contains(&needle) {
                found.push(format!("{shown}:{}: {}", index + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cite the project's own docs (README.md sections, docs/*.md, the chart's README) \
         instead of {needle:?}:\n{}",
        found.join("\n")
    );
}
