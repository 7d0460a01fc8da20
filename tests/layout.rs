//! The layout's rules, read from the source: the module graph (which
//! top-level module of `src/` names which, outside its tests) has no cycle;
//! the drain and the leaves import nothing of the rest; `main.rs` only
//! parses and calls the library; no function in `src/` is over 80 lines.
//!
//! `cargo test --test layout -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that may import only each other: the value types, ports and
/// state machine of the drain, and the small leaves.
const LEAVES: [&str; 5] = ["drain", "duration", "logging", "url", "sys"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/`, with its path relative to `src/`.
fn sources() -> Vec<(String, String)> {
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
    walk(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(src()).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The code of a file without its unit tests: a `tests.rs` file is all
/// tests; elsewhere the tests start at `#[cfg(test)]` before a `mod`.
fn without_tests<'a>(rel: &str, text: &'a str) -> &'a str {
    if rel.ends_with("tests.rs") {
        return "";
    }
    let tests = text.match_indices("#[cfg(test)]\n").find(|(i, m)| {
        let next = text[i + m.len()..].lines().next().unwrap_or("");
        next.starts_with("mod ") || next.starts_with("pub(crate) mod ")
    });
    match tests {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// The top-level module a file belongs to: `drain/plan.rs` → `drain`,
/// `url.rs` → `url`; `lib.rs` and `main.rs` are the crate itself.
fn module_of(rel: &str) -> Option<String> {
    let first = rel.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// Top-level module → the top-level modules its code names (`crate::x`).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in sources() {
        let Some(from) = module_of(&rel) else { continue };
        let edges = graph.entry(from.clone()).or_default();
        for line in without_tests(&rel, &text).lines() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let before = line[..i].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let to: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !to.is_empty() && to != from {
                    edges.insert(to);
                }
            }
        }
    }
    // Names at the crate root that are no module (a macro) are no edge.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for edges in graph.values_mut() {
        edges.retain(|to| modules.contains(to));
    }
    graph
}

/// A cycle in the graph, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_module_graph_has_no_cycle() {
    let graph = graph();
    for (from, to) in &graph {
        println!("{from:>9} -> {}", to.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    assert!(graph.len() >= 10, "the source tree was not read: {graph:?}");
    assert_eq!(find_cycle(&graph), None, "a cycle between top-level modules");
}

#[test]
fn the_drain_and_the_leaves_import_nothing_but_leaves() {
    let graph = graph();
    for leaf in LEAVES {
        let outside: Vec<_> = graph[leaf].iter().filter(|m| !LEAVES.contains(&m.as_str())).collect();
        assert!(outside.is_empty(), "{leaf} imports {outside:?}");
    }
}

#[test]
fn the_adapters_implement_the_drains_ports_and_never_the_reverse() {
    let graph = graph();
    for adapter in ["envoy", "pod"] {
        assert!(
            graph[adapter].contains("drain"),
            "{adapter} implements no port of the drain"
        );
        for other in ["agent", "status", "metrics", "exit", "config", "cli", "hooks"] {
            assert!(!graph[adapter].contains(other), "{adapter} imports {other}");
        }
    }
}

#[test]
fn main_only_parses_and_calls_the_library() {
    let main = std::fs::read_to_string(src().join("main.rs")).unwrap();
    let lines = main.lines().count();
    println!("src/main.rs: {lines} lines");
    assert!(lines < 60, "src/main.rs has {lines} lines");
    assert!(main.contains("lifeguard::cli::parse") && main.contains("lifeguard::agent::main"));
}

/// Function bodies outside tests, by brace depth: `path:line name length`.
fn long_functions(limit: usize) -> Vec<String> {
    let mut found = Vec::new();
    for (rel, text) in sources() {
        let lines: Vec<&str> = without_tests(&rel, &text).lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            let code = code
                .strip_prefix("pub(crate) ")
                .or(code.strip_prefix("pub(super) "))
                .unwrap_or(code);
            let code = code.strip_prefix("pub ").unwrap_or(code);
            let code = code.strip_prefix("async ").unwrap_or(code);
            let Some(rest) = code.strip_prefix("fn ") else { continue };
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let (mut depth, mut opened) = (0i64, false);
            for (j, body) in lines[i..].iter().enumerate() {
                depth += body.matches('{').count() as i64 - body.matches('}').count() as i64;
                opened |= body.contains('{');
                if !opened && body.trim_end().ends_with(';') {
                    break;
                }
                if opened && depth <= 0 {
                    if j + 1 > limit {
                        found.push(format!("src/{rel}:{} {name} {} lines", i + 1, j + 1));
                    }
                    break;
                }
            }
        }
    }
    found
}

#[test]
fn no_function_is_over_80_lines() {
    let long = long_functions(80);
    assert!(long.is_empty(), "{long:#?}");
    // The check sees long functions when there are some.
    assert!(!long_functions(20).is_empty());
}
