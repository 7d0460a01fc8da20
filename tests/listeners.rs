//! No size cap a real config reaches on the drain's
//! active-count read. A real Envoy with 10,000 listeners, each of which has
//! carried a connection once, answers that read with more than 1 MiB (the
//! old cap, which a config of some 6,000 listeners already passed, so the
//! read failed and exit-on-zero never fired). lifeguard must read it, see
//! the one connection held open, and exit as soon as it closes, long before
//! the deadline.
//!
//! The 10,000 listeners share one leased port, each on its own loopback
//! address (127.100.x.y: all of 127.0.0.0/8 is loopback on Linux), each
//! with the echo network filter: a connection to it stays open, idle, with
//! nothing behind it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use lifeguard::envoy::admin::ACTIVE_LIMIT;
use lifeguard::envoy::counts::{active, ACTIVE_STATS};

const LISTENERS: usize = 10_000;

/// The loopback address of generated listener `i`: 127.100.100.100 to
/// 127.100.166.249, every octet three digits (stat names of one length).
fn listener_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 100, (100 + i / 150) as u8, (100 + i % 150) as u8)
}

/// The kit's bootstrap (admin, status, prometheus and inbound listeners)
/// with `n` more listeners, each on `port` at its own loopback address.
fn bootstrap_with_listeners(ports: &Ports, port: u16, n: usize) -> String {
    let yaml = bootstrap(ports);
    let clusters = "\n  clusters:\n";
    assert_eq!(
        yaml.matches(clusters).count(),
        1,
        "the listeners list ends at `clusters:`"
    );
    let mut listeners = String::with_capacity(n * 300);
    for i in 0..n {
        listeners.push_str(&format!(
            "\n  - name: gen_{i}\n    address: {{ socket_address: {{ address: {}, port_value: {port} }} }}\n    filter_chains: [{{ filters: [{{ name: envoy.filters.network.echo, typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo }} }}] }}]\n",
            listener_ip(i)
        ));
    }
    yaml.replacen(clusters, &format!("{listeners}{clusters}"), 1)
}

/// The generated listeners' own `downstream_cx_active` lines (not the
/// per-worker ones) in an answer to the active-count read.
fn generated_lines(body: &str) -> usize {
    body.lines()
        .filter(|l| l.starts_with("listener.127.100.") && !l.contains(".worker_"))
        .count()
}

