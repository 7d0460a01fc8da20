//! Configuration: every setting comes from a flag, an environment variable,
//! a TOML file given with `--config`, or its default — in that order of
//! precedence — and is validated once, here, before anything starts.
//!
//! Each setting is declared once, as a field of [`Settings`]: its flag, env
//! variable, default and value parser in `#[arg]`, its file key the field
//! name, its help the doc comment. clap parses flags, env and defaults; the
//! file goes through serde with the same parsers ([`RunArgs::load`]). A bad
//! value stops start-up with a message that names the field (as the user
//! wrote it: flag, env variable or file key) and the value.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};
use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;
use ipnet::IpNet;
use parsers::{
    addr, app_metrics, app_probes, control_socket, filter, grace, message_path, pod_ip, poll, ports, positive, range,
    ranges, ranges_shown, span, threshold, url,
};

mod layers;
mod parsers;
mod proxy_config;
mod reference;

pub(crate) use layers::from_clap_error;
pub(crate) use parsers::{go_bool, ValueError};
pub use reference::reference;

use crate::istio::annotations::AppMetrics;
use crate::istio::probers::{AppProbes, PodIp};
use crate::url::ControlSocket;
pub(crate) use crate::url::LoopbackUrl;
use crate::{drain::DrainScope, drain::DrainUntil, envoy::state::XdsCheck, exit::MessagePath, logging::LogFormat};

/// Options of `lifeguard run` and `check`: the settings file, then the settings.
#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// TOML file with settings (flags and env variables override it).
    #[arg(long, env = "LIFEGUARD_CONFIG", value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Istio's proxy config, as its injector writes it (JSON or YAML): a
    /// layer under flags and env, over the file.
    #[arg(long, env = "PROXY_CONFIG", value_name = "JSON")]
    pub(crate) proxy_config: Option<String>,
    #[command(flatten)]
    pub(crate) settings: Settings,
}

