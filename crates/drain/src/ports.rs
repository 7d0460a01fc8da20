//! The drain's ports: what it needs from Envoy ([`EnvoyControl`]) and from
//! the app ([`AppControl`]), and the values they answer with (the load
//! balancers' verdict: [`crate::Rotation`], in `rotation`). The adapters implement them
//! (`lifeguard_envoy::process::Envoy`, `lifeguard_pod::app::Watcher`,
//! `lifeguard_drain_wait::DrainWait`); the drain knows nothing of the admin
//! API, `/proc`, signals or probes, so its unit tests script every side in
//! virtual time.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::process::ExitStatus;
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;

/// Why a call through [`EnvoyControl`] failed, with the adapter's reason
/// (for the log and `GET /drain`): the drain knows no admin API, so the
/// reason reaches it as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Envoy refused the connection: an external Envoy that keeps refusing
    /// is gone.
    #[error("{0}")]
    Refused(String),
    /// Any other failure (no answer within the read's timeout, an error
    /// status, a body cut short).
    #[error("{0}")]
    Failed(String),
}

/// Which listeners Envoy drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DrainScope {
    /// `drain_listeners?inboundonly`: listeners with traffic_direction INBOUND.
    Inbound,
    /// Every listener (gateways).
    All,
}

lifeguard_base::display_as_value!(DrainScope);
lifeguard_base::serialize_as_display!(DrainScope);

/// What the drain needs from Envoy. `lifeguard_envoy::process::Envoy` is the real one;
/// the unit tests script their own.
pub trait EnvoyControl {
    /// Starts the graceful drain of the `scope` listeners. With
    /// `skip_exit`, Envoy's drain timer does not close them afterwards.
    fn drain_listeners(
        &self,
        scope: DrainScope,
        skip_exit: bool,
    ) -> impl Future<Output = Result<(), ControlError>> + Send;
    /// Reads the active downstream connections and requests, with the
    /// read's own time ([`ActiveRead::took`]), shared or not; a new read
    /// waits at most `timeout` for Envoy's answer (else
    /// [`ControlError::Failed`], naming the timeout), and a read under way when asked is
    /// waited for as its own timeout says.
    fn active(&self, timeout: Duration) -> impl Future<Output = Result<ActiveRead, ControlError>> + Send;
    /// How long a new read of the counts would wait for Envoy now: the
    /// admin timeout, longer after reads that ran past it, as
    /// [`Patience`](crate::Patience) says. The port keeps the one record
    /// of every such read (the drain's, and the drain wait's, which cost
    /// Envoy alike); the drain caps what it gets by its deadline, and keeps
    /// no record of its own. So a port counts as timed out an
    /// [`active`](EnvoyControl::active) read dropped before its answer
    /// (the drain's timeout cut it; Envoy finishes it all the same).
    fn read_timeout(&self) -> Duration;
    /// Stops Envoy gracefully within `bound`.
    fn stop(&self, bound: Duration) -> impl Future<Output = Exit> + Send;
    /// Resolves when Envoy exits on its own (never, if that cannot be seen).
    fn exited(&self) -> impl Future<Output = ExitStatus> + Send;
    /// Whether Envoy is lifeguard's child (its exit is seen directly).
    fn is_child(&self) -> bool;
    /// Whether Envoy's admin answers at all (a cheap call): how an Envoy
    /// that is not lifeguard's child is seen gone while the drain waits on
    /// something else than Envoy's counts.
    fn answering(&self) -> impl Future<Output = Result<(), ControlError>> + Send;
}

/// What the app still holds, for the `app-exit` policy. `lifeguard_pod::app::Watcher`
/// is the real one.
pub trait AppControl {
    /// Why a look at the app failed: the drain logs it and goes on.
    type Error: fmt::Display + Send;
    fn work(&self) -> impl Future<Output = Result<Work, Self::Error>> + Send;
    /// Whether the pod has an app: Some(true) once a socket or process of
    /// one was seen; Some(false) when none ever was though the pod has been
    /// looked at long enough (a pod whose only container is the proxy);
    /// None when it cannot be told yet.
    fn has_app(&self) -> Option<bool>;
    /// Resolves once one of the app's `processes` (a scan's) has exited
    /// (the pod shares its process namespace). Never where nothing tells
    /// it (only its sockets are seen: the drain looks again every
    /// [`APP_SCAN`](crate::APP_SCAN)).
    fn changed(&self, processes: Vec<AppProcess>) -> impl Future<Output = ()> + Send {
        let _ = processes;
        std::future::pending()
    }
}

