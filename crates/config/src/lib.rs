//! The settings: every crate's settings, flattened
//! into one set that comes from a flag, an environment variable, Istio's
//! `PROXY_CONFIG`, a TOML file given with `--config`, or its default — in
//! that order of precedence — and checked once, here, before anything
//! starts.
//!
//! Each crate owns its settings: a clap `Args` group
//! (`lifeguard_envoy::Settings`, `lifeguard_drain::Settings`, ...), each
//! setting declared once with its flag, env variable, default, parser and
//! help; in the file, the crate's section (`[drain]`, `sections.rs`) with
//! a key a field, or the key at the top level. [`Settings`] flattens them all;
//! [`RunArgs::load`] lays the layers (the file's values and `PROXY_CONFIG`'s
//! through each setting's own argument, so its parser checks them and clap
//! sets that field alone), and each crate turns its settings into
//! its plan ([`Plan`]), refusing with a typed error a rule across them that
//! does not hold. A bad value stops start-up with a message that names the
//! field (as the user wrote it: flag, env variable, file key or
//! `PROXY_CONFIG`'s field) and the value.
//!
//! The command line that takes them, parsed into what to run, is the
//! binary's (`lifeguard::cli`).
//!
//! - `layers`: the layers, the effective values and their sources.
//! - `proxy_config`: `PROXY_CONFIG` as a layer.
//! - `sections`: the file's sections, a crate's each, and the one list
//!   `Settings` and the sections are made from; a key out of place
//!   ([`KeyError`]).
//! - `entry`: one value of a lower layer, as the file and `PROXY_CONFIG`
//!   give it and the layers lay it, and where a value came from
//!   ([`Source`]) (the modules above share it; it imports none of them).
//! - `error`: why settings were refused ([`ConfigError`]).
//! - [`reference()`]: docs/configuration.md, written from the settings.

use std::path::PathBuf;

use clap::Args;

mod entry;
mod error;
mod layers;
mod proxy_config;
mod reference;
mod sections;

pub use entry::Source;
pub use error::{ConfigError, FileError, Why};
pub use layers::from_clap_error;
pub use reference::reference;
pub use sections::{KeyError, Settings};

/// Options of `lifeguard run` and `check`: the settings file, then the settings.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// TOML file with settings (flags and env variables override it).
    #[arg(long, env = "LIFEGUARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Istio's proxy config, as its injector writes it (JSON or YAML): a
    /// layer under flags and env, over the file.
    #[arg(long, env = "PROXY_CONFIG", value_name = "JSON")]
    pub proxy_config: Option<String>,
    #[command(flatten)]
    pub settings: Settings,
}

/// What the agent runs with: each crate's plan, made from its settings
/// once every layer was in.
#[derive(Debug, Clone)]
pub struct Plan {
    pub log: lifeguard_logging::Settings,
    pub envoy: lifeguard_envoy::Plan,
    pub drain: lifeguard_drain::Plan,
    pub drain_wait: lifeguard_drain_wait::DrainWaitPlan,
    pub status: lifeguard_status::Plan,
    pub metrics: lifeguard_scrape::Plan,
    pub pod: lifeguard_pod::Settings,
    pub exit: lifeguard_exit::Settings,
    /// PROXY_CONFIG's fields lifeguard does not use, listed once at start-up.
    pub proxy_config_unused: Vec<String>,
    /// Settings given that the drain's policy leaves aside, each as the
    /// user gave it: said at start-up and by `lifeguard check`.
    pub set_aside: Vec<String>,
    /// The settings file's keys written under an old name (read as the
    /// new one): said at start-up and by `lifeguard check`.
    pub renamed_keys: Vec<String>,
}

/// Settings loaded: their values, the plan they make, and every effective
/// value with its source.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub settings: Settings,
    pub plan: Plan,
    pub effective: Vec<Effective>,
}

