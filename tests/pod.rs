//! "Drain until the app is done", in a pod built from the
//! kernel's own pieces (see `common/pod.rs`): the real Envoy and lifeguard
//! in the pod's network namespace, the app in a cgroup of its own, clients
//! and the peer service in another namespace across a veth pair, and the
//! kubelet's SIGTERM to the app and to lifeguard at one instant.
//!
//! What a user would check: every request and call succeeds, Envoy stops
//! soon after the app is gone (the figure is printed), hooks and idle
//! connections do not hold the pod, and the deadline counts from the first
//! sign of termination. Needs root (namespaces, cgroups).

use std::time::{Duration, Instant};

use common::{http, idle_keepalive_connection, pod, wait_for, wait_status};
use pod::*;
use serde_json::Value;

/// Generous bounds for timings on a shared 2-core machine; the figures the
/// tests print are the measurement (tens of milliseconds). The drain spaces
/// its reads by ten times the last read's duration, so one read slowed by
/// CPU contention (80 ms seen with two pods running at once) delays the
/// stop by up to ten times that; and Envoy's own exit after its SIGTERM
/// has taken 3.5 s on a busy machine. Below every wrong answer these tests
/// tell apart: a 5 s minimum, a 20 s grace period.
const PROMPT: Duration = Duration::from_secs(4);

