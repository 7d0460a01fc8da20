//! The status port's settings: its address, who may drain and stop Envoy
//! (loopback callers, the control socket), the app's probes and where they
//! reach the app; the [`Plan`] they make.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use lifeguard_base::settings::{GoBool, SettingError};
use lifeguard_base::url::ControlSocket;
use lifeguard_istio::probers::{AppProbes, PodIp};
use serde::Serialize;

use crate::app_probe::AppProber;
use crate::service::ControlAccess;

/// The status port's address: `IP:PORT`, the port not 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusAddr(SocketAddr);

/// Why the status address was refused.
#[derive(Debug, thiserror::Error)]
pub enum AddrError {
    #[error("expected IP:PORT, for example 0.0.0.0:15020")]
    NotAnAddress,
    #[error("port 0 is not allowed: Envoy must know where to send probes")]
    PortZero,
}

impl StatusAddr {
    pub fn get(self) -> SocketAddr {
        self.0
    }
}

impl FromStr for StatusAddr {
    type Err = AddrError;
    fn from_str(s: &str) -> Result<StatusAddr, AddrError> {
        let addr: SocketAddr = s.parse().map_err(|_| AddrError::NotAnAddress)?;
        if addr.port() == 0 {
            return Err(AddrError::PortZero);
        }
        Ok(StatusAddr(addr))
    }
}

impl fmt::Display for StatusAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

lifeguard_base::serialize_as_display!(StatusAddr);

/// The status port's settings. In the file: the section `[status]`, a key a field.
#[derive(Debug, Clone, Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// Address the status server (readiness, drain, metrics) listens on.
    #[arg(long, env = "LIFEGUARD_STATUS_ADDR", value_name = "ADDR", default_value = "0.0.0.0:15020")]
    pub status_addr: StatusAddr,

    /// A Unix socket (mode 0600) serving POST /drain, POST /quitquitquit and
    /// GET /drain to whoever may open it; none by default. The hook
    /// commands use it too when the file exists.
    #[arg(long, env = "LIFEGUARD_CONTROL_SOCKET", value_name = "PATH", default_value = "none")]
    pub control_socket: ControlSocket,

    /// Whether loopback callers of the status port may drain and stop Envoy
    /// (POST /drain, /quitquitquit). false: only the control socket may.
    #[arg(long, env = "LIFEGUARD_LOOPBACK_CONTROL", value_name = "BOOL", default_value = "true")]
    pub loopback_control: GoBool,

    /// The app's probes and hooks to serve on the status port, as JSON:
    /// the map Istio's injector (or `lifeguard inject`) writes, from
    /// `/app-health/<container>/livez|readyz|startupz` and
    /// `/app-lifecycle/<container>/prestopz|poststartz` to the original
    /// probe (`httpGet`, `tcpSocket` or `grpc`, and `timeoutSeconds`). An
    /// entry that is wrong stops start-up, named.
    #[arg(long, env = "ISTIO_KUBE_APP_PROBERS", value_name = "JSON", default_value = "")]
    pub app_probers: AppProbes,

    /// The pod's address, where the app probes reach the app (as the
    /// kubelet would); POD_IP is read when INSTANCE_IP is not set, and
    /// loopback when neither is.
    #[arg(long, env = "INSTANCE_IP", value_name = "IP", default_value = "")]
    pub pod_ip: PodIp,

    /// Send the app probes to loopback instead of the pod's address
    /// (Istio's legacy mode; true or false).
    #[arg(long, env = "REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION", value_name = "BOOL", default_value = "false")]
    pub app_probe_localhost: GoBool,
}

/// A rule across the status port's settings that does not hold.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("with no control_socket nothing could drain or stop Envoy: set control_socket too")]
    NoWayToControl,
}

impl SettingError for PlanError {
    fn key(&self) -> &'static str {
        "loopback_control"
    }

    fn value(&self) -> String {
        "false".into()
    }
}

/// What the status port serves, and to whom.
#[derive(Debug, Clone)]
pub struct Plan {
    pub addr: SocketAddr,
    /// The control socket's path, if one is served.
    pub control_socket: Option<PathBuf>,
    /// Who may drain and stop Envoy.
    pub access: ControlAccess,
    app_probers: AppProbes,
    pod_ip: PodIp,
    app_probe_localhost: bool,
}

impl Settings {
    /// The status port's plan.
    pub fn plan(&self) -> Result<Plan, PlanError> {
        let socket = self.control_socket.0.clone();
        let loopback = self.loopback_control.get();
        if !loopback && socket.is_none() {
            return Err(PlanError::NoWayToControl);
        }
        Ok(Plan {
            addr: self.status_addr.get(),
            control_socket: socket.clone(),
            access: ControlAccess { loopback, socket },
            app_probers: self.app_probers.clone(),
            pod_ip: self.pod_ip,
            app_probe_localhost: self.app_probe_localhost.get(),
        })
    }
}

impl Plan {
    /// Where the app's probes reach the app: the pod's address (the
    /// `pod_ip` setting: INSTANCE_IP, else POD_IP), or loopback.
    pub(crate) fn probe_destination(&self) -> IpAddr {
        self.pod_ip.probe_destination(self.app_probe_localhost)
    }

    /// The app's prober, when the app has probes to serve; the status port
    /// is `status_port` (what the probes' checks leave out).
    pub fn app_prober(&self, status_port: u16, metrics: &lifeguard_metrics::Metrics) -> Option<AppProber> {
        let dest = self.probe_destination();
        let prober = AppProber::new(&self.app_probers, dest, status_port, Some(metrics))?;
        let paths = self.app_probers.0.len();
        match self.pod_ip.0 {
            None if !self.app_probe_localhost => tracing::warn!(
                paths, %dest, "app probes served; the pod's address is unknown (no INSTANCE_IP or POD_IP), so they go to loopback, \
                 which an app listening only on the pod's address does not answer"
            ),
            _ => tracing::info!(paths, %dest, "app probes served"),
        }
        Some(prober)
    }
}
