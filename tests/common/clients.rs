//! The tests' one HTTP client, [`request`]: one request on a fresh
//! connection, over TCP or a Unix socket, any method and headers, within a
//! timeout; the whole [`Answer`], read by its framing (content-length,
//! chunked, or to the end), so a draining Envoy that keeps the socket open
//! a while after `connection: close` does not hold it up; the connection
//! closed once the answer is in, so no idle connection of ours is ever
//! counted by a drain. Hyper's client does the HTTP: no test parses an
//! answer by hand. Beside it: its short forms (`get`, `http`,
//! `http_timeout`, `unix_get`, `unix_post`), a keep-alive client, an idle
//! keep-alive connection held open (raw on purpose), and reading a sample
//! out of a Prometheus scrape.

use std::cell::Cell;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::runtime::Runtime;

/// Where a request goes: a TCP address, or a Unix socket's path.
#[derive(Debug, Clone, Copy)]
pub enum To<'a> {
    Tcp(SocketAddr),
    Unix(&'a Path),
}

impl From<SocketAddr> for To<'_> {
    fn from(addr: SocketAddr) -> Self {
        To::Tcp(addr)
    }
}

impl<'a> From<&'a Path> for To<'a> {
    fn from(socket: &'a Path) -> Self {
        To::Unix(socket)
    }
}

/// An answer: its status, its headers (names lowercase, in their order)
/// and its body as it came (not decompressed).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The first value of the header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as text, gunzipped first when it came gzipped
    /// (`content-encoding: gzip`); panics when it does not decode whole.
    pub fn decoded(&self) -> String {
        if self.header("content-encoding") != Some("gzip") {
            return self.text();
        }
        let mut text = String::new();
        flate2::read::GzDecoder::new(&self.body[..])
            .read_to_string(&mut text)
            .expect("a whole gzip member of UTF-8 text");
        text
    }
}

/// One request on a fresh connection to `to` (a `SocketAddr` or a Unix
/// socket's `&Path`): `method path` with `headers` (and a `host` header
/// when they have none), within `timeout` from connecting to the answer's
/// last byte. The connection is closed once the answer is in.
pub fn request<'a>(
    to: impl Into<To<'a>>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> io::Result<Answer> {
    let to = to.into();
    let host = match to {
        To::Tcp(addr) => addr.to_string(),
        To::Unix(_) => "localhost".to_owned(),
    };
    let request = build(method, &host, path, headers)?;
    // A runtime for this request alone: dropping it closes the connection.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let exchange = async {
            match to {
                To::Tcp(addr) => {
                    let stream = tokio::net::TcpStream::connect(addr).await?;
                    stream.set_nodelay(true)?;
                    exchange(&mut handshake(stream).await?, request).await
                }
                To::Unix(socket) => {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    exchange(&mut handshake(stream).await?, request).await
                }
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole answer within {timeout:?}"),
            )),
        }
    })
}

/// The request: `method path`, `host` unless `headers` has one, `headers`.
fn build(method: &str, host: &str, path: &str, headers: &[(&str, &str)]) -> io::Result<Request<Empty<Bytes>>> {
    let method = Method::from_bytes(method.as_bytes()).map_err(io::Error::other)?;
    let mut builder = Request::builder().method(method).uri(path);
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        builder = builder.header("host", host);
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Empty::new()).map_err(io::Error::other)
}

/// An HTTP/1.1 client connection on `io`, driven by a task of the current
/// runtime (which ends with it).
async fn handshake<IO>(io: IO) -> io::Result<SendRequest<Empty<Bytes>>>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io)).await.map_err(io::Error::other)?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends `request` on `sender`'s connection and reads the whole answer.
async fn exchange(sender: &mut SendRequest<Empty<Bytes>>, request: Request<Empty<Bytes>>) -> io::Result<Answer> {
    let response = sender.send_request(request).await.map_err(io::Error::other)?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response.into_body().collect().await.map_err(io::Error::other)?;
    Ok(Answer {
        status,
        headers,
        body: body.to_bytes().to_vec(),
    })
}

