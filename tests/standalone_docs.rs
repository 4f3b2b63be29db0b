//! The docs stand alone: code comments, doc comments, `--help` text, error messages and docs point
//! at the project's own docs (README.md, `docs/`, the chart's README), never at sections of a
//! specification that is not part of the repository. This test walks the sources, tests, docs
//! and chart and fails listing every `file:line` that cites one, so a new citation cannot creep
//! back in. A second test keeps the pointers at our own docs from rotting: every section a file
//! names by its heading is a heading of the file named, and every `docs/` page named exists.

use std::{
    collections::{BTreeSet, HashMap},
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

/// Every text file walked: its path as shown (from the repository's root), its path, its text.
/// Images and other binary files are left out: they are no text to cite anything in.
fn texts() -> Vec<(String, PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for relative in ROOTS {
        walk(&root.join(relative), &mut files);
    }
    files
        .into_iter()
        .filter_map(|file| {
            let text = fs::read_to_string(&file).ok()?;
            let shown = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            Some((shown, file, text))
        })
        .collect()
}

#[test]
fn no_file_cites_a_specification_outside_the_repository() {
    let files = texts();
    assert!(
        files.iter().any(|(shown, _, _)| shown == "src/lib.rs"),
        "the walk found the sources"
    );

    let needle = citation();
    let mut found = Vec::new();
    for (shown, _, text) in &files {
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

/// Whether a byte may be part of a file path as the docs write one.
fn is_path_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'/' | b'-')
}

/// A file's text as one line, so that a reference broken over two lines (a wrapped comment, a
/// Markdown paragraph) reads as written: each line loses its indentation and the comment markers
/// that open it (`//!`, `///`, `//`, `#`, `*`), an escaped quote (`\"` in a Rust or shell string)
/// becomes a plain one, and the lines are joined by spaces. Also returns where each line starts.
fn as_one_line(text: &str) -> (String, Vec<usize>) {
    let mut joined = String::with_capacity(text.len());
    let mut starts = Vec::new();
    for line in text.lines() {
        starts.push(joined.len());
        let bare = line.trim().trim_start_matches(['/', '!', '#', '*']).trim();
        joined.push_str(&bare.replace("\\\"", "\""));
        joined.push(' ');
    }
    (joined, starts)
}

/// A pointer at another file found in a file: the line it starts on, the path as written
/// (`README`, `README.md`, `docs/<page>.md`, `../../docs/<page>.md`, …) and the quoted heading after it,
/// if any.
struct Pointer {
    line: usize,
    path: String,
    heading: Option<String>,
}

impl Pointer {
    fn names_a_readme(&self) -> bool {
        matches!(
            self.path.rsplit('/').next(),
            Some("README") | Some("README.md")
        )
    }
}

/// Every pointer at a Markdown file in `text`. A heading counts when the path is followed (after
/// an optional closing backtick or link parenthesis) by a comma and a quoted heading, by a
/// parenthesised quoted heading (a `.md` path), or by an apostrophe s and a quoted heading (a
/// README).
fn pointers(text: &str) -> Vec<Pointer> {
    let (joined, starts) = as_one_line(text);
    let bytes = joined.as_bytes();
    let line_of = |at: usize| starts.partition_point(|&start| start <= at);
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !is_path_byte(bytes[i]) || (i > 0 && is_path_byte(bytes[i - 1])) {
            i += 1;
            continue;
        }
        let mut end = i;
        while end < bytes.len() && is_path_byte(bytes[end]) {
            end += 1;
        }
        // A sentence's full stop is not part of the path.
        let path = joined[i..end].trim_end_matches('.');
        let after_url_scheme = i > 0 && bytes[i - 1] == b':';
        let is_readme = matches!(path.rsplit('/').next(), Some("README") | Some("README.md"));
        if (path.ends_with(".md") || is_readme) && !after_url_scheme && !path.starts_with("//") {
            let mut k = i + path.len();
            for closing in [b'`', b')'] {
                if bytes.get(k) == Some(&closing) {
                    k += 1;
                }
            }
            let separators: &[&str] = if is_readme {
                &[", \"", "'s \""]
            } else {
                &[", \"", " (\""]
            };
            let heading = separators
                .iter()
                .find(|separator| joined[k..].starts_with(*separator))
                .and_then(|separator| {
                    let open = k + separator.len();
                    let close = open + joined[open..].find('"')?;
                    // A quote that closes far away is not a heading's.
                    (close - open <= 200).then(|| joined[open..close].to_string())
                });
            found.push(Pointer {
                line: line_of(i),
                path: path.to_string(),
                heading,
            });
        }
        i = end;
    }
    found
}