fn s(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

/// `calls N ok M failed` from the app's output.
fn calls(out: &str) -> (u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("calls "))
        .unwrap_or_else(|| panic!("the app did not report its calls:\n{out}"));
    let words: Vec<&str> = line.split(' ').collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

/// The scenario of tests 1 and 2: a request in flight at SIGTERM, then two
/// seconds of outbound calls, with the default policy.
fn app_finishes_then_calls_out(shared_pids: bool, mode: AppMode, idle_client: bool) -> Vec<Value> {
    let mut pod = TestPod::start(&PodSpec::new(
        shared_pids,
        &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(mode, 2.0, "");
    let idle = idle_client.then(|| {
        let addr = pod.net.pod_addr(INBOUND);
        pod.net.peer.run(move || idle_keepalive_connection(addr, "/work/0"))
    });
    let inflight = pod.request("/work/1");
    pod.wait_app_says("inbound /work/1");
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(20));

    let sigterm = pod.kubelet_sigterm();
    let (answer, _) = inflight.join().unwrap();
    assert_eq!(
        answer.unwrap(),
        (200, "done\n".to_owned()),
        "the request in flight at SIGTERM"
    );
    let app_gone = app_exit.wait().expect("the app exits");
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let seen = watch.finish();

    let app_status = pod.app.as_mut().unwrap().wait_exit(Duration::from_secs(5));
    let out = pod.app_output();
    let (ok, failed) = calls(&out);
    assert_eq!(failed, 0, "outbound calls failed:\n{out}");
    assert!(ok >= 10, "only {ok} outbound calls in 2s:\n{out}");
    assert_eq!(app_status.and_then(|s| s.code()), Some(0), "{out}");
    // With a shared process namespace Envoy outlives the app's process.
    // Without one the app's sockets are the only signal: Envoy may stop
    // while the process is still tearing down after its last close (every
    // call has been answered by then, as checked above).
    if shared_pids {
        assert!(
            envoy_gone > app_gone,
            "Envoy was stopped {:?} before the app exited",
            app_gone - envoy_gone
        );
    }
    let lag = if envoy_gone >= app_gone {
        format!("{:?}", envoy_gone - app_gone)
    } else {
        format!("-{:?}", app_gone - envoy_gone)
    };
    eprintln!(
        "app-exit ({mode:?}, shared pids {shared_pids}, idle client {idle_client}): SIGTERM -> app exit {:?}, \
         app exit -> Envoy stopped {lag}; {ok} outbound calls, all answered",
        app_gone - sigterm
    );
    assert!(
        envoy_gone.saturating_duration_since(app_gone) < PROMPT,
        "Envoy stopped {lag} after the app exited"
    );
    assert_eq!(code, 0, "{}", pod.agent.output());
    if let Some(stream) = idle {
        // The idle client was still connected when Envoy stopped: it did
        // not hold the pod, and it was no app socket.
        assert!(
            seen.iter().any(|v| v["active_connections"].as_u64() >= Some(1)),
            "{seen:#?}"
        );
        drop(stream);
    }
    seen
}

/// The app finishes its last request, which calls out through Envoy, and
/// exits: the drain waits on that outbound call, then stops Envoy.
#[test]
fn app_exit_lets_the_app_finish_its_request_and_its_outbound_calls() {
    let seen = app_finishes_then_calls_out(false, AppMode::Pooled, false);
    // The drain waited on the app's outbound connection through Envoy.
    assert!(
        seen.iter().any(|v| s(v, "waiting_on").contains("-> 127.0.0.1:15001")),
        "{seen:#?}"
    );
}

/// An idle keep-alive client of the app does not hold the drain: the
/// app exits, and Envoy stops.
#[test]
fn app_exit_is_not_held_by_an_idle_keepalive_client() {
    app_finishes_then_calls_out(false, AppMode::Pooled, true);
}

/// Between two calls the app holds no socket at all;
/// with a shared process namespace its process still holds the drain.
#[test]
fn app_exit_with_a_shared_process_namespace_waits_for_an_app_between_calls() {
    let seen = app_finishes_then_calls_out(true, AppMode::Fresh, false);
    assert!(
        seen.iter().any(|v| s(v, "phase") == "draining"
            && v["app_sockets"] == 0
            && v["app_processes"] == 1
            && v["active_requests"] == 0),
        "the drain never waited on the app's process alone: {seen:#?}"
    );
}

/// `wait-app-exit` (which starts the drain) and
/// `lifeguard drain` (connected to the agent until drained) run as hooks of
/// the proxy container; neither holds the drain: it ends when the app is
/// gone.
#[test]
fn hooks_connected_to_the_agent_do_not_hold_the_drain() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 0.5, "");
    let mut wait_hook = pod.hook("wait-app-exit", &["wait-app-exit", "--period", "100ms"]);
    let status = pod.net.pod_addr(AGENT);
    pod.net
        .peer
        .run(move || wait_status(status, "/healthz/ready", 503, Duration::from_secs(5)));
    let mut drain_hook = pod.hook("drain", &["drain"]);
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(20));
    // The drain waits on the app, and on nothing of the hooks'.
    wait_for("the drain to wait on the app", Duration::from_secs(10), || {
        let seen = watch.seen();
        match seen.last() {
            Some(v) if s(v, "waiting_on").contains("8080 listening") => Ok(()),
            other => Err(other.cloned()),
        }
    });
    let (drain_exit, wait_exit) = (
        ExitWatch::new(drain_hook.pid(), Duration::from_secs(30)),
        ExitWatch::new(wait_hook.pid(), Duration::from_secs(30)),
    );
    assert!(!drain_exit.has_exited() && !wait_exit.has_exited());
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    signal(app, libc::SIGTERM);
    let app_gone = app_exit.wait().expect("the app exits");
    let drained = drain_exit.wait().expect("lifeguard drain returns");
    let waited = wait_exit.wait().expect("wait-app-exit returns");
    eprintln!(
        "hooks: app exit -> `lifeguard drain` returned {:?}, -> `wait-app-exit` returned {:?}",
        drained.saturating_duration_since(app_gone),
        waited.saturating_duration_since(app_gone)
    );
    assert!(drained.saturating_duration_since(app_gone) < PROMPT);
    assert!(waited.saturating_duration_since(app_gone) < PROMPT);
    let drain_code = drain_hook.wait_exit(Duration::from_secs(5)).and_then(|s| s.code());
    assert_eq!(drain_code, Some(0), "{}", drain_hook.output());
    assert!(
        drain_hook.output().contains("\"phase\":\"drained\""),
        "{}",
        drain_hook.output()
    );
    let wait_code = wait_hook.wait_exit(Duration::from_secs(5)).and_then(|s| s.code());
    assert_eq!(wait_code, Some(0), "{}", wait_hook.output());
    assert!(
        wait_hook.output().contains("the app holds no socket and no process"),
        "{}",
        wait_hook.output()
    );
    // The kubelet's SIGTERM once the hooks returned stops Envoy at once.
    let sigterm = pod.kubelet_sigterm();
    pod.agent.assert_exit(Duration::from_secs(5), 0);
    eprintln!(
        "hooks: SIGTERM after the hooks -> lifeguard exited {:?}",
        sigterm.elapsed()
    );
    let seen = watch.finish();
    for v in &seen {
        let on = s(v, "waiting_on");
        assert!(
            !on.contains(":15020") && !on.contains("lifeguard"),
            "a hook was counted: {on}"
        );
    }
}