/// One effective setting, for `lifeguard check` and the start-up log.
#[derive(Debug, Clone)]
pub struct Effective {
    pub key: String,
    pub value: String,
    pub source: Source,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    use clap::FromArgMatches;
    use lifeguard_base::duration;
    use lifeguard_base::url::{ControlSocket, LoopbackUrl};
    use lifeguard_drain::{DrainScope, DrainUntil};
    use lifeguard_envoy::state::XdsCheck;
    use lifeguard_envoy::ALWAYS_IGNORED_PORTS;
    use lifeguard_exit::MessagePath;
    use lifeguard_logging::LogFormat;
    use std::ffi::OsString;

    /// Loads `lifeguard run ARGS` as main does, without reading the environment.
    pub(crate) fn load(args: &[&str]) -> Result<(Loaded, Vec<Effective>), ConfigError> {
        let argv: Vec<OsString> = std::iter::once("lifeguard")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        let cmd = RunArgs::augment_args(clap::Command::new("lifeguard")).mut_args(|a| a.env(None));
        let matches = match cmd.try_get_matches_from(&argv) {
            Ok(m) => m,
            Err(e) => return Err(from_clap_error(e, &argv).unwrap_or_else(|e| panic!("{e}"))),
        };
        let loaded = RunArgs::from_arg_matches(&matches).unwrap().load(&matches)?;
        let effective = loaded.effective.clone();
        Ok((loaded, effective))
    }

    fn settings(args: &[&str]) -> Loaded {
        load(args).unwrap_or_else(|e| panic!("{args:?}: {e}")).0
    }

    /// The error of `args`; it must name `field` and contain `needle`.
    fn refused(args: &[&str], field: &str, needle: &str) {
        let msg = load(args).map(|(s, _)| s).expect_err(&format!("{args:?}")).to_string();
        assert!(msg.contains(field) && msg.contains(needle), "{args:?}: {msg}");
    }

    /// A file for `--config`, removed when dropped.
    struct TempFile(PathBuf);
    impl TempFile {
        fn new(name: &str, text: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!("lifeguard-cfg-{}-{name}", std::process::id()));
            std::fs::write(&path, text).unwrap();
            TempFile(path)
        }
        fn arg(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let (s, eff) = load(&[]).unwrap();
        assert_eq!(s.settings.status.status_addr.to_string(), "0.0.0.0:15020");
        assert_eq!(s.settings.envoy.admin_url.to_string(), "http://127.0.0.1:15000");
        assert_eq!(s.settings.envoy.poll_interval.get(), Duration::from_secs(1));
        assert_eq!(s.settings.envoy.startup_poll_interval.get(), Duration::from_millis(100));
        assert_eq!(s.settings.envoy.admin_timeout.get(), Duration::from_secs(1));
        assert_eq!(s.settings.envoy.xds_check, XdsCheck::Auto);
        assert_eq!(s.settings.log.log.to_string(), "info");
        assert!(
            s.settings.metrics.merge_envoy_metrics.get() && !s.settings.drain.exit_on_zero_active_connections.get()
        );
        assert_eq!(s.plan.envoy.stale_after, Duration::from_secs(4));
        assert_eq!(eff.len(), 38);
        assert_eq!(
            (
                s.settings.drain_wait.unhealthy_threshold.get(),
                s.settings.drain_wait.min_quiet_period.get()
            ),
            (3, Duration::from_millis(500))
        );
        assert_eq!(
            (
                s.settings.drain_wait.checker_timeout.get(),
                s.settings.drain_wait.app_time.get()
            ),
            (Duration::from_secs(20), Duration::from_secs(5))
        );
        assert!(s.settings.drain_wait.checker_ranges.is_empty());
        assert!(
            s.settings.status.app_probers.0.is_empty()
                && s.settings.status.pod_ip.0.is_none()
                && !s.settings.status.app_probe_localhost.get()
        );
        assert_eq!(s.settings.status.control_socket, ControlSocket(None));
        assert!(s.settings.status.loopback_control.get());
        assert_eq!(s.settings.drain.readiness_fail_delay.get(), Duration::ZERO);
        assert_eq!(
            s.plan.drain.terminating_readiness(),
            lifeguard_drain::TerminatingReadiness::Serving
        );
        assert_eq!(s.settings.log.log_format, LogFormat::Text);
        assert_eq!(s.settings.metrics.linger.get(), Duration::ZERO);
        assert_eq!(s.settings.exit.termination_message_path, MessagePath::Auto);
        assert!(eff.iter().all(|e| e.source == Source::Default));
    }

