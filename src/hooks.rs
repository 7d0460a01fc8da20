//! Helpers for the pod's hooks, shipped in the same binary so a distroless
//! image needs nothing else:
//!
//! - [`wait`]: the postStart hook that holds the app until the proxy is
//!   ready (`holdApplicationUntilProxyStarts`).
//! - [`wait_app_exit`]: a preStop helper that waits until no process but
//!   Envoy and lifeguard listens on a TCP port (replaces `netstat` loops that
//!   count the agent's own port and never end).
//! - [`drain`]: a client for `POST /drain`, the native-sidecar preStop hook.
//!
//! Each returns the process exit code: 0 success, 1 gave up or refused.
//! Every network call has a timeout, and every URL must be loopback.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};

use crate::admin::{fetch, AdminError};
use crate::config::LoopbackUrl;
use crate::duration::Display as D;
use crate::sockets::{self, Listening, Owner};

/// Exit code when a helper gives up or is refused.
pub const FAILED: u8 = 1;
/// How often a waiting helper reports on stderr.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Options of `lifeguard wait`.
#[derive(Debug, Clone)]
pub struct WaitOptions {
    pub url: LoopbackUrl,
    pub path: String,
    /// Zero: wait forever.
    pub timeout: Duration,
    pub period: Duration,
    pub request_timeout: Duration,
}

/// Polls the readiness URL until it answers 200.
pub async fn wait(opts: &WaitOptions) -> u8 {
    let started = Instant::now();
    let mut last_report = started;
    loop {
        let attempt = Instant::now();
        let answer = tokio::time::timeout(opts.request_timeout, fetch(&opts.url, Method::GET, &opts.path, 4096)).await;
        let last = match answer {
            Ok(Ok((StatusCode::OK, _))) => {
                eprintln!(
                    "lifeguard wait: {}{} is ready after {}",
                    opts.url,
                    opts.path,
                    D(round_ms(started.elapsed()))
                );
                return 0;
            }
            Ok(Ok((status, body))) => {
                let body = String::from_utf8_lossy(&body);
                format!("{} {}", status.as_u16(), body.trim())
            }
            Ok(Err(AdminError::Connect { url, source })) => format!("cannot connect to {url}: {source}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}", D(opts.request_timeout)),
        };
        let waited = started.elapsed();
        if !opts.timeout.is_zero() && waited >= opts.timeout {
            eprintln!(
                "lifeguard wait: {}{} not ready after {}; last answer: {last}",
                opts.url,
                opts.path,
                D(opts.timeout)
            );
            return FAILED;
        }
        if last_report.elapsed() >= REPORT_EVERY {
            eprintln!("lifeguard wait: still waiting after {}: {last}", D(round_ms(waited)));
            last_report = Instant::now();
        }
        let mut next = attempt + opts.period;
        if !opts.timeout.is_zero() {
            next = next.min(started + opts.timeout);
        }
        tokio::time::sleep_until(next.into()).await;
    }
}

/// Options of `lifeguard drain`.
#[derive(Debug, Clone)]
pub struct DrainOptions {
    pub url: LoopbackUrl,
    pub timeout: Duration,
}

/// `POST /drain` on the agent; prints the drain's status on success.
pub async fn drain(opts: &DrainOptions) -> u8 {
    let answer = tokio::time::timeout(opts.timeout, fetch(&opts.url, Method::POST, "/drain", 64 * 1024)).await;
    match answer {
        Ok(Ok((StatusCode::OK, body))) => {
            println!("{}", String::from_utf8_lossy(&body).trim());
            0
        }
        Ok(Ok((status, body))) => {
            let body = String::from_utf8_lossy(&body);
            eprintln!(
                "lifeguard drain: {}/drain answered {}: {}",
                opts.url,
                status.as_u16(),
                body.trim()
            );
            FAILED
        }
        Ok(Err(AdminError::Connect { url, source })) => {
            eprintln!("lifeguard drain: cannot connect to {url}: {source}");
            FAILED
        }
        Ok(Err(e)) => {
            eprintln!("lifeguard drain: {e}");
            FAILED
        }
        Err(_) => {
            eprintln!(
                "lifeguard drain: {}/drain did not answer within {}",
                opts.url,
                D(opts.timeout)
            );
            FAILED
        }
    }
}

/// Ports Envoy and lifeguard listen on in a sidecar: admin, outbound,
/// inbound, status (agent), status (Envoy), Prometheus.
pub const PROXY_PORTS: [u16; 6] = [15000, 15001, 15006, 15020, 15021, 15090];
/// Process names whose sockets are the proxy's, not the app's.
pub const PROXY_PROCESSES: [&str; 3] = ["envoy", "lifeguard", "pilot-agent"];

/// Options of `lifeguard wait-app-exit`.
#[derive(Debug, Clone)]
pub struct AppExitOptions {
    /// Zero: wait forever (the kubelet ends the hook at the grace period).
    pub timeout: Duration,
    pub period: Duration,
    pub ignore_ports: Vec<u16>,
    pub ignore_processes: Vec<String>,
}

