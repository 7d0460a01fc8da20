//! What Cargo and clippy cannot see of the layout. Cargo keeps the layers
//! (a crate cannot name one it does not depend on, and the graph has no
//! cycle); clippy keeps functions short and `pub` reachable. Left here:
//! the graph Cargo.toml declares is the one docs/architecture.md draws;
//! `main.rs` only parses and calls the library; no file is over 600 lines
//! outside its tests.
//!
//! `cargo test --test layout -- --nocapture` prints the graph and the
//! files' lengths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A crate's short name: `lifeguard-drain-wait` → `drain-wait`.
fn short(name: &str) -> &str {
    name.strip_prefix("lifeguard-").unwrap_or(name)
}

/// The workspace's crates and the workspace crates each depends on (its
/// normal dependencies), as `cargo metadata` reads Cargo.toml.
fn declared_graph() -> BTreeMap<String, Vec<String>> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version=1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut graph = BTreeMap::new();
    for pkg in meta["packages"].as_array().unwrap() {
        let name = pkg["name"].as_str().unwrap();
        if !name.starts_with("lifeguard") || name == "lifeguard-test-kit" {
            continue;
        }
        let mut deps: Vec<String> = pkg["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str().filter(|n| n.starts_with("lifeguard-")))
            .map(|n| short(n).to_owned())
            .collect();
        deps.sort();
        graph.insert(short(name).to_owned(), deps);
    }
    graph
}

/// The graph docs/architecture.md draws: its lines `CRATE -> DEP ...`.
fn drawn_graph() -> BTreeMap<String, Vec<String>> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut graph = BTreeMap::new();
    for line in doc.lines() {
        let Some((name, deps)) = line.split_once(" ->") else {
            continue;
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
            continue;
        }
        let mut deps: Vec<String> = deps.split_whitespace().map(str::to_owned).collect();
        deps.sort();
        graph.insert(name.trim().to_owned(), deps);
    }
    graph
}

#[test]
fn the_crate_graph_is_the_one_the_architecture_draws() {
    let declared = declared_graph();
    for (name, deps) in &declared {
        println!("{name} -> {}", deps.join(" "));
    }
    assert!(declared.len() >= 10, "{declared:?}");
    assert_eq!(
        drawn_graph(),
        declared,
        "docs/architecture.md's crate graph (left) and Cargo.toml's (right)"
    );
}

#[test]
fn main_only_parses_and_calls_the_library() {
    let main = std::fs::read_to_string(root().join("src/main.rs")).unwrap();
    let lines = main.lines().count();
    println!("src/main.rs: {lines} lines");
    assert!(lines < 60, "src/main.rs has {lines} lines");
    assert!(main.contains("lifeguard::cli::parse") && main.contains("lifeguard::agent::main"));
    assert!(
        main.contains("lifeguard::exit::code"),
        "the exit code is exit's to decide"
    );
}

/// Every `.rs` file of the binary's crate and of crates/.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    walk(&root().join("crates"), &mut files);
    files.sort();
    files
}

/// The code of a file without its unit tests: a `tests.rs` file is all
/// tests; elsewhere the tests start at `#[cfg(test)]` before a `mod`.
fn without_tests<'a>(path: &Path, text: &'a str) -> &'a str {
    if path.ends_with("tests.rs") {
        return "";
    }
    let tests = text.match_indices("#[cfg(test)]\n").find(|(i, m)| {
        let next = text[i + m.len()..].lines().next().unwrap_or("");
        next.starts_with("mod ") || next.starts_with("pub(crate) mod ")
    });
    tests.map_or(text, |(i, _)| &text[..i])
}

/// The largest file outside its tests: one concern a file.
const FILE_CEILING: usize = 600;

#[test]
fn no_file_is_over_the_ceiling() {
    let mut big = Vec::new();
    for path in sources() {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = without_tests(&path, &text).lines().count();
        let rel = path.strip_prefix(root()).unwrap().display().to_string();
        println!("{lines:5} {rel}");
        if lines > FILE_CEILING {
            big.push(format!("{rel}: {lines} lines"));
        }
    }
    assert!(big.is_empty(), "over {FILE_CEILING} lines outside tests: {big:#?}");
}
