//! Every committed seed of every fuzz target (`fuzz/seeds/TARGET/`,
//! `found-*` among them: the inputs that once found a bug) run once
//! through the target, as `cargo fuzz run` runs an input: the fuzz
//! targets' regression test, in every `cargo test`, with no nightly
//! toolchain and no instrumented build. Exploring from the seeds for
//! new inputs is `scripts/fuzz`'s (docs/testing.md: Fuzzing).

use std::path::{Path, PathBuf};

// The fuzz targets themselves (fuzz/src/lib.rs), as `cargo fuzz` builds
// them; checked as fuzz targets, not as the agent's code.
#[path = "../fuzz/src/lib.rs"]
#[allow(unreachable_pub, clippy::too_many_lines)]
mod targets;

/// A target's `run`: one input.
type Run = fn(&[u8]);

/// Each target by its name in fuzz/Cargo.toml, and its `run`.
const TARGETS: [(&str, Run); 13] = [
    ("app_probe_answer", targets::app_probe_answer::run),
    ("app_probers", targets::app_probers::run),
    ("envoy_stats", targets::envoy_stats::run),
    ("go_duration", targets::go_duration::run),
    ("grpc_health", targets::grpc_health::run),
    ("inbound", targets::inbound::run),
    ("inject", targets::inject::run),
    ("merged_scrape", targets::merged_scrape::run),
    ("metrics_lines", targets::metrics_lines::run),
    ("prometheus_annotations", targets::prometheus_annotations::run),
    ("proxy_config", targets::proxy_config::run),
    ("settings_toml", targets::settings_toml::run),
    ("status_routes", targets::status_routes::run),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of a directory, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

#[test]
fn every_target_is_replayed_and_has_seeds() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    let mut declared: Vec<&str> = manifest
        .lines()
        .skip_while(|l| *l != "[[bin]]")
        .filter_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"'))
        .collect();
    declared.sort_unstable();
    let replayed: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(declared, replayed, "fuzz/Cargo.toml's targets and the replay's");
    for (name, _) in TARGETS {
        assert!(
            !files(&fuzz_dir().join("seeds").join(name)).is_empty(),
            "{name} has no seeds"
        );
    }
}

#[test]
fn every_seed_passes_its_fuzz_target() {
    let mut count = 0;
    for (name, run) in TARGETS {
        for seed in files(&fuzz_dir().join("seeds").join(name)) {
            // Shown when a seed fails: which one, and how to replay it
            // under the fuzzer.
            eprintln!(
                "{name}: {} (cd fuzz && cargo +nightly fuzz run {name} {})",
                seed.display(),
                seed.strip_prefix(fuzz_dir()).unwrap().display()
            );
            run(&std::fs::read(&seed).unwrap());
            count += 1;
        }
    }
    std::fs::remove_dir_all(targets::scratch_dir()).unwrap();
    assert!(count >= 100, "{count} seeds");
}
