//! Envoy admin calls over TCP and over a Unix socket, side by side: two real
//! Envoys from config/envoy-bootstrap.yaml, one with its admin on
//! 127.0.0.1, one on a Unix socket, read in turns through lifeguard's own
//! admin client (a fresh connection per call, as lifeguard makes them):
//! the poller's steady read (`GET /ready`), its full check (the readiness
//! stats) and the drain's active-count read.
//!
//! Run by `bench/admin_transport.sh [CALLS=2000]`. Loopback and sockets in
//! a temporary directory only.

use std::time::{Duration, Instant};

use common::*;
use lifeguard::envoy::admin::{AdminClient, Endpoint, ACTIVE_LIMIT, STATS_LIMIT};
use lifeguard::envoy::counts::ACTIVE_STATS;
use lifeguard::envoy::state::READINESS_STATS;

fn main() {
    let calls: usize = std::env::args().nth(1).map_or(2000, |n| n.parse().expect("CALLS"));
    let tcp_ports = Ports::with_admin_socket(false);
    let unix_ports = Ports::with_admin_socket(true);
    let _tcp_envoy = start_envoy(&bootstrap(&tcp_ports));
    let _unix_envoy = start_envoy(&bootstrap(&unix_ports));
    let timeout = Duration::from_secs(2);
    let tcp = AdminClient::new(tcp_ports.admin_url().parse().unwrap(), timeout);
    let unix = AdminClient::new(unix_ports.admin_url().parse().unwrap(), timeout);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (name, client) in [("tcp", &tcp), ("unix", &unix)] {
        wait_for(&format!("Envoy ({name}) LIVE"), Duration::from_secs(30), || {
            match rt.block_on(client.get_any(Endpoint::Ready, "/ready", 64)) {
                Ok((status, body)) if status == 200 && body.starts_with(b"LIVE") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    }
    println!("# {calls} calls each, alternating TCP and Unix socket, one fresh connection per call");
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "read", "tcp p50", "unix p50", "tcp p99", "unix p99", "p50 u/t"
    );
    let reads: [(&str, Endpoint, &str, usize); 3] = [
        ("poller: GET /ready", Endpoint::Ready, "/ready", 64),
        ("poller: readiness stats", Endpoint::Stats, READINESS_STATS, STATS_LIMIT),
        ("drain: active counts", Endpoint::Stats, ACTIVE_STATS, ACTIVE_LIMIT),
    ];
    for (name, endpoint, path, limit) in reads {
        let (mut t, mut u) = (Vec::with_capacity(calls), Vec::with_capacity(calls));
        for _ in 0..calls {
            for (client, into) in [(&tcp, &mut t), (&unix, &mut u)] {
                let started = Instant::now();
                rt.block_on(client.get_any(endpoint, path, limit))
                    .expect("admin answered");
                into.push(started.elapsed());
            }
        }
        let q = |v: &mut Vec<Duration>, q: f64| {
            v.sort();
            v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
        };
        let (tp50, up50, tp99, up99) = (q(&mut t, 0.5), q(&mut u, 0.5), q(&mut t, 0.99), q(&mut u, 0.99));
        println!(
            "{name:<28} {:>7}us {:>7}us {:>7}us {:>7}us {:>9.2}",
            tp50.as_micros(),
            up50.as_micros(),
            tp99.as_micros(),
            up99.as_micros(),
            up50.as_secs_f64() / tp50.as_secs_f64()
        );
    }
}
