//! The client for Envoy's admin API (127.0.0.1:15000 in a sidecar, or a
//! Unix socket only the proxy's container can reach).
//!
//! Every call opens a fresh connection (loopback TCP or a Unix socket,
//! through [`lifeguard_http`]), and the whole exchange (connect,
//! request, reading the body) runs under one timeout, so a hung or slow
//! Envoy costs at most that timeout and never a stuck task; the one
//! exception is the merged scrape's streamed read ([`AdminClient::open`]),
//! which its caller bounds by the scrape's budget. Bodies are read up to a
//! limit: an Envoy that answers with megabytes of garbage is an error, not
//! an out-of-memory.
//!
//! The connection is driven inside the caller's future rather than in a
//! spawned task, so nothing outlives the call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use lifeguard_base::url::LoopbackUrl;
use lifeguard_drain::Patience;
use lifeguard_http::LocalStream;
use lifeguard_http::{fetch, FetchError};

/// Why an admin call did not produce a usable body.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot connect to Envoy admin at {url}: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("Envoy admin at {url} did not answer within {}", lifeguard_base::duration::GoDuration(*.timeout))]
    Timeout { url: String, timeout: Duration },
    #[error("Envoy admin HTTP error: {0}")]
    Http(#[from] hyper::Error),
    #[error("Envoy admin answered {status} to {path}: {body}")]
    Status {
        status: StatusCode,
        path: String,
        body: String,
    },
    #[error("Envoy admin answer to {path} is larger than {limit} bytes")]
    TooLarge { path: String, limit: usize },
    #[error("Envoy admin answer to {path} is not UTF-8 text")]
    NotText { path: String },
    #[error("{path:?} is not a valid request path")]
    BadPath { path: String },
}

/// A request's failure, told as Envoy's admin's.
impl From<FetchError> for AdminError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Connect { url, source } => AdminError::Connect { url, source },
            FetchError::Http(e) => AdminError::Http(e),
            FetchError::TooLarge { path, limit } => AdminError::TooLarge { path, limit },
            FetchError::BadPath { path } => AdminError::BadPath { path },
        }
    }
}

impl AdminError {
    /// Whether the call got no answer in time (as opposed to a definite one:
    /// refused, an error status, a broken body).
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(self, AdminError::Timeout { .. })
    }
}

/// The admin endpoints lifeguard calls. The caller names the endpoint of
/// each call (nothing is guessed from the path); the observer gets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Endpoint {
    /// `/ready`
    Ready,
    /// `/stats?...` (readiness and drain counts)
    Stats,
    /// `/stats/prometheus`
    #[strum(serialize = "stats_prometheus")]
    Prometheus,
    /// `/drain_listeners`
    DrainListeners,
    /// `/quitquitquit`
    #[strum(serialize = "quitquitquit")]
    Quit,
    /// `/config_dump` (the listeners, once a drain)
    ConfigDump,
    /// `/server_info` (Envoy's version, read once)
    ServerInfo,
    /// `/healthcheck/fail` (the load balancers' checks fail from the drain's start)
    HealthcheckFail,
}

/// How an admin call ended, for the observer: the `outcome` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CallOutcome {
    Ok,
    Error,
    Timeout,
}

/// Told of every admin call: which endpoint, how it ended, how long it took.
/// The binary wires this to the metrics; the client knows nothing of them.
pub(crate) type Observer = Arc<dyn Fn(Endpoint, CallOutcome, Duration) + Send + Sync>;

/// A client for one Envoy admin endpoint.
#[derive(Clone)]
pub struct AdminClient {
    url: LoopbackUrl,
    timeout: Duration,
    observer: Option<Observer>,
}

/// Largest `/stats` answer accepted for the small filtered queries.
pub const STATS_LIMIT: usize = 1 << 20;

/// Largest answer to the drain's active-count read. It has a few lines per
/// listener (one per worker too): about 150 bytes a listener with two
/// workers, so 64 MiB is some 400,000 listeners, far past any real config.
pub const ACTIVE_LIMIT: usize = 64 << 20;

impl AdminClient {
    pub fn new(url: LoopbackUrl, timeout: Duration) -> Self {
        Self {
            url,
            timeout,
            observer: None,
        }
    }

    /// How long each call is waited for.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same client, waiting as `patience` says for each call.
    pub(crate) fn patient(&self, patience: Patience) -> AdminClient {
        self.waiting(patience.timeout(self.timeout))
    }

    /// The same client, waiting `timeout` for each call.
    pub(crate) fn waiting(&self, timeout: Duration) -> AdminClient {
        AdminClient {
            timeout,
            ..self.clone()
        }
    }

    /// The same client, telling `observer` of every call.
    pub fn observed(self, observer: Observer) -> Self {
        Self {
            observer: Some(observer),
            ..self
        }
    }