/// `method path` on a fresh connection (`connection: close`) within
/// `timeout`: the status and the body as text.
pub fn http_timeout(method: &str, addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let answer = request(addr, method, path, &[("connection", "close")], timeout)?;
    Ok((answer.status, answer.text()))
}

/// [`http_timeout`] within 5 s.
pub fn http(method: &str, addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    http_timeout(method, addr, path, Duration::from_secs(5))
}

/// `GET path` within 5 s: the status and the body.
pub fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    http("GET", addr, path)
}

/// `GET path` over a Unix socket within 10 s: the status and the body.
pub fn unix_get(socket: &Path, path: &str) -> io::Result<(u16, String)> {
    let answer = request(socket, "GET", path, &[("connection", "close")], Duration::from_secs(10))?;
    Ok((answer.status, answer.text()))
}

/// `POST path` (no body) over a Unix socket within 10 s: the status and
/// the body.
pub fn unix_post(socket: &Path, path: &str) -> io::Result<(u16, String)> {
    let answer = request(
        socket,
        "POST",
        path,
        &[("connection", "close")],
        Duration::from_secs(10),
    )?;
    Ok((answer.status, answer.text()))
}

/// A client that keeps its connection open between requests (the
/// benchmark probes in a tight loop on one keep-alive connection; a pod's
/// client polls `GET /drain` on one). A connection the server closed is
/// replaced, and a request that fails on a reused connection is sent once
/// more on a new one.
pub struct KeepAliveClient {
    runtime: Runtime,
    connection: Cell<Option<(SocketAddr, SendRequest<Empty<Bytes>>)>>,
}

impl KeepAliveClient {
    pub fn new() -> KeepAliveClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        KeepAliveClient {
            runtime,
            connection: Cell::new(None),
        }
    }

    /// `GET path` within `timeout`: the status and the body.
    pub fn get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
        let host = addr.to_string();
        let kept = self
            .connection
            .take()
            .filter(|(to, sender)| *to == addr && !sender.is_closed());
        let answer = self.runtime.block_on(async {
            tokio::time::timeout(timeout, async {
                if let Some((_, mut sender)) = kept {
                    let ready = sender.ready().await.is_ok();
                    if ready {
                        if let Ok(answer) = exchange(&mut sender, build("GET", &host, path, &[])?).await {
                            return Ok((answer, sender));
                        }
                    }
                }
                let stream = tokio::net::TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                let mut sender = handshake(stream).await?;
                let answer = exchange(&mut sender, build("GET", &host, path, &[])?).await?;
                Ok((answer, sender))
            })
            .await
            .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")))
        });
        let (answer, sender) = answer?;
        self.connection.set(Some((addr, sender)));
        Ok((answer.status, answer.text()))
    }
}

impl Default for KeepAliveClient {
    fn default() -> Self {
        KeepAliveClient::new()
    }
}

/// A keep-alive client connection: sends one request, reads the answer and
/// keeps the socket open (idle) until dropped. Raw on purpose: the test is
/// about the idle socket, which a pooling client would hide.
pub fn idle_keepalive_connection(addr: SocketAddr, path: &str) -> TcpStream {
    use std::io::Write;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    while !raw.ends_with(b"done\n") {
        let n = stream.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed before the answer");
        raw.extend_from_slice(&chunk[..n]);
    }
    assert!(raw.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&raw));
    stream
}

/// The value of the sample named exactly `series` (name and labels) in a
/// Prometheus scrape.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Answer times, sorted: their median, 99th percentile and slowest (zero
/// when there are none).
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut times: Vec<Duration>) -> Latencies {
        times.sort();
        Latencies(times)
    }

    /// The time at `percent` of the way through (the `len × percent / 100`th).
    fn at(&self, percent: usize) -> Duration {
        let i = (self.0.len() * percent / 100).min(self.0.len().saturating_sub(1));
        self.0.get(i).copied().unwrap_or_default()
    }

    pub fn median(&self) -> Duration {
        self.at(50)
    }

    pub fn p99(&self) -> Duration {
        self.at(99)
    }

    pub fn slowest(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
}

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} probes, p50 {:?}, p99 {:?}, max {:?}",
            self.0.len(),
            self.median(),
            self.p99(),
            self.slowest()
        )
    }
}