/// A heading or a quoted reference to one, as compared: without backticks, surrounding space
/// and trailing punctuation.
fn comparable(heading: &str) -> String {
    heading
        .replace('`', "")
        .trim()
        .trim_end_matches(['.', ':', ';', ',', '!', '?'])
        .trim()
        .to_string()
}

/// The Markdown headings of a file (lines opening with `#`s and a space, outside fenced code).
fn headings_of(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut in_code = false;
    let mut headings = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if title.starts_with(' ') {
            headings.push(comparable(title));
        }
    }
    headings
}

/// The file a pointer in `file` names: a bare `README` or `README.md` is the nearest README.md
/// in the file's directory or above it (so the chart's files mean the chart's README); a path is
/// taken from the repository root, else from the file's directory (`../` always from there).
fn resolve(root: &Path, file: &Path, pointer: &Pointer) -> Option<PathBuf> {
    let dir = file.parent()?;
    if pointer.path == "README" || pointer.path == "README.md" {
        return dir
            .ancestors()
            .take_while(|ancestor| ancestor.starts_with(root))
            .map(|ancestor| ancestor.join("README.md"))
            .find(|candidate| candidate.is_file());
    }
    let candidates = if pointer.path.starts_with("../") || pointer.path.starts_with("./") {
        vec![dir.join(&pointer.path)]
    } else {
        vec![root.join(&pointer.path), dir.join(&pointer.path)]
    };
    candidates.into_iter().find(|candidate| candidate.is_file())
}

/// The page of `docs/` a path names when it is one (`docs/<page>.md`, `../../docs/<page>.md`).
fn docs_page(path: &str) -> Option<&str> {
    let mut rest = path;
    while let Some(up) = rest.strip_prefix("../") {
        rest = up;
    }
    let page = rest.strip_prefix("docs/")?;
    let stem = page.strip_suffix(".md")?;
    (!stem.is_empty()
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'))
    .then_some(page)
}

#[test]
fn every_section_a_file_points_at_is_a_heading_there() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut headings: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut checked = 0;
    let mut broken = BTreeSet::new();
    for (shown, file, text) in &texts() {
        let file = file.as_path();
        for pointer in pointers(text) {
            let at = format!("{shown}:{}", pointer.line);
            match &pointer.heading {
                Some(heading) => {
                    checked += 1;
                    let reference = format!("{}, \"{heading}\"", pointer.path);
                    let Some(target) = resolve(root, file, &pointer) else {
                        let what = if pointer.names_a_readme() {
                            "no README above it"
                        } else {
                            "no such file"
                        };
                        broken.insert((at, format!("{reference} ({what})")));
                        continue;
                    };
                    let key = target.canonicalize().unwrap_or_else(|_| target.clone());
                    let titles = headings.entry(key).or_insert_with(|| headings_of(&target));
                    let wanted = comparable(heading);
                    if !titles.iter().any(|title| title.starts_with(&wanted)) {
                        let named = target
                            .strip_prefix(root)
                            .unwrap_or(&target)
                            .display()
                            .to_string();
                        broken.insert((at, format!("{reference} (no such heading in {named})")));
                    }
                }
                None => {
                    if let Some(page) = docs_page(&pointer.path) {
                        checked += 1;
                        if !root.join("docs").join(page).is_file() {
                            broken.insert((at, format!("{} (no such file)", pointer.path)));
                        }
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "the walk found only {checked} pointers at docs: the scan is broken"
    );
    assert!(
        broken.is_empty(),
        "a file points at a section (or a docs/ page) that is not there; name a heading of the \
         file as it is now, or the file the section moved to:\n{}",
        broken
            .into_iter()
            .map(|(at, reference)| format!("{at}: {reference}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// README is the first hour, not the manual: what it is, the two commands, a tour and links. The
/// reference lives in docs/ (docs/configuration.md, docs/replicas.md, …).
#[test]
fn the_readme_stays_a_first_hour_page_that_starts_with_the_two_commands() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: move reference text into docs/ and link it"
    );
    let first_block: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(
        first_block[0].starts_with("cargo run --release -- serve")
            && first_block[1].starts_with("scripts/test"),
        "README.md starts with the two commands (serve, then scripts/test): {first_block:?}"
    );
    for page in ["docs/quickstart.md", "docs/configuration.md"] {
        assert!(readme.contains(page), "README.md links {page}");
    }
}
