//! The layers (docs/design.md) point one way: transport (`grpc`, `auth`) → engine (`session`) → runtime
//! transport (`acp`) and storage (`store`) → `domain`. This test reads every `src/**/*.rs`, collects
//! the top-level modules each one names through `crate::…` (in `use` lines, grouped
//! `use crate::{a, b::c}` forms and inline paths alike), and fails naming the file and the edge
//! when a layer reaches the wrong way, so the rule stays enforced as the code grows.
//!
//! Inside a module the same holds between its files: two sibling modules (say `grpc/browser.rs`
//! and `grpc/console.rs`, or `session/manager/` and `session/subscribe.rs`) never reach each
//! other in a circle, through `crate::…`, `super::…` or `self::…` paths. A parent and its own
//! children may (`mod.rs` declares and re-exports them; they use its items through `super`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Which top-level module reaches which, with the files that do it.
type Edges = BTreeMap<(String, String), BTreeSet<String>>;

/// The top-level modules each named under `crate::` in `source` (comments ignored).
fn referenced_modules(source: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `agent_harness_crate::` or `my_crate::` are not the crate root.
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let body = group_body(group);
            for item in split_top_level(body) {
                if let Some(name) = leading_ident(item.trim()) {
                    found.insert(name);
                }
            }
        } else if let Some(name) = leading_ident(rest) {
            found.insert(name);
        }
    }
    found.remove("self");
    found
}

/// The text of a `{ … }` group up to its matching brace (the opening one already consumed).
fn group_body(text: &str) -> &str {
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[..i];
                }
            }
            _ => {}
        }
    }
    text
}

/// The comma-separated items of a group, nested groups kept whole.
fn split_top_level(body: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    items
}

fn leading_ident(text: &str) -> Option<String> {
    let ident: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!ident.is_empty() && !ident.starts_with(|c: char| c.is_ascii_digit())).then_some(ident)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every edge between top-level modules of the library, read from the sources.
fn crate_edges() -> Edges {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut edges = Edges::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let top = relative
            .components()
            .next()
            .expect("a file under src/")
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        // The binary is its own crate: `crate::` there is not the library.
        if top == "main" {
            continue;
        }
        let source = fs::read_to_string(&file).expect("source is readable");
        for target in referenced_modules(&source) {
            if target != top {
                edges
                    .entry((top.clone(), target))
                    .or_default()
                    .insert(format!("src/{}", relative.display()));
            }
        }
    }
    edges
}

/// The edges from `from` to any of `to`, described for a failure message.
fn forbidden(edges: &Edges, from: &[&str], to: impl Fn(&str) -> bool) -> Vec<String> {
    edges
        .iter()
        .filter(|((a, b), _)| from.contains(&a.as_str()) && to(b))
        .flat_map(|((a, b), files)| files.iter().map(move |file| format!("{file}: {a} → {b}")))
        .collect()
}

#[test]
fn the_domain_imports_nothing_else_of_the_crate() {
    let bad = forbidden(&crate_edges(), &["domain"], |_| true);
    assert!(bad.is_empty(), "domain must stay pure:\n{}", bad.join("\n"));
}

#[test]
fn the_engine_storage_and_runtime_transport_never_import_the_transport_or_telemetry() {
    let bad = forbidden(&crate_edges(), &["session", "store", "acp"], |to| {
        ["grpc", "auth", "telemetry"].contains(&to)
    });
    assert!(bad.is_empty(), "layers reach upwards:\n{}", bad.join("\n"));
}

#[test]
fn storage_and_the_runtime_transport_never_import_the_engine() {
    let bad = forbidden(&crate_edges(), &["store", "acp"], |to| to == "session");
    assert!(bad.is_empty(), "layers reach upwards:\n{}", bad.join("\n"));
}

