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
//! | any | `IN_FLIGHT` of the path already running past the timeout | 503 |
//!
//! An unknown path under those prefixes is 404. The probes are served for
//! as long as the status port is (through the drain and the linger).
//!
//! The probes are `lifeguard_istio::probers`' (the JSON, checked). Files:
//! `call` (the connection and HTTP
//! exchange), `grpc` (the health check), `error` (why a call failed).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, USER_AGENT};
use hyper::StatusCode;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use call::{HttpAnswer, HttpCall, ProbeTarget};
use grpc::{Health, ServingStatus};
use lifeguard_base::reason::ByReason;
use lifeguard_istio::probers::{Action, AppProbes, Checked};
use lifeguard_metrics::{CounterFamily, Metrics};
use metrics::{Counter, Histogram};

pub mod call;
mod error;
pub mod grpc;

/// How one app probe ended, its series' `result` label
/// (`lifeguard_app_probe_results_total{path,result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum AppProbeResult {
    /// The app said yes.
    Success,
    /// The app said no, or did not answer in time.
    Failure,
    /// Too many probes of the path were in flight.
    Busy,
}

/// One app probe's series: its results, and the duration of its calls.
#[derive(Clone)]
struct AppProbeMetrics {
    results: ByReason<AppProbeResult, Counter>,
    duration: Histogram,
}

impl AppProbeMetrics {
    /// The series of the probe served on `path`, there from now.
    fn new(metrics: &Metrics, path: &str) -> AppProbeMetrics {
        AppProbeMetrics {
            results: metrics.counters(CounterFamily::APP_PROBE_RESULTS, &[("path", path)], |_| true),
            duration: metrics.app_probe_duration(path),
        }
    }

    /// Counts one probe that ended with `result`, having taken `took`.
    fn record(&self, result: AppProbeResult, took: Duration) {
        self.results.get(result).increment(1);
        self.duration.record(took.as_secs_f64());
    }
}

/// Calls of one path at once; more wait (within the probe's timeout) for
/// one to end, so a flood of probes makes no more than this many calls to
/// the app at once.
pub(crate) const IN_FLIGHT: usize = 4;

/// The app's probes, each to be served on its own path. Cloning shares them.
#[derive(Clone)]
pub struct AppProber {
    probes: Vec<AppProbe>,
}

/// One of the app's probes, with what running it needs: the route of its
/// path holds it. Cloning shares it (and its slots).
#[derive(Clone)]
pub(crate) struct AppProbe {
    inner: Arc<Entry>,
}

struct Entry {
    /// The status port's path it is served on.
    path: String,
    probe: Checked,
    slots: Arc<Semaphore>,
    metrics: Option<AppProbeMetrics>,
    app: Arc<App>,
}

/// Where the probes reach the app, shared by them all.
struct App {
    target: ProbeTarget,
    /// The status port, to rewrite a Host that names it.
    status_port: u16,
}

impl AppProber {
    /// The prober of `probes`, reaching the app at `dest` (the pod's
    /// address, or loopback); None when there are no probes.
    pub fn new(probes: &AppProbes, dest: IpAddr, status_port: u16, metrics: Option<&Metrics>) -> Option<AppProber> {
        let app = Arc::new(App {
            target: ProbeTarget::new(dest),
            status_port,
        });
        let probes: Vec<_> = probes
            .checked()
            .into_iter()
            .map(|(path, probe)| AppProbe {
                inner: Arc::new(Entry {
                    metrics: metrics.map(|m| AppProbeMetrics::new(m, &path)),
                    slots: Arc::new(Semaphore::new(IN_FLIGHT)),
                    path,
                    probe,
                    app: app.clone(),
                }),
            })
            .collect();
        if probes.is_empty() {
            return None;
        }
        Some(AppProber { probes })
    }

    /// The probes, each a route of its own.
    pub(crate) fn probes(&self) -> impl Iterator<Item = &AppProbe> {
        self.probes.iter()
    }
}

impl AppProbe {
    /// The status port's path of the probe.
    pub(crate) fn path(&self) -> &str {
        &self.inner.path
    }

