//! The layout's rules that no lint can check, read from the source: the
//! module graph (which top-level module of `src/` names which, outside its
//! tests) has no cycle, and neither has the graph of files (each file's
//! module and the files its code names, at any depth); the drain and the
//! leaves import nothing of the rest; `main.rs` only parses, calls the
//! library and maps how it ended to the exit code through `exit`; no file
//! is over 600 lines outside its tests; errors are typed (no
//! `Result<_, String>` outside tests), and no function outside `agent`,
//! `exit` and `main.rs` returns a `u8` exit code.
//!
//! Why not clippy: its lints see one item at a time, never which file
//! names which (the graphs, the leaves), a file's length, or a type
//! argument in a position (`disallowed-types` forbids `String` everywhere
//! or nowhere; a `u8` is no type of its own). What clippy can check is in
//! clippy.toml and Cargo.toml's `[workspace.lints]`: no function over 80
//! lines of code (`too_many_lines`, src/lib.rs and src/main.rs turn it on),
//! `pub` only where it is reachable (`unreachable_pub`), the disallowed
//! methods and macros.
//!
//! `cargo test --test layout -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that may import only each other: the value types, ports and
/// state machine of the drain, Istio's formats, and the small leaves.
const LEAVES: [&str; 6] = ["drain", "duration", "istio", "logging", "url", "sys"];

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
    assert!(
        main.contains("lifeguard::exit::code"),
        "the exit code is exit's to decide"
    );
}

// ---------------------------------------------------------------------------
// Files

/// A file's module path: `metrics/scrape/mod.rs` → `metrics::scrape`,
/// `url.rs` → `url`; `lib.rs` and `main.rs` are the crate root ("").
fn module_path(rel: &str) -> String {
    let path = rel.strip_suffix(".rs").unwrap_or(rel);
    let path = path.strip_suffix("/mod").unwrap_or(path);
    match path {
        "lib" | "main" => String::new(),
        _ => path.replace('/', "::"),
    }
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (_, true) => base.to_owned(),
        _ => format!("{base}::{rest}"),
    }
}

fn parent(module: &str) -> String {
    module.rsplit_once("::").map_or(String::new(), |(p, _)| p.to_owned())
}

/// The paths of a `use` tree (`a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`,
/// `a::c::e`), `self` in a group standing for its prefix.
fn use_paths(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("").trim();
        return vec![path.to_owned()];
    };
    let prefix = tree[..open].trim().trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(use_paths)
        .map(|p| match p.as_str() {
            "self" => prefix.to_owned(),
            _ => join(prefix, &p),
        })
        .collect()
}

/// Identifier paths in a line of code: `crate::a::b`, `super::x`,
/// `name::y` (at a word's start).
fn code_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = line.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = word(bytes[i]) && (i == 0 || !(word(bytes[i - 1]) || bytes[i - 1] == b':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (word(bytes[j]) || (bytes[j] == b':' && bytes.get(j + 1) == Some(&b':'))) {
            j += if bytes[j] == b':' { 2 } else { 1 };
        }
        let path = line[i..j].trim_end_matches(':');
        if path.contains("::") {
            out.push(path.to_owned());
        }
        i = j.max(i + 1);
    }
    out
}

