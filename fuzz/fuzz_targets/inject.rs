//! `lifeguard inject` (inject/) on any YAML: the documents, the pods of
//! every kind, the proxy container and its status port, each container's
//! probes and hooks.
//!
//! Input: a flags byte (`--proxy-container proxy`, `--status-port 15021`,
//! `--drain-wait`), then the YAML.
//! Holds: never a panic; a refusal names the document; what comes out is
//! YAML, and running inject on it again changes nothing.

use super::flags;
use lifeguard::fuzzing::{inject, InjectOptions};

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let (flags, rest) = flags(data);
    let Ok(yaml) = std::str::from_utf8(rest) else { return };
    let opts = InjectOptions {
        input: None,
        proxy_container: (flags & 1 == 1).then(|| "proxy".to_owned()),
        status_port: (flags & 2 == 2).then_some(15021),
        drain_wait: flags & 4 == 4,
    };
    match inject(yaml, &opts) {
        Ok(out) => {
            let again = inject(&out, &opts).map_err(|e| e.to_string());
            assert_eq!(again.as_ref(), Ok(&out), "a second run changed the output of:\n{yaml}");
        }
        Err(e) => {
            let why = e.to_string();
            let n = why.strip_prefix("document ").and_then(|r| r.split(':').next());
            assert!(n.is_some_and(|n| n.parse::<usize>().is_ok()), "{why}");
        }
    }
}