    /// Runs the probe for a kubelet request with `headers`; the answer for
    /// the kubelet. A call, once started, runs to its end or its timeout
    /// even if the kubelet goes away, holding its slot: the app never sees
    /// more than [`IN_FLIGHT`] calls of a path at once.
    pub(crate) async fn answer(&self, headers: &HeaderMap) -> (StatusCode, Bytes) {
        let entry = &*self.inner;
        let started = Instant::now();
        let timeout = entry.probe.timeout;
        let (result, answer) = match tokio::time::timeout(timeout, entry.slots.clone().acquire_owned()).await {
            Ok(Ok(slot)) => {
                let (probe, headers) = (self.clone(), headers.clone());
                let call = tokio::spawn(async move {
                    let _slot = slot;
                    tokio::time::timeout(timeout, probe.run(&headers)).await
                });
                match call.await {
                    Ok(Ok(Ok(answer))) => (AppProbeResult::Success, answer),
                    Ok(Ok(Err(answer))) => (AppProbeResult::Failure, answer),
                    Ok(Err(_)) => (
                        AppProbeResult::Failure,
                        failure(format!("no answer within {}", Secs(timeout))),
                    ),
                    Err(e) => (
                        AppProbeResult::Failure,
                        failure(format!("the probe's task failed: {e}")),
                    ),
                }
            }
            _ => (AppProbeResult::Busy, busy(timeout)),
        };
        if let Some(m) = &entry.metrics {
            m.record(result, started.elapsed());
        }
        if result != AppProbeResult::Success {
            let reason = String::from_utf8_lossy(&answer.1);
            let (path, status) = (&entry.path, answer.0.as_u16());
            tracing::debug!(path, status, reason = %reason.trim_end(), "app probe failed");
        }
        answer
    }

    /// One probe; Ok: the app said yes, Err: it said no or did not answer.
    async fn run(&self, incoming: &HeaderMap) -> Result<(StatusCode, Bytes), (StatusCode, Bytes)> {
        let App { target, status_port } = &*self.inner.app;
        match &self.inner.probe.action {
            Action::Http {
                port,
                https,
                path,
                headers,
            } => {
                let app = SocketAddr::new(target.dest, *port);
                let headers = call::forwarded_headers(incoming, headers, *status_port, app);
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
                Ok(health) => grpc_answer(health),
                Err(why) => Err(failure(why)),
            },
        }
    }
}

/// The answer to a gRPC probe the app's health service answered: 200 when
/// it is serving, else 500 naming its status or the failed call's.
fn grpc_answer(health: Health) -> Result<(StatusCode, Bytes), (StatusCode, Bytes)> {
    match health {
        Health::Status(ServingStatus::Serving) => Ok((StatusCode::OK, Bytes::from_static(b"SERVING\n"))),
        Health::Status(other) => Err(failure(format!("the app's health service answered {}", other.name()))),
        Health::Failed(status) => Err(failure(format!("the health check failed: {status}"))),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC probe is 200 only when the service is serving; any other
    /// status, or a failed call, is 500 naming it.
    #[test]
    fn a_grpc_status_gives_its_http_code() {
        let answer = |health| match grpc_answer(health) {
            Ok((code, body)) | Err((code, body)) => (code.as_u16(), String::from_utf8(body.to_vec()).unwrap()),
        };
        assert_eq!(
            answer(Health::Status(ServingStatus::Serving)),
            (200, "SERVING\n".into())
        );
        for (status, name) in [
            (ServingStatus::NotServing, "NOT_SERVING"),
            (ServingStatus::Unknown, "UNKNOWN"),
            (ServingStatus::ServiceUnknown, "SERVICE_UNKNOWN"),
        ] {
            let body = format!("app probe failed: the app's health service answered {name}\n");
            assert_eq!(answer(Health::Status(status)), (500, body));
        }
        assert_eq!(
            answer(Health::Failed("NOT_FOUND unknown service".into())),
            (
                500,
                "app probe failed: the health check failed: NOT_FOUND unknown service\n".into()
            )
        );
    }
}