/// Every setting of a running agent, validated. The file key is the field name.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Settings {
    /// Address the status server (readiness, drain, metrics) listens on.
    #[arg(long, env = "LIFEGUARD_STATUS_ADDR", value_name = "ADDR", default_value = "0.0.0.0:15020", value_parser = addr::parse)]
    #[serde(with = "addr")]
    pub(crate) status_addr: SocketAddr,

    /// Envoy's admin API: a loopback URL, or a Unix socket
    /// (`unix:///PATH`, the locked form). Every admin call goes there:
    /// readiness, the drain, the counts, the merged scrape, the stop.
    #[arg(long, env = "LIFEGUARD_ADMIN_URL", value_name = "URL", default_value = "http://127.0.0.1:15000", value_parser = url::parse)]
    #[serde(with = "url")]
    pub(crate) admin_url: LoopbackUrl,

    /// How often Envoy's admin is read once Envoy is ready (`/ready`; at
    /// least 10ms).
    #[arg(long, env = "LIFEGUARD_POLL_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = poll::parse)]
    #[serde(with = "poll")]
    pub(crate) poll_interval: Duration,

    /// How often Envoy's admin is read while Envoy is not ready (the full
    /// stats check; at least 10ms).
    #[arg(long, env = "LIFEGUARD_STARTUP_POLL_INTERVAL", value_name = "DURATION", default_value = "100ms", value_parser = poll::parse)]
    #[serde(with = "poll")]
    pub(crate) startup_poll_interval: Duration,

    /// Timeout of one admin API call: connect, request and body.
    #[arg(long, env = "LIFEGUARD_ADMIN_TIMEOUT", value_name = "DURATION", default_value = "1s", value_parser = positive::parse)]
    #[serde(with = "positive")]
    pub(crate) admin_timeout: Duration,

    /// Require the first CDS/LDS update: auto (when Envoy has those
    /// counters, as when fed by istiod), required, or off.
    #[arg(long, env = "LIFEGUARD_XDS_CHECK", value_name = "MODE", default_value = "auto")]
    pub(crate) xds_check: XdsCheck,

    /// Log filter: a level (`info`), or targets and their levels
    /// (`warn,lifeguard=debug`).
    #[arg(long, env = "LIFEGUARD_LOG", value_name = "FILTER", default_value = "info", value_parser = filter::parse)]
    #[serde(with = "filter")]
    pub(crate) log: String,

    /// Log line format: text (for people) or json (one JSON object a line,
    /// with `timestamp`, `level` and `fields`, for log pipelines).
    #[arg(long, env = "LIFEGUARD_LOG_FORMAT", value_name = "FORMAT", default_value = "text")]
    pub(crate) log_format: LogFormat,

    /// The pod's terminationGracePeriodSeconds (a bare number counts as
    /// seconds); the drain ends by this minus the shutdown margin.
    #[arg(long, env = "TERMINATION_GRACE_PERIOD", value_name = "DURATION", default_value = "30s", value_parser = grace::parse)]
    #[serde(with = "grace")]
    pub(crate) termination_grace_period: Duration,

    /// Time kept back from the grace period to stop Envoy and exit; also
    /// how long Envoy gets between SIGTERM and SIGKILL (at least 100ms).
    #[arg(long, env = "LIFEGUARD_SHUTDOWN_MARGIN", value_name = "DURATION", default_value = "2s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) shutdown_margin: Duration,

    /// Pause after readiness turns 503 and before Envoy starts draining, so
    /// endpoint removal can propagate.
    #[arg(long, env = "LIFEGUARD_DRAIN_DELAY", value_name = "DURATION", default_value = "0s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) drain_delay: Duration,

    /// Start Envoy's drain at once but keep readiness answering as Envoy
    /// does for this long (the opposite order of --drain-delay): a
    /// terminating endpoint that still reports ready keeps the traffic that
    /// falls back to it (KEP-1669), and Envoy closes it gracefully.
    #[arg(long, env = "LIFEGUARD_READINESS_FAIL_DELAY", value_name = "DURATION", default_value = "0s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) readiness_fail_delay: Duration,

    /// Fixed policy: how long Envoy drains before it is stopped.
    #[arg(long, env = "TERMINATION_DRAIN_DURATION", value_name = "DURATION", default_value = "5s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) termination_drain_duration: Duration,

    /// Stop Envoy once its active downstream connections reach zero (true
    /// or false; makes --drain-until default to connections).
    #[arg(long, env = "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", value_name = "BOOL", default_value = "false", action = ArgAction::Set, value_parser = go_bool)]
    pub(crate) exit_on_zero_active_connections: bool,

    /// Exit-on-zero policies: the shortest drain.
    #[arg(long, env = "MINIMUM_DRAIN_DURATION", value_name = "DURATION", default_value = "5s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) minimum_drain_duration: Duration,

    /// What the drain waits for: app-exit (Envoy idle and the app gone),
    /// out-of-rotation (a gateway: every load balancer has taken the pod
    /// out, then no request in flight), time (fixed), connections or
    /// requests (zero active). When not given: connections if
    /// --exit-on-zero-active-connections is true, time if
    /// --termination-drain-duration is given, out-of-rotation with
    /// --drain-scope all, app-exit otherwise (and out-of-rotation when the
    /// drain begins in a pod where no app was ever seen).
    #[arg(long, env = "LIFEGUARD_DRAIN_UNTIL", value_name = "WHAT", default_value = "app-exit")]
    pub(crate) drain_until: DrainUntil,
    /// Envoy's `--drain-time-s`, added to Envoy's command line unless it
    /// sets it: how long Envoy may take before it closes drained listeners
    /// (Istio's drainDuration). 0s: the grace period, so Envoy never closes
    /// them before lifeguard's deadline.
    #[arg(long, env = "LIFEGUARD_ENVOY_DRAIN_TIME", value_name = "DURATION", default_value = "0s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) envoy_drain_time: Duration,

    /// The drain wait (GET /drain/wait): a checker of the pod's readiness
    /// (a load balancer) has taken the pod out once it has had this many
    /// failed probes in a row (HAProxy and the kubelet default to 3, AWS
    /// and GCP to 2).
    #[arg(long, env = "LIFEGUARD_DRAIN_WAIT_UNHEALTHY_THRESHOLD", value_name = "N", default_value = "3", value_parser = threshold::parse)]
    #[serde(deserialize_with = "threshold::deserialize")]
    pub(crate) drain_wait_unhealthy_threshold: u32,

    /// The drain wait: the shortest quiet period. Once every checker has
    /// taken the pod out, no new request on Envoy's inbound listeners for
    /// the quiet period means the traffic has stopped; the quiet period is
    /// derived from the traffic before the drain (a gap that comes by
    /// chance at most once in a thousand), never shorter than this.
    #[arg(long, env = "LIFEGUARD_DRAIN_WAIT_MIN_QUIET_PERIOD", value_name = "DURATION", default_value = "500ms", value_parser = positive::parse)]
    #[serde(with = "positive")]
    pub(crate) drain_wait_min_quiet_period: Duration,

    /// The drain wait: only readiness probes from these address ranges
    /// (CIDR, comma-separated; cloud health checkers publish theirs, e.g.
    /// GoogleHC's 35.191.0.0/16,130.211.0.0/22) count as a load balancer's
    /// checks; empty: probes from anywhere but the kubelet.
    #[arg(long = "drain-wait-checker-ranges", env = "LIFEGUARD_DRAIN_WAIT_CHECKER_RANGES", value_name = "CIDR", value_delimiter = ',', value_parser = range::parse)]
    #[serde(deserialize_with = "ranges", serialize_with = "ranges_shown")]
    pub(crate) drain_wait_checker_ranges: Vec<IpNet>,

    /// The drain wait: no checker of the pod's readiness holds the wait
    /// longer than this after the drain began (a prober that checks
    /// rarely, or keeps probing without failing enough, cannot hold every
    /// rollout to the grace period).
    #[arg(long, env = "LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT", value_name = "DURATION", default_value = "20s", value_parser = positive::parse)]
    #[serde(with = "positive")]
    pub(crate) drain_wait_checker_timeout: Duration,

    /// The drain wait: time kept for the app between the wait's end and the
    /// drain's deadline, when the wait ends at its bound (at most half the
    /// deadline): the app gets its SIGTERM this long before Envoy is stopped.
    #[arg(long, env = "LIFEGUARD_DRAIN_WAIT_APP_TIME", value_name = "DURATION", default_value = "5s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) drain_wait_app_time: Duration,

    /// Whether the policy was asked for (not the default).
    #[arg(skip)]
    #[serde(skip)]
    pub(crate) drain_until_given: bool,

    /// Which of Envoy's listeners drain: inbound (a sidecar:
    /// `drain_listeners?inboundonly`) or all (an ingress gateway, whose
    /// listeners carry no traffic direction).
    #[arg(long, env = "LIFEGUARD_DRAIN_SCOPE", value_name = "SCOPE", default_value = "inbound")]
    pub(crate) drain_scope: DrainScope,

    /// PROXY_CONFIG's fields lifeguard does not use, listed once at start-up.
    #[arg(skip)]
    #[serde(skip)]
    pub(crate) proxy_config_unused: Vec<String>,

    /// Local port of another sidecar whose sockets the app-exit policy and
    /// wait-app-exit leave out (repeatable).
    #[arg(long = "ignore-app-port", env = "LIFEGUARD_IGNORE_APP_PORTS", value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    #[serde(deserialize_with = "ports")]
    pub(crate) ignore_app_ports: Vec<u16>,

    /// Listener port whose connections the drain does not wait for
    /// (repeatable; 15021 and 15090 are always left out).
    // Once loaded, the list includes ALWAYS_IGNORED_PORTS.
    #[arg(long = "ignore-listener-port", env = "LIFEGUARD_IGNORE_LISTENER_PORTS", value_name = "PORT", value_delimiter = ',', value_parser = clap::value_parser!(u16).range(1..))]
    #[serde(deserialize_with = "ports")]
    pub(crate) ignore_listener_ports: Vec<u16>,

    /// A Unix socket (mode 0600) serving POST /drain, POST /quitquitquit and
    /// GET /drain to whoever may open it; none by default. The hook
    /// commands use it too when the file exists.
    #[arg(long, env = "LIFEGUARD_CONTROL_SOCKET", value_name = "PATH", default_value = "none", value_parser = control_socket::parse)]
    #[serde(with = "control_socket")]
    pub(crate) control_socket: ControlSocket,

    /// Whether loopback callers of the status port may drain and stop Envoy
    /// (POST /drain, /quitquitquit). false: only the control socket may.
    #[arg(long, env = "LIFEGUARD_LOOPBACK_CONTROL", value_name = "BOOL", default_value = "true", action = ArgAction::Set, value_parser = go_bool)]
    pub(crate) loopback_control: bool,

    /// The app's probes and hooks to serve on the status port, as JSON:
    /// the map Istio's injector (or `lifeguard inject`) writes, from
    /// `/app-health/<container>/livez|readyz|startupz` and
    /// `/app-lifecycle/<container>/prestopz|poststartz` to the original
    /// probe (`httpGet`, `tcpSocket` or `grpc`, and `timeoutSeconds`). An
    /// entry that is wrong stops start-up, named.
    #[arg(long, env = "ISTIO_KUBE_APP_PROBERS", value_name = "JSON", default_value = "", value_parser = app_probes::parse)]
    #[serde(with = "app_probes")]
    pub(crate) app_probers: AppProbes,

    /// The pod's address, where the app probes reach the app (as the
    /// kubelet would); POD_IP is read when INSTANCE_IP is not set, and
    /// loopback when neither is.
    #[arg(long, env = "INSTANCE_IP", value_name = "IP", default_value = "", value_parser = pod_ip::parse)]
    #[serde(with = "pod_ip")]
    pub(crate) pod_ip: PodIp,

    /// Send the app probes to loopback instead of the pod's address
    /// (Istio's legacy mode; true or false).
    #[arg(long, env = "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", value_name = "BOOL", default_value = "false", action = ArgAction::Set, value_parser = go_bool)]
    pub(crate) app_probe_localhost: bool,

    /// The app's own metrics, served last in `/stats/prometheus`, as the
    /// JSON Istio's injector writes: `{"scrape":"true","port":"8080",
    /// "path":"/metrics"}` or `{"targets":[{"port":..,"path":..},...]}`;
    /// `"scrape":"false"` or empty: none. Read on 127.0.0.1; a target on a
    /// port of the proxy stops start-up, named.
    #[arg(long, env = "ISTIO_PROMETHEUS_ANNOTATIONS", value_name = "JSON", default_value = "", value_parser = app_metrics::parse)]
    #[serde(with = "app_metrics")]
    pub(crate) app_metrics: AppMetrics,

    /// Append Envoy's own metrics to `/stats/prometheus` (true or false).
    #[arg(long, env = "LIFEGUARD_MERGE_ENVOY_METRICS", value_name = "BOOL", default_value = "true", action = ArgAction::Set, value_parser = go_bool)]
    pub(crate) merge_envoy_metrics: bool,

    /// After Envoy stops, keep the status port answering until one scrape of
    /// /stats/prometheus has seen the final state, or this long at most;
    /// never past the grace period.
    #[arg(long, env = "LIFEGUARD_LINGER", value_name = "DURATION", default_value = "0s", value_parser = span::parse)]
    #[serde(with = "span")]
    pub(crate) linger: Duration,

    /// Where the exit summary (one line of JSON, at most 4 KiB) is written
    /// for Kubernetes to show as the container's termination message: auto
    /// (/dev/termination-log when that file exists), none, or a path.
    #[arg(long, env = "LIFEGUARD_TERMINATION_MESSAGE_PATH", value_name = "PATH", default_value = "auto", value_parser = message_path::parse)]
    #[serde(with = "message_path")]
    pub(crate) termination_message_path: MessagePath,
}

