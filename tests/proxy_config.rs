//! Istio's `PROXY_CONFIG` as a settings layer: the values Istio's injector
//! writes, read by `lifeguard check`; precedence (flag > env >
//! PROXY_CONFIG > file); errors; and a drain of the duration it sets,
//! against the real Envoy.

use std::time::Duration;

use common::*;

/// `lifeguard check ARGS` with `env`; (exit code, stdout and stderr).
fn check(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let args: Vec<&str> = ["check"].into_iter().chain(args.iter().copied()).collect();
    run_lifeguard_env(&args, env)
}

/// The line `check` prints for `key`.
fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no {key} in {out}"))
}

#[test]
fn what_istios_injector_writes_is_read_and_what_lifeguard_does_not_use_is_listed() {
    let fixtures = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/istio-proxy-config.txt"
    ))
    .unwrap();
    let values: Vec<&str> = fixtures.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(values.len(), 6);
    for value in &values {
        // As the injector writes it: a YAML block scalar, with its newline.
        let (code, out) = check(&[], &[("PROXY_CONFIG", &format!("{value}\n"))]);
        assert_eq!(code, 0, "{value}: {out}");
    }
    let (_, out) = check(&[], &[("PROXY_CONFIG", r#"{"drainDuration":"23s"}"#)]);
    let drain = line(&out, "envoy_drain_time");
    assert!(drain.contains("23s") && drain.contains("(PROXY_CONFIG)"), "{drain}");
    let (_, out) = check(&[], &[("PROXY_CONFIG", values[5])]);
    assert!(
        out.contains("PROXY_CONFIG fields not used: discoveryAddress, concurrency, proxyMetadata.FOO, proxyMetadata.ISTIO_META_TLS_CLIENT_KEY"),
        "{out}"
    );
}

#[test]
fn ports_durations_and_metadata_become_settings_under_flags_and_env_over_the_file() {
    let config = r#"{"terminationDrainDuration":"30s","statusPort":15120,"proxyAdminPort":15100,
        "proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true","MINIMUM_DRAIN_DURATION":"12s"}}"#;
    let dir = temp_dir("proxy-config");
    let file = dir.path().join("lifeguard.toml");
    std::fs::write(&file, "minimum_drain_duration = \"3s\"\npoll_interval = \"2s\"\n").unwrap();
    let file = file.to_str().unwrap();
    let (code, out) = check(&["--config", file], &[("PROXY_CONFIG", config)]);
    assert_eq!(code, 0, "{out}");
    for (key, value, source) in [
        ("termination_drain_duration", "30s", "(PROXY_CONFIG)"),
        ("status_addr", "0.0.0.0:15120", "(PROXY_CONFIG)"),
        ("admin_url", "http://127.0.0.1:15100", "(PROXY_CONFIG)"),
        ("exit_on_zero_active_connections", "true", "(PROXY_CONFIG)"),
        ("minimum_drain_duration", "12s", "(PROXY_CONFIG)"),
        ("poll_interval", "2s", "(file)"),
        ("drain_until", "connections", "(default)"),
    ] {
        let l = line(&out, key);
        assert!(l.contains(value) && l.ends_with(source), "{key}: {l}");
    }
    // The env and flags beat it.
    let (_, out) = check(
        &["--status-addr", "127.0.0.1:15021"],
        &[("PROXY_CONFIG", config), ("TERMINATION_DRAIN_DURATION", "7s")],
    );
    assert!(line(&out, "termination_drain_duration").contains("7s"), "{out}");
    assert!(line(&out, "termination_drain_duration").ends_with("(env)"));
    assert!(line(&out, "status_addr").ends_with("(flag)"));
}

#[test]
fn a_malformed_proxy_config_stops_start_up_naming_it() {
    for (value, want) in [
        ("{not json", "invalid PROXY_CONFIG"),
        (
            r#"{"terminationDrainDuration":"5 minutes"}"#,
            "invalid PROXY_CONFIG terminationDrainDuration",
        ),
        (r#"{"statusPort":0}"#, "invalid PROXY_CONFIG statusPort"),
        (
            r#"{"proxyMetadata":{"MINIMUM_DRAIN_DURATION":"-1s"}}"#,
            "invalid PROXY_CONFIG proxyMetadata.MINIMUM_DRAIN_DURATION",
        ),
    ] {
        let (code, out) = check(&[], &[("PROXY_CONFIG", value)]);
        assert_eq!(code, 2, "{value}: {out}");
        assert!(out.contains(want), "{value}: {out}");
    }
    // `run` too, before anything starts.
    let (code, out) = run_lifeguard(&["run", "--proxy-config", "[1]"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("PROXY_CONFIG"), "{out}");
}

/// 8 s: not the default (5 s), and short enough to wait for (the drain
/// runs on the wall clock, against the real Envoy).
#[test]
fn an_8s_termination_drain_duration_from_proxy_config_drains_8s() {
    let proxy_config = "{\"terminationDrainDuration\":\"8s\",\"concurrency\":2}\n";
    let pod = Pod::start(
        Agent::builder()
            .args(&["--termination-grace-period", "20s"])
            .env("PROXY_CONFIG", proxy_config),
    );
    pod.agent
        .wait_output("PROXY_CONFIG fields lifeguard does not use", Duration::from_secs(5));
    let sent = pod.sigterm();
    let status = pod.ports.agent.addr();
    let (_, drain) = wait_for("the drain to start", Duration::from_secs(5), || {
        let (code, body) = get(status, "/drain").map_err(|e| e.to_string())?;
        body.contains(r#""phase":"draining""#)
            .then_some((code, body.clone()))
            .ok_or(body)
    });
    assert!(drain.contains(r#""policy":"time""#), "{drain}");
    let mut agent = pod.agent;
    let code = agent.exit_code(Duration::from_secs(20));
    let took = sent.elapsed();
    eprintln!("SIGTERM -> lifeguard exit: {took:?} (PROXY_CONFIG terminationDrainDuration 8s)");
    assert_eq!(code, 0, "{}", agent.output());
    assert!(
        took >= Duration::from_secs(8) && took < Duration::from_secs(12),
        "{took:?}"
    );
}
