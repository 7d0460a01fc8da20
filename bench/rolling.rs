//! Rolling restarts behind real load balancers, the app's preStop hook
//! side by side: none, fixed sleeps, and lifeguard's drain wait
//! (`GET /drain/wait`). The rollout of `tests/lb.rs` (`tests/common/lb.rs`):
//! 3 pods replaced one by one, a client at a fixed rate through the load
//! balancer, the app stopping to listen at SIGTERM. Needs root, HAProxy
//! and Envoy.
//!
//! `bench/rolling.sh [ROUNDS=1] [hooks|balancers]`, or
//! `cargo bench --bench rolling -- [ROUNDS] [hooks|balancers]`:
//!
//! - `hooks`: HAProxy checking 15021 (every 1 s, down after 2; every 2 s,
//!   after 3) at 200 requests a second, each hook: none, `sleep 1`, `3`,
//!   `10`, the drain wait;
//! - `balancers` (the default): every kind of load balancer, at the rates
//!   of issue #34's table and at 200 a second, without a hook and with the
//!   drain wait;
//! - `gateways`: ingress gateways (the pod is the proxy alone) behind every
//!   kind of load balancer, at 200 and 2 requests a second, their drain
//!   side by side: out of rotation (lifeguard's default for a gateway), a
//!   fixed 10 s drain (as Envoy Gateway's minimum), and zero requests after
//!   the 5 s minimum (as Istio's exit on zero connections, counting
//!   requests); the requests that failed, and how long each pod's Envoy
//!   lived past its load balancer's removal (negative: it stopped while
//!   still in rotation). The fixed and zero-requests rows answer the
//!   kubelet 503 from SIGTERM, as those peers do
//!   (`--terminating-readiness failing`);
//! - `nodes`: the ways a node gets its traffic with `externalTrafficPolicy:
//!   Local`, kube-proxy's rules modelled on each node
//!   (`tests/common/nodes.rs`): a load balancer that checks the node
//!   (kube-proxy's health-check node port) every 10 s and every 5 s, out
//!   after 3, and an announcer that follows the EndpointSlice (MetalLB); a
//!   gateway and a sidecar's pod (the app's hook the drain wait), at 200
//!   and 2 requests a second, a 90 s grace period; lifeguard's defaults
//!   (the kubelet answered as Envoy is for the node's load balancers' time,
//!   then 503) or 503 from SIGTERM (`failing`, as Istio); a gateway's fixed
//!   10 s drain beside them.
//!
//! For each: the requests that failed, and per pod the time from its
//! deletion to its app's SIGTERM (the hook's return), to the pod gone
//! (lifeguard exited) and to the load balancer's taking it out, medians
//! over the pods.

use std::time::Duration;

use common::lb;
use lb::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

const FAST: Check = Check::FAST;
const SLOW: Check = Check::SLOW;

