//! Whether Envoy is ready, read from its answers: the states `GET /ready`
//! names, and the verdict on one answer to the readiness stats
//! ([`READINESS_STATS`]): `server.state` LIVE, the workers started, and the
//! first CDS and LDS updates when they are required ([`XdsCheck`]). Every
//! reason not ready is one line of text, for the 503 body and the log.

use clap::ValueEnum;
use hyper::StatusCode;
use tokio::time::Instant;

use crate::readiness::Verdict;
use crate::stats::{self, StatValue};

/// The admin query that says whether Envoy is live, plus the xDS counters
/// that say whether its first CDS and LDS updates arrived.
///
/// `usedonly` matters: without it Envoy reports `server.state: 0` (LIVE)
/// before it ever set the gauge. The regex is percent-encoded for the URI.
pub const READINESS_STATS: &str = "/stats?usedonly&filter=\
%5E(server%5C.state%7Clistener_manager%5C.workers_started\
%7C(cluster_manager%5C.cds%7Clistener_manager%5C.lds)%5C.update_(attempt%7Csuccess%7Crejected))%24";

/// Envoy's server states, as `GET /ready` names them (the number is the
/// `server.state` gauge's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerState {
    Live = 0,
    Draining = 1,
    PreInitializing = 2,
    Initializing = 3,
}

impl ServerState {
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Live => "LIVE",
            ServerState::Draining => "DRAINING",
            ServerState::PreInitializing => "PRE_INITIALIZING",
            ServerState::Initializing => "INITIALIZING",
        }
    }
}

/// What `GET /ready` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyAnswer {
    /// 200 and `LIVE`, or 503 and one of the other state names.
    State(ServerState),
    /// Anything else (the status and the start of the body): not Envoy's
    /// `/ready`, so the stats decide.
    Unrecognized(String),
}

impl ReadyAnswer {
    /// Reads a `/ready` answer: Envoy answers 200 `LIVE`, else 503 and the
    /// state's name.
    pub fn parse(status: StatusCode, body: &[u8]) -> ReadyAnswer {
        let text = String::from_utf8_lossy(body);
        let name = text.trim();
        let state = match (status, name) {
            (StatusCode::OK, "LIVE") => Some(ServerState::Live),
            (StatusCode::SERVICE_UNAVAILABLE, "DRAINING") => Some(ServerState::Draining),
            (StatusCode::SERVICE_UNAVAILABLE, "PRE_INITIALIZING") => Some(ServerState::PreInitializing),
            (StatusCode::SERVICE_UNAVAILABLE, "INITIALIZING") => Some(ServerState::Initializing),
            _ => None,
        };
        match state {
            Some(state) => ReadyAnswer::State(state),
            None => ReadyAnswer::Unrecognized(format!("{status} {:?}", name.chars().take(40).collect::<String>())),
        }
    }
}

pub(crate) const SERVER_STATE: &str = "server.state";
const WORKERS_STARTED: &str = "listener_manager.workers_started";

/// Turns one answer to [`READINESS_STATS`] into a verdict.
pub fn evaluate(body: &str, xds: XdsCheck, at: impl Into<Instant>) -> Verdict {
    let at = at.into();
    match reason_not_ready(body, xds) {
        None => Verdict::ready(at),
        Some(reason) => Verdict::not_ready(&reason, at),
    }
}

fn reason_not_ready(body: &str, xds: XdsCheck) -> Option<String> {
    let server = server_reason(body);
    let xds = match xds {
        XdsCheck::Off => None,
        mode => xds_reason(body, mode),
    };
    match (server, xds) {
        (None, None) => None,
        (Some(r), None) | (None, Some(r)) => Some(r),
        (Some(server), Some(xds)) => Some(format!("{server}; {xds}")),
    }
}

/// Why `server.state` and `workers_started` do not say LIVE, if they do not.
fn server_reason(body: &str) -> Option<String> {
    match stats::find(body, SERVER_STATE) {
        None => {
            return Some(format!(
                "{SERVER_STATE} missing from Envoy's stats (Envoy is still initializing)"
            ))
        }
        Some(StatValue::Number(0)) => {}
        Some(StatValue::Number(n)) => {
            let name = match n {
                1 => "DRAINING",
                2 => "PRE_INITIALIZING",
                3 => "INITIALIZING",
                _ => "an unknown state",
            };
            return Some(format!("{SERVER_STATE} is {n} ({name}), not 0 (LIVE)"));
        }
        Some(other) => return Some(bad_value(SERVER_STATE, other)),
    }
    match stats::find(body, WORKERS_STARTED) {
        None => Some(format!("{WORKERS_STARTED} missing: Envoy's workers have not started")),
        Some(StatValue::Number(1)) => None,
        Some(StatValue::Number(n)) => Some(format!(
            "{WORKERS_STARTED} is {n}, not 1: Envoy's workers have not started"
        )),
        Some(other) => Some(bad_value(WORKERS_STARTED, other)),
    }
}

/// Why the first CDS/LDS updates are not there, if they are required.
fn xds_reason(body: &str, mode: XdsCheck) -> Option<String> {
    let mut waiting = Vec::new();
    for (kind, prefix) in [("CDS", "cluster_manager.cds"), ("LDS", "listener_manager.lds")] {
        let stat = |what: &str| {
            let name = format!("{prefix}.update_{what}");
            match stats::find(body, &name) {
                Some(StatValue::Number(n)) => Ok(Some(n)),
                Some(other) => Err(bad_value(&name, other)),
                None => Ok(None),
            }
        };
        let (attempt, success, rejected) = match (stat("attempt"), stat("success"), stat("rejected")) {
            (Ok(a), Ok(s), Ok(r)) => (a, s, r),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Some(e),
        };
        let in_use = attempt.is_some() || success.is_some() || rejected.is_some();
        if mode == XdsCheck::Auto && !in_use {
            continue;
        }
        if success.unwrap_or(0) > 0 {
            continue;
        }
        match rejected {
            Some(n) if n > 0 => {
                return Some(format!(
                "Envoy rejected its {kind} config ({prefix}.update_rejected = {n}) and has no accepted {kind} update"
            ))
            }
            _ => waiting.push(kind),
        }
    }
    if waiting.is_empty() {
        None
    } else {
        Some(format!(
            "waiting for the first {} update from xDS",
            waiting.join(" and ")
        ))
    }
}