/// A process named `envoy` that is not Envoy is the
/// app's, for the drain and for `wait-app-exit` alike.
#[test]
fn a_listener_of_a_process_named_envoy_that_is_not_envoy_is_the_apps() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Stubborn, 0.0, "envoy");
    let comm = std::fs::read_to_string(format!("/proc/{app}/comm")).unwrap();
    assert_eq!(comm.trim(), "envoy");
    let mut hook = pod.hook("wait-app-exit", &["wait-app-exit", "--period", "100ms"]);
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(20));
    pod.kubelet_sigterm(); // the stubborn app ignores it
    let held = wait_for(
        "the drain to wait on the fake envoy",
        Duration::from_secs(10),
        || match watch.seen().last() {
            Some(v) if v["stop_requested"] == true && s(v, "waiting_on").contains("127.0.0.1:8080 listening") => {
                Ok(v.clone())
            }
            other => Err(other.cloned()),
        },
    );
    assert_eq!(held["app_sockets"], 1, "{held}");
    assert_eq!(held["app_processes"], 1, "{held}");
    let in_pod = ns_pid(app);
    assert!(
        s(&held, "waiting_on").contains(&format!("envoy pid {in_pod}")),
        "{held}"
    );
    wait_for("wait-app-exit to name it", Duration::from_secs(5), || {
        let out = hook.output();
        if out.contains("127.0.0.1:8080 listening") {
            Ok(())
        } else {
            Err(out)
        }
    });
    assert!(hook.is_running() && !envoy_exit.has_exited());
    // Past the minimum drain, so the figure below is the reaction alone.
    let minimum_over = held["started_at"].as_f64().unwrap() + 0.5;
    wait_for("the minimum drain to pass", Duration::from_secs(5), || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        if now.as_secs_f64() >= minimum_over {
            Ok(())
        } else {
            Err(now)
        }
    });
    assert!(
        !envoy_exit.has_exited(),
        "Envoy was stopped while the fake envoy listened"
    );

    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    signal(app, libc::SIGKILL);
    let app_gone = app_exit.wait().unwrap();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped once the fake envoy is gone");
    assert!(envoy_gone > app_gone);
    eprintln!("fake envoy killed -> real Envoy stopped {:?}", envoy_gone - app_gone);
    pod.agent.assert_exit(Duration::from_secs(5), 0);
    let code = hook.wait_exit(Duration::from_secs(5)).and_then(|s| s.code());
    assert_eq!(code, Some(0), "{}", hook.output());
}

/// An internal listener's connections are Envoy's own
/// plumbing; a pooled connection into one does not hold the drain.
#[test]
fn a_pooled_connection_into_an_internal_listener_does_not_hold_the_drain() {
    let mut spec = PodSpec::new(
        false,
        &[
            "--minimum-drain-duration",
            "500ms",
            "--termination-grace-period",
            "10s",
            "--shutdown-margin",
            "1s",
        ],
    );
    spec.internal_listener = true;
    let mut pod = TestPod::start(&spec);
    // A call from inside the pod through the internal listener; the client
    // closes, Envoy keeps its upstream connection into `inner` pooled.
    let answer = pod.net.pod.run(|| {
        let outbound = std::net::SocketAddr::from(([127, 0, 0, 1], OUTBOUND));
        http("GET", outbound, "/via-inner/x")
    });
    assert_eq!(answer.unwrap(), (200, "peer\n".to_owned()));
    let stats = pod.admin_get("/stats?filter=envoy_internal_inner.downstream_cx_active$");
    assert!(
        stats.contains("listener.envoy_internal_inner.downstream_cx_active: 1"),
        "no pooled connection into the internal listener: {stats}"
    );
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(20));
    let sigterm = pod.kubelet_sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(15));
    let took = sigterm.elapsed();
    eprintln!("internal listener with a pooled connection: SIGTERM -> lifeguard exited {took:?} (deadline 9s)");
    assert_eq!(code, 0, "{}", pod.agent.output());
    assert!(
        took < Duration::from_secs(3),
        "held by the internal connection: {took:?}"
    );
    let seen = watch.finish();
    assert!(
        seen.iter().all(|v| v["active_connections"].as_u64() <= Some(0)),
        "{seen:#?}"
    );
}

/// The fixed policy stops Envoy with a request in
/// flight, exits 3 and says how many it cut: in its log, and in `GET
/// /drain` while it lingers after the stop (a record that stays, not the
/// moment Envoy takes to exit).
#[test]
fn the_fixed_policy_cutting_a_request_exits_3_with_left_at_stop() {
    let mut pod = TestPod::start(&PodSpec::new(
        false,
        &[
            "--drain-until",
            "time",
            "--termination-drain-duration",
            "1s",
            "--linger",
            "5s",
        ],
    ));
    pod.start_app(AppMode::Pooled, 0.2, "");
    let inflight = pod.request("/work/3");
    pod.wait_app_says("inbound /work/3");
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    pod.kubelet_sigterm();
    envoy_exit.wait().expect("Envoy is stopped");
    let agent = pod.net.pod_addr(AGENT);
    // lifeguard publishes "stopped" once it has reaped Envoy, a moment
    // after Envoy's exit: the record that stays is the lingering status.
    let lingering: Value = wait_for("GET /drain to say stopped", Duration::from_secs(10), || {
        let (status, body) = pod
            .net
            .peer
            .run(move || http("GET", agent, "/drain"))
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        match (status, s(&v, "phase").as_str()) {
            (200, "stopped") => Ok(v),
            _ => Err(body),
        }
    });
    eprintln!(
        "fixed policy: GET /drain while lingering: phase {}, left_at_stop {}",
        lingering["phase"], lingering["left_at_stop"]
    );
    assert_eq!(s(&lingering, "phase"), "stopped", "{lingering}");
    assert_eq!(lingering["left_at_stop"], 1, "{lingering}");
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let (answer, _) = inflight.join().unwrap();
    assert!(!matches!(answer, Ok((200, _))), "the 3s request survived a 1s drain");
    assert_eq!(code, 3, "{}", pod.agent.output());
    assert!(pod.agent.output().contains("left_at_stop=1"), "{}", pod.agent.output());
}

