//! The stats parser and the readiness evaluation, fuzzed with proptest:
//! they never panic, and never call "ready" what Envoy did not say.
//! Bounded: a fixed number of cases per property, run in every `cargo test`.

use std::time::Instant;

use lifeguard::envoy::counts::active;
use lifeguard::envoy::state::evaluate;
use lifeguard::envoy::state::XdsCheck;
use lifeguard::envoy::stats::{lines, StatValue};
use proptest::prelude::*;

/// Stat names as Envoy writes them, plus near-misses.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("server.state".to_owned()),
        Just("listener_manager.workers_started".to_owned()),
        Just("cluster_manager.cds.update_success".to_owned()),
        Just("cluster_manager.cds.update_rejected".to_owned()),
        Just("listener_manager.lds.update_attempt".to_owned()),
        Just("listener.admin.downstream_cx_active".to_owned()),
        Just("listener.admin.main_thread.downstream_cx_active".to_owned()),
        Just("http.inbound_http.downstream_rq_active".to_owned()),
        Just("http.admin.downstream_rq_active".to_owned()),
        (any::<u16>()).prop_map(|p| format!("listener.0.0.0.0_{p}.downstream_cx_active")),
        (any::<u16>()).prop_map(|p| format!("listener.[__1]_{p}.downstream_cx_active")),
        (any::<u16>(), 0u8..4).prop_map(|(p, w)| format!("listener.127.0.0.1_{p}.worker_{w}.downstream_cx_active")),
        "[a-z_.\\[\\]0-9]{0,40}",
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..5).prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        Just(u64::MAX.to_string()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just("P0(nan,0) P25(nan,1)".to_owned()),
        "[ -~]{0,12}",
    ]
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::collection::vec(
            (
                name(),
                value(),
                prop_oneof![Just(": "), Just(":"), Just(" : "), Just(" ")]
            ),
            0..20
        )
        .prop_map(|ls| ls.into_iter().map(|(n, v, sep)| format!("{n}{sep}{v}\n")).collect()),
        any::<String>(),
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_parser_never_panics_and_trims_names(text in body()) {
        for line in lines(&text) {
            prop_assert_eq!(line.name, line.name.trim());
            if let StatValue::Wrapped(v) = line.value {
                prop_assert!(v > i64::MAX as u64);
            }
        }
    }

    #[test]
    fn active_counts_never_panic_and_never_exceed_the_numbers_read(text in body()) {
        let counted = active(&text, &[15021, 15090]);
        let total: u64 = lines(&text)
            .filter_map(|l| match l.value { StatValue::Number(n) => Some(n), _ => None })
            .fold(0u64, u64::saturating_add);
        prop_assert!(counted.connections <= total);
        prop_assert!(counted.requests <= total);
    }

    #[test]
    fn ready_only_when_envoy_said_live_with_workers_started(text in body(), xds in prop_oneof![Just(XdsCheck::Auto), Just(XdsCheck::Required), Just(XdsCheck::Off)]) {
        let verdict = evaluate(&text, xds, Instant::now());
        if verdict.is_ready() {
            let state = lines(&text).find(|l| l.name == "server.state").map(|l| l.value);
            let workers = lines(&text).find(|l| l.name == "listener_manager.workers_started").map(|l| l.value);
            prop_assert_eq!(state, Some(StatValue::Number(0)));
            prop_assert_eq!(workers, Some(StatValue::Number(1)));
        } else {
            prop_assert!(!verdict.text().is_empty());
        }
    }
}
