//! The fuzz targets, one module each (`fuzz_targets/NAME.rs`: what it
//! exercises, what it holds, and `run`, one input), and what they share:
//! one input cut into fields, a runtime for the async code, header maps
//! written as text.
//!
//! Two builds run the targets: `cargo fuzz` (`entry/NAME.rs`, libFuzzer's
//! entry, explores from the seeds; `scripts/fuzz`), and lifeguard's unit
//! tests, which include this file (src/fuzzing.rs) and run every committed
//! seed through `run` once: the regression test, in every `cargo test`. So
//! this file and the targets name the agent `lifeguard::` and each other
//! `super::`, never `crate::` (which differs between the two).

#[path = "../fuzz_targets/app_probe_answer.rs"]
pub mod app_probe_answer;
#[path = "../fuzz_targets/app_probers.rs"]
pub mod app_probers;
#[path = "../fuzz_targets/envoy_stats.rs"]
pub mod envoy_stats;
#[path = "../fuzz_targets/go_duration.rs"]
pub mod go_duration;
#[path = "../fuzz_targets/grpc_health.rs"]
pub mod grpc_health;
#[path = "../fuzz_targets/inbound.rs"]
pub mod inbound;
#[path = "../fuzz_targets/inject.rs"]
pub mod inject;
#[path = "../fuzz_targets/merged_scrape.rs"]
pub mod merged_scrape;
#[path = "../fuzz_targets/metrics_lines.rs"]
pub mod metrics_lines;
#[path = "../fuzz_targets/prometheus_annotations.rs"]
pub mod prometheus_annotations;
#[path = "../fuzz_targets/proxy_config.rs"]
pub mod proxy_config;
#[path = "../fuzz_targets/settings_toml.rs"]
pub mod settings_toml;
#[path = "../fuzz_targets/status_routes.rs"]
pub mod status_routes;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::OnceLock;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::runtime::Runtime;

/// `data` cut at NUL bytes into `n` fields (the last keeps any further NUL;
/// missing fields are empty). Seeds are written as text this way.
pub fn fields(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |&b| b == 0).collect();
    out.resize(n, &[]);
    out
}

/// The bytes as text, the invalid sequences replaced.
pub fn text(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// The first byte (0 when there is none) and the rest.
pub fn flags(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((&first, rest)) => (first, rest),
        None => (0, data),
    }
}

/// One current-thread runtime for the process: a target's tasks (fake
/// servers) live across its runs.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// Headers written one a line, `name: value`; lines that are not a header
/// hyper would accept are left out.
pub fn header_map(text: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = line[colon + 1..].strip_prefix(b" ").unwrap_or(&line[colon + 1..]);
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    headers
}

/// A client's `Accept` values as headers (those hyper would refuse left
/// out).
pub fn accept_headers(values: &[&[u8]]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for v in values {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            headers.append(hyper::header::ACCEPT, v);
        }
    }
    headers
}

/// A directory of this process's own for the targets' files (a settings
/// file, the fake admin's socket), made on first use.
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lifeguard-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the scratch directory is made");
    dir
}

/// A settings file of this process's own, holding `text`.
pub fn settings_file(text: &str) -> PathBuf {
    let path = scratch_dir().join("settings.toml");
    std::fs::write(&path, text).expect("the settings file is written");
    path
}

/// Every setting loaded, as TOML (the form the settings file takes).
pub fn settings_table(loaded: &lifeguard::fuzzing::Loaded) -> toml::Table {
    toml::Table::try_from(&loaded.settings).expect("settings serialize")
}

/// The settings loaded, written as a settings file (every value, as the
/// file takes it), load back the same.
pub fn settings_read_back(table: &toml::Table) {
    let text = toml::to_string(table).expect("settings as TOML");
    let path = settings_file(&text);
    match lifeguard::fuzzing::load_settings(Some(&path), None) {
        Ok(again) => assert_eq!(&settings_table(&again), table, "the settings as a file:\n{text}"),
        Err(e) => panic!("the settings as a file are refused: {e:?}\n{text}"),
    }
}
