//! The app's own probes and hooks, served on the status port: the kubelet
//! asks `GET /app-health/<container>/livez|readyz|startupz` or
//! `/app-lifecycle/<container>/prestopz|poststartz` (the paths Istio's
//! injector, or `lifeguard inject`, rewrote the pod's probes to), and
//! lifeguard runs the container's original probe against the app, as the
//! kubelet would have, and answers with its result:
//!
//! | probe | app's answer | lifeguard answers |
//! | --- | --- | --- |
//! | `httpGet` | 2xx | the same code and body (at most 10 KiB) |
//! | `httpGet` | 3xx | 200 (a redirect on the same host is followed first) |
//! | `httpGet` | 4xx, 5xx | the same code and body (at most 10 KiB) |
//! | `tcpSocket` | connected | 200 |
//! | `grpc` | `SERVING` | 200 |
//! | `grpc` | any other status, or a gRPC error | 500 naming it |
//! | any | refused, reset, no answer within `timeoutSeconds` | 500 with the reason |
//! | any | [`IN_FLIGHT`] of the path already running past the timeout | 503 |
//!
//! An unknown path under those prefixes is 404. The probes are served for
//! as long as the status port is (through the drain and the linger).
//!
//! The probes are `lifeguard_istio::probers`' (the JSON, checked). Files:
//! `call` (the connection and HTTP
//! exchange), `grpc` (the health check), `error` (why a call failed).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, USER_AGENT};
use hyper::StatusCode;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use call::{HttpAnswer, HttpCall, Target};
use lifeguard_istio::probers::{Action, AppProbes, Checked};
use lifeguard_metrics::{AppProbeMetrics, Metrics};

pub mod call;
mod error;
pub mod grpc;

/// Calls of one path at once; more wait (within the probe's timeout) for
/// one to end, so a flood of probes makes no more than this many calls to
/// the app at once.
pub const IN_FLIGHT: usize = 4;

/// Runs the app's probes. Cloning shares them.
#[derive(Clone)]
pub struct AppProber {
    inner: Arc<Inner>,
}

struct Inner {
    probes: HashMap<String, Entry>,
    target: Target,
    /// The status port, to rewrite a Host that names it.
    status_port: u16,
}

struct Entry {
    probe: Checked,
    slots: Arc<Semaphore>,
    metrics: Option<AppProbeMetrics>,
}

/// How one probe ended, for its counter.
#[derive(Clone, Copy)]
enum Outcome {
    Success = 0,
    Failure = 1,
    Busy = 2,
}

impl AppProber {
    /// The prober of `probes`, reaching the app at `dest` (the pod's
    /// address, or loopback); None when there are no probes.
    pub fn new(probes: &AppProbes, dest: IpAddr, status_port: u16, metrics: Option<&Metrics>) -> Option<AppProber> {
        let probes: HashMap<_, _> = probes
            .checked()
            .into_iter()
            .map(|(path, probe)| {
                let metrics = metrics.map(|m| m.app_probe(&path));
                let slots = Arc::new(Semaphore::new(IN_FLIGHT));
                (path, Entry { probe, slots, metrics })
            })
            .collect();
        if probes.is_empty() {
            return None;
        }
        let target = Target::new(dest);
        Some(AppProber {
            inner: Arc::new(Inner {
                probes,
                target,
                status_port,
            }),
        })
    }

    /// Whether `path` is one of the probes.
    pub fn knows(&self, path: &str) -> bool {
        self.inner.probes.contains_key(path)
    }

    /// The status port's paths of the probes (each a route of its own).
    pub(crate) fn paths(&self) -> impl Iterator<Item = &str> {
        self.inner.probes.keys().map(String::as_str)
    }

