//! What an ingress gateway's drain does to its kept-alive clients, side by
//! side for the shapes its traffic listener can take (issue #52): the
//! connections opened while one gateway drains, the requests lost, and
//! how long the drain took. Needs root, HAProxy and Envoy.
//!
//! `bench/keepalive.sh [ROUNDS=1]`, or `cargo bench --bench keepalive --
//! [ROUNDS]`.
//!
//! The traffic listener's shapes (`tests/common/gateway.rs`):
//!
//! - **shipped**: `config/envoy-gateway.yaml` as shipped: the
//!   `health_check` filter, `drain_type: MODIFY_ONLY`;
//! - **default drain type**: the same without `drain_type` (the shipped
//!   bootstrap before #52): the drain's `/healthcheck/fail`, which fails
//!   the load balancers' checks the filter recognises, also has Envoy close
//!   every kept-alive connection at its next response from the drain's
//!   start;
//! - **no health_check filter**: nothing is closed before
//!   `drain_listeners`.
//!
//! The load balancers, 200 requests a second:
//!
//! - **node-checked L4** (an AWS NLB with instance targets): HAProxy in TCP
//!   mode checking each node's kube-proxy health-check port every 5 s, out
//!   after 2; kube-proxy's rules modelled on each node
//!   (`tests/common/nodes.rs`); a client keeping 8 connections alive
//!   through it (each stays with the node it reached); lifeguard told the
//!   checks (`--load-balancer-checks 5sx2`);
//! - **pod-checked L4** (an NLB with IP targets): HAProxy in TCP mode
//!   checking each gateway's 15021 every 2 s, out after 3, the same client;
//! - **pod-checked L7, pooled** (an ALB, Google's front ends): HAProxy in
//!   HTTP mode checking 15021 every 2 s, out after 3, reusing its
//!   connections to the gateways for any client's requests; each client
//!   request on a new connection to HAProxy.
//!
//! Each row: connections opened during the drain (from the deletion to
//! Envoy's stop) by the kept-alive client, and those the draining gateway
//! accepted (read from its Envoy; the node-checked rows have none: what
//! the node sends it is the client's);
//! requests lost over the run; the time from the deletion to Envoy's stop,
//! and whether the drain wait's verdict came (`out of rotation`) or the
//! deadline cut the drain.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::lb::*;
use common::nodes::{node_rolling_restart, NodeRollout, ProbeSpec};
use common::pod::{Gateway, TrafficListener, GATEWAY_PORT};

/// The traffic listener's shapes, by name.
const SHAPES: [(&str, Gateway); 3] = [
    (
        "shipped (health_check filter, drain_type MODIFY_ONLY)",
        Gateway::Shipped,
    ),
    (
        "health_check filter, default drain type",
        Gateway::ShippedWith(TrafficListener::DefaultDrainType),
    ),
    (
        "no health_check filter",
        Gateway::ShippedWith(TrafficListener::NoHealthCheckFilter),
    ),
];

const RATE: u32 = 200;

/// Kept-alive connections through an L4 load balancer.
const KEPT_ALIVE: Client = Client {
    kept_alive: true,
    slow_every: None,
};

/// The load balancers that check the pod: every 2 s, out after 3.
const POD_CHECKED: Check = Check {
    inter: Duration::from_secs(2),
    fall: 3,
    rise: 1,
    terminates: false,
};