/// The test's own read of Envoy's admin: a 1.3 MiB answer from 10,000
/// listeners takes 0.3 to 1 s on an idle machine and more than 5 s (the
/// usual read's bound) beside a busy loop.
fn admin_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_timeout("GET", addr, path, Duration::from_secs(30))
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn exit_on_zero_fires_with_10000_listeners() {
    let test_start = Instant::now();
    let ports = Ports::new();
    let shared = port();
    let yaml = bootstrap_with_listeners(&ports, shared.port, LISTENERS);
    eprintln!("bootstrap: {LISTENERS} extra listeners, {} bytes", yaml.len());

    // A real Envoy with 10,000 listeners.
    let started = Instant::now();
    let mut envoy = start_envoy(&yaml);
    wait_for("Envoy LIVE with 10,000 listeners", Duration::from_secs(180), || {
        if !envoy.is_running() {
            panic!("Envoy exited during startup:\n{}", envoy.output());
        }
        match admin_get(ports.admin.addr(), "/ready") {
            Ok((200, body)) if body.trim() == "LIVE" => Ok(()),
            other => Err(other),
        }
    });
    let envoy_start = started.elapsed();
    eprintln!(
        "Envoy LIVE after {envoy_start:?}, RSS {} MiB",
        memory_kib(envoy.pid()).0 >> 10
    );

    // Every generated listener is up. An active gauge never moved is not
    // "used", so `usedonly` leaves it out: the read is small until each
    // listener has carried a connection, as in a config that serves.
    let (status, all) = admin_get(ports.admin.addr(), "/stats?filter=downstream_%28cx%7Crq%29_active%24").unwrap();
    assert_eq!(status, 200);
    assert_eq!(generated_lines(&all), LISTENERS, "listeners Envoy reports");
    let (_, before) = admin_get(ports.admin.addr(), ACTIVE_STATS).unwrap();
    eprintln!(
        "active-count read before any traffic: {} bytes ({} generated listeners)",
        before.len(),
        generated_lines(&before)
    );

    // One connection to each listener, opened and closed.
    let touched = Instant::now();
    for i in 0..LISTENERS {
        let addr = SocketAddr::from((listener_ip(i), shared.port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to listener {i} at {addr}: {e}"));
        drop(stream);
    }
    eprintln!(
        "one connection to each of {LISTENERS} listeners: {:?}",
        touched.elapsed()
    );

    // The premise, from Envoy itself: the drain's exact query answers more
    // than the old 1 MiB cap, and all of them are back to zero.
    let body = wait_for(
        "every listener's gauge in the read",
        Duration::from_secs(60),
        || match admin_get(ports.admin.addr(), ACTIVE_STATS) {
            Ok((200, body)) if generated_lines(&body) == LISTENERS && active(&body, &[]).connections == 0 => Ok(body),
            Ok((status, body)) => Err(format!(
                "{status}, {} bytes, {} generated lines, {} connections",
                body.len(),
                generated_lines(&body),
                active(&body, &[]).connections
            )),
            Err(e) => Err(e.to_string()),
        },
    );
    let read_at = Instant::now();
    admin_get(ports.admin.addr(), ACTIVE_STATS).unwrap();
    let read_time = read_at.elapsed();
    eprintln!(
        "active-count read ({ACTIVE_STATS}): {} bytes = {:.2} MiB, {} lines, {read_time:?} a read; \
         ACTIVE_LIMIT {} MiB; Envoy RSS {} MiB (peak {} MiB)",
        body.len(),
        body.len() as f64 / (1 << 20) as f64,
        body.lines().count(),
        ACTIVE_LIMIT >> 20,
        memory_kib(envoy.pid()).0 >> 10,
        memory_kib(envoy.pid()).1 >> 10,
    );
    assert!(body.len() > 1 << 20, "the read is not past 1 MiB: {} bytes", body.len());
    assert!(
        body.len() < ACTIVE_LIMIT,
        "the read is past ACTIVE_LIMIT: {} bytes",
        body.len()
    );

    // lifeguard against it, with a deadline far away (120 s - 2 s margin:
    // beside a busy loop, reads of 3 s paced 11 times that apart saw the
    // close only after a 60 s grace period's deadline).
    // The policy's own reads of the count from the drain's start: the
    // kubelet told 503 at once, so no wait for the load balancers' verdict
    // comes first (its reads of 10,000 listeners' request counters are
    // paced like these: an idle machine saw quiet 7.5 s after the checker
    // was done). The admin timeout is the default 1 s: beside a busy loop,
    // each read took about 3 s, and the reads after one that timed out wait
    // longer (cut at 1 s every time, the drain never counted).
    let mut agent = Agent::builder()
        .on(&ports)
        .exit_on_zero("500ms")
        .args(&[
            "--termination-grace-period",
            "120s",
            "--terminating-readiness",
            "failing",
        ])
        .start();
    wait_status(ports.agent.addr(), "/healthz/ready", 200, Duration::from_secs(30));

    // One idle connection held open to the last listener, echoed once so
    // Envoy has surely accepted it.
    let held_addr = SocketAddr::from((listener_ip(LISTENERS - 1), shared.port));
    let mut held = TcpStream::connect_timeout(&held_addr, Duration::from_secs(5)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    held.write_all(b"ping\n").unwrap();
    let mut echoed = [0u8; 5];
    held.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"ping\n");
    let held_stat = format!(
        "listener.{}_{}.downstream_cx_active: 1",
        listener_ip(LISTENERS - 1),
        shared.port
    );
    wait_for(
        "Envoy to count the held connection",
        Duration::from_secs(60),
        || match admin_get(ports.admin.addr(), ACTIVE_STATS) {
            Ok((200, body)) if body.lines().any(|l| l == held_stat) => Ok(()),
            other => Err(other.map(|(s, b)| (s, b.len()))),
        },
    );

    // SIGTERM: the drain reads the count (1), not an error.
    agent.signal(libc::SIGTERM);
    let sent = Instant::now();
    let drain = wait_for(
        "the drain to count the held connection",
        Duration::from_secs(100),
        || {
            let (status, body) = get(ports.agent.addr(), "/drain").map_err(|e| e.to_string())?;
            let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| format!("{status} {body}: {e}"))?;
            if status == 200 && json["phase"] == "draining" && json["active_connections"] == 1 {
                Ok(json)
            } else {
                Err(body)
            }
        },
    );
    eprintln!("SIGTERM -> /drain counts the held connection: {:?}", sent.elapsed());
    assert!(drain["last_read_error"].is_null(), "{drain}");
    assert_eq!(drain["policy"], "connections", "{drain}");

    // Held open well past the minimum drain duration: lifeguard waits.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(sent.elapsed()));
    assert!(
        agent.is_running(),
        "lifeguard exited with a connection open:\n{}",
        agent.output()
    );
    let (_, body) = get(ports.agent.addr(), "/drain").unwrap();
    let drain: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(drain["active_connections"], 1, "{drain}");
    assert!(drain["last_read_error"].is_null(), "{drain}");

    // Close it: exit-on-zero fires, long before the 118 s deadline.
    drop(held);
    let closed = Instant::now();
    let exit = agent
        .wait_exit(Duration::from_secs(90))
        .unwrap_or_else(|| panic!("lifeguard did not exit within 90 s of the close:\n{}", agent.output()));
    let after_close = closed.elapsed();
    let after_sigterm = sent.elapsed();
    eprintln!(
        "connection closed -> lifeguard exited {exit}: {after_close:?} (SIGTERM -> exit {after_sigterm:?}; deadline 118 s)"
    );
    assert_eq!(exit.code(), Some(0), "{}", agent.output());
    // The drain starts each read PACE (11) times the last one's cost after
    // it, and a read of this size takes 0.3 to 1 s on an idle 2-core
    // machine, more beside a busy loop (at most the 3 s admin timeout). So
    // the close is seen within two reads' paces (21.6 s seen with a read
    // timing out after the close, the suite beside, at a 1 s timeout), and
    // the exit comes before the 118 s deadline a drain that cannot read
    // would wait for, with room for lifeguard's own exit.
    let pace = lifeguard_drain::PACE * Duration::from_secs(3);
    assert!(
        after_close < 2 * pace + Duration::from_secs(4),
        "exit-on-zero was slow: {after_close:?}"
    );
    assert!(
        after_sigterm < Duration::from_secs(115),
        "held towards the deadline: {after_sigterm:?}"
    );
    let out = agent.output();
    assert!(out.contains("zero active connections"), "{out}");

    // lifeguard stopped the external Envoy through its admin API.
    assert!(
        envoy.wait_exit(Duration::from_secs(10)).is_some(),
        "Envoy still runs after lifeguard exited"
    );
    eprintln!("test wall time: {:?}", test_start.elapsed());
}