/// The shortest shutdown margin: the time Envoy gets between SIGTERM and
/// SIGKILL, kept back from the grace period.
pub(crate) const MIN_SHUTDOWN_MARGIN: Duration = Duration::from_millis(100);

/// Listener ports never waited for: Istio's status (15021) and Prometheus
/// (15090) listeners, whose own probe and scrape traffic never ends.
pub(crate) const ALWAYS_IGNORED_PORTS: [u16; 2] = [15021, 15090];

impl Settings {
    /// How long after the drain begins Envoy must be stopped: the grace
    /// period less the shutdown margin.
    pub(crate) fn drain_deadline(&self) -> Duration {
        self.termination_grace_period.saturating_sub(self.shutdown_margin)
    }

    /// Envoy's `--drain-time-s`: `envoy_drain_time`, or the grace period
    /// when it is 0.
    pub(crate) fn envoy_drain(&self) -> Duration {
        match self.envoy_drain_time {
            t if t.is_zero() => self.termination_grace_period,
            t => t,
        }
    }

    /// Durations that do not fit inside the drain deadline, as warnings.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let budget = self.drain_deadline();
        let (what, wait) = match self.drain_until {
            DrainUntil::Time => ("termination_drain_duration", self.termination_drain_duration),
            // The load balancers' time is the drain wait's budget, said
            // once they are learned.
            DrainUntil::OutOfRotation => ("no minimum", Duration::ZERO),
            _ => ("minimum_drain_duration", self.minimum_drain_duration),
        };
        let mut out = Vec::new();
        if self.readiness_fail_delay > budget {
            out.push(format!(
                "readiness_fail_delay ({}) does not fit the {} left by termination_grace_period - shutdown_margin: readiness fails only at the deadline",
                GoDuration(self.readiness_fail_delay),
                GoDuration(budget)
            ));
        }
        if self.drain_delay + wait > budget {
            out.push(format!(
                "drain_delay ({}) + {what} ({}) = {} does not fit the {} left by termination_grace_period ({}) - shutdown_margin ({}): the drain will be cut at the deadline",
                GoDuration(self.drain_delay),
                GoDuration(wait),
                GoDuration(self.drain_delay + wait),
                GoDuration(budget),
                GoDuration(self.termination_grace_period),
                GoDuration(self.shutdown_margin),
            ));
        }
        out
    }

    /// The rules across settings, applied once every layer is in. `named`
    /// gives a key's field (as the user wrote it) and source.
    fn resolve(&mut self, named: impl Fn(&str) -> (String, Source)) -> Result<(), ConfigError> {
        let invalid = |key: &str, value: String, why: String| {
            let (field, origin) = named(key);
            Err(ConfigError::Invalid {
                field,
                value,
                origin,
                why,
            })
        };
        if self.shutdown_margin < MIN_SHUTDOWN_MARGIN {
            let why = format!(
                "must be at least {}: Envoy gets this long to exit after SIGTERM, inside the grace period",
                GoDuration(MIN_SHUTDOWN_MARGIN)
            );
            return invalid("shutdown_margin", GoDuration(self.shutdown_margin).to_string(), why);
        }
        if self.shutdown_margin >= self.termination_grace_period {
            let why = format!(
                "must be shorter than termination_grace_period ({})",
                GoDuration(self.termination_grace_period)
            );
            return invalid("shutdown_margin", GoDuration(self.shutdown_margin).to_string(), why);
        }
        if !self.loopback_control && self.control_socket.0.is_none() {
            let why = "with no control_socket nothing could drain or stop Envoy: set control_socket too";
            return invalid("loopback_control", "false".into(), why.into());
        }
        if let Err(why) = self
            .app_metrics
            .check_ports(self.status_addr.port(), self.admin_url.port())
        {
            return invalid("app_metrics", self.app_metrics.to_json(), why.to_string());
        }
        if !self.drain_delay.is_zero() && !self.readiness_fail_delay.is_zero() {
            let why = "cannot be used with drain_delay: readiness fails first with drain_delay, last with readiness_fail_delay";
            return invalid(
                "readiness_fail_delay",
                GoDuration(self.readiness_fail_delay).to_string(),
                why.into(),
            );
        }
        self.drain_until_given = named("drain_until").1 != Source::Default;
        if named("drain_until").1 == Source::Default {
            if self.exit_on_zero_active_connections {
                self.drain_until = DrainUntil::Connections;
            } else if named("termination_drain_duration").1 != Source::Default {
                self.drain_until = DrainUntil::Time;
            } else if self.drain_scope == DrainScope::All {
                // A gateway: no app to wait for.
                self.drain_until = DrainUntil::OutOfRotation;
            }
        }
        self.ignore_listener_ports.extend(ALWAYS_IGNORED_PORTS);
        self.ignore_listener_ports.sort_unstable();
        self.ignore_listener_ports.dedup();
        Ok(())
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Flag,
    Env,
    /// Istio's `PROXY_CONFIG`.
    ProxyConfig,
    File,
    Default,
}