/// `wait-app-exit` at t0 tells the agent termination
/// began; SIGTERM comes 2 s later. With a 6 s grace period and a 1 s
/// margin, Envoy is stopped at t0 + 5 s, not SIGTERM + 5 s, and lifeguard
/// exits 3: the app still held its listener.
#[test]
fn the_deadline_counts_from_the_hook_not_from_sigterm() {
    let mut pod = TestPod::start(&PodSpec::new(
        false,
        &[
            "--termination-grace-period",
            "6s",
            "--shutdown-margin",
            "1s",
            "--minimum-drain-duration",
            "500ms",
        ],
    ));
    pod.start_app(AppMode::Stubborn, 0.0, "");
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let t0 = Instant::now();
    let hook = pod.hook("wait-app-exit", &["wait-app-exit", "--period", "100ms"]);
    let status = pod.net.pod_addr(AGENT);
    pod.net
        .peer
        .run(move || wait_status(status, "/healthz/ready", 503, Duration::from_secs(5)));
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(50));
    let at = |secs: u64| {
        wait_for(&format!("t0 + {secs}s"), Duration::from_secs(10), || {
            if t0.elapsed() >= Duration::from_secs(secs) {
                Ok(())
            } else {
                Err(t0.elapsed())
            }
        })
    };
    at(2);
    pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let stopped_at = envoy_gone - t0;
    eprintln!("hook at t0, SIGTERM at t0+2s, grace 6s, margin 1s: Envoy stopped at t0+{stopped_at:?}");
    let code = pod.agent.exit_code(Duration::from_secs(5));
    at(6);
    pod.kubelet_sigkill();
    let seen = watch.finish();
    assert!(
        stopped_at >= Duration::from_secs(5) && stopped_at < Duration::from_millis(6500),
        "Envoy stopped at t0+{stopped_at:?}, not t0+5s"
    );
    assert_eq!(code, 3, "{}", pod.agent.output());
    let last = seen.last().expect("GET /drain answered");
    let window = last["deadline"].as_f64().unwrap() - last["started_at"].as_f64().unwrap();
    assert!((window - 5.0).abs() < 0.01, "{last}");
    // The hook's drain is the pod's termination.
    assert_eq!(s(last, "trigger"), "preStop hook", "{last}");
    // What Envoy was stopped with, from the exit summary (a record that
    // stays, not the moment Envoy takes to exit).
    let last_line = summary(&pod.agent.output());
    let left: u64 = last_line
        .split("left_at_stop=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no left_at_stop in {last_line}"));
    assert!(left >= 1, "{last_line}");
    assert!(hook.output().contains("127.0.0.1:8080 listening"), "{}", hook.output());
}

/// The summary line lifeguard logs last, as its fields (`key=value`).
fn summary(agent_output: &str) -> String {
    agent_output
        .lines()
        .rev()
        .find(|l| l.contains("lifeguard exiting"))
        .unwrap_or_else(|| panic!("no summary line:\n{agent_output}"))
        .to_owned()
}

