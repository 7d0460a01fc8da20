//! Helpers for the pod's hooks, shipped in the same binary so a distroless
//! image needs nothing else:
//!
//! - [`wait`]: the postStart hook that holds the app until the proxy is
//!   ready (`holdApplicationUntilProxyStarts`).
//! - [`wait_app_exit`]: a preStop helper that tells the agent termination
//!   began, then waits until the app holds no socket (listening or
//!   connected) and, with a shared process namespace, no process; the proxy
//!   is known by pid (replaces `netstat` loops that count the agent's own
//!   port and never end, and trust process names).
//! - [`drain`]: a client for `POST /drain?prestop`, the native-sidecar
//!   preStop hook (`--operator`: an operator's drain of a pod that is not
//!   terminating, which takes it out of its Service's endpoints).
//!
//! Each returns how it ended ([`HookEnd`]; `lifeguard_exit` makes it the
//! exit code: 0 done, 1 otherwise), having said why on stderr. Every
//! network call has a timeout, and every URL must be loopback.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

use lifeguard_base::duration::GoDuration;
use lifeguard_base::settings::{PositiveSpan, Span};
use lifeguard_base::url::{parse_loopback_url, ControlSocket, LoopbackUrl, UrlError};
use lifeguard_http::{fetch, FetchError};
use lifeguard_pod::app;

/// How a hook helper ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEnd {
    /// It got what it waited for: the proxy ready, the drain done, the
    /// app gone.
    Done,
    /// Its timeout came first.
    GaveUp,
    /// The agent refused or did not answer, or `/proc` could not be read.
    Failed,
}

/// How often a waiting helper reports on stderr.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A URL to poll: a loopback address and a path
/// (`http://127.0.0.1:15021/healthz/ready`).
#[derive(Debug, Clone)]
pub(crate) struct PollUrl {
    url: LoopbackUrl,
    path: String,
}

impl FromStr for PollUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<PollUrl, UrlError> {
        let (url, path) = parse_loopback_url(s)?;
        Ok(PollUrl { url, path })
    }
}

impl fmt::Display for PollUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.url, self.path)
    }
}

/// Options of `lifeguard wait`, as the command line declares them.
#[derive(Debug, Clone, clap::Args)]
pub struct WaitOptions {
    /// Readiness URL to poll (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:15021/healthz/ready")]
    pub(crate) url: PollUrl,
    /// Give up after this long; 0 waits forever.
    #[arg(long, default_value = "60s")]
    pub timeout: Span,
    /// Time between attempts.
    #[arg(long, default_value = "500ms")]
    pub period: PositiveSpan,
    /// Timeout of one attempt.
    #[arg(long, default_value = "500ms")]
    pub(crate) request_timeout: PositiveSpan,
}

