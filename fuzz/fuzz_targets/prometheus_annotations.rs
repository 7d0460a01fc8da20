//! `ISTIO_PROMETHEUS_ANNOTATIONS` (istio/annotations.rs): the app's metrics
//! endpoints as Istio's injector writes them, one or a list.
//!
//! Input: the JSON.
//! Holds: a refusal names the field (`port`, `path`, `targets[i].port`,
//! `targets[i].path`) or says the text is not the annotations' JSON; what
//! is accepted has ports that are the app's (never 0, never one of the
//! proxy's own) and paths that fit a request line, and reads back the same
//! from the JSON `lifeguard check` shows.

use lifeguard::fuzzing::AppMetrics;

const RESERVED: [u16; 9] = [15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090];

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let Ok(json) = std::str::from_utf8(data) else { return };
    match AppMetrics::parse(json) {
        Ok(metrics) => {
            for t in &metrics.0 {
                assert!(t.port > 0 && !RESERVED.contains(&t.port), "{}", t.port);
                assert!(t.path.starts_with('/'), "{:?}", t.path);
                assert!(!t.path.bytes().any(|b| b <= b' ' || b == 0x7f), "{:?}", t.path);
                assert!(
                    t.path.parse::<hyper::Uri>().is_ok(),
                    "{:?} is no request target",
                    t.path
                );
            }
            assert!(metrics.check_ports(15020, Some(15000)).is_ok());
            let shown = metrics.to_json();
            let again = AppMetrics::parse(&shown).map_err(|e| e.to_string());
            assert_eq!(again.as_ref(), Ok(&metrics), "{shown}");
        }
        Err(e) => {
            let why = e.to_string();
            let field = why.split(':').next().unwrap_or("");
            let by_field = matches!(field, "port" | "path")
                || field
                    .strip_prefix("targets[")
                    .and_then(|r| r.split_once("]."))
                    .is_some_and(|(i, f)| i.parse::<usize>().is_ok() && matches!(f, "port" | "path"));
            assert!(
                by_field || why.starts_with("not the JSON of prometheus annotations: "),
                "{why}"
            );
        }
    }
}