    /// Runs the probe of `path` for a kubelet request with `headers`; the
    /// answer for the kubelet. A call, once started, runs to its end or its
    /// timeout even if the kubelet goes away, holding its slot: the app never
    /// sees more than [`IN_FLIGHT`] calls of a path at once.
    pub async fn answer(&self, path: &str, headers: &HeaderMap) -> (StatusCode, Bytes) {
        let Some(entry) = self.inner.probes.get(path) else {
            return (
                StatusCode::NOT_FOUND,
                Bytes::from(format!("no app probe is configured for {path}\n")),
            );
        };
        let started = Instant::now();
        let timeout = entry.probe.timeout;
        let (result, answer) = match tokio::time::timeout(timeout, entry.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => {
                let (prober, path, headers) = (self.clone(), path.to_owned(), headers.clone());
                let call = tokio::spawn(async move {
                    let _slot = slot;
                    let entry = &prober.inner.probes[&path];
                    tokio::time::timeout(timeout, prober.run(&entry.probe.action, &headers)).await
                });
                match call.await {
                    Ok(Ok(Ok(answer))) => (Outcome::Success, answer),
                    Ok(Ok(Err(answer))) => (Outcome::Failure, answer),
                    Ok(Err(_)) => (Outcome::Failure, failure(format!("no answer within {}", Secs(timeout)))),
                    Err(e) => (Outcome::Failure, failure(format!("the probe's task failed: {e}"))),
                }
            }
            _ => (Outcome::Busy, busy(timeout)),
        };
        if let Some(m) = &entry.metrics {
            m.results[result as usize].increment(1);
            m.duration.record(started.elapsed().as_secs_f64());
        }
        if matches!(result, Outcome::Failure | Outcome::Busy) {
            let reason = String::from_utf8_lossy(&answer.1);
            tracing::debug!(path, status = answer.0.as_u16(), reason = %reason.trim_end(), "app probe failed");
        }
        answer
    }

    /// One probe; Ok: the app said yes, Err: it said no or did not answer.
    async fn run(&self, action: &Action, incoming: &HeaderMap) -> Result<(StatusCode, Bytes), (StatusCode, Bytes)> {
        let target = &self.inner.target;
        match action {
            Action::Http {
                port,
                https,
                path,
                headers,
            } => {
                let app = SocketAddr::new(target.dest, *port);
                let headers = call::forwarded_headers(incoming, headers, self.inner.status_port, app);
                let call = HttpCall {
                    port: *port,
                    https: *https,
                    path: path.clone(),
                    headers,
                };
                match call::http_get(target, call).await {
                    Ok(HttpAnswer::Redirect(_)) => Ok((StatusCode::OK, Bytes::new())),
                    Ok(HttpAnswer::Status(code, body)) if code.is_success() => Ok((code, body)),
                    Ok(HttpAnswer::Status(code, body)) => Err((code, body)),
                    Err(why) => Err(failure(why)),
                }
            }
            Action::Tcp { port } => match target.connect_to_probe(*port).await {
                Ok(_) => Ok((StatusCode::OK, Bytes::new())),
                Err(why) => Err(failure(why)),
            },
            Action::Grpc { port, service } => match grpc::check(target, *port, service, incoming.get(USER_AGENT)).await
            {
                Ok(grpc::Health::Status("SERVING")) => Ok((StatusCode::OK, Bytes::from_static(b"SERVING\n"))),
                Ok(grpc::Health::Status(other)) => Err(failure(format!("the app's health service answered {other}"))),
                Ok(grpc::Health::Failed(status)) => Err(failure(format!("the health check failed: {status}"))),
                Err(why) => Err(failure(why)),
            },
        }
    }
}

/// The answer when every slot of the path stayed taken for the whole timeout.
fn busy(timeout: Duration) -> (StatusCode, Bytes) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from(format!(
            "{IN_FLIGHT} probes of this path are already in flight; none ended within {}\n",
            Secs(timeout)
        )),
    )
}

fn failure(why: impl std::fmt::Display) -> (StatusCode, Bytes) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Bytes::from(format!("app probe failed: {why}\n")),
    )
}

/// A timeout as the probe spec gives it: whole seconds.
struct Secs(Duration);

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}s", self.0.as_secs())
    }
}