/// For drains whose policy never looks at the app.
impl AppControl for () {
    type Error = std::convert::Infallible;
    async fn work(&self) -> Result<Work, Self::Error> {
        Ok(Work::default())
    }
    fn has_app(&self) -> Option<bool> {
        None
    }
}

/// How Envoy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The child exited with this status.
    Status(ExitStatus),
    /// An external Envoy acknowledged `/quitquitquit`, or its answer was
    /// lost and its admin refused connections after it (it quit).
    Quit,
    /// An external Envoy's admin API could not be reached to stop it (or
    /// answered `/quitquitquit` with neither an answer nor an exit).
    Unreachable,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Status(s) => write!(f, "{s}"),
            Exit::Quit => f.write_str("quit through the admin API"),
            Exit::Unreachable => f.write_str("admin API unreachable"),
        }
    }
}

/// Active downstream connections and requests, each counted once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Active {
    /// Sum of `listener.<addr>_<port>.downstream_cx_active` over the
    /// listeners that count (not per worker, not the HTTP layer).
    pub connections: u64,
    /// Sum of `http.<prefix>.downstream_rq_active` over the HTTP connection
    /// managers that count.
    pub requests: u64,
    /// Connections that no HTTP connection manager holds (TCP proxy and
    /// other network filters): the listeners' connections less the HTTP
    /// managers' `downstream_cx_active`. Each is work in flight.
    pub tcp: u64,
    /// Lines that were not counted because their value made no sense
    /// (wrapped or unparsable), as text for the log.
    pub skipped: Vec<String>,
}

/// An answered read of [`Active`] counts, and what it cost Envoy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActiveRead {
    /// What the read found.
    pub active: Active,
    /// How long Envoy took to answer the read. A read already under way
    /// when the drain asked is shared (with the drain wait) and took longer
    /// than the drain waited for it: the drain paces its reads by this.
    pub took: Duration,
}

impl Active {
    /// Work in flight in Envoy: HTTP requests and TCP-proxy connections.
    pub fn work(&self) -> u64 {
        self.requests.saturating_add(self.tcp)
    }
}

/// One socket the app holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppSocket {
    pub local: SocketAddr,
    /// None for a listening socket.
    pub remote: Option<SocketAddr>,
}

impl fmt::Display for AppSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.remote {
            None => write!(f, "{} listening", self.local),
            Some(remote) => write!(f, "{} -> {}", self.local, remote),
        }
    }
}

/// One process of the app's containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppProcess {
    pub pid: u32,
    pub name: String,
}

/// What the app holds at one scan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Work {
    pub sockets: Vec<AppSocket>,
    pub processes: Vec<AppProcess>,
    /// Whether the app's processes were looked at (the pod shares its
    /// process namespace); otherwise its sockets were the only signal.
    pub processes_seen: bool,
}

impl Work {
    pub fn is_done(&self) -> bool {
        self.sockets.is_empty() && self.processes.is_empty()
    }

    /// The app's processes were seen and none is left: it exited, and an
    /// app that exited does not come back.
    pub fn gone(&self) -> bool {
        self.processes_seen && self.is_done()
    }

    /// How many things the app still holds.
    pub fn count(&self) -> u64 {
        (self.sockets.len() + self.processes.len()) as u64
    }
}

impl Work {
    /// Every socket and process, none left out of the list.
    pub fn listed_in_full(&self) -> String {
        Listed(self, usize::MAX).to_string()
    }
}

/// `2 app sockets (127.0.0.1:8080 listening; 127.0.0.1:41234 -> 127.0.0.1:15001)`,
/// at most a few listed.
impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Listed(self, 4).fmt(f)
    }
}

/// Work, listing at most `.1` sockets and processes.
struct Listed<'a>(&'a Work, usize);

impl fmt::Display for Listed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (work, listed) = (self.0, self.1);
        let mut parts = Vec::new();
        if !work.sockets.is_empty() {
            let n = work.sockets.len();
            let mut list: Vec<String> = work.sockets.iter().take(listed).map(ToString::to_string).collect();
            if n > listed {
                list.push(format!("{} more", n - listed));
            }
            parts.push(format!("{n} app socket{} ({})", plural(n), list.join("; ")));
        }
        if !work.processes.is_empty() {
            let n = work.processes.len();
            let mut list: Vec<String> = work
                .processes
                .iter()
                .take(listed)
                .map(|p| format!("{} pid {}", p.name, p.pid))
                .collect();
            if n > listed {
                list.push(format!("{} more", n - listed));
            }
            parts.push(format!(
                "{n} app process{} ({})",
                if n == 1 { "" } else { "es" },
                list.join("; ")
            ));
        }
        if parts.is_empty() {
            f.write_str("nothing")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
