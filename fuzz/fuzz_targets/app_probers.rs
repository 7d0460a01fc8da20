//! `ISTIO_KUBE_APP_PROBERS` (status/app_probe/spec.rs): the JSON map from
//! a status-port path to the container's original probe.
//!
//! Input: the JSON as the pod spec would carry it.
//! Holds: a refusal names the entry (its path) or says the text is not the
//! JSON of app probes; what is accepted is every entry checked (a path of
//! the right form, one handler, a port 1-65535, a request path, headers
//! hyper takes, a timeout of at least 1 s), and reads back the same from
//! the JSON the agent shows (and `lifeguard inject` writes).

use std::collections::BTreeMap;

use lifeguard::fuzzing::{Action, AppProbes};
use serde::de::IgnoredAny;

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let Ok(json) = std::str::from_utf8(data) else { return };
    match AppProbes::parse(json) {
        Ok(probes) => {
            let checked = probes.checked();
            assert_eq!(checked.len(), probes.0.len(), "an accepted entry does not check");
            for (path, probe) in &checked {
                assert!(path.starts_with("/app-health/") || path.starts_with("/app-lifecycle/"));
                assert!(probe.timeout.as_secs() >= 1);
                match &probe.action {
                    Action::Http {
                        port, path, headers, ..
                    } => {
                        assert!(*port > 0);
                        assert!(path.starts_with('/') && path.parse::<hyper::Uri>().is_ok(), "{path:?}");
                        for (name, value) in headers {
                            assert!(hyper::header::HeaderName::from_bytes(name.as_bytes()).is_ok());
                            assert!(hyper::header::HeaderValue::from_str(value).is_ok());
                        }
                    }
                    Action::Tcp { port } | Action::Grpc { port, .. } => assert!(*port > 0),
                }
            }
            let shown = probes.to_json();
            let again = AppProbes::parse(&shown).map_err(|e| e.to_string());
            assert_eq!(again.as_ref(), Ok(&probes), "{shown}");
        }
        Err(e) => {
            let why = e.to_string();
            // The entries' names, whatever their values (a number too large
            // for a float is still an entry to name).
            let keys: Vec<String> = match serde_json::from_str::<BTreeMap<String, IgnoredAny>>(json) {
                Ok(map) => map.keys().cloned().collect(),
                Err(_) => Vec::new(),
            };
            let named = keys.iter().any(|k| why.starts_with(&format!("{k}: ")));
            assert!(named || why.starts_with("not the JSON of app probes: "), "{why}");
        }
    }
}