/// File module → the file modules its code names (outside its tests and
/// comments): `use` trees and paths, `super::` resolved from the inline
/// module it is written in. A `pub use` of the file's own descendants is a
/// re-export, not a use.
fn file_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = sources();
    let modules: BTreeSet<String> = files.iter().map(|(rel, _)| module_path(rel)).collect();
    let land = |path: &str| -> Option<String> {
        let mut p = path.to_owned();
        loop {
            if modules.contains(&p) {
                return Some(p);
            }
            p = p.rsplit_once("::")?.0.to_owned();
        }
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in &files {
        let file = module_path(rel);
        let edges = graph.entry(file.clone()).or_default();
        let code: String = without_tests(rel, text)
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        // Inline modules: (module path, brace depth it opened at).
        let mut scopes: Vec<(String, i64)> = vec![(file.clone(), -1)];
        let mut depth = 0i64;
        let mut statement = String::new();
        for line in code.lines() {
            let here = scopes.last().unwrap().0.clone();
            let trimmed = line.trim_start();
            let bare = trimmed
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            if let Some(name) = bare.strip_prefix("mod ").and_then(|r| r.strip_suffix('{')) {
                scopes.push((join(&here, name.trim()), depth));
            }
            let resolve = |path: &str| -> Option<String> {
                let mut segs: Vec<&str> = path.split("::").collect();
                let base = match segs[0] {
                    "crate" => {
                        segs.remove(0);
                        String::new()
                    }
                    "self" => {
                        segs.remove(0);
                        here.clone()
                    }
                    "super" => {
                        let mut base = parent(&here);
                        segs.remove(0);
                        while segs.first() == Some(&"super") {
                            segs.remove(0);
                            base = parent(&base);
                        }
                        base
                    }
                    first if modules.contains(&join(&here, first)) => here.clone(),
                    _ => return None,
                };
                land(&join(&base, &segs.join("::")))
            };
            if !statement.is_empty() || bare.starts_with("use ") {
                statement.push_str(line);
                if let Some(end) = statement.find(';') {
                    let reexport = trimmed.starts_with("pub") || statement.trim_start().starts_with("pub");
                    let tree = statement[..end].trim_start();
                    let tree = tree[tree.find("use ").unwrap() + 4..].to_owned();
                    for path in use_paths(&tree) {
                        if let Some(to) = resolve(&path) {
                            let inside = to.starts_with(&format!("{here}::")) || here.is_empty();
                            if !(reexport && inside) {
                                edges.insert(to);
                            }
                        }
                    }
                    statement.clear();
                }
            } else {
                for path in code_paths(line) {
                    if let Some(to) = resolve(&path) {
                        edges.insert(to);
                    }
                }
            }
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            while scopes.len() > 1 && depth <= scopes.last().unwrap().1 {
                scopes.pop();
            }
        }
        edges.remove(&file);
        edges.remove("");
    }
    graph
}

#[test]
fn no_cycle_between_files() {
    let graph = file_graph();
    assert!(graph.len() >= 40, "the source tree was not read: {graph:?}");
    assert!(
        graph["status::service"].contains("status::routes"),
        "the file graph sees a plain use: {:?}",
        graph["status::service"]
    );
    assert_eq!(find_cycle(&graph), None, "a cycle between files");
}

/// The largest file of `src/` outside its tests: one concern a file.
const FILE_CEILING: usize = 600;

#[test]
fn no_file_is_over_the_ceiling() {
    let mut big = Vec::new();
    for (rel, text) in sources() {
        let lines = without_tests(&rel, &text).lines().count();
        println!("{lines:5} src/{rel}");
        if lines > FILE_CEILING {
            big.push(format!("src/{rel}: {lines} lines"));
        }
    }
    assert!(big.is_empty(), "over {FILE_CEILING} lines outside tests: {big:#?}");
}

// ---------------------------------------------------------------------------
// Errors and exit codes