    /// `GET path`, expecting 200 and a UTF-8 body of at most `limit` bytes.
    pub(crate) async fn get_text(&self, endpoint: Endpoint, path: &str, limit: usize) -> Result<String, AdminError> {
        let body = self.call(endpoint, Method::GET, path, limit).await?;
        String::from_utf8(body.into()).map_err(|_| AdminError::NotText { path: path.into() })
    }

    /// `POST path`, expecting 200; returns the body.
    pub(crate) async fn post(&self, endpoint: Endpoint, path: &str) -> Result<Bytes, AdminError> {
        self.call(endpoint, Method::POST, path, 64 * 1024).await
    }

    /// One request on a fresh connection, all of it under `self.timeout`.
    pub(crate) async fn call(
        &self,
        endpoint: Endpoint,
        method: Method,
        path: &str,
        limit: usize,
    ) -> Result<Bytes, AdminError> {
        self.timed(endpoint, async {
            let (status, body) = fetch(&self.url, method, path, limit).await?;
            check_status(status, body, path)
        })
        .await
    }

    /// `GET path` under `self.timeout`: the status, whatever it is, and up
    /// to `limit` bytes of body (`/ready` answers 503 with a state name).
    pub async fn get_any(
        &self,
        endpoint: Endpoint,
        path: &str,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), AdminError> {
        let exchange = async { Ok(fetch(&self.url, Method::GET, path, limit).await?) };
        self.timed(endpoint, exchange).await
    }

    async fn timed<T>(
        &self,
        endpoint: Endpoint,
        exchange: impl Future<Output = Result<T, AdminError>>,
    ) -> Result<T, AdminError> {
        let started = tokio::time::Instant::now();
        let result = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(AdminError::Timeout {
                url: self.url.to_string(),
                timeout: self.timeout,
            }),
        };
        let outcome = match &result {
            Ok(_) => CallOutcome::Ok,
            Err(AdminError::Timeout { .. }) => CallOutcome::Timeout,
            Err(_) => CallOutcome::Error,
        };
        self.observe(endpoint, outcome, started.elapsed());
        result
    }

    /// Tells the observer of a call made outside `AdminClient::call`
    /// (a streamed read, timed by its caller).
    pub fn observe(&self, endpoint: Endpoint, outcome: CallOutcome, took: Duration) {
        if let Some(observer) = &self.observer {
            observer(endpoint, outcome, took);
        }
    }

    /// `GET path` on a fresh connection, answered with its status and a
    /// body read chunk by chunk ([`BodyStream`]). No timeout and no
    /// observer: the caller bounds and reports the whole read.
    pub async fn open(&self, path: &str) -> Result<(StatusCode, BodyStream), AdminError> {
        let stream = lifeguard_http::connect(&self.url)
            .await
            .map_err(|source| AdminError::Connect {
                url: self.url.to_string(),
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let request = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(hyper::header::HOST, self.url.authority())
            .body(Empty::<Bytes>::new())
            .map_err(|_| AdminError::BadPath { path: path.to_owned() })?;
        let mut conn = Box::pin(conn);
        let mut conn_done = false;
        let response = {
            let send = sender.send_request(request);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    biased;
                    response = &mut send => break response?,
                    result = &mut conn, if !conn_done => {
                        conn_done = true;
                        result?;
                    }
                }
            }
        };
        let status = response.status();
        Ok((
            status,
            BodyStream {
                conn,
                conn_done,
                body: response.into_body(),
            },
        ))
    }
}

/// The body of a response from [`AdminClient::open`], read chunk by chunk
/// as Envoy sends it (each chunk is hyper's buffer, not a copy). The
/// connection is driven while chunks are awaited; dropping this closes it.
pub struct BodyStream {
    conn: Pin<Box<hyper::client::conn::http1::Connection<TokioIo<LocalStream>, Empty<Bytes>>>>,
    conn_done: bool,
    body: hyper::body::Incoming,
}

impl BodyStream {
    /// The next chunk of the body, or None at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, AdminError> {
        loop {
            tokio::select! {
                biased;
                frame = self.body.frame() => match frame {
                    None => return Ok(None),
                    Some(Err(e)) => return Err(AdminError::Http(e)),
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            return Ok(Some(data));
                        }
                    }
                },
                result = &mut self.conn, if !self.conn_done => {
                    self.conn_done = true;
                    result?;
                }
            }
        }
    }
}

/// The body of a 200 answer, or the error naming the status and the first
/// line of the body.
pub fn check_status(status: StatusCode, body: Bytes, path: &str) -> Result<Bytes, AdminError> {
    if status != StatusCode::OK {
        let text = String::from_utf8_lossy(&body);
        let first = text.lines().next().unwrap_or("").chars().take(200).collect();
        return Err(AdminError::Status {
            status,
            path: path.to_owned(),
            body: first,
        });
    }
    Ok(body)
}