/// `flag`, `env`, `PROXY_CONFIG`, `file`, `default`.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ProxyConfig => f.write_str("PROXY_CONFIG"),
            other => f.write_str(&format!("{other:?}").to_lowercase()),
        }
    }
}

/// One effective setting, for `lifeguard check` and the start-up log.
#[derive(Debug, Clone)]
pub(crate) struct Effective {
    pub(crate) key: String,
    pub(crate) value: String,
    pub(crate) source: Source,
}

/// A configuration error. The message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid {field} = {value:?} (from {origin}): {why}")]
    Invalid {
        field: String,
        value: String,
        origin: Source,
        why: String,
    },
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::duration;
    use clap::FromArgMatches;
    use std::ffi::OsString;

    /// Loads `lifeguard run ARGS` as main does, without reading the environment.
    pub(crate) fn load(args: &[&str]) -> Result<(Settings, Vec<Effective>), ConfigError> {
        let argv: Vec<OsString> = std::iter::once("lifeguard")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect();
        let cmd = RunArgs::augment_args(clap::Command::new("lifeguard")).mut_args(|a| a.env(None));
        let matches = match cmd.try_get_matches_from(&argv) {
            Ok(m) => m,
            Err(e) => return Err(from_clap_error(&e, &argv).unwrap_or_else(|| panic!("{e}"))),
        };
        RunArgs::from_arg_matches(&matches).unwrap().load(&matches)
    }

    fn settings(args: &[&str]) -> Settings {
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
        assert_eq!(s.status_addr, "0.0.0.0:15020".parse().unwrap());
        assert_eq!(s.admin_url.to_string(), "http://127.0.0.1:15000");
        assert_eq!(s.poll_interval, Duration::from_secs(1));
        assert_eq!(s.startup_poll_interval, Duration::from_millis(100));
        assert_eq!(s.admin_timeout, Duration::from_secs(1));
        assert_eq!(s.xds_check, XdsCheck::Auto);
        assert_eq!(s.log, "info");
        assert!(s.merge_envoy_metrics && !s.exit_on_zero_active_connections);
        assert_eq!(crate::agent::Options::from(&s).stale_after, Duration::from_secs(4));
        assert_eq!(eff.len(), 34);
        assert_eq!(
            (s.drain_wait_unhealthy_threshold, s.drain_wait_min_quiet_period),
            (3, Duration::from_millis(500))
        );
        assert_eq!(
            (s.drain_wait_checker_timeout, s.drain_wait_app_time),
            (Duration::from_secs(20), Duration::from_secs(5))
        );
        assert!(s.drain_wait_checker_ranges.is_empty());
        assert!(s.app_probers.0.is_empty() && s.pod_ip.0.is_none() && !s.app_probe_localhost);
        assert_eq!(s.control_socket, ControlSocket(None));
        assert!(s.loopback_control);
        assert_eq!(s.readiness_fail_delay, Duration::ZERO);
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.linger, Duration::ZERO);
        assert_eq!(s.termination_message_path, MessagePath::Auto);
        assert!(eff.iter().all(|e| e.source == Source::Default));
    }

    #[test]
    fn flag_beats_file_beats_default() {
        let file = TempFile::new(
            "a.toml",
            "poll_interval = \"2s\"\nadmin_timeout = \"300ms\"\nlog = \"debug\"\n",
        );
        let (s, eff) = load(&["--config", file.arg(), "--poll-interval", "500ms"]).unwrap();
        assert_eq!(s.poll_interval, Duration::from_millis(500));
        assert_eq!(s.admin_timeout, Duration::from_millis(300));
        assert_eq!(s.log, "debug");
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
    }

    #[test]
    fn bad_file_values_name_the_key_and_value() {
        for (text, key, needle) in [
            ("poll_interval = \"5x\"", "poll_interval", "\"5x\""),
            ("status_addr = \"127.0.0.1:0\"", "status_addr", "port 0"),
            (
                "ignore_listener_ports = [8081, 0]",
                "ignore_listener_ports",
                "not a port",
            ),
            (
                "exit_on_zero_active_connections = \"maybe\"",
                "exit_on_zero_active_connections",
                "maybe",
            ),
            ("drain_until = \"forever\"", "drain_until", "forever"),
            ("log = \"foo=bar\"", "log", "not a log filter"),
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
        let msg = from_clap_error(&err, &["lifeguard".into()]).unwrap().to_string();
        assert!(
            msg.starts_with("invalid LIFEGUARD_DRAIN_DELAY = \"5\" (from env): invalid duration"),
            "{msg}"
        );
        let argv = ["lifeguard".into(), "--drain-delay".into(), "5".into()];
        let msg = from_clap_error(&err, &argv).unwrap().to_string();
        assert!(msg.starts_with("invalid --drain-delay = \"5\" (from flag)"), "{msg}");
    }

    #[test]
    fn booleans_take_gos_forms() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert!(settings(&["--exit-on-zero-active-connections", t]).exit_on_zero_active_connections);
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert!(!settings(&["--merge-envoy-metrics", f]).merge_envoy_metrics);
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
            settings(&["--termination-grace-period", "45"]).termination_grace_period,
            Duration::from_secs(45)
        );
        assert_eq!(
            settings(&["--termination-grace-period", "8760h"]).termination_grace_period,
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
            settings(&["--poll-interval", "10ms"]).poll_interval,
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
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.linger, Duration::from_secs(20));
        assert_eq!(s.termination_message_path.resolve(), None);
        let s = settings(&["--termination-message-path", "/tmp/msg"]);
        assert_eq!(s.termination_message_path.resolve(), Some(PathBuf::from("/tmp/msg")));
        let file = TempFile::new(
            "outcome.toml",
            "termination_message_path = \"\"\nlog_format = \"json\"\n",
        );
        let s = settings(&["--config", file.arg()]);
        assert_eq!(s.termination_message_path, MessagePath::Off);
        refused(&["--log-format", "xml"], "--log-format", "xml");
        refused(&["--linger=-1s"], "--linger", "-1s");
    }

    #[test]
    fn log_filters_are_validated() {
        assert_eq!(settings(&["--log", "warn,lifeguard=debug"]).log, "warn,lifeguard=debug");
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
    }

    #[test]
    fn drain_policy_follows_istio_names() {
        let s = settings(&[]);
        assert_eq!(s.drain_until, DrainUntil::AppExit);
        assert_eq!(s.drain_scope, DrainScope::Inbound);
        assert_eq!(s.termination_drain_duration, Duration::from_secs(5));
        let s = settings(&["--termination-drain-duration", "5s"]);
        assert_eq!(s.drain_until, DrainUntil::Time);
        let s = settings(&[
            "--drain-until",
            "app-exit",
            "--drain-scope",
            "all",
            "--ignore-app-port",
            "9901",
        ]);
        assert_eq!(s.drain_until, DrainUntil::AppExit);
        assert_eq!(s.drain_scope, DrainScope::All);
        assert_eq!(s.ignore_app_ports, [9901]);
        let file = TempFile::new("appexit.toml", "drain_until = \"app-exit\"\ndrain_scope = \"all\"\n");
        assert_eq!(settings(&["--config", file.arg()]).drain_until, DrainUntil::AppExit);
        assert_eq!(s.drain_deadline(), Duration::from_secs(28));
        assert_eq!(s.ignore_listener_ports, ALWAYS_IGNORED_PORTS);
        assert!(s.warnings().is_empty());
        // A gateway: every listener drains, and no app to wait for.
        let s = settings(&["--drain-scope", "all"]);
        assert_eq!((s.drain_until, s.drain_until_given), (DrainUntil::OutOfRotation, false));
        assert!(s.warnings().is_empty());
        let s = settings(&["--drain-scope", "all", "--drain-until", "requests"]);
        assert_eq!(s.drain_until, DrainUntil::Requests);
        let s = settings(&["--drain-until", "out-of-rotation"]);
        assert_eq!(
            (s.drain_until, s.drain_scope),
            (DrainUntil::OutOfRotation, DrainScope::Inbound)
        );
        let s = settings(&["--exit-on-zero-active-connections", "true"]);
        assert_eq!(s.drain_until, DrainUntil::Connections);
        let file = TempFile::new("zero.toml", "exit_on_zero_active_connections = true\n");
        assert_eq!(settings(&["--config", file.arg()]).drain_until, DrainUntil::Connections);
        let s = settings(&[
            "--exit-on-zero-active-connections=true",
            "--drain-until=requests",
            "--termination-grace-period=45",
            "--ignore-listener-port=8081,15021",
        ]);
        assert_eq!(s.drain_until, DrainUntil::Requests);
        assert_eq!(s.termination_grace_period, Duration::from_secs(45));
        assert_eq!(s.ignore_listener_ports, vec![8081, 15021, 15090]);
    }

    /// Issue #41: whatever margin is accepted, the drain's deadline and
    /// Envoy's stop after it fit the grace period.
    #[test]
    fn envoy_is_never_stopped_past_the_grace_period_at_any_accepted_margin() {
        for margin in ["0s", "1ms", "99ms", "100ms", "1s", "2s", "29s", "29900ms"] {
            let Ok((s, _)) = load(&["--shutdown-margin", margin]) else {
                continue;
            };
            let plan = crate::agent::Options::plan(&s, s.drain_until);
            let stopped_by = plan.drain_deadline + plan.shutdown_margin;
            assert!(
                stopped_by <= s.termination_grace_period,
                "margin {margin}: Envoy stopped by {stopped_by:?}, past the {:?} grace period",
                s.termination_grace_period
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
        let w = s.warnings();
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
        // Issue #41: a margin of 0 made the deadline the whole grace period,
        // and Envoy's stop (given 100 ms at least) ran past it.
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
    fn unknown_file_key_is_an_error_naming_it() {
        let file = TempFile::new("b.toml", "pol_interval = \"2s\"\n");
        refused(&["--config", file.arg()], "pol_interval", "unknown field");
    }

    #[test]
    fn the_shipped_config_file_lists_every_setting() {
        // docs/configuration.md is written from the settings themselves
        // (tests/docs.rs); the shipped file is written by hand.
        let toml = include_str!("../../config/lifeguard.toml");
        let cmd = RunArgs::augment_args(clap::Command::new("lifeguard"));
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str();
            if key == "config" || key == "proxy_config" {
                continue;
            }
            let flag = format!("--{}", arg.get_long().unwrap());
            let env = arg.get_env().unwrap().to_str().unwrap();
            let listed = toml.contains(&format!("\n{key} = ")) || toml.contains(&format!("\n# {key} = "));
            assert!(listed, "config/lifeguard.toml lacks {key}");
            assert!(
                toml.contains(env) && toml.contains(&flag),
                "config/lifeguard.toml lacks {env} or {flag}"
            );
        }
        // ...and what the file sets is the default.
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/lifeguard.toml");
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