/// One drain's figures.
struct Figures {
    /// None: the client opens a connection per request (to the load
    /// balancer, which pools its own to the gateways).
    client_connections: Option<usize>,
    accepted: Option<u64>,
    lost: usize,
    sent: usize,
    stopped_after: Option<f64>,
    ended: String,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let rounds: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(1);
    println!("| load balancer | the gateway's traffic listener | client connections opened during the drain | connections the draining gateway accepted during it | requests lost (of sent) | deletion -> Envoy stopped | the drain ended |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    type Scenario = (&'static str, fn(Gateway) -> Figures);
    let scenarios: [Scenario; 3] = [
        ("node-checked L4, kept-alive clients", node_checked),
        ("pod-checked L4, kept-alive clients", |shape| {
            one_drain(Balancer::PassThrough(POD_CHECKED), shape, KEPT_ALIVE)
        }),
        ("pod-checked L7, connections pooled", |shape| {
            one_drain(Balancer::Pooling(POD_CHECKED), shape, Client::NEW_CONNECTIONS)
        }),
    ];
    for (lb, run) in scenarios {
        for (shape_name, shape) in SHAPES {
            for _ in 0..rounds {
                let f = run(shape);
                println!(
                    "| {lb} | {shape_name} | {} | {} | {} (of {}) | {} | {} |",
                    f.client_connections.map_or("-".into(), |n| n.to_string()),
                    f.accepted.map_or("-".into(), |n| n.to_string()),
                    f.lost,
                    f.sent,
                    f.stopped_after.map_or("-".into(), |s| format!("{s:.1} s")),
                    f.ended,
                );
            }
        }
    }
}

/// A gateway on node 0 replaced by one on node 1 behind the node-checking
/// load balancer (every 5 s, out after 2).
fn node_checked(shape: Gateway) -> Figures {
    let check = Check {
        inter: Duration::from_secs(5),
        fall: 2,
        rise: 1,
        terminates: false,
    };
    let run = node_rolling_restart(&NodeRollout {
        way: common::nodes::NodeWay::Checked(check),
        rate: RATE,
        steady: Duration::from_secs(5),
        gateway: Some(shape),
        agent_args: &[
            "--drain-scope",
            "all",
            "--termination-grace-period",
            "60s",
            "--load-balancer-checks",
            "5sx2",
        ],
        grace: Duration::from_secs(60),
        kubelet: ProbeSpec::SHIPPED,
        client: KEPT_ALIVE,
    });
    // What the node sent the gateway is counted by the node's own view of
    // its endpoint (ready for a second after the deletion, then
    // terminating), not by the drain's: the client's count says it.
    figures(&run.run, None)
}

/// Two gateways behind `balancer`; the client at 200 a second for 5 s,
/// then one gateway is deleted; the connections its Envoy accepted from
/// then on (its listener's count, read every 100 ms from inside its pod).
fn one_drain(balancer: Balancer, shape: Gateway, client: Client) -> Figures {
    let lan = Lan::new();
    let args = ["--drain-scope", "all", "--termination-grace-period", "30s"];
    let (mut old, old_ip) = gateway_at(&lan, 0, shape, &args);
    let (_other, other_ip) = gateway_at(&lan, 1, shape, &args);
    let servers = [("old0".to_owned(), old_ip), ("old1".to_owned(), other_ip)];
    let front = Front::start(&lan, balancer, &servers, 1, GATEWAY_PORT);
    // HAProxy starts its servers up (and says nothing while they stay so).
    let frontend = front.frontend;
    common::wait_for("the load balancer's frontend", Duration::from_secs(10), || {
        lan.host
            .run(move || std::net::TcpStream::connect_timeout(&frontend, Duration::from_secs(1)).map(drop))
    });
    let load = Load::with(&lan.host, &[front.frontend], RATE, client);
    // A scenario's length, not a wait for a condition: the traffic the
    // gateways have had when one is deleted.
    std::thread::sleep(Duration::from_secs(5));
    let watching = Arc::new(AtomicBool::new(true));
    let last = Arc::new(AtomicU64::new(u64::MAX));
    let first = old.net.pod.run(read_accepted);
    let watcher = {
        let (watching, last) = (watching.clone(), last.clone());
        old.net.pod.spawn(move || {
            while watching.load(Ordering::Relaxed) {
                if let Some(n) = read_accepted() {
                    last.store(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let deletion = delete_pod(&mut old, &lan.host, old_ip, &Hook::None, Duration::from_secs(30), || {});
    watching.store(false, Ordering::Relaxed);
    watcher.join().unwrap();
    let sent = load.stop();
    let accepted = match (first, last.load(Ordering::Relaxed)) {
        (Some(first), last) if last != u64::MAX => Some(last.saturating_sub(first)),
        _ => None,
    };
    let run = Run {
        sent,
        left: vec![Left {
            deletion,
            down: Vec::new(),
            log: old.agent.output(),
            envoy_log: None,
            summary: old.termination_message(),
        }],
        events: Vec::new(),
        rate: RATE,
        resets: Vec::new(),
    };
    figures(&run, accepted)
}

/// `listener.0.0.0.0_8080.downstream_cx_total` from the gateway's Envoy
/// admin (the calling thread in its pod's network namespace).
fn read_accepted() -> Option<u64> {
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, 15000));
    let (_, body) = common::get(
        admin,
        "/stats?filter=^listener\\.0\\.0\\.0\\.0_8080\\.downstream_cx_total$",
    )
    .ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("listener.0.0.0.0_8080.downstream_cx_total: "))
        .and_then(|n| n.trim().parse().ok())
}

/// The drain's figures from a run of one deletion.
fn figures(run: &Run, accepted: Option<u64>) -> Figures {
    let l = &run.left[0];
    let d = &l.deletion;
    let end = d.envoy_stopped.unwrap_or(d.gone);
    let during = |at: SystemTime| at >= d.started && at <= end;
    let kept_alive = run.sent.iter().any(|s| !s.connected);
    let client_connections = kept_alive.then(|| run.sent.iter().filter(|s| s.connected && during(s.at)).count());
    let lost = run.sent.iter().filter(|s| s.answer != Ok(200)).count();
    let ended = match &l.summary {
        Some(summary) => match (
            summary["outcome"].as_str(),
            summary["load_balancers"]["out_after_seconds"].as_f64(),
        ) {
            (Some("drained"), Some(out)) => format!("out of rotation at {out:.1} s"),
            (outcome, _) => format!(
                "{} ({})",
                outcome.unwrap_or("?"),
                summary["load_balancers"]["held_by"].as_str().unwrap_or("-")
            ),
        },
        None => "no exit summary".into(),
    };
    Figures {
        client_connections,
        accepted,
        lost,
        sent: run.sent.len(),
        stopped_after: d.envoy_stopped.map(|t| secs(d.started, t)),
        ended,
    }
}