/// The fixed policy's time runs out with a request in
/// flight, but the app finishes it and exits before the kubelet's SIGTERM
/// reaches lifeguard (its preStop hook returned only then): Envoy stops
/// with nothing in flight, and the outcome says so.
#[test]
fn the_outcome_is_read_at_the_stop_not_when_the_drain_time_ran_out() {
    let mut pod = TestPod::start(&PodSpec::new(
        false,
        &["--drain-until", "time", "--termination-drain-duration", "1s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 0.0, "");
    let inflight = pod.request("/work/3");
    pod.wait_app_says("inbound /work/3");
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(50));
    let t0 = Instant::now();
    let hook = pod.hook("wait-app-exit", &["wait-app-exit", "--period", "100ms"]);
    signal(app, libc::SIGTERM);
    let hook_exit = ExitWatch::new(hook.pid(), Duration::from_secs(30));
    let returned = hook_exit.wait().expect("wait-app-exit returns once the app is gone");
    let sigterm = pod.kubelet_sigterm();
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let seen = watch.finish();
    let (answer, _) = inflight.join().unwrap();
    assert_eq!(answer.unwrap(), (200, "done\n".to_owned()), "the request in flight");
    // The time ran out with the request still in flight...
    assert!(
        seen.iter()
            .any(|v| s(v, "phase") == "drained" && v["active_requests"] == 1),
        "{seen:#?}"
    );
    // ... and Envoy was stopped after the app had answered it.
    let out = pod.agent.output();
    let last = summary(&out);
    eprintln!(
        "hook at t0, drain time 1s, app done at t0+{:?}, SIGTERM at t0+{:?}: {last}",
        returned - t0,
        sigterm - t0
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        last.contains("outcome=\"drained\"") && last.contains("left_at_stop=0"),
        "{last}"
    );
    assert!(
        last.contains("trigger=\"preStop hook\"") && last.contains("stop_signal=\"SIGTERM\""),
        "{last}"
    );
}

/// The proxy's preStop hook `wait-app-exit` told a wrong address for
/// lifeguard (nothing listens on 127.0.0.1:15999): it cannot start the
/// drain, and waits for the app on its own.
fn hook_without_the_agent(pod: &TestPod) -> common::Proc {
    let args = [
        "wait-app-exit",
        "--period",
        "100ms",
        "--agent-url",
        "http://127.0.0.1:15999",
    ];
    pod.hook("wait-app-exit", &args)
}

/// `wait-app-exit` that cannot reach the agent (a wrong
/// `--agent-url`) still knows the proxy: lifeguard's processes in its own
/// container and their descendants. Their listeners are never the app's,
/// and the message names the agent as the agent.
#[test]
fn wait_app_exit_knows_the_proxy_without_the_agent() {
    let mut pod = TestPod::start(&PodSpec::new(
        false,
        &["--minimum-drain-duration", "2s", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 0.0, "");
    let mut hook = hook_without_the_agent(&pod);
    let out = wait_for("the hook to name the app's listener", Duration::from_secs(10), || {
        let out = hook.output();
        if out.contains("waiting for") && out.contains(":8080 listening") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(
        out.contains("could not tell the agent at http://127.0.0.1:15999"),
        "{out}"
    );
    assert!(
        !out.contains("Envoy admin"),
        "the agent was named as Envoy's admin: {out}"
    );
    for port in [ADMIN, OUTBOUND, INBOUND, AGENT, STATUS] {
        assert!(
            !out.contains(&format!(":{port} ")),
            "a proxy socket ({port}) was the app's: {out}"
        );
        assert!(
            !out.contains(&format!(":{port})")),
            "a proxy socket ({port}) was the app's: {out}"
        );
    }
    // The agent's own drain was never started: readiness still 200.
    let status_addr = pod.net.pod_addr(STATUS);
    pod.net
        .peer
        .run(move || wait_status(status_addr, "/healthz/ready", 200, Duration::from_secs(5)));
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    signal(app, libc::SIGTERM);
    let app_gone = app_exit.wait().expect("the app exits");
    let status = hook.wait_exit(Duration::from_secs(10)).expect("the hook returns");
    assert_eq!(status.code(), Some(0), "{}", hook.output());
    eprintln!(
        "wait-app-exit without the agent: returned {:?} after the app exited",
        app_gone.elapsed()
    );
    assert!(app_gone.elapsed() < PROMPT);
    // The kubelet's SIGTERM comes once the hook
    // returned. The app holds no socket, but without a shared process
    // namespace lifeguard cannot tell an app that exited from one between
    // two steps of its shutdown (its listener closed, its next call not yet
    // made): the minimum drain time (2 s here) applies, and the log says
    // why. (With a shared process namespace the app's processes tell, and
    // Envoy stops at once: an_app_already_gone_is_recognised_...)
    let sigterm = pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let held = envoy_gone.duration_since(sigterm);
    eprintln!("the hook could not reach the agent, no shared process namespace: SIGTERM -> Envoy stopped {held:?}");
    let out = pod.agent.assert_exit(Duration::from_secs(10), 0);
    assert!(
        out.contains(
            "the minimum drain time applies: the drain began with no app socket and no request in Envoy, \
             but without a shared process namespace the app's processes cannot be seen"
        ),
        "{out}"
    );
    assert!(!out.contains("already gone"), "{out}");
    assert!(
        held >= Duration::from_secs(2) && held < Duration::from_secs(2) + PROMPT,
        "Envoy stopped {held:?} after SIGTERM, not at the 2 s minimum"
    );
}

/// A native sidecar as the kubelet runs it now. The proxy's
/// preStop `lifeguard drain` starts at T0, beside the app's shutdown; the
/// app exits later; lifeguard's SIGTERM comes only then. Envoy serves the
/// app to its end and stops at once; the outcome says what happened.
#[test]
fn a_native_sidecar_is_drained_by_its_prestop_and_stopped_by_the_late_sigterm() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 1.0, "");
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    let mut prestop = pod.hook("drain", &["drain"]);
    signal(app, libc::SIGTERM);
    let prestop_exit = ExitWatch::new(prestop.pid(), Duration::from_secs(30));
    let app_gone = app_exit.wait().expect("the app exits");
    let drained = prestop_exit.wait().expect("the preStop hook returns");
    // The kubelet: the sidecar's SIGTERM after the last app container exited.
    let sigterm = pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let out = pod.agent.output();
    let last = summary(&out);
    eprintln!(
        "native sidecar: app exit -> preStop returned {:?}; SIGTERM -> Envoy stopped {:?}; {last}",
        drained.saturating_duration_since(app_gone),
        envoy_gone.saturating_duration_since(sigterm)
    );
    assert!(envoy_gone > app_gone, "Envoy was stopped before the app exited");
    assert!(envoy_gone.saturating_duration_since(sigterm) < PROMPT);
    assert_eq!(
        prestop.wait_exit(Duration::from_secs(5)).and_then(|s| s.code()),
        Some(0)
    );
    let (ok, failed) = calls(&pod.app_output());
    assert_eq!(failed, 0, "{}", pod.app_output());
    assert!(ok > 0);
    assert_eq!(code, 0, "{out}");
    assert!(
        last.contains("outcome=\"drained\"") && last.contains("cut_by_deadline=false"),
        "{last}"
    );
    assert!(
        last.contains("trigger=\"preStop hook\"") && last.contains("stop_signal=\"SIGTERM\""),
        "{last}"
    );
}

/// The grace period runs out with the app still running (it
/// ignores SIGTERM): the kubelet sends what is left SIGTERM, then SIGKILL
/// 2 s later. Envoy is stopped between the two, and the outcome says the
/// deadline cut the drain.
#[test]
fn a_native_sidecar_at_grace_expiry_stops_envoy_before_the_sigkill() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &[
            "--minimum-drain-duration",
            "500ms",
            "--termination-grace-period",
            "4s",
            "--shutdown-margin",
            "1s",
        ],
    ));
    pod.start_app(AppMode::Stubborn, 0.0, "");
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let t0 = Instant::now();
    let _prestop = pod.hook("drain", &["drain"]);
    let status = pod.net.pod_addr(AGENT);
    pod.net
        .peer
        .run(move || wait_status(status, "/healthz/ready", 503, Duration::from_secs(5)));
    wait_for("the grace period to end", Duration::from_secs(10), || {
        if t0.elapsed() >= Duration::from_secs(4) {
            Ok(())
        } else {
            Err(t0.elapsed())
        }
    });
    let sigterm = pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let sigkill_at = sigterm + Duration::from_secs(2);
    let code = pod.agent.exit_code(Duration::from_secs(2));
    pod.kubelet_sigkill();
    let out = pod.agent.output();
    let last = summary(&out);
    eprintln!(
        "grace expiry: SIGTERM at t0+{:?} -> Envoy stopped {:?} later (SIGKILL due 2s after); {last}",
        sigterm - t0,
        envoy_gone.saturating_duration_since(sigterm)
    );
    assert!(envoy_gone < sigkill_at, "Envoy was still running at the SIGKILL");
    assert_eq!(code, 3, "{out}");
    assert!(
        last.contains("outcome=\"cut\"") && last.contains("cut_by_deadline=true"),
        "{last}"
    );
    assert!(last.contains("stop_signal=\"SIGTERM\""), "{last}");
    // What Envoy was stopped with was read at the stop: the app's listener
    // and its process. That read gets a quarter of the margin (250 ms): on
    // a busy machine it may fail, and the outcome then says the count was
    // unknown, never a number it did not read.
    match last.contains("left_at_stop=") {
        true => assert!(last.contains("left_at_stop=2"), "{last}"),
        false => assert!(out.contains("the active count was unknown"), "{out}"),
    }
}

/// In the locked form (Envoy's admin and lifeguard's control on
/// Unix sockets only the proxy's container may open, loopback control
/// off), the app — another user, another cgroup, the same loopback —
/// reaches neither Envoy's admin nor any way to drain or stop the proxy;
/// the kubelet's probe, the merged scrape, the preStop hook and the drain
/// work as before, and Envoy stops when the app is done.
#[test]
fn in_the_locked_form_the_app_can_neither_drain_nor_stop_the_proxy() {
    let mut pod = TestPod::start(
        &PodSpec::new(
            true,
            &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
        )
        .locked(),
    );
    let app = pod.start_app(AppMode::Pooled, 1.0, "");
    let sockets = pod.sockets.as_ref().unwrap();
    let script = pod.dir.path().join("app_reach.py");
    std::fs::write(&script, include_str!("fixtures/app_reach.py")).unwrap();
    let argv: Vec<String> = [
        "python3".into(),
        script.display().to_string(),
        sockets.admin.display().to_string(),
        sockets.control.display().to_string(),
    ]
    .into();
    let reach = pod.run_in_app("app-reach", &argv);
    let out = reach.wait_output("done", Duration::from_secs(30));
    eprintln!("what the app reached:\n{out}");
    for line in [
        "admin-tcp-quit refused",
        "admin-tcp-config-dump refused",
        "admin-unix-quit denied",
        "admin-unix-drain denied",
        "control-unix-quit denied",
        "agent-drain open 403",
        "agent-drain-nowait open 403",
        "agent-quit open 403",
        "agent-drain-status open 200",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in:\n{out}");
    }
    // Nothing happened: ready through Envoy (the kubelet's probe), no drain.
    let status = pod.net.pod_addr(STATUS);
    pod.net
        .peer
        .run(move || wait_status(status, "/healthz/ready", 200, Duration::from_secs(5)));
    assert!(pod.admin_get("/ready").contains("LIVE"));
    // The merged scrape from outside, Envoy's part read over the socket.
    let agent = pod.net.pod_addr(AGENT);
    let (code, scrape) = pod
        .net
        .peer
        .run(move || http("GET", agent, "/stats/prometheus").unwrap());
    assert_eq!(code, 200);
    assert!(
        scrape.contains("envoy_server_live") && scrape.contains("lifeguard_ready 1"),
        "{scrape:.300}"
    );

    // Pod deletion, native order: the proxy's preStop hook drains through
    // the control socket, the app shuts down; SIGTERM once the app is gone.
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    let mut prestop = pod.hook("drain", &["drain"]);
    signal(app, libc::SIGTERM);
    let app_gone = app_exit.wait().expect("the app exits");
    assert_eq!(
        prestop.wait_exit(Duration::from_secs(10)).and_then(|s| s.code()),
        Some(0),
        "{}",
        prestop.output()
    );
    assert!(
        prestop.output().contains("\"phase\":\"drained\""),
        "{}",
        prestop.output()
    );
    pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    assert!(envoy_gone > app_gone, "Envoy was stopped before the app exited");
    let code = pod.agent.exit_code(Duration::from_secs(10));
    assert_eq!(code, 0, "{}", pod.agent.output());
    let (_, failed) = calls(&pod.app_output());
    assert_eq!(failed, 0, "{}", pod.app_output());
}

/// The sockets a `waiting_on` text names: `2 app sockets (A; B)` → A, B
/// (an `N more` left out).
fn named_sockets(text: &str) -> Vec<String> {
    let Some(at) = text.find(" app socket") else {
        return Vec::new();
    };
    let rest = &text[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        panic!("no list of sockets in {text:?}");
    };
    rest[open + 1..close]
        .split("; ")
        .filter(|s| !s.ends_with(" more"))
        .map(String::from)
        .collect()
}

/// Whether a socket named by the drain is the app's in this pod: its
/// listener on 127.0.0.1:8080, a connection it accepted there, or its
/// call to Envoy's outbound listener. Anything else is Envoy's (its
/// listeners' connections, its connections to the app or the peer).
fn is_the_apps(socket: &str) -> bool {
    socket == "127.0.0.1:8080 listening"
        || socket.starts_with("127.0.0.1:8080 -> ")
        || socket.ends_with(&format!(" -> 127.0.0.1:{OUTBOUND}"))
}

/// Behind load balancers. Idle keep-alive connections from
/// outside the pod, a load of new connections to Envoy's inbound listener
/// and probes through its status listener while the app finishes and calls
/// out. `GET /drain`, read over and over, the progress lines and the exit
/// summary name only the app's sockets, never one of Envoy's, however they
/// come and go while lifeguard reads. (The app's sockets are told by the
/// table alone in any pod: only the proxy's descriptors are read. The pod
/// shares its process namespace so that the app's process holds the drain
/// while the app is between two steps, whatever the machine's load.)
#[test]
fn the_drain_names_only_the_apps_sockets_under_a_load_of_new_connections() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "500ms", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 3.0, "");
    let idle = pod.idle_clients(3);
    let load = Prober::start(&pod.net, INBOUND, "/load", Duration::ZERO);
    let probes = Prober::start(&pod.net, STATUS, "/healthz/ready", Duration::from_millis(10));
    wait_for("the load to flow", Duration::from_secs(10), || match load.answered() {
        n if n >= 20 => Ok(()),
        n => Err(n),
    });
    let watch = DrainWatch::start(&pod.net, Duration::from_millis(5));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    let before = load.answered();
    pod.kubelet_sigterm();
    app_exit.wait().expect("the app exits");
    let during = load.answered() - before;
    load.finish();
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let (seen, taken) = watch.finish_counted();
    let probed = probes.finish();
    let out = pod.agent.output();
    let last = summary(&out);
    let mut named: Vec<String> = seen
        .iter()
        .flat_map(|v| [s(v, "waiting_on"), s(v, "waited_on_last")])
        .chain(
            out.lines()
                .filter(|l| l.contains("draining: waiting for"))
                .map(String::from),
        )
        .chain([last.clone()])
        .flat_map(|text| named_sockets(&text))
        .collect();
    named.sort();
    named.dedup();
    let envoys: Vec<&String> = named.iter().filter(|s| !is_the_apps(s)).collect();
    let naming = seen
        .iter()
        .filter(|v| named_sockets(&s(v, "waiting_on")).iter().any(|s| !is_the_apps(s)))
        .count();
    eprintln!(
        "under load: {taken} GET /drain answers ({} distinct), {naming} naming a socket not the app's; \
         {during} new connections answered while the app worked, {probed} probes; sockets named: {named:?}; {last}",
        seen.len()
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        envoys.is_empty(),
        "Envoy's sockets named as the app's: {envoys:?}\n{out}"
    );
    // It waited on the app's own call out, and the load ran meanwhile.
    assert!(
        named.iter().any(|s| s.ends_with(" -> 127.0.0.1:15001")),
        "{seen:#?}\n{out}\n----- app -----\n{}",
        pod.app_output()
    );
    assert!(during >= 20, "only {during} new connections during the drain");
    assert!(probed > 0 && taken > 0);
    drop(idle);
}