fn bad_value(name: &str, value: StatValue<'_>) -> String {
    match value {
        StatValue::Wrapped(n) => format!("{name} has an impossible value {n}"),
        StatValue::Unparsable(text) => {
            let text: String = text.chars().take(80).collect();
            format!("{name} has a value that is not a number: {text:?}")
        }
        StatValue::Number(n) => format!("{name} = {n}"),
    }
}

/// When readiness also requires Envoy's first xDS (CDS and LDS) updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum XdsCheck {
    /// Required for each of CDS and LDS whose counters Envoy reports: a
    /// static bootstrap has none and is not held back; an xDS-fed Envoy is.
    Auto,
    /// Always required (both CDS and LDS).
    #[value(alias = "on", alias = "true")]
    Required,
    /// Never checked.
    #[value(alias = "false")]
    Off,
}

lifeguard_base::display_as_value!(XdsCheck);
lifeguard_base::serialize_as_display!(XdsCheck);

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(body: &str, xds: XdsCheck) -> Option<String> {
        reason_not_ready(body, xds)
    }

    const LIVE: &str = "listener_manager.workers_started: 1\nserver.state: 0\n";

    #[test]
    fn live_and_workers_started_is_ready() {
        assert_eq!(reason(LIVE, XdsCheck::Auto), None);
        assert!(evaluate(LIVE, XdsCheck::Auto, Instant::now()).is_ready());
    }

    #[test]
    fn empty_body_means_initializing() {
        let r = reason("", XdsCheck::Auto).unwrap();
        assert!(r.contains("server.state missing"), "{r}");
    }

    #[test]
    fn names_the_server_state() {
        for (n, name) in [
            (1, "DRAINING"),
            (2, "PRE_INITIALIZING"),
            (3, "INITIALIZING"),
            (7, "unknown"),
        ] {
            let r = reason(&format!("server.state: {n}\n"), XdsCheck::Auto).unwrap();
            assert!(r.contains(name), "{r}");
        }
    }

    #[test]
    fn workers_must_have_started() {
        let r = reason("server.state: 0\n", XdsCheck::Auto).unwrap();
        assert!(r.contains("workers"), "{r}");
        let r = reason("server.state: 0\nlistener_manager.workers_started: 0\n", XdsCheck::Auto).unwrap();
        assert!(r.contains("workers"), "{r}");
    }

    #[test]
    fn garbage_and_wrapped_values_are_reasons() {
        let r = reason("server.state: banana\n", XdsCheck::Auto).unwrap();
        assert!(r.contains("not a number") && r.contains("banana"), "{r}");
        let r = reason("server.state: 18446744073709551615\n", XdsCheck::Auto).unwrap();
        assert!(r.contains("impossible"), "{r}");
        let r = reason("<html>", XdsCheck::Auto).unwrap();
        assert!(r.contains("server.state missing"), "{r}");
    }

    #[test]
    fn static_bootstrap_passes_auto_and_fails_required() {
        assert_eq!(reason(LIVE, XdsCheck::Auto), None);
        let r = reason(LIVE, XdsCheck::Required).unwrap();
        assert!(r.contains("CDS and LDS"), "{r}");
        assert_eq!(reason(LIVE, XdsCheck::Off), None);
    }

    #[test]
    fn xds_fed_envoy_waits_for_first_updates_in_auto() {
        let body = format!("{LIVE}cluster_manager.cds.update_attempt: 3\nlistener_manager.lds.update_attempt: 1\n");
        let r = reason(&body, XdsCheck::Auto).unwrap();
        assert!(r.contains("CDS and LDS"), "{r}");
        let body = format!("{body}cluster_manager.cds.update_success: 1\n");
        let r = reason(&body, XdsCheck::Auto).unwrap();
        assert!(r.contains("first LDS") && !r.contains("CDS"), "{r}");
        let body = format!("{body}listener_manager.lds.update_success: 2\n");
        assert_eq!(reason(&body, XdsCheck::Auto), None);
        assert_eq!(reason(&body, XdsCheck::Required), None);
    }

    #[test]
    fn initializing_envoy_names_the_missing_xds_update_too() {
        let r = reason("cluster_manager.cds.update_attempt: 2\n", XdsCheck::Auto).unwrap();
        assert!(
            r.contains("server.state missing") && r.contains("first CDS update"),
            "{r}"
        );
        let r = reason(
            "cluster_manager.cds.update_attempt: 2\nserver.state: 2\n",
            XdsCheck::Auto,
        )
        .unwrap();
        assert!(r.contains("PRE_INITIALIZING") && r.contains("first CDS update"), "{r}");
    }

    #[test]
    fn rejected_config_is_its_own_reason() {
        let body = format!("{LIVE}cluster_manager.cds.update_rejected: 2\n");
        let r = reason(&body, XdsCheck::Auto).unwrap();
        assert!(r.contains("rejected its CDS config"), "{r}");
        // A rejection after an accepted update keeps the accepted config.
        let body = format!("{body}cluster_manager.cds.update_success: 1\n");
        assert_eq!(reason(&body, XdsCheck::Auto), None);
    }
}
