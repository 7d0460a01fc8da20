//! Faults, bad input and hostile clients: lifeguard keeps answering and
//! never says "ready" about an Envoy it cannot vouch for.
//!
//! A fake admin server stands in for Envoy only where a real Envoy will not
//! misbehave on demand (hang, garbage, truncation, huge bodies, 500s,
//! wrapped gauges, one slow read).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use lifeguard::status::connections::MAX_CONNECTIONS;

/// Exit-on-zero connections with a short minimum drain.
const EXIT_ON_ZERO: [&str; 4] = [
    "--exit-on-zero-active-connections",
    "true",
    "--minimum-drain-duration",
    "200ms",
];

/// How fast probes must be answered while a client misbehaves. A kubelet
/// gives up after 1 s (`timeoutSeconds`'s default): 99 % of them within
/// half of that, for a shared 2-core machine running debug builds, where a
/// probe or two may wait out the test thread's own descheduling. A probe
/// that waits on the misbehaving peer (queued behind it, or on the hung
/// admin's 300 ms timeout) is slow every time: the median tells it.
const P99_PROBE: Duration = Duration::from_millis(500);
const MEDIAN_PROBE: Duration = Duration::from_millis(150);

/// Probes `n` times on fresh connections (each within 2 s, or the test
/// fails); asserts the median and the 99th percentile of the answers'
/// times, and prints them with the slowest.
fn probe_many(addr: std::net::SocketAddr, n: usize, beside: &str) {
    let took = Latencies::new(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let (status, _) = http_timeout("GET", addr, "/healthz/ready", Duration::from_secs(2))
                    .expect("the probe was answered");
                assert!(status == 200 || status == 503, "{status}");
                t.elapsed()
            })
            .collect(),
    );
    let (median, p99) = (took.median(), took.p99());
    eprintln!("{beside}: {took}");
    assert!(median < MEDIAN_PROBE, "median {median:?} (bound {MEDIAN_PROBE:?})");
    assert!(p99 < P99_PROBE, "p99 {p99:?} (bound {P99_PROBE:?})");
}

#[test]
fn a_hung_admin_turns_readiness_503_within_the_read_timeout_and_probes_keep_answering() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--admin-timeout", "300ms", "--poll-interval", "200ms"])
        .ready();
    admin.set(AdminMode::Hang);
    let hung = Instant::now();
    let body = wait_status(agent.status, "/healthz/ready", 503, Duration::from_secs(3));
    eprintln!("hung admin -> 503 after {:?}", hung.elapsed());
    assert!(body.contains("did not answer within 300ms"), "{body}");
    // The poller is stuck on the hung admin again and again; probes are not.
    probe_many(agent.status, 300, "while the admin hangs");
    assert!(agent.is_running());
}

/// Before the first ready, the readiness stats read is matched against
/// every stat Envoy has: 2.9 s for an Envoy of 10,000 listeners on a busy
/// node. Each read that timed out is followed by one waiting twice as
/// long: the pod gets ready, and the 503 meanwhile names each timeout.
#[test]
fn a_readiness_stats_read_slower_than_the_admin_timeout_is_waited_for_longer() {
    let admin = FakeAdmin::start(AdminMode::Live);
    *admin.readiness_stats_takes.lock().unwrap() = Duration::from_millis(1200);
    let agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--admin-timeout", "500ms"])
        .start();
    let started = Instant::now();
    wait_for(
        "a 503 naming the first read's timeout",
        Duration::from_secs(5),
        || match get(agent.status, "/healthz/ready") {
            Ok((503, body)) if body.contains("did not answer within 500ms") => Ok(()),
            other => Err(other),
        },
    );
    wait_status(agent.status, "/healthz/ready", 200, Duration::from_secs(30));
    eprintln!(
        "ready after {:?} (reads cut at 0.5 s, 1 s, then waited 2 s)",
        started.elapsed()
    );
    let log = agent.output();
    assert!(
        log.contains("did not answer within 1s"),
        "the second read waited 1 s\n{log}"
    );
}

