//! What the fuzz targets share: one input cut into fields, a runtime for
//! the async code, header maps written as text.

use std::borrow::Cow;
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

/// A settings file of this process's own, holding `text`.
pub fn settings_file(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("lifeguard-fuzz-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("the settings file is written");
    path
}

/// The settings loaded, written as a settings file (every value, as the
/// file takes it), load back the same.
pub fn settings_read_back(table: &toml::Table) {
    let text = toml::to_string(table).expect("settings as TOML");
    let path = settings_file(&text);
    match lifeguard::fuzzing::load_settings(Some(&path), None) {
        Ok((again, _)) => assert_eq!(&again, table, "the settings as a file:\n{text}"),
        Err(e) => panic!("the settings as a file are refused: {e:?}\n{text}"),
    }
}