/// A file's code outside its tests, its comments blanked (lines kept, so
/// an offset still gives the line).
fn code_without_comments(rel: &str, text: &str) -> String {
    without_tests(rel, text)
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The line (from 1) of `offset` in `code`.
fn line_at(code: &str, offset: usize) -> usize {
    code[..offset].matches('\n').count() + 1
}

/// The top-level arguments of the generic list that opens at `code[open]`
/// (a `<`), and where it closes; `->` is no bracket.
fn generic_args(code: &str, open: usize) -> Option<(Vec<&str>, usize)> {
    let bytes = code.as_bytes();
    let (mut depth, mut start, mut args) = (0i32, open + 1, Vec::new());
    for i in open..bytes.len() {
        match bytes[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' if i > 0 && bytes[i - 1] == b'-' => {}
            b'>' | b')' | b']' => {
                depth -= 1;
                if depth == 0 {
                    args.push(&code[start..i]);
                    return Some((args, i));
                }
            }
            b',' if depth == 1 => {
                args.push(&code[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    None
}

/// Every `Result<_, String>` in `code`: `line: the type`.
fn string_errors_in(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some((args, end)) = generic_args(code, at + "Result".len()) else {
            continue;
        };
        let args: Vec<&str> = args.into_iter().map(str::trim).filter(|a| !a.is_empty()).collect();
        if args.len() == 2 && args[1] == "String" {
            let text: String = code[at..=end].split_whitespace().collect::<Vec<_>>().join(" ");
            found.push(format!("{}: {text}", line_at(code, at)));
        }
    }
    found
}

/// Every function of `code` that returns a `u8`, bare or inside another
/// type (`Result<_, u8>`), bytes aside (`[u8]`, `Vec<u8>`): `line: name`.
fn u8_returners_in(code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if at > 0 && word(bytes[at - 1]) {
            continue;
        }
        let rest = &code[at + 3..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(open) = rest.find('(') else { continue };
        // The parameters' closing parenthesis.
        let mut depth = 0;
        let Some(close) = rest[open..].char_indices().find_map(|(i, c)| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            (depth == 0).then_some(open + i)
        }) else {
            continue;
        };
        let after = rest[close + 1..].trim_start();
        let Some(ret) = after.strip_prefix("->") else { continue };
        let end = ret.find(['{', ';']).unwrap_or(ret.len());
        let ret = ret[..end].split(" where ").next().unwrap_or("");
        let ret: String = ret.split_whitespace().collect();
        let rb = ret.as_bytes();
        let returns_u8 = ret.match_indices("u8").any(|(i, _)| {
            let alone = (i == 0 || !word(rb[i - 1])) && rb.get(i + 2).is_none_or(|c| !word(*c));
            let bytes = (i > 0 && rb[i - 1] == b'[') || ret[..i].ends_with("Vec<");
            alone && !bytes
        });
        if returns_u8 {
            found.push(format!("{}: {name} -> {ret}", line_at(code, at)));
        }
    }
    found
}

#[test]
fn no_result_with_a_string_error_outside_tests() {
    // The check sees one when there is one.
    let sample = "fn f(s: &str) -> Result<(u16, Option<String>), String> {\n    let r: io::Result<String> = x;\n}\n\
                  fn g() -> Result<\n    (),\n    String,\n> {}";
    assert_eq!(
        string_errors_in(sample),
        ["1: Result<(u16, Option<String>), String>", "4: Result< (), String, >"]
    );
    let mut found = Vec::new();
    for (rel, text) in sources() {
        let code = code_without_comments(&rel, &text);
        found.extend(string_errors_in(&code).into_iter().map(|f| format!("src/{rel}:{f}")));
    }
    assert!(found.is_empty(), "errors are typed (thiserror), not prose: {found:#?}");
}

/// Where a process exit code may be made: the composition root, the
/// module that decides it, and the binary.
fn may_return_exit_codes(rel: &str) -> bool {
    rel == "main.rs" || rel.starts_with("agent/") || rel.starts_with("exit/")
}

#[test]
fn exit_codes_are_decided_in_exit() {
    // The check sees them when there are some, and leaves bytes alone.
    let sample = "pub async fn wait(o: &O) -> u8 {\n}\nfn parse(a: Vec<u8>)\n    -> Result<I, u8> {}\n\
                  fn body(&self) -> &[u8] {}\nfn take(self) -> Vec<u8> {}\nfn go(f: impl Fn(u8) -> u8) -> u16 {}";
    assert_eq!(u8_returners_in(sample), ["1: wait -> u8", "3: parse -> Result<I,u8>"]);
    let mut found = Vec::new();
    for (rel, text) in sources() {
        if may_return_exit_codes(&rel) {
            continue;
        }
        let code = code_without_comments(&rel, &text);
        found.extend(u8_returners_in(&code).into_iter().map(|f| format!("src/{rel}:{f}")));
    }
    assert!(
        found.is_empty(),
        "a function outside agent, exit and main.rs returns a u8 (an exit code: return a typed \
         result, and let crate::exit decide the number): {found:#?}"
    );
}