#[test]
fn broken_admin_answers_are_reasons_in_the_503_never_a_panic() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder()
        .admin_url(admin.url())
        .args(&["--admin-timeout", "500ms", "--poll-interval", "100ms"])
        .ready();
    for (mode, reason) in [
        (AdminMode::Garbage, "server.state missing"),
        (AdminMode::Truncated, "Envoy admin HTTP error"),
        (AdminMode::Huge, "larger than 1048576 bytes"),
        (AdminMode::Error500, "500 Internal Server Error"),
        (AdminMode::Wrapped, "impossible value 18446744073709551615"),
    ] {
        admin.set(AdminMode::Live);
        wait_status(agent.status, "/healthz/ready", 200, Duration::from_secs(5));
        admin.set(mode.clone());
        let body = wait_status(agent.status, "/healthz/ready", 503, Duration::from_secs(5));
        assert!(body.contains(reason), "{mode:?}: {body}");
        assert!(agent.is_running(), "{mode:?} killed the agent: {}", agent.output());
    }
    // The reason is in the log too, once per change.
    assert!(agent.output().contains("impossible value 18446744073709551615"));
}

#[test]
fn a_slow_read_during_an_exit_on_zero_drain_does_not_end_it_early() {
    let admin = FakeAdmin::start(AdminMode::Live);
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 1\n".into();
    // The policy's own reads (not the load balancers' verdict first).
    let mut agent = Agent::builder()
        .admin_url(admin.url())
        .args(&EXIT_ON_ZERO)
        .args(&["--admin-timeout", "300ms", "--termination-grace-period", "20s"])
        .args(&["--terminating-readiness", "failing"])
        .ready();
    *admin.slow_next_active.lock().unwrap() = Some(Duration::from_secs(1));
    agent.signal(libc::SIGTERM);
    // The slow read times out; one connection is still live: no exit.
    wait_for("the slow read to be used", Duration::from_secs(5), || {
        if admin.slow_next_active.lock().unwrap().is_none() {
            Ok(())
        } else {
            Err(())
        }
    });
    assert!(
        agent.wait_exit(Duration::from_millis(1500)).is_none(),
        "the drain ended with a live connection:\n{}",
        agent.output()
    );
    assert!(!admin.quit_called.load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        agent.output().contains("cannot read active counts; the drain goes on"),
        "{}",
        agent.output()
    );
    // The connection closes: the drain ends at zero.
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 0\n".into();
    let code = agent
        .wait_exit(Duration::from_secs(5))
        .expect("the drain ends at zero")
        .code();
    assert_eq!(code, Some(0), "{}", agent.output());
    assert!(
        admin.quit_called.load(std::sync::atomic::Ordering::Relaxed),
        "Envoy was not told to quit"
    );
}

/// An Envoy whose every count read takes longer than the admin timeout (a
/// `/stats` read is matched against every stat Envoy has: 10,000
/// listeners on a busy node): the read after one that timed out waits
/// twice as long and is answered, and the reads after it, the drain's and
/// the drain wait's, keep the time they need. Cut at the admin timeout
/// every time, the drain would never read a count and would wait to its
/// deadline; cut again after each answer, every other read would be lost.
#[test]
fn count_reads_slower_than_the_admin_timeout_are_waited_for_and_end_the_drain() {
    let admin = FakeAdmin::start(AdminMode::Live);
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 1\n".into();
    *admin.active_read_takes.lock().unwrap() = Duration::from_millis(550);
    let mut agent = Agent::builder()
        .admin_url(admin.url())
        .args(&EXIT_ON_ZERO)
        .args(&["--admin-timeout", "500ms", "--termination-grace-period", "60s"])
        .args(&["--terminating-readiness", "failing"])
        .ready();
    let signalled = Instant::now();
    agent.signal(libc::SIGTERM);
    wait_for("a count read answered", Duration::from_secs(10), || {
        match get(agent.status, "/drain") {
            Ok((200, b)) if b.contains("\"active_connections\":1") => Ok(()),
            other => Err(other),
        }
    });
    let counted = signalled.elapsed();
    // The next read comes 11 times the 550 ms this one took after it.
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 0\n".into();
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .expect("the drain ends at zero, long before its deadline");
    let exited = signalled.elapsed();
    let log = agent.output();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("within 500ms"), "the first read was cut\n{log}");
    assert!(log.contains("outcome=\"drained\""), "{log}");
    let reads: Vec<Duration> = admin
        .active_reads
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| r.checked_duration_since(signalled))
        .collect();
    eprintln!(
        "550 ms count reads against a 500 ms admin timeout: counted {counted:?} after SIGTERM, \
         exit {exited:?} after; reads at {reads:?}"
    );
    // One cut at 500 ms, one answered within 1 s, and the next (given the
    // 1 s again) answered zero. The drain wait's reads are these or come
    // paced like them, given the same time.
    assert_eq!(
        reads.len(),
        3,
        "a read after the first answer was cut: reads at {reads:?}\n{log}"
    );
}

