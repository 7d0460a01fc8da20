//! Starting `lifeguard run`: one builder, [`AgentBuilder`], for every way a
//! test starts the agent (beside an Envoy started on its own, against a
//! fake admin, or running Envoy as its child; with flags and environment;
//! inside a network namespace), and the running agent it gives, [`Agent`].
//!
//! ```ignore
//! // Beside an Envoy on `ports`, once its status port answers:
//! let agent = Agent::builder().on(&ports).args(&["--poll-interval", "200ms"]).start();
//! // Against a fake admin, on a status port of its own, once ready:
//! let agent = Agent::builder().admin_url(admin.url()).ready();
//! agent.signal(libc::SIGTERM);
//! wait_status(agent.status, "/healthz/ready", 503, Duration::from_secs(5));
//! ```

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::process::Command;
use std::time::Duration;

use super::bins::lifeguard_bin;
use super::clients::get;
use super::envoy::{envoy_command, Ports};
use super::netns::Netns;
use super::ports::{port, Port};
use super::procs::Proc;
use super::temp::temp_dir;
use super::wait::{wait_for, wait_status};

/// `lifeguard run` to be started: its status address, Envoy's admin URL,
/// flags, environment and the Envoy it runs as its child. Its command line
/// is `run --status-addr S [--admin-url U] [--ignore-listener-port P]
/// ARGS... [-- ENVOY...]`; its environment sets `LIFEGUARD_LOG=info`
/// (over any value given with [`env`](Self::env)).
pub struct AgentBuilder {
    program: Command,
    status: Option<SocketAddr>,
    admin_url: Option<String>,
    ignore_listener_port: Option<u16>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    envoy: Option<String>,
}

/// A running `lifeguard run`: its process (what it derefs to), killed on
/// drop, and its status address.
pub struct Agent {
    pub proc: Proc,
    /// The status port's address (`--status-addr`).
    pub status: SocketAddr,
    /// The status port's lease when the builder took one; released after
    /// the process is killed.
    _lease: Option<Port>,
}

impl Agent {
    pub fn builder() -> AgentBuilder {
        AgentBuilder {
            program: Command::new(lifeguard_bin()),
            status: None,
            admin_url: None,
            ignore_listener_port: None,
            args: Vec::new(),
            env: Vec::new(),
            envoy: None,
        }
    }
}

impl Deref for Agent {
    type Target = Proc;

    fn deref(&self) -> &Proc {
        &self.proc
    }
}

impl DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.proc
    }
}

impl AgentBuilder {
    /// On the ports of an Envoy + agent pair: the status port
    /// `ports.agent`, Envoy's admin at `ports.admin_url()`, and Envoy's
    /// status listener left out of the drain's count (it is not on 15021 in
    /// tests).
    pub fn on(mut self, ports: &Ports) -> AgentBuilder {
        self.status = Some(ports.agent.addr());
        self.admin_url = Some(ports.admin_url());
        self.ignore_listener_port = Some(ports.status_listener.port);
        self
    }

    /// The status address. Without one (nor [`on`](Self::on)), the agent
    /// gets a leased loopback port of its own.
    pub fn status(mut self, addr: SocketAddr) -> AgentBuilder {
        self.status = Some(addr);
        self
    }

    /// Envoy's admin API: `http://…` or `unix://…`.
    pub fn admin_url(mut self, url: impl Into<String>) -> AgentBuilder {
        self.admin_url = Some(url.into());
        self
    }

    /// More flags, after the ones above.
    pub fn args(mut self, args: &[&str]) -> AgentBuilder {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// The exit-on-zero policy (`--exit-on-zero-active-connections true`)
    /// with this minimum drain time, as more flags.
    pub fn exit_on_zero(self, minimum_drain_duration: &str) -> AgentBuilder {
        self.args(&[
            "--exit-on-zero-active-connections",
            "true",
            "--minimum-drain-duration",
            minimum_drain_duration,
        ])
    }

    /// One more environment variable.
    pub fn env(mut self, key: &str, value: &str) -> AgentBuilder {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Runs the real Envoy as lifeguard's child (`-- envoy ...`) with this
    /// bootstrap, written beside lifeguard's log.
    pub fn envoy(mut self, bootstrap_yaml: &str) -> AgentBuilder {
        self.envoy = Some(bootstrap_yaml.to_owned());
        self
    }

    /// Runs lifeguard inside the network namespace `ns`.
    pub fn netns(mut self, ns: &Netns) -> AgentBuilder {
        self.program = ns.command(lifeguard_bin());
        self
    }

    /// Starts lifeguard and returns at once.
    pub fn spawn(self) -> Agent {
        let (status, lease) = match self.status {
            Some(addr) => (addr, None),
            None => {
                let leased = port();
                (leased.addr(), Some(leased))
            }
        };
        let dir = temp_dir("agent");
        let mut cmd = self.program;
        cmd.args(["run", "--status-addr", &status.to_string()]);
        if let Some(url) = &self.admin_url {
            cmd.args(["--admin-url", url]);
        }
        if let Some(ignored) = self.ignore_listener_port {
            cmd.args(["--ignore-listener-port", &ignored.to_string()]);
        }
        cmd.args(&self.args);
        if let Some(bootstrap) = &self.envoy {
            cmd.arg("--").args(envoy_command(bootstrap, &dir));
        }
        cmd.envs(self.env);
        cmd.env("LIFEGUARD_LOG", "info");
        Agent {
            proc: Proc::spawn("lifeguard", cmd, dir),
            status,
            _lease: lease,
        }
    }

    /// Starts lifeguard and returns once its status port answers (within
    /// 10 s), ready or not: whether it is ready is the caller's to check.
    pub fn start(self) -> Agent {
        let agent = self.spawn();
        wait_for("the agent's status port", Duration::from_secs(10), || {
            get(agent.status, "/healthz/ready")
        });
        agent
    }

    /// [`start`](Self::start), then waits until it says ready (within
    /// 10 s more).
    pub fn ready(self) -> Agent {
        let agent = self.start();
        wait_status(agent.status, "/healthz/ready", 200, Duration::from_secs(10));
        agent
    }
}

/// Reads `pid=N` from the "Envoy started" log line of lifeguard.
pub fn envoy_pid(agent: &Proc) -> i32 {
    wait_for("Envoy's pid in lifeguard's log", Duration::from_secs(10), || {
        let out = agent.output();
        out.lines()
            .find(|l| l.contains("Envoy started"))
            .and_then(|l| l.split("pid=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|pid| pid.parse().ok())
            .ok_or(())
    })
}