    #[test]
    fn flag_beats_file_beats_default() {
        let file = TempFile::new(
            "a.toml",
            "poll_interval = \"2s\"\nadmin_timeout = \"300ms\"\nlog = \"debug\"\n",
        );
        let (s, eff) = load(&["--config", file.arg(), "--poll-interval", "500ms"]).unwrap();
        assert_eq!(s.settings.envoy.poll_interval.get(), Duration::from_millis(500));
        assert_eq!(s.settings.envoy.admin_timeout.get(), Duration::from_millis(300));
        assert_eq!(s.settings.log.log.to_string(), "debug");
        let src = |k| eff.iter().find(|e| e.key == k).unwrap().source;
        assert_eq!(src("poll_interval"), Source::Flag);
        assert_eq!(src("admin_timeout"), Source::File);
        assert_eq!(src("status_addr"), Source::Default);
    }

    #[test]
    fn bad_values_name_the_field_and_value() {
        refused(&["--poll-interval", "5x"], "--poll-interval", "5x");
        refused(&["--poll-interval=-1s"], "--poll-interval", "-1s");
        refused(&["--admin-timeout", "0s"], "--admin-timeout", "greater than zero");
        refused(&["--status-addr", "nowhere"], "--status-addr", "nowhere");
        refused(&["--status-addr", "127.0.0.1:0"], "--status-addr", "port 0");
        refused(&["--admin-url", "http://10.0.0.1:15000"], "--admin-url", "loopback");
        refused(&["--admin-url", "https://127.0.0.1:15000"], "--admin-url", "http://");
        refused(&["--xds-check", "maybe"], "--xds-check", "maybe");
        refused(&["--log", "foo=bar"], "--log", "foo=bar");
        refused(
            &["--termination-message-path", "summary.txt"],
            "--termination-message-path",
            "not an absolute path",
        );
        refused(
            &["--drain-wait-checker-ranges", "35.191.0.0/16,10.0.0.5/16"],
            "--drain-wait-checker-ranges",
            "write 10.0.0.0/16",
        );
        refused(
            &["--load-balancer-checks", "10sx0"],
            "--load-balancer-checks",
            "the threshold 1 to 100",
        );
    }

    #[test]
    fn bad_file_values_name_the_key_and_value() {
        for (text, key, needle) in [
            ("poll_interval = \"5x\"", "poll_interval", "\"5x\""),
            ("status_addr = \"127.0.0.1:0\"", "status_addr", "port 0"),
            (
                "ignore_listener_ports = [8081, 0]",
                "ignore_listener_ports",
                "0 is not in 1..=65535",
            ),
            (
                "admin_timeout = [\"1s\", \"2s\"]",
                "admin_timeout",
                "one value, not a list",
            ),
            (
                "exit_on_zero_active_connections = \"maybe\"",
                "exit_on_zero_active_connections",
                "maybe",
            ),
            ("drain_until = \"forever\"", "drain_until", "forever"),
            ("log = \"foo=bar\"", "log", "not a log filter"),
            ("admin_timeout = [\"1s\"]", "admin_timeout", "one value, not a list"),
            // A list in one text, as the env variable writes it: refused
            // as the env variable's would be.
            ("ignore_app_ports = \"9000, 9001\"", "ignore_app_ports", "invalid digit"),
            ("ignore_app_ports = \"9000,,9001\"", "ignore_app_ports", "empty string"),
        ] {
            let file = TempFile::new(&format!("bad-{key}.toml"), text);
            refused(&["--config", file.arg()], key, needle);
            refused(&["--config", file.arg()], "(from file)", "");
        }
        let file = TempFile::new("short-grace.toml", "termination_grace_period = \"1s\"");
        refused(
            &["--config", file.arg()],
            "shutdown_margin",
            "termination_grace_period (1s)",
        );
    }