#[test]
fn a_wrapped_gauge_in_the_drain_count_is_logged_not_counted_as_minus_one() {
    let admin = FakeAdmin::start(AdminMode::Live);
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 18446744073709551615\n\
         listener.[__1]_15006.downstream_cx_active: 0\n"
        .into();
    let mut agent = Agent::builder().admin_url(admin.url()).args(&EXIT_ON_ZERO).ready();
    agent.signal(libc::SIGTERM);
    let code = agent.wait_exit(Duration::from_secs(10)).expect("the drain ends").code();
    assert_eq!(code, Some(0), "{}", agent.output());
    assert!(
        agent
            .output()
            .contains("not counted: listener.127.0.0.1_15006.downstream_cx_active = 18446744073709551615"),
        "{}",
        agent.output()
    );
}

#[test]
fn an_external_envoy_that_vanishes_mid_drain_makes_lifeguard_exit_non_zero() {
    let mut admin = FakeAdmin::start(AdminMode::Live);
    *admin.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 3\n".into();
    let mut agent = Agent::builder().admin_url(admin.url()).args(&EXIT_ON_ZERO).ready();
    agent.signal(libc::SIGTERM);
    wait_for("the drain to read the count", Duration::from_secs(5), || {
        match get(agent.status, "/drain") {
            Ok((200, b)) if b.contains("\"active_connections\":3") => Ok(()),
            other => Err(other),
        }
    });
    admin.stop();
    let code = agent
        .wait_exit(Duration::from_secs(5))
        .expect("lifeguard notices")
        .code();
    assert_eq!(code, Some(4), "{}", agent.output());
    assert!(agent.output().contains("Envoy is gone"), "{}", agent.output());
}

#[test]
fn signals_during_the_pre_drain_delay_start_one_drain_and_one_exit() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder()
        .admin_url(admin.url())
        // A delay of 3 s, so that the signals below land in it on a busy
        // machine.
        .args(&["--drain-delay", "3s", "--termination-drain-duration", "200ms"])
        .ready();
    let sent = Instant::now();
    agent.signal(libc::SIGTERM);
    wait_for("the delay phase", Duration::from_secs(2), || {
        match get(agent.status, "/drain") {
            Ok((200, b)) if b.contains("\"phase\":\"delaying\"") => Ok(()),
            other => Err(other),
        }
    });
    assert_eq!(
        get(agent.status, "/healthz/ready").unwrap(),
        (
            503,
            "not ready: draining (the pod terminates: load balancers are answered 503; \
             the kubelet 200 while Envoy accepts new connections)\n"
                .into()
        )
    );
    agent.signal(libc::SIGTERM);
    agent.signal(libc::SIGINT);
    let code = agent.wait_exit(Duration::from_secs(10)).expect("one exit").code();
    assert_eq!(code, Some(0), "{}", agent.output());
    assert!(
        sent.elapsed() >= Duration::from_millis(3200),
        "the delay or the drain was cut short"
    );
    let out = agent.output();
    assert_eq!(out.matches("drain started").count(), 1, "{out}");
    assert_eq!(out.matches("signal received again").count(), 2, "{out}");
}

