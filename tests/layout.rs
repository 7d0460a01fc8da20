//! What Cargo and clippy cannot see of the layout. Cargo keeps the layers
//! (a crate cannot name one it does not depend on, and the graph has no
//! cycle); clippy keeps functions short and `pub` reachable. Left here:
//! the graph Cargo.toml declares is the one docs/architecture.md draws;
//! inside each crate, no two top-level modules (its root included) name
//! each other, directly or around a circle; `main.rs` only parses and
//! calls the library; no file is over 600 lines outside its tests.
//!
//! `cargo test --test layout -- --nocapture` prints the graphs and the
//! files' lengths.

use std::collections::{BTreeMap, BTreeSet};
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

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
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
    walk(dir, &mut files);
    files.sort();
    files
}

/// Every `.rs` file of the binary's crate and of crates/.
fn sources() -> Vec<PathBuf> {
    let mut files = rust_files(&root().join("src"));
    files.extend(rust_files(&root().join("crates")));
    files
}

/// The code of a file without its unit tests: a `tests.rs` file is all
/// tests; elsewhere a `#[cfg(test)]` `mod tests;` line goes, and the tests
/// start at a `#[cfg(test)]` before a `mod` with its body.
fn without_tests<'a>(path: &Path, text: &'a str) -> std::borrow::Cow<'a, str> {
    if path.ends_with("tests.rs") {
        return "".into();
    }
    let mut code = String::new();
    let mut rest = text;
    while let Some((i, m)) = rest.match_indices("#[cfg(test)]\n").find(|(i, m)| {
        let next = rest[i + m.len()..].lines().next().unwrap_or("");
        next.starts_with("mod ") || next.starts_with("pub(crate) mod ")
    }) {
        code.push_str(&rest[..i]);
        let after = &rest[i + m.len()..];
        let line = after.lines().next().unwrap_or("");
        if !line.trim_end().ends_with(';') {
            return code.into();
        }
        rest = after[line.len()..].strip_prefix('\n').unwrap_or(&after[line.len()..]);
    }
    match code.is_empty() {
        true => rest.into(),
        false => (code + rest).into(),
    }
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

/// A crate's top-level modules (`src/x.rs` or `src/x/`), and its root.
const ROOT: &str = "(root)";

/// The module of a crate a file belongs to: `machine/reads.rs` →
/// `machine`, `lib.rs` → [`ROOT`].
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.strip_suffix(".rs").unwrap_or(&first) {
        "lib" | "main" => ROOT.to_owned(),
        name => name.to_owned(),
    }
}

/// The first segment of each path that `prefix` begins in `code`
/// (comments aside, and not the tail of a longer path): `crate::a::b` and
/// `crate::{a, b::c}` give `a` (and `b`), `crate::*` gives `*`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let first = |s: &str| {
        let s = s.trim_start();
        match s.strip_prefix('*') {
            Some(_) => "*".to_owned(),
            None => s[..s.find(|c| !ident(c)).unwrap_or(s.len())].to_owned(),
        }
    };
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        if code[..i].chars().last().is_some_and(|c| ident(c) || c == ':') {
            continue;
        }
        let rest = &code[i + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(first(rest));
            continue;
        };
        // The group's items, split at its own commas (not a nested group's).
        let (mut depth, mut item) = (0, 0);
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    out.push(first(&group[item..j]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(first(&group[item..j]));
                    item = j + 1;
                }
                _ => {}
            }
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The statements of `code` (to their `;`) whose line begins with one of
/// `starts`.
fn statements<'a>(code: &'a str, starts: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let begin = at + (line.len() - trimmed.len());
        at += line.len();
        if starts.iter().any(|s| trimmed.starts_with(s)) {
            let end = code[begin..].find(';').map_or(code.len(), |e| begin + e + 1);
            out.push(&code[begin..end]);
        }
    }
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// What a crate's root says of its modules: their names, and the items it
/// re-exports from each (item → module).
struct Contents {
    modules: BTreeSet<String>,
    reexported: BTreeMap<String, String>,
}

impl Contents {
    fn read(src: &Path, files: &[PathBuf]) -> Contents {
        let modules: BTreeSet<String> = files.iter().map(|f| top_module(src, f)).collect();
        let root_file = ["lib.rs", "main.rs"]
            .iter()
            .map(|f| src.join(f))
            .find(|f| f.exists())
            .unwrap();
        let root_text = std::fs::read_to_string(root_file).unwrap();
        let mut reexported = BTreeMap::new();
        for statement in statements(&root_text, &["pub use ", "pub(crate) use ", "use "]) {
            let rest = statement.split_once("use ").unwrap().1;
            let Some((module, items)) = rest.split_once("::") else {
                continue;
            };
            if modules.contains(module.trim()) {
                for item in items
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .filter(|s| !s.is_empty())
                {
                    reexported.insert(item.to_owned(), module.trim().to_owned());
                }
            }
        }
        Contents { modules, reexported }
    }