#[test]
fn the_transport_and_the_layers_below_never_reach_the_entry_points_configuration() {
    // `app` reads `config` and hands each layer options of its own (e.g. the browser's).
    let bad = forbidden(
        &crate_edges(),
        &["grpc", "auth", "session", "store", "acp", "domain"],
        |to| ["config", "app"].contains(&to),
    );
    assert!(
        bad.is_empty(),
        "layers reach the entry point:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_command_line_is_a_client_that_reaches_only_the_generated_types() {
    // `agent-harness sessions|prompt|follow|…` talk to a server like any other caller would.
    // `net` holds facts about addresses that clients need as much as the server does.
    let bad = forbidden(&crate_edges(), &["cli"], |to| to != "pb" && to != "net");
    assert!(
        bad.is_empty(),
        "the cli must use only pb (and net):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_model_proxy_is_an_adapter_that_reaches_only_the_domain() {
    // What it needs of sessions (a budget check, a place for usage) comes through its `Meter`
    // trait, which the engine implements: it never reaches the engine, the store or the server.
    let bad = forbidden(&crate_edges(), &["model_proxy"], |to| to != "domain");
    assert!(
        bad.is_empty(),
        "the model proxy reaches into the service:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_shared_address_facts_import_nothing_else_of_the_crate() {
    let bad = forbidden(&crate_edges(), &["net"], |_| true);
    assert!(bad.is_empty(), "net must stay a leaf:\n{}", bad.join("\n"));
}

#[test]
fn the_bridge_is_only_a_client_of_the_gateway_and_nothing_of_the_service_reaches_it() {
    let edges = crate_edges();
    // It starts processes (`acp`) and speaks the wire types (`pb`); it never runs the engine,
    // the store or the server's transport.
    let bad = forbidden(&edges, &["bridge"], |to| {
        ["session", "store", "grpc", "auth", "app", "translate"].contains(&to)
    });
    assert!(
        bad.is_empty(),
        "the bridge reaches into the service:\n{}",
        bad.join("\n")
    );
    let bad = forbidden(
        &edges,
        &[
            "domain",
            "acp",
            "store",
            "session",
            "grpc",
            "auth",
            "app",
            "config",
            "telemetry",
        ],
        |to| to == "bridge",
    );
    assert!(
        bad.is_empty(),
        "the service reaches the bridge:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_top_level_modules_import_each_other_in_a_circle() {
    let edges = crate_edges();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().insert(b);
    }
    let mut circles = BTreeSet::new();
    // A circle through `a → b` exists when `b` reaches `a`; report the path it takes, once,
    // starting from its first module in name order.
    for (a, b) in edges.keys() {
        if let Some(back) = path_between(&graph, b, a) {
            let mut circle: Vec<&str> = std::iter::once(a.as_str()).chain(back).collect();
            circle.pop();
            let first = (0..circle.len())
                .min_by_key(|&i| circle[i])
                .expect("a circle has modules");
            circle.rotate_left(first);
            circle.push(circle[0]);
            let via: Vec<String> = circle
                .windows(2)
                .map(|pair| {
                    let files = &edges[&(pair[0].to_owned(), pair[1].to_owned())];
                    let file = files.iter().next().expect("an edge has a file");
                    format!("{} → {} ({file})", pair[0], pair[1])
                })
                .collect();
            circles.insert(via.join(", "));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles between top-level modules:\n{}",
        circles.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The modules on a path from `from` to `to` (both included), if there is one.
fn path_between<'a>(
    graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    from: &'a str,
    to: &'a str,
) -> Option<Vec<&'a str>> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut frontier = vec![from];
    let mut seen = BTreeSet::from([from]);
    while let Some(node) = frontier.pop() {
        if node == to {
            let mut path = vec![to];
            let mut at = to;
            while let Some(prev) = came_from.get(at) {
                path.push(prev);
                at = prev;
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(node).into_iter().flatten() {
            if seen.insert(next) {
                came_from.insert(next, node);
                frontier.push(next);
            }
        }
    }
    None
}

// ---- circles between the files of one module --------------------------------------------------

/// The module a file under `src/` is: `session/manager/mod.rs` is `session::manager`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().expect("a file name");
    let stem = file.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib") {
        parts.push(stem.to_owned());
    }
    parts
}

/// Every path `source` names from the crate root, its parent (`super::`, repeated) or itself
/// (`self::`), made absolute for the file module `module`; groups are expanded, so
/// `use super::{a::b, c}` names `<parent>::a::b` and `<parent>::c`. Test modules at the end of a
/// file are skipped: their `super` is the file itself.
fn absolute_paths(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code: String = source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let code = &code[..inline_test_module(&code).unwrap_or(code.len())];
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let Some(offset) = ["crate::", "super::", "self::"]
            .iter()
            .filter_map(|root| rest.find(root))
            .min()
        else {
            break;
        };
        let start = at + offset;
        at = start + 1;
        // Part of a longer path or name (`super::super::`, `my_crate::`): counted from its start.
        if code[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        let mut tail = &code[start..];
        let base: Vec<String> = if let Some(after) = tail.strip_prefix("crate::") {
            tail = after;
            Vec::new()
        } else if let Some(after) = tail.strip_prefix("self::") {
            tail = after;
            module.to_vec()
        } else {
            let mut base = module.to_vec();
            while let Some(after) = tail.strip_prefix("super::") {
                tail = after;
                base.pop();
            }
            base
        };
        for path in expand(tail) {
            found.push(base.iter().cloned().chain(path).collect());
        }
    }
    found
}

/// Where the file's inline `#[cfg(test)] mod tests { … }` starts, if it has one.
fn inline_test_module(code: &str) -> Option<usize> {
    code.match_indices("#[cfg(test)]")
        .map(|(at, _)| at)
        .find(|&at| {
            let after = code[at + "#[cfg(test)]".len()..].trim_start();
            after.strip_prefix("mod ").is_some_and(|rest| {
                rest.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_' || c == ' ')
                    .starts_with('{')
            })
        })
}

/// The child modules `code` declares for tests only (`#[cfg(test)] mod tests;`).
fn test_only_children(code: &str) -> Vec<String> {
    code.match_indices("#[cfg(test)]")
        .filter_map(|(at, _)| {
            let line = code[at + "#[cfg(test)]".len()..]
                .trim_start()
                .split('\n')
                .next()?;
            let line = line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            let name = line.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_owned())
        })
        .collect()
}

/// The paths a path tail names: `a::b::{c, d::{self, e}}` names `a::b::c`, `a::b::d` and
/// `a::b::d::e`.
fn expand(tail: &str) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    let mut rest = tail;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            return split_top_level(group_body(group))
                .into_iter()
                .flat_map(|item| expand(item.trim()))
                .map(|path| {
                    let path = path.into_iter().filter(|s| s != "self");
                    prefix.iter().cloned().chain(path).collect()
                })
                .collect();
        }
        let Some(ident) = leading_ident(rest) else {
            return vec![prefix];
        };
        rest = &rest[ident.len()..];
        prefix.push(ident);
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![prefix],
        }
    }
}

