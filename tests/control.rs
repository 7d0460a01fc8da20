//! Who can drain or stop Envoy: the control socket (`--control-socket`),
//! loopback control turned off (`--loopback-control false`), and Envoy's
//! admin on a Unix socket that is missing, not a socket, or refusing; and
//! a control socket or a status port in the way, which stops start-up.
//! Against the real Envoy, through the binary.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn with_loopback_control_off_only_the_control_socket_drains_and_stops() {
    let dir = temp_dir("control");
    let socket = dir.path().join("control.sock");
    let socket_arg = socket.display().to_string();
    let mut pod = Pod::start(Agent::builder().args(&[
        "--control-socket",
        &socket_arg,
        "--loopback-control",
        "false",
        "--drain-until",
        "requests",
        "--minimum-drain-duration",
        "200ms",
    ]));
    let meta = std::fs::symlink_metadata(&socket).expect("the control socket exists");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the socket's mode");

    // Loopback callers (the app shares loopback): 403, naming the socket,
    // and nothing happens.
    for path in ["/drain", "/drain?nowait", "/quitquitquit"] {
        let (status, body) = http("POST", pod.ports.agent.addr(), path).unwrap();
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains(&socket_arg), "{path}: {body}");
    }
    assert_eq!(get(pod.ports.agent.addr(), "/healthz/ready").unwrap().0, 200);
    // GET /drain stays open to all; the probe, the scrape too.
    assert_eq!(get(pod.ports.agent.addr(), "/drain").unwrap().0, 200);

    // The proxy container's preStop hook goes through the socket.
    let (code, out) = run_lifeguard(&["drain", "--control-socket", &socket_arg, "--url", "http://127.0.0.1:1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"phase\":\"drained\""), "{out}");
    assert_eq!(get(pod.ports.agent.addr(), "/healthz/ready").unwrap().0, 503);
    // The same env variable as `run`.
    let out = Command::new(lifeguard_bin())
        .args(["drain", "--url", "http://127.0.0.1:1"])
        .env("LIFEGUARD_CONTROL_SOCKET", &socket_arg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // A stop through the socket; the socket file goes with lifeguard.
    let (status, body) = unix_post(&socket, "/quitquitquit").unwrap();
    assert_eq!((status, body.as_str()), (200, "OK\n"));
    assert_eq!(
        pod.agent.exit_code(Duration::from_secs(10)),
        0,
        "{}",
        pod.agent.output()
    );
    assert!(!socket.exists(), "the control socket was left behind");
}

#[test]
fn loopback_control_off_without_a_socket_or_a_socket_in_the_way_stops_start_up() {
    let (code, out) = run_lifeguard(&["check", "--loopback-control", "false"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--loopback-control") && out.contains("control_socket"),
        "{out}"
    );

    let dir = temp_dir("control");
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"x").unwrap();
    let ports = Ports::new();
    let status = ports.agent.addr().to_string();
    let path = file.display().to_string();
    let (code, out) = run_lifeguard(&["run", "--status-addr", &status, "--control-socket", &path]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("cannot bind the control socket") && out.contains("not a socket"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"x",
        "the file in the way was not touched"
    );
    let (code, out) = run_lifeguard(&["check", "--control-socket", "control.sock"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("absolute"), "{out}");
}

/// The status port is bound first: taken, it stops start-up before the
/// control socket is made and before Envoy is launched.
#[test]
fn a_status_port_in_use_stops_start_up_before_the_control_socket_and_envoy() {
    let taken = port();
    let _holder = bind_leased(&taken);
    let dir = temp_dir("port-in-use");
    let socket = dir.path().join("control.sock");
    let launched = dir.path().join("envoy-launched");
    let status = taken.addr().to_string();
    let touch = format!("touch {}", launched.display());
    let socket_arg = socket.display().to_string();
    let args = ["run", "--status-addr", &status, "--control-socket", &socket_arg];
    let envoy = ["--", "/bin/sh", "-c", &touch];
    let (code, out) = run_lifeguard(&[&args[..], &envoy[..]].concat());
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains(&format!("cannot bind the status address {status}")),
        "{out}"
    );
    assert!(!socket.exists(), "the control socket was made: {out}");
    assert!(!launched.exists(), "Envoy was launched: {out}");
}

#[test]
fn an_admin_socket_missing_not_a_socket_or_refusing_is_a_clear_503() {
    let dir = temp_dir("admin-socket");
    let missing = dir.path().join("missing.sock");
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"").unwrap();
    let refusing = dir.path().join("refusing.sock");
    drop(std::os::unix::net::UnixListener::bind(&refusing).unwrap());
    for (path, why) in [
        (&missing, "No such file or directory"),
        (&file, "Connection refused"),
        (&refusing, "Connection refused"),
    ] {
        let ports = Ports::new();
        let url = format!("unix://{}", path.display());
        let mut agent = Agent::builder().status(ports.agent.addr()).admin_url(&url).spawn();
        let want = format!("not ready: cannot connect to Envoy admin at {url}: {why}");
        let body = wait_for("the 503 reason", Duration::from_secs(5), || {
            match get(ports.agent.addr(), "/healthz/ready") {
                Ok((503, body)) if body.starts_with(&want) => Ok(body),
                other => Err(other),
            }
        });
        eprintln!("{}", body.trim());
        let logged = format!("Envoy is NOT ready reason=\"cannot connect to Envoy admin at {url}: {why}");
        assert!(agent.output().contains(&logged), "{}", agent.output());
        // As with a TCP admin that refuses: the drain cannot reach Envoy,
        // which is gone (exit 4), once SIGTERM comes.
        agent.signal(libc::SIGTERM);
        assert_eq!(agent.exit_code(Duration::from_secs(10)), 4, "{}", agent.output());
    }
}
