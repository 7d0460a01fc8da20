//! Envoy under test: the ports of one Envoy + agent pair ([`Ports`]), the
//! shipped bootstrap remapped onto them, Envoy's command line, starting
//! Envoy on its own (lifeguard then runs beside it), and what its admin
//! says.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::bins::envoy_bin;
use super::clients::{get, unix_get};
use super::ports::{port, Port};
use super::procs::Proc;
use super::temp::{temp_dir, TempDir};
use super::wait::wait_for;

/// The ports of one Envoy + lifeguard pair, all reserved for the test.
pub struct Ports {
    pub admin: Port,
    pub status_listener: Port,
    pub agent: Port,
    pub inbound: Port,
    pub app: Port,
    pub prometheus: Port,
    /// Envoy's admin on a Unix socket instead of `admin`, when the run asks
    /// for it (see `admin_over_unix`); the directory it lives in.
    pub admin_socket: Option<(PathBuf, TempDir)>,
}

/// Whether this test run puts Envoy's admin on a Unix socket:
/// `LIFEGUARD_TEST_ADMIN=unix`. `scripts/test` runs the readiness, drain,
/// metrics and outcome tests once more that way, so every one of them
/// covers both transports without being written twice.
fn admin_over_unix() -> bool {
    std::env::var("LIFEGUARD_TEST_ADMIN").is_ok_and(|v| v == "unix")
}

impl Ports {
    /// The ports, Envoy's admin on a Unix socket when the run asks for it
    /// (`LIFEGUARD_TEST_ADMIN=unix`).
    pub fn new() -> Ports {
        Ports::with_admin_socket(admin_over_unix())
    }

    /// The ports, Envoy's admin on a Unix socket or not, whatever the run
    /// asks for (a benchmark compares the two).
    pub fn with_admin_socket(unix: bool) -> Ports {
        let admin_socket = unix.then(|| {
            let dir = temp_dir("admin");
            (dir.path().join("admin.sock"), dir)
        });
        Ports {
            admin: port(),
            status_listener: port(),
            agent: port(),
            inbound: port(),
            app: port(),
            prometheus: port(),
            admin_socket,
        }
    }

    /// The admin URL lifeguard is given: `http://127.0.0.1:PORT`, or
    /// `unix:///…/admin.sock`.
    pub fn admin_url(&self) -> String {
        match &self.admin_socket {
            Some((path, _)) => format!("unix://{}", path.display()),
            None => format!("http://127.0.0.1:{}", self.admin.port),
        }
    }

    /// `GET path` on Envoy's admin, over whichever transport it listens on.
    pub fn admin_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        match &self.admin_socket {
            Some((socket, _)) => unix_get(socket, path),
            None => get(self.admin.addr(), path),
        }
    }
}

/// config/envoy-bootstrap.yaml with its ports remapped to `ports` and its
/// listeners on 127.0.0.1 instead of 0.0.0.0.
pub fn bootstrap(ports: &Ports) -> String {
    let path = super::bins::root().join("config/envoy-bootstrap.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = text.replace("0.0.0.0", "127.0.0.1");
    if let Some((socket, _)) = &ports.admin_socket {
        out = admin_on_pipe(&out, socket);
    }
    for (from, to) in [
        (15000, &ports.admin),
        (15021, &ports.status_listener),
        (15020, &ports.agent),
        (15006, &ports.inbound),
        (8080, &ports.app),
        (15090, &ports.prometheus),
    ] {
        let needle = format!("port_value: {from} ");
        if from == 15000 && ports.admin_socket.is_some() {
            continue;
        }
        assert!(out.contains(&needle), "bootstrap has no {needle:?}");
        out = out.replace(&needle, &format!("port_value: {} ", to.port));
    }
    out
}

/// `bootstrap` (the shipped one, its addresses on 127.0.0.1) with Envoy's
/// admin on the Unix socket `socket` instead of 127.0.0.1:15000: the admin
/// listener and the cluster that routes the 15090 listener to it.
pub fn admin_on_pipe(bootstrap: &str, socket: &Path) -> String {
    let tcp = "socket_address: { address: 127.0.0.1, port_value: 15000 }";
    assert_eq!(bootstrap.matches(tcp).count(), 2, "the bootstrap's admin address moved");
    bootstrap.replace(tcp, &format!("pipe: {{ path: {} }}", socket.display()))
}

/// The Envoy command line for `lifeguard run -- ...`, with the bootstrap
/// written into `dir`.
pub fn envoy_command(bootstrap_yaml: &str, dir: &TempDir) -> Vec<String> {
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, bootstrap_yaml).unwrap();
    vec![
        envoy_bin().display().to_string(),
        "-c".into(),
        config.display().to_string(),
        "--disable-hot-restart".into(),
        "-l".into(),
        "warning".into(),
        "--concurrency".into(),
        "1".into(),
    ]
}

/// Starts the real Envoy with the given bootstrap.
pub fn start_envoy(bootstrap_yaml: &str) -> Proc {
    let dir = temp_dir("envoy");
    let envoy = envoy_command(bootstrap_yaml, &dir);
    let mut cmd = Command::new(&envoy[0]);
    cmd.args(&envoy[1..]);
    Proc::spawn("envoy", cmd, dir)
}

/// Waits until the Envoy of `ports` counts `n` active requests on its
/// inbound listener.
pub fn wait_inflight(ports: &Ports, n: u64) {
    let want = format!("http.inbound_http.downstream_rq_active: {n}");
    wait_for("the request to reach Envoy", Duration::from_secs(10), || {
        match ports.admin_get("/stats?filter=inbound_http.downstream_rq_active") {
            Ok((200, body)) if body.contains(&want) => Ok(()),
            other => Err(other),
        }
    });
}