/// One row of the table: a load balancer, the client's rate, the hooks.
type Row = (Balancer, u32, Vec<(&'static str, Hook)>);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let rounds: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(1);
    if args.iter().any(|a| a == "gateways") {
        return gateways(rounds);
    }
    if args.iter().any(|a| a == "nodes") {
        return nodes(rounds);
    }
    let hooks_table = args.iter().any(|a| a == "hooks");
    let none = || ("none", Hook::Sleep(Duration::ZERO));
    let wait = || ("GET /drain/wait", Hook::Get("/drain/wait".into()));
    let rows: Vec<Row> = if hooks_table {
        let hooks = || {
            vec![
                none(),
                ("sleep 1", Hook::Sleep(Duration::from_secs(1))),
                ("sleep 3", Hook::Sleep(Duration::from_secs(3))),
                ("sleep 10", Hook::Sleep(Duration::from_secs(10))),
                wait(),
            ]
        };
        vec![
            (Balancer::Haproxy(FAST), 200, hooks()),
            (Balancer::Haproxy(SLOW), 200, hooks()),
        ]
    } else {
        let envoy = Balancer::Envoy {
            inter: Duration::from_secs(1),
            http2: false,
        };
        let mut rows = Vec::new();
        for (balancer, rates) in [
            (Balancer::Haproxy(FAST), &[50, 200][..]),
            (envoy, &[50, 200][..]),
            (Balancer::Endpoints, &[5, 2, 200][..]),
            (Balancer::TrafficPort(FAST), &[50, 2, 200][..]),
        ] {
            for rate in rates {
                rows.push((balancer, *rate, vec![none(), wait()]));
            }
        }
        rows
    };
    println!("| load balancer | rate | app's preStop hook | requests failed (of sent) | deletion -> app's SIGTERM, median | deletion -> pod gone, median | load balancer took the pod out, median |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (balancer, rate, hooks) in rows {
        for (hook_name, hook) in hooks {
            for _ in 0..rounds {
                let balancers = [balancer];
                let run = rolling_restart(&Rollout {
                    balancers: &balancers,
                    hook: hook.clone(),
                    replace: 3,
                    rate,
                    agent_args: &[],
                    steady: Duration::from_secs(20),
                    gateway: None,
                    grace: GRACE,
                });
                let failed = run.sent.iter().filter(|s| s.answer != Ok(200)).count();
                let since = |f: &dyn Fn(&Left) -> std::time::SystemTime| {
                    median(run.left.iter().map(|l| secs(l.deletion.started, f(l))).collect())
                };
                let to_sigterm = since(&|l| l.deletion.hook_returned);
                let to_gone = since(&|l| l.deletion.gone);
                let to_down = since(&|l| l.down[0]);
                println!(
                    "| {} | {rate}/s | {hook_name} | {failed} (of {}) | {to_sigterm:.2} s | {to_gone:.2} s | {to_down:.2} s |",
                    balancer.name(),
                    run.sent.len()
                );
            }
        }
    }
}

/// The gateways' table: each load balancer, each rate, each drain policy.
fn gateways(rounds: usize) {
    let slower = Check {
        inter: Duration::from_secs(5),
        fall: 3,
        rise: 1,
        terminates: false,
    };
    let envoy = Balancer::Envoy {
        inter: Duration::from_secs(1),
        http2: false,
    };
    let balancers = [
        Balancer::Haproxy(FAST),
        Balancer::Haproxy(SLOW),
        Balancer::Haproxy(slower),
        envoy,
        Balancer::Endpoints,
        Balancer::TrafficPort(FAST),
    ];
    let policies: [(&str, &[&str]); 3] = [
        ("out-of-rotation (lifeguard)", &["--drain-scope", "all"]),
        (
            "fixed 10 s",
            &[
                "--drain-scope",
                "all",
                "--drain-until",
                "time",
                "--termination-drain-duration",
                "10s",
                "--terminating-readiness",
                "failing",
            ],
        ),
        (
            "zero requests after 5 s",
            &[
                "--drain-scope",
                "all",
                "--drain-until",
                "requests",
                "--terminating-readiness",
                "failing",
            ],
        ),
    ];
    println!("| load balancer | rate | gateway's drain | requests failed (of sent) | Envoy stopped after its removal, median (min, max) |");
    println!("| --- | --- | --- | --- | --- |");
    for balancer in balancers {
        for rate in [200, 2] {
            for (policy, args) in policies {
                for _ in 0..rounds {
                    let only = [balancer];
                    let run = rolling_restart(&Rollout {
                        agent_args: args,
                        rate,
                        steady: Duration::from_secs(20),
                        ..Rollout::gateway(&only, common::pod::Gateway::Shipped)
                    });
                    let failed = run.sent.iter().filter(|s| s.answer != Ok(200)).count();
                    let lived: Vec<f64> = run
                        .left
                        .iter()
                        .filter_map(|l| {
                            let removed = *l.down.iter().max()?;
                            Some(secs(removed, l.deletion.envoy_stopped?))
                        })
                        .collect();
                    let (min, max) = lived
                        .iter()
                        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
                    println!(
                        "| {} | {rate}/s | {policy} | {failed} (of {}) | {:.2} s ({min:.2}, {max:.2}) |",
                        balancer.name(),
                        run.sent.len(),
                        median(lived),
                    );
                }
            }
        }
    }
}

/// The table of the ways a node gets its traffic that no probe of the pod
/// shows: load balancers that check the node (every 10 s and 5 s, out
/// after 3) and an announcer that follows the EndpointSlice (MetalLB), each
/// pod, each rate, each rule for the kubelet's answer; a 90 s grace period.
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn nodes(rounds: usize) {
    use common::nodes::{node_rolling_restart, NodeRollout, NodeWay, ProbeSpec};
    use common::pod::Gateway;
    let every = |s: u64| Check {
        inter: Duration::from_secs(s),
        fall: 3,
        rise: 1,
        terminates: false,
    };
    const GRACE: &[&str] = &["--termination-grace-period", "90s"];
    let gateway: [(&str, &[&str]); 3] = [
        (
            "out-of-rotation, lifeguard's defaults",
            &["--drain-scope", "all", "--termination-grace-period", "90s"],
        ),
        (
            "out-of-rotation, the kubelet answered 503 from SIGTERM",
            &[
                "--drain-scope",
                "all",
                "--termination-grace-period",
                "90s",
                "--terminating-readiness",
                "failing",
            ],
        ),
        (
            "fixed 10 s, 503 from SIGTERM",
            &[
                "--drain-scope",
                "all",
                "--termination-grace-period",
                "90s",
                "--drain-until",
                "time",
                "--termination-drain-duration",
                "10s",
                "--terminating-readiness",
                "failing",
            ],
        ),
    ];
    let sidecar: [(&str, &[&str]); 2] = [
        ("GET /drain/wait, lifeguard's defaults", GRACE),
        (
            "GET /drain/wait, the kubelet answered 503 from SIGTERM",
            &[
                "--termination-grace-period",
                "90s",
                "--terminating-readiness",
                "failing",
            ],
        ),
    ];
    let ways = [
        ("checked every 10s, out after 3", NodeWay::Checked(every(10))),
        ("checked every 5s, out after 3", NodeWay::Checked(every(5))),
        ("announced (MetalLB), 0.5 s late", NodeWay::METALLB),
    ];
    println!("| the node's traffic | pod | rate | rule | requests failed (of sent) | the node let go after SIGTERM | Envoy stopped after the node was let go |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (way_name, way) in ways {
        for rate in [200, 2] {
            let pods = gateway
                .iter()
                .map(|(rule, args)| ("gateway", Some(Gateway::Shipped), *rule, *args))
                .chain(sidecar.iter().map(|(rule, args)| ("sidecar", None, *rule, *args)));
            for (pod, kind, rule, args) in pods {
                for _ in 0..rounds {
                    let run = node_rolling_restart(&NodeRollout {
                        way,
                        rate,
                        steady: Duration::from_secs(20),
                        gateway: kind,
                        agent_args: args,
                        grace: Duration::from_secs(90),
                        kubelet: ProbeSpec::SHIPPED,
                        client: Client::NEW_CONNECTIONS,
                    });
                    let failed = run.run.sent.iter().filter(|s| s.answer != Ok(200)).count();
                    let l = &run.run.left[0];
                    let let_go = secs(l.deletion.started, l.down[0]);
                    let stopped = l
                        .deletion
                        .envoy_stopped
                        .map_or("-".into(), |t| format!("{:.2} s", secs(l.down[0], t)));
                    println!(
                        "| {way_name} | {pod} | {rate}/s | {rule} | {failed} (of {}) | {let_go:.2} s | {stopped} |",
                        run.run.sent.len(),
                    );
                }
            }
        }
    }
}
