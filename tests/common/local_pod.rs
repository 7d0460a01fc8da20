//! A pod on loopback ([`Pod`]): the slow test app, and lifeguard running
//! the real Envoy as its child in front of it, on ports leased for the
//! test. (The pod of namespaces and cgroups is `pod.rs`.)

use std::time::{Duration, Instant};

use super::agent::{Agent, AgentBuilder};
use super::clients::http_timeout;
use super::envoy::{bootstrap, wait_inflight, Ports};
use super::servers::App;
use super::wait::wait_status;

/// A pod: the slow app, and lifeguard running Envoy as its child. The
/// agent is stopped first on drop, then the app, then the ports are let go.
pub struct Pod {
    pub agent: Agent,
    _app: App,
    pub ports: Ports,
}

impl Pod {
    /// Starts the app and `agent` (its flags and environment: the pod
    /// gives it its ports and its Envoy) and waits until the pod is ready
    /// through Envoy.
    pub fn start(agent: AgentBuilder) -> Pod {
        let ports = Ports::new();
        let app = App::start(&ports.app);
        let agent = agent.on(&ports).envoy(&bootstrap(&ports)).spawn();
        wait_status(
            ports.status_listener.addr(),
            "/healthz/ready",
            200,
            Duration::from_secs(30),
        );
        Pod {
            agent,
            _app: app,
            ports,
        }
    }

    /// A request through Envoy's inbound listener, in a thread, once Envoy
    /// counts it in flight (the only one); the thread returns the answer
    /// and when it came.
    pub fn request_in_flight(&self, path: &str) -> std::thread::JoinHandle<(std::io::Result<(u16, String)>, Instant)> {
        let addr = self.ports.inbound.addr();
        let path = path.to_owned();
        let request = std::thread::spawn(move || {
            let r = http_timeout("GET", addr, &path, Duration::from_secs(20));
            (r, Instant::now())
        });
        wait_inflight(&self.ports, 1);
        request
    }

    /// Sends SIGTERM; the instant returned is taken before it, so that
    /// whatever the agent times from the signal ends after it.
    pub fn sigterm(&self) -> Instant {
        let sent = Instant::now();
        self.agent.signal(libc::SIGTERM);
        sent
    }
}