    /// The modules the root's code names: `x::…` (or `crate::x::…`,
    /// `self::x::…`), or an item re-exported from `x` (its `mod` and `pub
    /// use` lines are the crate's table of contents, not a use).
    fn named_by_root(&self, code: &str) -> Vec<String> {
        let contents = ["mod ", "pub mod ", "pub(crate) mod ", "pub use ", "pub(crate) use "];
        let mut body = code.to_owned();
        for statement in statements(code, &contents) {
            body = body.replacen(statement, "", 1);
        }
        let words: BTreeSet<&str> = body
            .lines()
            .flat_map(|l| {
                l.split("//")
                    .next()
                    .unwrap_or("")
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            })
            .collect();
        let mut named: BTreeSet<&str> = ["crate::", "self::"]
            .iter()
            .flat_map(|prefix| paths_after(&body, prefix))
            .filter_map(|seg| self.modules.get(&seg).map(String::as_str))
            .collect();
        named.extend(
            self.modules
                .iter()
                .filter(|m| !paths_after(&body, &format!("{m}::")).is_empty())
                .map(String::as_str),
        );
        let by_path = named.into_iter().filter(|m| *m != ROOT).map(str::to_owned);
        let by_item = self
            .reexported
            .iter()
            .filter(|(item, _)| words.contains(item.as_str()))
            .map(|(_, m)| m);
        by_path.chain(by_item.cloned()).collect()
    }

    /// The modules the code of a module's file names: `crate::x::…` (or
    /// `super::x` from a file of the root's own, `super::super::x` from
    /// one a directory down) names `x`; `crate::Item`, the module the root
    /// re-exports it from, else the root.
    fn named_by_module(&self, src: &Path, file: &Path, code: &str) -> Vec<String> {
        let depth = file.strip_prefix(src).unwrap().components().count() - usize::from(file.ends_with("mod.rs"));
        let mut segments = paths_after(code, "crate::");
        segments.extend(
            paths_after(code, &"super::".repeat(depth))
                .into_iter()
                .filter(|s| s != "super"),
        );
        segments
            .into_iter()
            .map(|seg| match self.modules.contains(&seg) {
                true => seg,
                false => self.reexported.get(&seg).cloned().unwrap_or_else(|| ROOT.to_owned()),
            })
            .collect()
    }
}

/// One crate's module graph: which of its top-level modules (and its
/// root) the code of each names, outside its tests.
fn module_graph(src: &Path) -> Graph {
    let files = rust_files(src);
    let contents = Contents::read(src, &files);
    let mut graph = Graph::new();
    for file in &files {
        let from = top_module(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let code = without_tests(file, &text);
        let named = match from == ROOT {
            true => contents.named_by_root(&code),
            false => contents.named_by_module(src, file, &code),
        };
        let edges = graph.entry(from.clone()).or_default();
        edges.extend(named.into_iter().filter(|m| *m != from));
    }
    graph
}

/// A cycle in `graph`, if it has one: the modules around it.
fn a_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, done: &mut BTreeSet<String>, path: &mut Vec<String>) -> Option<Vec<String>> {
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
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut done, &mut Vec::new()))
}

/// A reader follows a crate top-down: no two of its modules (its root
/// included) name each other, directly or around a circle. Files inside
/// one module's directory (an impl split across files) are that module's
/// own business.
#[test]
fn no_crate_has_modules_that_name_each_other() {
    let mut crates = vec![root().join("src")];
    for entry in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        crates.push(entry.path().join("src"));
    }
    crates.sort();
    let mut cycles = Vec::new();
    let mut uses = 0;
    for src in crates.iter().filter(|s| s.exists()) {
        let graph = module_graph(src);
        uses += graph.values().map(|n| n.len()).sum::<usize>();
        let name = src
            .parent()
            .unwrap()
            .strip_prefix(root())
            .unwrap()
            .display()
            .to_string();
        for (module, names) in &graph {
            if !names.is_empty() {
                println!(
                    "{name}: {module} -> {}",
                    names.iter().cloned().collect::<Vec<_>>().join(" ")
                );
            }
        }
        if let Some(cycle) = a_cycle(&graph) {
            cycles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    // The reading itself is checked: the crates' modules do name each other.
    assert!(uses > 50, "only {uses} uses between modules were read");
    assert!(cycles.is_empty(), "modules that name each other: {cycles:#?}");
}

/// The reader finds what it is for: in a crate written here, a circle
/// through the root (the root's `crate::b::…` after a `#[cfg(test)] mod
/// tests;` line, `b`'s multi-line `use crate::{…}` from a file a directory
/// down, `a`'s `use super::*`), and no circle once `a` names nothing.
#[test]
fn the_module_reader_finds_a_circle_however_it_is_written() {
    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::env::temp_dir().join(format!("lifeguard-layout-{}", std::process::id())));
    let src = dir.0.join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    let write = |file: &str, text: &str| std::fs::write(src.join(file), text).unwrap();
    write(
        "lib.rs",
        "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\npub use a::Thing;\n\npub fn f() {\n    crate::b::go();\n}\n",
    );
    write("a.rs", "use super::*;\n\npub struct Thing;\n");
    write("b/mod.rs", "mod c;\n\npub fn go() {}\n");
    write("b/c.rs", "use crate::{\n    a::Thing,\n};\n");
    write("tests.rs", "use crate::a::Thing;\n");
    let graph = module_graph(&src);
    let names = |m: &str| graph[m].iter().cloned().collect::<Vec<_>>();
    assert_eq!(
        (names(ROOT), names("a"), names("b")),
        (vec!["b".to_owned()], vec![ROOT.to_owned()], vec!["a".to_owned()])
    );
    assert_eq!(a_cycle(&graph).map(|c| c.len()), Some(4), "{graph:?}");
    write("a.rs", "pub struct Thing;\n");
    let graph = module_graph(&src);
    assert_eq!(a_cycle(&graph), None, "{graph:?}");
}