/// Which sibling module reaches which inside a module of the library (`grpc::browser` →
/// `grpc::console`), with the files that do it. A file counts for the sibling it lies under, so
/// `session/manager/reads.rs` reaching `session/subscribe.rs` is `session::manager` →
/// `session::subscribe`. Top-level modules are left to the tests above.
fn sibling_edges() -> Edges {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let files: Vec<(PathBuf, Vec<String>)> = files
        .into_iter()
        .filter(|file| !file.ends_with("main.rs") || file.parent() != Some(src.as_path()))
        .map(|file| {
            let module = module_of(file.strip_prefix(&src).expect("under src/"));
            (file, module)
        })
        .collect();
    let sources: Vec<String> = files
        .iter()
        .map(|(file, _)| fs::read_to_string(file).expect("source is readable"))
        .collect();
    // Test scaffolding (the store's conformance suite and the backends' test modules) may
    // reach back and forth: it is not part of the library's structure.
    let test_only: BTreeSet<Vec<String>> = files
        .iter()
        .zip(&sources)
        .flat_map(|((_, module), source)| {
            test_only_children(source).into_iter().map(|child| {
                let mut path = module.clone();
                path.push(child);
                path
            })
        })
        .collect();
    let modules: BTreeSet<&[String]> = files.iter().map(|(_, m)| m.as_slice()).collect();
    let mut edges = Edges::new();
    for ((file, module), source) in files.iter().zip(&sources) {
        if (1..=module.len()).any(|n| test_only.contains(&module[..n])) {
            continue;
        }
        let source = source.as_str();
        for path in absolute_paths(source, module) {
            // The deepest module the path names (the rest are items in it).
            let Some(target) = (0..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|prefix| modules.contains(prefix))
            else {
                continue;
            };
            let common = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            // Itself, an ancestor or a descendant; or two top-level modules.
            if common == module.len() || common == target.len() || common == 0 {
                continue;
            }
            edges
                .entry((module[..=common].join("::"), target[..=common].join("::")))
                .or_default()
                .insert(format!(
                    "src/{}",
                    file.strip_prefix(&src).expect("under src/").display()
                ));
        }
    }
    edges
}