/// Polls the readiness URL until it answers 200.
pub async fn wait(opts: &WaitOptions) -> HookEnd {
    let PollUrl { url, path } = &opts.url;
    let (timeout, period, request_timeout) = (opts.timeout.get(), opts.period.get(), opts.request_timeout.get());
    let started = Instant::now();
    let mut last_report = started;
    loop {
        let attempt = Instant::now();
        let answer = tokio::time::timeout(request_timeout, fetch(url, Method::GET, path, 4096)).await;
        let last = match answer {
            Ok(Ok((StatusCode::OK, _))) => {
                eprintln!(
                    "lifeguard wait: {} is ready after {}",
                    opts.url,
                    GoDuration(round_ms(started.elapsed()))
                );
                return HookEnd::Done;
            }
            Ok(Ok((status, body))) => {
                let body = String::from_utf8_lossy(&body);
                format!("{} {}", status.as_u16(), body.trim())
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}", opts.request_timeout),
        };
        let waited = started.elapsed();
        if !timeout.is_zero() && waited >= timeout {
            eprintln!(
                "lifeguard wait: {} not ready after {}; last answer: {last}",
                opts.url, opts.timeout
            );
            return HookEnd::GaveUp;
        }
        if last_report.elapsed() >= REPORT_EVERY {
            eprintln!(
                "lifeguard wait: still waiting after {}: {last}",
                GoDuration(round_ms(waited))
            );
            last_report = Instant::now();
        }
        let mut next = attempt + period;
        if !timeout.is_zero() {
            next = next.min(started + timeout);
        }
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Options of `lifeguard drain`, as the command line declares them.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainOptions {
    /// The agent's status address (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:15020")]
    pub(crate) url: LoopbackUrl,
    /// Give up after this long.
    #[arg(long, default_value = "5m")]
    pub(crate) timeout: PositiveSpan,
    /// The agent's control socket: used instead of --url when the file
    /// exists.
    #[arg(long, env = "LIFEGUARD_CONTROL_SOCKET", value_name = "PATH", default_value = "none")]
    pub(crate) control_socket: ControlSocket,
    /// An operator's drain of a pod that is not terminating (run by hand,
    /// not as the preStop hook): readiness answers the kubelet 503 too, so
    /// the pod leaves its Service's endpoints. Without it, the drain is the
    /// pod's termination: the kubelet is answered 200 while Envoy accepts
    /// new connections (--terminating-readiness).
    #[arg(long)]
    pub(crate) operator: bool,
}

/// `POST /drain?prestop` on the agent (`POST /drain` with `--operator`);
/// prints the drain's status on success.
pub async fn drain(opts: &DrainOptions) -> HookEnd {
    let url = opts.control_socket.or(opts.url.clone());
    let path = match opts.operator {
        true => "/drain",
        false => "/drain?prestop",
    };
    let answer = tokio::time::timeout(opts.timeout.get(), fetch(&url, Method::POST, path, 64 * 1024)).await;
    match answer {
        Ok(Ok((StatusCode::OK, body))) => {
            println!("{}", String::from_utf8_lossy(&body).trim());
            HookEnd::Done
        }
        Ok(Ok((status, body))) => {
            let body = String::from_utf8_lossy(&body);
            eprintln!(
                "lifeguard drain: {}/drain answered {}: {}",
                url,
                status.as_u16(),
                body.trim()
            );
            HookEnd::Failed
        }
        Ok(Err(e)) => {
            eprintln!("lifeguard drain: {e}");
            HookEnd::Failed
        }
        Err(_) => {
            eprintln!("lifeguard drain: {}/drain did not answer within {}", url, opts.timeout);
            HookEnd::GaveUp
        }
    }
}

/// Options of `lifeguard wait-app-exit`, as the command line declares them.
#[derive(Debug, Clone, clap::Args)]
pub struct AppExitOptions {
    /// Give up (exit 1) after this long; 0 waits until the kubelet ends
    /// the hook.
    #[arg(long, default_value = "0s")]
    pub(crate) timeout: Span,
    /// Time between checks.
    #[arg(long, default_value = "500ms")]
    pub(crate) period: PositiveSpan,
    /// A local port whose sockets never count: another sidecar's
    /// (repeatable).
    #[arg(long = "ignore-port", value_name = "PORT")]
    pub(crate) ignore_ports: Vec<u16>,
    /// The agent's status address: told that termination began; the
    /// process that owns it is the proxy's (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:15020")]
    pub(crate) agent_url: LoopbackUrl,
    /// Envoy's admin API: the process that owns it is Envoy (loopback only).
    #[arg(long, default_value = "http://127.0.0.1:15000")]
    pub(crate) admin_url: LoopbackUrl,
    /// The agent's control socket: used instead of --agent-url when the
    /// file exists.
    #[arg(long, env = "LIFEGUARD_CONTROL_SOCKET", value_name = "PATH", default_value = "none")]
    pub(crate) control_socket: ControlSocket,
}

/// Tells the agent that termination began (`POST /drain?nowait&prestop`):
/// readiness turns 503 for the load balancers and the pod's deadline clock
/// starts now, not at SIGTERM. Best effort: a missing agent is reported,
/// not fatal.
async fn tell_agent(agent: &LoopbackUrl) {
    let call = fetch(agent, Method::POST, "/drain?nowait&prestop", 64 * 1024);
    match tokio::time::timeout(Duration::from_secs(1), call).await {
        Ok(Ok((status, _))) if status.is_success() => {
            eprintln!("lifeguard wait-app-exit: told the agent at {agent} that termination began")
        }
        Ok(Ok((status, body))) => eprintln!(
            "lifeguard wait-app-exit: the agent at {agent} answered {}: {}",
            status.as_u16(),
            String::from_utf8_lossy(&body).trim()
        ),
        Ok(Err(FetchError::Connect { source, .. })) => {
            eprintln!("lifeguard wait-app-exit: could not tell the agent at {agent} that termination began: cannot connect: {source}")
        }
        Ok(Err(e)) => {
            eprintln!("lifeguard wait-app-exit: could not tell the agent at {agent} that termination began: {e}")
        }
        Err(_) => eprintln!("lifeguard wait-app-exit: the agent at {agent} did not answer within 1s"),
    }
}

/// Waits until the app holds no socket (and, in a pod that shares its
/// process namespace, no process), by the rules of [`crate::app`]: the
/// proxy is this helper, the agent and Envoy, known by the pids that own
/// their listeners.
pub async fn wait_app_exit(opts: &AppExitOptions) -> HookEnd {
    let agent = opts.control_socket.or(opts.agent_url.clone());
    let started = Instant::now();
    tell_agent(&agent).await;
    let processes = app::shares_pod_process_namespace();
    let mut last_report: Option<Instant> = None;
    loop {
        let (agent_port, admin_port) = (agent.port(), opts.admin_url.port());
        let proxy = app::Proxy {
            pids: app::own_proxy_processes()
                .into_iter()
                .chain(agent_port.and_then(app::listener_owner))
                .collect(),
            control_ports: agent_port.into_iter().chain(admin_port).collect(),
            ignored_ports: opts.ignore_ports.clone(),
        };
        let work = match app::scan(&proxy, processes, admin_port) {
            Ok(work) => work,
            Err(e) => {
                eprintln!("lifeguard wait-app-exit: cannot read /proc/net/tcp: {e}");
                return HookEnd::Failed;
            }
        };
        if work.is_done() {
            eprintln!(
                "lifeguard wait-app-exit: the app holds no socket{} (after {})",
                if processes { " and no process" } else { "" },
                GoDuration(round_ms(started.elapsed()))
            );
            return HookEnd::Done;
        }
        let timeout = opts.timeout.get();
        if !timeout.is_zero() && started.elapsed() >= timeout {
            let all = work.listed_in_full();
            eprintln!("lifeguard wait-app-exit: gave up after {}; still: {all}", opts.timeout);
            return HookEnd::GaveUp;
        }
        if last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
            eprintln!("lifeguard wait-app-exit: waiting for {work}");
            last_report = Some(Instant::now());
        }
        tokio::time::sleep(opts.period.get()).await;
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