#[test]
fn a_slowloris_client_is_cut_off_and_does_not_slow_other_probes() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder().admin_url(admin.url()).ready();
    let addr = agent.status;
    let slow = thread::spawn(move || {
        // Taken before the connection: lifeguard's timer starts with it.
        let started = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let request = b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\nX-Slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'));
        let mut buf = [0u8; 256];
        for byte in request {
            if started.elapsed() > Duration::from_secs(15) {
                return None;
            }
            if s.write_all(&[*byte]).is_err() {
                return Some(started.elapsed());
            }
            match s.read(&mut buf) {
                Ok(0) => return Some(started.elapsed()),
                Ok(_) => return Some(started.elapsed()), // a 408, then close
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return Some(started.elapsed()),
            }
            thread::sleep(Duration::from_millis(150));
        }
        None
    });
    probe_many(addr, 200, "beside a slowloris client");
    let cut = slow.join().unwrap().expect("the slow client was never cut off");
    eprintln!("slowloris cut after {cut:?}");
    assert!(cut >= Duration::from_secs(4) && cut < Duration::from_secs(8), "{cut:?}");
}

#[test]
fn idle_connections_up_to_the_cap_are_held_without_slowing_probes() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder().admin_url(admin.url()).ready();
    // Up to the cap, with room left for the probes.
    let n = MAX_CONNECTIONS - 64;
    let idle: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(agent.status).unwrap()).collect();
    probe_many(agent.status, 200, &format!("beside {n} idle connections"));
    assert!(agent.is_running());
    drop(idle);
}

#[test]
fn connections_past_the_cap_are_closed_and_idle_ones_time_out() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder().admin_url(admin.url()).ready();
    // Hold every slot, then one more.
    let held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(agent.status).unwrap())
        .collect();
    wait_for("a connection past the cap to be closed", Duration::from_secs(5), || {
        let mut extra = TcpStream::connect(agent.status).map_err(|e| e.to_string())?;
        extra.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let _ = extra.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 64];
        match extra.read(&mut buf) {
            Ok(0) | Err(_) => Ok(()),
            Ok(_) => Err(format!("answered; agent log: {}", agent.output())),
        }
    });
    // Idle connections are closed by the header-read timeout (5s): the
    // probe path comes back without anyone closing them.
    wait_status(agent.status, "/healthz/ready", 200, Duration::from_secs(10));
    drop(held);
}

/// A client that sent more than its request (a pipelined request after
/// `Connection: close`, or a body the route does not read) still gets its
/// whole answer and an orderly close (FIN), never a reset.
#[test]
fn a_client_that_sends_more_than_its_request_gets_its_answer_and_no_reset() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder().admin_url(admin.url()).ready();
    let exchange = |bytes: &[u8]| -> (String, std::io::Result<usize>) {
        let mut s = TcpStream::connect(agent.status).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(bytes).unwrap();
        let mut out = Vec::new();
        let end = s.read_to_end(&mut out);
        (String::from_utf8_lossy(&out).to_string(), end)
    };
    let close = b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec();
    let mut pipelined = close.clone();
    pipelined.extend_from_slice(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut body =
        b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 65536\r\n\r\n".to_vec();
    body.extend(std::iter::repeat_n(b'b', 65536));
    for (what, bytes) in [("plain", close), ("pipelined", pipelined), ("an unread body", body)] {
        for _ in 0..20 {
            let (out, end) = exchange(&bytes);
            assert!(
                out.starts_with("HTTP/1.1 200") && out.ends_with("ready\n"),
                "{what}: {out}"
            );
            assert!(
                end.is_ok(),
                "{what}: the answer ended with {end:?}, not an orderly close"
            );
        }
    }
    assert!(agent.is_running());
}

#[test]
fn odd_requests_get_a_correct_answer_or_a_clean_error() {
    let admin = FakeAdmin::start(AdminMode::Live);
    let mut agent = Agent::builder().admin_url(admin.url()).ready();
    let raw = |bytes: &[u8]| -> String {
        let mut s = TcpStream::connect(agent.status).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).to_string()
    };
    // HTTP/1.0
    let out = raw(b"GET /healthz/ready HTTP/1.0\r\n\r\n");
    assert!(out.starts_with("HTTP/1.0 200") && out.ends_with("ready\n"), "{out}");
    // Pipelined: two answers, in order.
    let out = raw(
        b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let first = out.find("HTTP/1.1 200").expect(&out);
    let second = out.find("HTTP/1.1 404").expect(&out);
    assert!(first < second, "{out}");
    // A method nobody uses.
    assert!(raw(b"BREW /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 405"));
    // Huge headers: refused with 431, or the connection closed.
    let mut huge = b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1 << 20));
    huge.extend_from_slice(b"\r\n\r\n");
    let out = raw(&huge);
    assert!(
        out.is_empty() || out.starts_with("HTTP/1.1 431"),
        "{}",
        &out[..out.len().min(200)]
    );
    // HTTP/2 prior knowledge on an HTTP/1 port: a clean error or a close.
    let out = raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00");
    assert!(
        out.is_empty() || out.starts_with("HTTP/1.1 4") || out.starts_with("HTTP/1.1 5"),
        "{out}"
    );
    // Garbage.
    let out = raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n");
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 400"), "{out}");
    // Still serving.
    assert_eq!(get(agent.status, "/healthz/ready").unwrap(), (200, "ready\n".into()));
    assert!(agent.is_running());
}