/// A pod with a shared process namespace, idle
/// keep-alive connections from a client outside the pod, probes through
/// Envoy's status listener all along (a load balancer's, the kubelet's:
/// connections Envoy accepts and closes while lifeguard reads the pod),
/// the proxy's preStop hook `wait-app-exit` not told lifeguard's address,
/// the minimum drain time 5 s. The kubelet's SIGTERM comes once the hook
/// saw the app exit: the drain begins with the app gone, and Envoy stops
/// at once, the log naming the reading that decided it.
#[test]
fn an_app_already_gone_is_recognised_with_idle_clients_and_probes() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "5s", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 0.3, "");
    let idle = pod.idle_clients(3);
    let mut hook = hook_without_the_agent(&pod);
    wait_for("the hook to wait on the app", Duration::from_secs(10), || {
        let out = hook.output();
        if out.contains("waiting for") {
            Ok(())
        } else {
            Err(out)
        }
    });
    let probes = Prober::start(&pod.net, STATUS, "/healthz/ready", Duration::from_millis(10));
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    signal(app, libc::SIGTERM);
    let app_gone = app_exit.wait().expect("the app exits");
    let hook_code = hook.wait_exit(Duration::from_secs(10)).and_then(|s| s.code());
    assert_eq!(hook_code, Some(0), "{}", hook.output());
    let sigterm = pod.kubelet_sigterm();
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let after = envoy_gone.duration_since(app_gone);
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let probed = probes.finish();
    let out = pod.agent.output();
    let last = summary(&out);
    eprintln!(
        "app already gone (shared process namespace, 3 idle clients, {probed} probes): \
         Envoy stopped {after:?} after the app exited (the hook saw it and the kubelet's SIGTERM \
         came {:?} after the exit; SIGTERM -> Envoy stopped {:?}); {last}",
        sigterm.duration_since(app_gone),
        envoy_gone.duration_since(sigterm)
    );
    assert_eq!(code, 0, "{out}");
    assert!(probed > 0, "no probe reached Envoy");
    assert!(
        out.contains(
            "the app was already gone when the drain began (no process left in the app's containers, \
             the pod sharing its process namespace; no app socket)"
        ),
        "{out}"
    );
    // Nothing was ever waited on: no probe's connection was the app's.
    assert!(!last.contains("waited_on_last"), "{last}");
    assert!(after < PROMPT, "Envoy stopped {after:?} after the app exited");
    drop(idle);
}

