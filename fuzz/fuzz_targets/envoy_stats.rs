//! Envoy's `/stats` text (envoy/stats.rs), the drain's active counts
//! (counts.rs), the readiness verdict and `GET /ready`'s answer (state.rs),
//! its version from `/server_info` (version.rs).
//!
//! Input: the body as Envoy would send it.
//! Holds: one line per non-blank input line, names trimmed, values typed as
//! promised; `find` is the first line of that name; the counts never exceed
//! what was read, each connection counted once, ignoring more ports never
//! counts more; ready only when `server.state` is 0 and the workers started
//! (and the stricter xDS modes never ready when a looser one is not); a
//! reason not ready is one line; an unrecognized `/ready` answer is kept
//! short; a version is read only from a `version` of the form
//! `commit/x.y.z/...`.

use hyper::StatusCode;
use lifeguard::fuzzing::{
    active_counts, readiness_verdict, stats_find, stats_lines, EnvoyVersion, ReadyAnswer, StatValue, XdsCheck,
};

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let body = super::text(data);
    let lines: Vec<_> = stats_lines(&body).collect();
    assert_eq!(lines.len(), body.lines().filter(|l| !l.trim().is_empty()).count());
    let mut total = 0u64;
    for line in &lines {
        assert_eq!(line.name, line.name.trim());
        match line.value {
            StatValue::Number(n) => {
                assert!(n <= i64::MAX as u64);
                total = total.saturating_add(n);
            }
            StatValue::Wrapped(n) => assert!(n > i64::MAX as u64),
            // A line without a colon is all name, and kept as the value.
            StatValue::Unparsable(text) => assert!(text.parse::<u64>().is_err() || text == line.name, "{text:?}"),
        }
    }
    for line in lines.iter().take(16) {
        let first = lines.iter().find(|l| l.name == line.name).map(|l| l.value);
        assert_eq!(stats_find(&body, line.name), first);
    }

    let all = active_counts(&body, &[]);
    let some = active_counts(&body, &[15021, 15090]);
    for a in [&all, &some] {
        assert!(a.connections <= total && a.requests <= total);
        assert!(a.tcp <= a.connections);
        assert!(a.skipped.len() <= lines.len());
    }
    assert!(some.connections <= all.connections);
    assert_eq!(some.requests, all.requests);

    let first = |name: &str| lines.iter().find(|l| l.name == name).map(|l| l.value);
    let mut ready_before = true;
    for xds in [XdsCheck::Off, XdsCheck::Auto, XdsCheck::Required] {
        let verdict = readiness_verdict(&body, xds, tokio::time::Instant::now());
        let (ready, text) = (verdict.is_ready(), verdict.text());
        if ready {
            assert!(ready_before, "{xds:?} ready where a looser check was not");
            assert_eq!(first("server.state"), Some(StatValue::Number(0)));
            assert_eq!(first("listener_manager.workers_started"), Some(StatValue::Number(1)));
            assert_eq!(text, "ready");
        } else {
            assert!(!text.is_empty() && !text.contains('\n'), "{text:?}");
        }
        ready_before = ready;
    }

    for status in [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE, StatusCode::NOT_FOUND] {
        match ReadyAnswer::parse(status, data) {
            ReadyAnswer::State(state) => assert_eq!(state.name(), body.trim()),
            ReadyAnswer::Unrecognized(kept) => assert!(kept.chars().count() <= 40 * 10 + 32, "{kept:?}"),
        }
    }

    match EnvoyVersion::from_server_info(&body) {
        Ok(EnvoyVersion {
            major, minor, patch, ..
        }) => {
            let info: serde_json::Value = serde_json::from_str(&body).expect("it was read as JSON");
            let build = info["version"].as_str().expect("it has a version");
            let number = build.split('/').nth(1).expect("commit/x.y.z/...");
            let parts: Vec<u32> = number
                .split(['-', '+'])
                .next()
                .unwrap()
                .split('.')
                .map(|p| p.parse().unwrap())
                .collect();
            assert_eq!(parts, [major, minor, patch], "{build:?}");
        }
        Err(why) => assert!(!why.to_string().is_empty()),
    }
}