/// Circles known and not yet broken, each as the test reports it. An entry fails the test once
/// its circle is gone, so the list only shrinks.
const KNOWN_CIRCLES: [&str; 0] = [];

#[test]
fn no_two_files_of_a_module_import_each_other_in_a_circle() {
    let edges = sibling_edges();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a).or_default().insert(b);
    }
    let mut circles = BTreeSet::new();
    for (a, b) in edges.keys() {
        if let Some(back) = path_between(&graph, b, a) {
            let mut circle: Vec<&str> = std::iter::once(a.as_str()).chain(back).collect();
            circle.pop();
            let first = (0..circle.len())
                .min_by_key(|&i| circle[i])
                .expect("a circle has modules");
            circle.rotate_left(first);
            circle.push(circle[0]);
            let via: Vec<String> = circle
                .windows(2)
                .map(|pair| {
                    let files = &edges[&(pair[0].to_owned(), pair[1].to_owned())];
                    let file = files.iter().next().expect("an edge has a file");
                    format!("{} → {} ({file})", pair[0], pair[1])
                })
                .collect();
            circles.insert(via.join(", "));
        }
    }
    for known in KNOWN_CIRCLES {
        assert!(
            circles.remove(known),
            "no longer a circle, remove it from KNOWN_CIRCLES: {known}"
        );
    }
    assert!(
        circles.is_empty(),
        "import circles between the files of a module:\n{}",
        circles.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn super_self_and_grouped_paths_are_made_absolute() {
    let module: Vec<String> = ["session", "manager", "reads"].map(String::from).to_vec();
    let source = r#"
        use super::{Sessions, create::{self, Made}};
        use crate::session::{Command, subscribe::{self, View}};
        fn f() { super::super::warm::fill(); self::inner::g(); }
        pub(super) fn h() {} // super::ignored in a comment
        #[cfg(test)]
        mod tests { use super::super::owners; }
    "#;
    let found: Vec<String> = absolute_paths(source, &module)
        .into_iter()
        .map(|path| path.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "session::manager::Sessions",
            "session::manager::create",
            "session::manager::create::Made",
            "session::Command",
            "session::subscribe",
            "session::subscribe::View",
            "session::warm::fill",
            "session::manager::reads::inner::g",
        ]
    );
    assert_eq!(
        module_of(Path::new("session/manager/mod.rs")),
        ["session", "manager"]
    );
    assert_eq!(module_of(Path::new("grpc/browser.rs")), ["grpc", "browser"]);
}

#[test]
fn grouped_nested_and_inline_crate_paths_are_all_collected() {
    let source = r#"
        use crate::{
            acp::{frames, process::spawn},
            domain::{self, Error},
        };
        use crate::store::Store; // crate::grpc in a comment does not count
        fn f() { let _ = crate::telemetry::metrics::install(); }
        use other_crate::auth;
    "#;
    let found: Vec<String> = referenced_modules(source).into_iter().collect();
    assert_eq!(found, ["acp", "domain", "store", "telemetry"]);
}

#[test]
fn a_circle_is_found_with_the_path_it_takes() {
    let graph = BTreeMap::from([
        ("a", BTreeSet::from(["b"])),
        ("b", BTreeSet::from(["c"])),
        ("c", BTreeSet::from(["a"])),
    ]);
    assert_eq!(path_between(&graph, "b", "a"), Some(vec!["b", "c", "a"]));
    assert_eq!(path_between(&graph, "a", "d"), None);
}