    #[test]
    fn a_value_clap_refuses_from_the_environment_names_the_variable() {
        let cmd = RunArgs::augment_args(clap::Command::new("lifeguard"));
        let err = cmd
            .try_get_matches_from(["lifeguard", "--drain-delay", "5"])
            .unwrap_err();
        let msg = from_clap_error(err, &["lifeguard".into()]).unwrap().to_string();
        assert!(
            msg.starts_with("invalid LIFEGUARD_DRAIN_DELAY = \"5\" (from env): invalid duration"),
            "{msg}"
        );
        let argv = ["lifeguard".into(), "--drain-delay".into(), "5".into()];
        let err = RunArgs::augment_args(clap::Command::new("lifeguard"))
            .try_get_matches_from(&argv)
            .unwrap_err();
        let msg = from_clap_error(err, &argv).unwrap().to_string();
        assert!(msg.starts_with("invalid --drain-delay = \"5\" (from flag)"), "{msg}");
    }

    #[test]
    fn booleans_take_gos_forms() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(settings(&["--exit-on-zero-active-connections", t])
                .settings
                .drain
                .exit_on_zero_active_connections
                .get());
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert!(!settings(&["--merge-envoy-metrics", f])
                .settings
                .metrics
                .merge_envoy_metrics
                .get());
        }
        for bad in ["yes", "tRUE", "2", ""] {
            refused(
                &["--merge-envoy-metrics", bad],
                "--merge-envoy-metrics",
                "expected true or false",
            );
        }
    }

    #[test]
    fn durations_too_large_for_a_deadline_are_refused() {
        let max = "18446744073709551615";
        refused(
            &["--termination-grace-period", max],
            "--termination-grace-period",
            "too large",
        );
        refused(&["--drain-delay", "8761h"], "--drain-delay", "too large");
        assert_eq!(
            settings(&["--termination-grace-period", "45"])
                .settings
                .drain
                .termination_grace_period
                .get(),
            Duration::from_secs(45)
        );
        assert_eq!(
            settings(&["--termination-grace-period", "8760h"])
                .settings
                .drain
                .termination_grace_period
                .get(),
            duration::MAX
        );
    }

    #[test]
    fn poll_intervals_have_a_floor_of_10ms() {
        refused(&["--poll-interval", "9ms"], "--poll-interval", "at least 10ms");
        refused(
            &["--startup-poll-interval", "0"],
            "--startup-poll-interval",
            "at least 10ms",
        );
        assert_eq!(
            settings(&["--poll-interval", "10ms"])
                .settings
                .envoy
                .poll_interval
                .get(),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn outcome_settings_take_their_forms() {
        let s = settings(&[
            "--log-format",
            "json",
            "--linger",
            "20s",
            "--termination-message-path",
            "none",
        ]);
        assert_eq!(s.settings.log.log_format, LogFormat::Json);
        assert_eq!(s.settings.metrics.linger.get(), Duration::from_secs(20));
        assert_eq!(s.settings.exit.termination_message_path.resolve(), None);
        let s = settings(&["--termination-message-path", "/tmp/msg"]);
        assert_eq!(
            s.settings.exit.termination_message_path.resolve(),
            Some(PathBuf::from("/tmp/msg"))
        );
        let file = TempFile::new(
            "outcome.toml",
            "termination_message_path = \"\"\nlog_format = \"json\"\n",
        );
        let s = settings(&["--config", file.arg()]);
        assert_eq!(s.settings.exit.termination_message_path, MessagePath::Off);
        refused(&["--log-format", "xml"], "--log-format", "xml");
        refused(&["--linger=-1s"], "--linger", "-1s");
    }

    #[test]
    fn log_filters_are_validated() {
        assert_eq!(
            settings(&["--log", "warn,lifeguard=debug"])
                .settings
                .log
                .log
                .to_string(),
            "warn,lifeguard=debug"
        );
        refused(&["--log", "lifeguard=loud"], "--log", "lifeguard=loud");
    }

    #[test]
    fn the_config_file_must_be_a_small_regular_file() {
        refused(&["--config", "/dev/zero"], "/dev/zero", "not a regular file");
        refused(&["--config", "/"], "config file /", "not a regular file");
        let fifo = std::env::temp_dir().join(format!("lifeguard-cfg-{}-fifo", std::process::id()));
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        refused(
            &["--config", fifo.to_str().unwrap()],
            fifo.to_str().unwrap(),
            "not a regular file",
        );
        std::fs::remove_file(&fifo).unwrap();
        let big = TempFile::new("big.toml", &"#\n".repeat((1 << 19) + 1));
        refused(&["--config", big.arg()], big.arg(), "larger than 1 MiB");
        let fits = TempFile::new("fits.toml", &"#\n".repeat(1 << 19));
        assert!(load(&["--config", fits.arg()]).is_ok());
        refused(
            &["--config", "/nonexistent/lifeguard.toml"],
            "/nonexistent/lifeguard.toml",
            "cannot read",
        );
        // Typed to the end: a caller can tell a missing file from a bad key.
        let missing = load(&["--config", "/nonexistent/lifeguard.toml"]).map(|_| ());
        assert!(
            matches!(&missing, Err(ConfigError::File { why: FileError::Read(e), .. }) if e.kind() == std::io::ErrorKind::NotFound),
            "{missing:?}"
        );
        let misplaced = TempFile::new("misplaced.toml", "[drain]\npoll_interval = \"2s\"\n");
        let err = load(&["--config", misplaced.arg()]).map(|_| ());
        assert!(
            matches!(
                &err,
                Err(ConfigError::File {
                    why: FileError::Key(KeyError::Misplaced { home: "envoy", .. }),
                    ..
                })
            ),
            "{err:?}"
        );
    }

    #[test]
    fn drain_policy_follows_istio_names() {
        let s = settings(&[]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::AppExit);
        assert_eq!(s.settings.drain.drain_scope, DrainScope::Inbound);
        assert_eq!(s.plan.drain.termination_drain_duration(), Duration::from_secs(5));
        let s = settings(&["--termination-drain-duration", "5s"]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::Time);
        let s = settings(&[
            "--drain-until",
            "app-exit",
            "--drain-scope",
            "all",
            "--ignore-app-port",
            "9901",
        ]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::AppExit);
        assert_eq!(s.settings.drain.drain_scope, DrainScope::All);
        assert_eq!(s.settings.pod.ignore_app_ports, [9901]);
        let file = TempFile::new("appexit.toml", "drain_until = \"app-exit\"\ndrain_scope = \"all\"\n");
        assert_eq!(
            settings(&["--config", file.arg()]).plan.drain.drain_until(),
            DrainUntil::AppExit
        );
        assert_eq!(s.plan.drain.grace().deadline(), Duration::from_secs(28));
        assert_eq!(s.plan.envoy.ignored_listener_ports, ALWAYS_IGNORED_PORTS);
        assert!(s.plan.drain.warnings().is_empty());
        // A gateway: every listener drains, and no app to wait for.
        let s = settings(&["--drain-scope", "all"]);
        assert_eq!(
            (s.plan.drain.drain_until(), s.plan.drain.asked()),
            (DrainUntil::OutOfRotation, false)
        );
        assert!(s.plan.drain.warnings().is_empty());
        let s = settings(&["--drain-scope", "all", "--drain-until", "requests"]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::Requests);
        let s = settings(&["--drain-until", "out-of-rotation"]);
        assert_eq!(
            (s.plan.drain.drain_until(), s.settings.drain.drain_scope),
            (DrainUntil::OutOfRotation, DrainScope::Inbound)
        );
        let s = settings(&["--exit-on-zero-active-connections", "true"]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::Connections);
        let file = TempFile::new("zero.toml", "exit_on_zero_active_connections = true\n");
        assert_eq!(
            settings(&["--config", file.arg()]).plan.drain.drain_until(),
            DrainUntil::Connections
        );
        let s = settings(&[
            "--exit-on-zero-active-connections=true",
            "--drain-until=requests",
            "--termination-grace-period=45",
            "--ignore-listener-port=8081,15021",
        ]);
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::Requests);
        assert_eq!(s.settings.drain.termination_grace_period.get(), Duration::from_secs(45));
        assert_eq!(s.plan.envoy.ignored_listener_ports, vec![8081, 15021, 15090]);
    }

    /// A setting the policy leaves aside is said, with why; one it uses,
    /// or one not given, is not.
    #[test]
    fn settings_the_policy_leaves_aside_are_listed() {
        for args in [
            &[][..],
            &["--termination-drain-duration", "5s"],
            &["--exit-on-zero-active-connections", "true"],
            &[
                "--exit-on-zero-active-connections",
                "false",
                "--drain-until",
                "requests",
            ],
        ] {
            assert!(settings(args).plan.set_aside.is_empty(), "{args:?}");
        }
        let s = settings(&[
            "--exit-on-zero-active-connections=true",
            "--termination-drain-duration=10s",
        ]);
        assert_eq!(
            s.plan.set_aside,
            ["--termination-drain-duration=10s (flag; drain_until is connections)"]
        );
        let s = settings(&[
            "--exit-on-zero-active-connections=true",
            "--termination-drain-duration=10s",
            "--drain-until=app-exit",
        ]);
        assert_eq!(
            s.plan.set_aside,
            [
                "--exit-on-zero-active-connections=true (flag; drain_until is app-exit)",
                "--termination-drain-duration=10s (flag; drain_until is app-exit)"
            ]
        );
        let file = TempFile::new("aside.toml", "[drain]\ntermination_drain_duration = \"7s\"\n");
        let proxy = r#"{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"true"}}"#;
        let s = settings(&["--config", file.arg(), "--proxy-config", proxy]);
        assert_eq!(
            s.plan.set_aside,
            ["drain.termination_drain_duration=7s (file; drain_until is connections)"]
        );
    }

    /// Whatever margin is accepted, the drain's deadline and Envoy's stop
    /// after it fit the grace period (the drain's own tests show the stop
    /// kept inside it when a read runs past the deadline).
    #[test]
    fn envoy_is_never_stopped_past_the_grace_period_at_any_accepted_margin() {
        for margin in ["0s", "1ms", "99ms", "100ms", "1s", "2s", "29s", "29900ms"] {
            let Ok((s, _)) = load(&["--shutdown-margin", margin]) else {
                continue;
            };
            let plan = &s.plan.drain;
            let grace = plan.grace();
            let stopped_by = grace.deadline() + grace.margin();
            assert!(
                stopped_by <= grace.period(),
                "margin {margin}: Envoy stopped by {stopped_by:?}, past the {:?} grace period",
                grace.period()
            );
        }
    }

    #[test]
    fn drain_that_cannot_fit_the_grace_period_is_a_warning() {
        let s = settings(&[
            "--termination-grace-period",
            "10s",
            "--termination-drain-duration",
            "9s",
        ]);
        let w = s.plan.drain.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("termination_drain_duration (9s)") && w[0].contains("8s"),
            "{w:?}"
        );
    }

    #[test]
    fn bad_drain_values_name_the_field() {
        refused(
            &["--exit-on-zero-active-connections", "maybe"],
            "--exit-on-zero-active-connections",
            "maybe",
        );
        refused(&["--drain-until", "forever"], "--drain-until", "forever");
        refused(&["--ignore-listener-port", "0"], "--ignore-listener-port", "\"0\"");
        refused(&["--ignore-listener-port", "70000"], "--ignore-listener-port", "70000");
        refused(
            &["--shutdown-margin", "30s"],
            "--shutdown-margin",
            "termination_grace_period",
        );
        // Envoy needs a margin to exit in: none, and the deadline would be
        // the whole grace period.
        refused(&["--shutdown-margin", "0s"], "--shutdown-margin", "at least 100ms");
        refused(&["--shutdown-margin", "50ms"], "--shutdown-margin", "at least 100ms");
        refused(
            &["--termination-grace-period", "0"],
            "--termination-grace-period",
            "\"0\"",
        );
    }

    /// Found by fuzzing (fuzz/fuzz_targets/proxy_config.rs): a rule across
    /// settings named a value PROXY_CONFIG set by its key, not as written
    /// there.
    #[test]
    fn a_rule_across_settings_names_a_proxy_config_value_as_written_there() {
        let metadata = r#"{"proxyMetadata":{"LIFEGUARD_LOOPBACK_CONTROL":"false"}}"#;
        refused(
            &["--proxy-config", metadata],
            "invalid PROXY_CONFIG proxyMetadata.LIFEGUARD_LOOPBACK_CONTROL = \"false\" (from PROXY_CONFIG)",
            "set control_socket too",
        );
        let both = r#"{"proxyMetadata":{"LIFEGUARD_DRAIN_DELAY":"1s","LIFEGUARD_READINESS_FAIL_DELAY":"2s"}}"#;
        refused(
            &["--proxy-config", both],
            "invalid PROXY_CONFIG proxyMetadata.LIFEGUARD_READINESS_FAIL_DELAY = \"2s\"",
            "cannot be used with drain_delay",
        );
    }

    #[test]
    fn a_file_in_sections_is_read_as_flags_are_and_its_errors_name_the_section() {
        let file = TempFile::new(
            "sections.toml",
            "[envoy]\npoll_interval = \"2s\"\n[drain]\ndrain_scope = \"all\"\nshutdown_margin = \"1s\"\n\
             [logging]\nlog = \"debug\"\n",
        );
        let (s, eff) = load(&["--config", file.arg()]).unwrap();
        let (flags, _) = load(&[
            "--poll-interval=2s",
            "--drain-scope=all",
            "--shutdown-margin=1s",
            "--log=debug",
        ])
        .unwrap();
        assert_eq!(format!("{:?}", s.settings), format!("{:?}", flags.settings));
        assert_eq!(s.plan.drain.drain_until(), DrainUntil::OutOfRotation);
        let source = |key: &str| eff.iter().find(|e| e.key == key).unwrap().source;
        assert_eq!(
            (source("poll_interval"), source("admin_url")),
            (Source::File, Source::Default)
        );
        // A bad value, or a rule that does not hold, names the key as written.
        let bad = TempFile::new("bad-section.toml", "[envoy]\npoll_interval = \"5x\"\n");
        refused(&["--config", bad.arg()], "envoy.poll_interval", "\"5x\"");
        let tight = TempFile::new("tight.toml", "[drain]\nshutdown_margin = \"50ms\"\n");
        refused(&["--config", tight.arg()], "drain.shutdown_margin", "50ms");
        let misplaced = TempFile::new("misplaced.toml", "[drain]\npoll_interval = \"2s\"\n");
        refused(&["--config", misplaced.arg()], misplaced.arg(), "belongs in [envoy]");
    }

    /// A file's value and PROXY_CONFIG's are laid through the setting's
    /// own argument: what its flag takes, they take, and nothing else moves.
    #[test]
    fn lower_layers_are_read_by_the_flags_parsers() {
        let file = TempFile::new(
            "typed.toml",
            "[drain_wait]\nunhealthy_threshold = \"4\"\nchecker_ranges = [\"10.0.0.0/8\", \"35.191.0.0/16\"]\n\
             load_balancer_checks = \"10sx3,5sx2\"\n[pod]\nignore_app_ports = []\n[status]\nloopback_control = \"F\"\n\
             control_socket = \"/run/lifeguard/control.sock\"\n",
        );
        let (s, eff) = load(&["--config", file.arg()]).unwrap();
        let (flags, _) = load(&[
            "--drain-wait-unhealthy-threshold=4",
            "--drain-wait-checker-ranges=10.0.0.0/8,35.191.0.0/16",
            "--load-balancer-checks=10sx3",
            "--load-balancer-checks=5sx2",
            "--loopback-control=F",
            "--control-socket=/run/lifeguard/control.sock",
        ])
        .unwrap();
        assert_eq!(format!("{:?}", s.settings), format!("{:?}", flags.settings));
        let shown = |key: &str| eff.iter().find(|e| e.key == key).unwrap().value.clone();
        assert_eq!(shown("checker_ranges"), "10.0.0.0/8,35.191.0.0/16");
        assert_eq!(shown("load_balancer_checks"), "10sx3,5sx2");
        // PROXY_CONFIG's metadata over the file's list: empty is empty.
        let file = TempFile::new("ports.toml", "ignore_app_ports = [9000, 9001]\n");
        let metadata = r#"{"proxyMetadata":{"LIFEGUARD_IGNORE_APP_PORTS":""}}"#;
        let (s, _) = load(&["--config", file.arg()]).unwrap();
        assert_eq!(s.settings.pod.ignore_app_ports, [9000, 9001]);
        let (s, eff) = load(&["--config", file.arg(), "--proxy-config", metadata]).unwrap();
        assert!(s.settings.pod.ignore_app_ports.is_empty(), "{:?}", s.settings.pod);
        let source = eff.iter().find(|e| e.key == "ignore_app_ports").unwrap().source;
        assert_eq!(source, Source::ProxyConfig);
        refused(
            &[
                "--proxy-config",
                r#"{"proxyMetadata":{"EXIT_ON_ZERO_ACTIVE_CONNECTIONS":"maybe"}}"#,
            ],
            "invalid PROXY_CONFIG proxyMetadata.EXIT_ON_ZERO_ACTIVE_CONNECTIONS = \"maybe\" (from PROXY_CONFIG)",
            "expected true or false",
        );
        let bad = r#"{"statusPort":"none"}"#;
        let msg = load(&["--proxy-config", bad]).map(|_| ()).unwrap_err().to_string();
        assert!(!msg.contains("PROXY_CONFIG statusPort:"), "named twice: {msg}");
        assert!(
            msg.ends_with("(from PROXY_CONFIG): expected a port between 1 and 65535"),
            "{msg}"
        );
        assert!(msg.starts_with("invalid PROXY_CONFIG statusPort = "), "{msg}");
        let table = TempFile::new("table.toml", "[envoy]\npoll_interval = { s = 1 }\n");
        refused(
            &["--config", table.arg()],
            "invalid envoy.poll_interval = \"{ s = 1 }\" (from file)",
            "expected a value or a list",
        );
    }

    #[test]
    fn unknown_file_key_is_an_error_naming_it() {
        let file = TempFile::new("b.toml", "pol_interval = \"2s\"\n");
        refused(&["--config", file.arg()], "pol_interval", "unknown field");
    }

    #[test]
    fn the_shipped_config_file_lists_every_setting() {
        // docs/configuration.md is written from the settings themselves
        // (tests/docs.rs); the shipped file is written by hand.
        let toml = include_str!("../../../config/lifeguard.toml");
        let cmd = RunArgs::augment_args(clap::Command::new("lifeguard"));
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            if key == "config" || key == "proxy_config" {
                continue;
            }
            let flag = format!("--{}", arg.get_long().unwrap());
            let env = arg.get_env().unwrap().to_str().unwrap();
            // Listed (or shown commented out) in its crate's section.
            let section = sections::Section::home(key).unwrap();
            let header = format!("\n[{}]\n", section.name);
            let body = toml
                .split_once(&header)
                .map(|(_, rest)| rest.split("\n[").next().unwrap());
            let listed =
                body.is_some_and(|b| b.contains(&format!("\n{key} = ")) || b.contains(&format!("\n# {key} = ")));
            assert!(listed, "config/lifeguard.toml lacks {key} in {header}");
            assert!(
                toml.contains(env) && toml.contains(&flag),
                "config/lifeguard.toml lacks {env} or {flag}"
            );
        }
        // ...and what the file sets is the default.
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/lifeguard.toml");
        let (_, from_file) = load(&["--config", shipped]).unwrap();
        let (_, defaults) = load(&[]).unwrap();
        for (f, d) in from_file.iter().zip(&defaults) {
            assert_eq!((&f.key, &f.value), (&d.key, &d.value), "config/lifeguard.toml");
        }
    }

    #[test]
    fn admin_url_forms() {
        let url = |s: &str| s.parse::<LoopbackUrl>();
        assert_eq!(url("http://localhost:15000").unwrap().port(), Some(15000));
        assert_eq!(url("http://[::1]:15000/").unwrap().to_string(), "http://[::1]:15000");
        let unix = url("unix:///var/run/lifeguard/admin.sock").unwrap();
        assert_eq!(unix.port(), None);
        assert_eq!(unix.to_string(), "unix:///var/run/lifeguard/admin.sock");
        assert!(url("unix://admin.sock").unwrap_err().to_string().contains("ABSOLUTE"));
        assert!(url("http://127.0.0.1:15000/stats").is_err());
        assert!(url("http://127.0.0.1:0").is_err());
        assert!(url("http://10.0.0.1:15000").is_err());
    }
}