#[test]
fn every_bad_value_stops_start_up_naming_the_field_and_value() {
    let dir = temp_dir("badcfg");
    let toml = dir.path().join("bad.toml");
    std::fs::write(&toml, "status_addr = \"127.0.0.1:15020\"\ndrain_dealy = \"1s\"\n").unwrap();
    let toml = toml.display().to_string();
    /// Flags, env, the field named, the value named.
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["--poll-interval=-1s"], vec![], "--poll-interval", "-1s"),
        (vec!["--admin-timeout", "soon"], vec![], "--admin-timeout", "soon"),
        (vec!["--status-addr", "localhost"], vec![], "--status-addr", "localhost"),
        (vec!["--status-addr", "127.0.0.1:0"], vec![], "--status-addr", "port 0"),
        (
            vec!["--admin-url", "http://127.0.0.1:0"],
            vec![],
            "--admin-url",
            "port 0",
        ),
        (
            vec!["--admin-url", "http://192.0.2.1:15000"],
            vec![],
            "--admin-url",
            "loopback",
        ),
        (
            vec![],
            vec![("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "maybe")],
            "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
            "maybe",
        ),
        (
            vec![],
            vec![("TERMINATION_DRAIN_DURATION", "5")],
            "TERMINATION_DRAIN_DURATION",
            "\"5\"",
        ),
        (vec!["--config", toml.as_str()], vec![], "drain_dealy", "unknown field"),
        (
            vec!["--ignore-listener-port", "70000"],
            vec![],
            "--ignore-listener-port",
            "70000",
        ),
        // Too large for a deadline: refused when parsed, not a panic later.
        (
            vec![],
            vec![("TERMINATION_GRACE_PERIOD", "18446744073709551615")],
            "TERMINATION_GRACE_PERIOD",
            "too large",
        ),
        (vec!["--log", "lifeguard=loud"], vec![], "--log", "lifeguard=loud"),
        (vec!["--config", "/dev/zero"], vec![], "/dev/zero", "not a regular file"),
        (
            vec!["--poll-interval", "1ns"],
            vec![],
            "--poll-interval",
            "at least 10ms",
        ),
        (
            vec![],
            vec![("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "yes")],
            "EXIT_ON_ZERO_ACTIVE_CONNECTIONS",
            "yes",
        ),
    ];
    let guard = port();
    let guard_addr = guard.addr().to_string();
    for (args, env, field, value) in cases {
        let mut cmd = Command::new(lifeguard_bin());
        cmd.arg("run").args(&args);
        // Should a case wrongly pass, the agent binds a reserved loopback port.
        if !args.contains(&"--status-addr") {
            cmd.args(["--status-addr", &guard_addr]);
        }
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut proc = Proc::spawn("lifeguard", cmd, temp_dir("badcfg"));
        let status = proc.wait_exit(Duration::from_secs(10));
        let err = proc.output();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains(field) && err.contains(value), "{args:?} {env:?}: {err}");
    }
}

#[test]
fn go_booleans_from_istio_pod_specs_are_accepted() {
    let forms = [
        (["1", "t", "T", "TRUE", "true", "True"], "connections"),
        (["0", "f", "F", "FALSE", "false", "False"], "app-exit"),
    ];
    for (values, policy) in forms {
        for value in values {
            let out = Command::new(lifeguard_bin())
                .arg("check")
                .env("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", value)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(0), "{value}: {text}");
            let line = text.lines().find(|l| l.starts_with("drain_until ")).unwrap_or("");
            assert!(line.contains(policy), "{value}: {text}");
        }
    }
}