/// A listening socket the helper waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSocket {
    pub addr: std::net::SocketAddr,
    pub owner: Option<Owner>,
}

impl std::fmt::Display for AppSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(o) => write!(f, "{} ({} pid {})", self.addr, o.name, o.pid),
            None => write!(f, "{} (owner not visible)", self.addr),
        }
    }
}

/// The app's listening sockets among `listening`: a socket is the proxy's
/// when its owner is a proxy process or ignored by name, or — when its owner
/// cannot be seen — when it is on a proxy port. Ignored ports never count.
pub fn app_sockets(
    listening: &[Listening],
    owners: &std::collections::HashMap<u64, Owner>,
    opts: &AppExitOptions,
) -> Vec<AppSocket> {
    let mut seen = HashSet::new();
    listening
        .iter()
        .filter(|l| seen.insert(l.inode))
        .filter(|l| !opts.ignore_ports.contains(&l.addr.port()))
        .filter_map(|l| {
            let owner = owners.get(&l.inode).cloned();
            let proxy = match &owner {
                Some(o) => PROXY_PROCESSES.contains(&o.name.as_str()) || opts.ignore_processes.contains(&o.name),
                None => PROXY_PORTS.contains(&l.addr.port()),
            };
            (!proxy).then_some(AppSocket { addr: l.addr, owner })
        })
        .collect()
}

/// Waits until no app socket is listening.
pub async fn wait_app_exit(opts: &AppExitOptions) -> u8 {
    let started = Instant::now();
    let mut last_report: Option<Instant> = None;
    loop {
        let listening = match sockets::listening() {
            Ok(l) => l,
            Err(e) => {
                eprintln!("lifeguard wait-app-exit: cannot read /proc/net/tcp: {e}");
                return FAILED;
            }
        };
        let app = app_sockets(&listening, &sockets::owners(), opts);
        if app.is_empty() {
            eprintln!(
                "lifeguard wait-app-exit: no app socket is listening (after {})",
                D(round_ms(started.elapsed()))
            );
            return 0;
        }
        let list = app.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        if !opts.timeout.is_zero() && started.elapsed() >= opts.timeout {
            eprintln!(
                "lifeguard wait-app-exit: gave up after {}; still listening: {list}",
                D(opts.timeout)
            );
            return FAILED;
        }
        if last_report.is_none_or(|t| t.elapsed() >= REPORT_EVERY) {
            eprintln!(
                "lifeguard wait-app-exit: waiting for {} listening socket(s): {list}",
                app.len()
            );
            last_report = Some(Instant::now());
        }
        tokio::time::sleep(opts.period).await;
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn listening(addr: &str, inode: u64) -> Listening {
        Listening {
            addr: addr.parse().unwrap(),
            inode,
        }
    }

    fn opts() -> AppExitOptions {
        AppExitOptions {
            timeout: Duration::ZERO,
            period: Duration::from_millis(100),
            ignore_ports: vec![],
            ignore_processes: vec![],
        }
    }

    #[test]
    fn proxy_sockets_by_owner_and_by_port_when_owner_is_hidden() {
        let sockets = [
            listening("0.0.0.0:15006", 1),   // envoy, by owner
            listening("0.0.0.0:15020", 2),   // owner hidden, proxy port
            listening("0.0.0.0:8080", 3),    // the app
            listening("[::]:9090", 4),       // owner hidden, not a proxy port
            listening("127.0.0.1:15000", 5), // a python app on a proxy port: counted
        ];
        let owners = HashMap::from([
            (
                1,
                Owner {
                    pid: 10,
                    name: "envoy".into(),
                },
            ),
            (
                3,
                Owner {
                    pid: 11,
                    name: "java".into(),
                },
            ),
            (
                5,
                Owner {
                    pid: 12,
                    name: "python3".into(),
                },
            ),
        ]);
        let got: Vec<_> = app_sockets(&sockets, &owners, &opts())
            .into_iter()
            .map(|s| s.addr.port())
            .collect();
        assert_eq!(got, vec![8080, 9090, 15000]);
    }

    #[test]
    fn ignored_ports_and_processes_do_not_count() {
        let sockets = [listening("0.0.0.0:8080", 3), listening("0.0.0.0:9000", 4)];
        let owners = HashMap::from([(
            4,
            Owner {
                pid: 11,
                name: "sidekick".into(),
            },
        )]);
        let mut o = opts();
        o.ignore_ports = vec![8080];
        o.ignore_processes = vec!["sidekick".into()];
        assert!(app_sockets(&sockets, &owners, &o).is_empty());
    }

    #[test]
    fn a_socket_listed_twice_counts_once() {
        let sockets = [listening("0.0.0.0:8080", 3), listening("[::]:8080", 3)];
        assert_eq!(app_sockets(&sockets, &HashMap::new(), &opts()).len(), 1);
    }
}