/// The app already gone at the drain's start (a shared process
/// namespace shows no process of it left) while a client outside the pod
/// still sends to it, each request answered 503 at once by Envoy: a
/// request may be in flight at that instant. Envoy waits for the requests
/// in flight, never for the 5 s minimum: lifeguard stops it within 3 s of
/// its SIGTERM (the figure printed; a read or two of Envoy's counters).
#[test]
fn a_gone_app_with_a_client_still_sending_is_not_held_to_the_minimum() {
    let mut pod = TestPod::start(&PodSpec::new(
        true,
        &["--minimum-drain-duration", "5s", "--termination-grace-period", "20s"],
    ));
    let app = pod.start_app(AppMode::Pooled, 0.3, "");
    let sending = Prober::start(&pod.net, INBOUND, "/work/0", Duration::from_millis(20));
    wait_for(
        "the client's first answers",
        Duration::from_secs(10),
        || match sending.answered() {
            0 => Err("none yet"),
            _ => Ok(()),
        },
    );
    let envoy_exit = ExitWatch::new(pod.envoy_pid, Duration::from_secs(30));
    let app_exit = ExitWatch::new(app, Duration::from_secs(30));
    signal(app, libc::SIGTERM);
    let app_gone = app_exit.wait().expect("the app exits");
    // The proxy's SIGTERM once the app's container is gone (a native
    // sidecar's), the client still sending.
    let sent = std::time::SystemTime::now();
    signal(pod.agent_pid, libc::SIGTERM);
    let envoy_gone = envoy_exit.wait().expect("Envoy is stopped");
    let answered = sending.finish();
    let after = envoy_gone.duration_since(app_gone);
    let code = pod.agent.exit_code(Duration::from_secs(10));
    let out = pod.agent.output();
    // lifeguard's own record of when it stopped Envoy: Envoy's exit after
    // it is Envoy's (seconds on a busy machine).
    let stopped = common::lb::envoy_stop_sent(&out).unwrap_or_else(|| panic!("Envoy was not stopped\n{out}"));
    let drained = stopped.duration_since(sent).unwrap_or_default();
    eprintln!(
        "app gone, a client sending ({answered} answered): SIGTERM -> Envoy stopped by lifeguard {drained:?}; \
         Envoy gone {after:?} after the app exited; {}",
        summary(&out)
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("the app was already gone when the drain began"), "{out}");
    assert!(
        drained < Duration::from_secs(3),
        "lifeguard stopped Envoy {drained:?} after SIGTERM, not at once (the minimum is 5 s)\n{out}"
    );
}
