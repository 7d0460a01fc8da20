//! HTTP clients of the tests: one request per connection (`http`, `get`,
//! with a timeout, with headers), a keep-alive client, requests over a
//! Unix socket, an idle keep-alive connection held open, and reading a
//! sample out of a Prometheus scrape.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// A client that answers any status as a response (not an error), uses no
/// proxy, follows no redirect and keeps up to `idle` connections open.
fn new_client(idle: usize) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .max_redirects(0)
        .max_redirects_will_error(false)
        .allow_non_standard_methods(true)
        .max_idle_connections(idle)
        .max_idle_connections_per_host(idle)
        .build()
        .new_agent()
}

/// The client of `http`: one request per connection (`connection: close`,
/// no pool), so no idle connection of ours is ever counted by a drain.
fn client() -> &'static ureq::Agent {
    static CLIENT: OnceLock<ureq::Agent> = OnceLock::new();
    CLIENT.get_or_init(|| new_client(0))
}

/// Runs `request` on `agent` within `timeout` (connect to the last body
/// byte); returns status and body.
fn exchange(
    agent: &ureq::Agent,
    request: ureq::http::Request<()>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let (status, _, body) = answer(agent, request, timeout)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Runs `request` on `agent` within `timeout`: the whole [`Answer`].
fn answer(agent: &ureq::Agent, request: ureq::http::Request<()>, timeout: Duration) -> std::io::Result<Answer> {
    let request = agent.configure_request(request).timeout_global(Some(timeout)).build();
    let mut response = agent.run(request).map_err(ureq::Error::into_io)?;
    let status = response.status().as_u16();
    let answer_headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .map_err(ureq::Error::into_io)?;
    Ok((status, answer_headers, body))
}

fn build(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<ureq::http::request::Builder> {
    let method = ureq::http::Method::from_bytes(method.as_bytes()).map_err(std::io::Error::other)?;
    Ok(ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}")))
}

/// One HTTP/1.1 request on a fresh connection; returns status and body.
pub fn http(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_timeout(method, addr, path, Duration::from_secs(5))
}

/// `GET path` over a Unix socket: the status and the body.
pub fn unix_get(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    unix_request("GET", socket, path)
}

/// `POST path` (no body) over a Unix socket: the status and the body.
pub fn unix_post(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    unix_request("POST", socket, path)
}

/// One request over a Unix socket (HTTP/1.1, `connection: close`, so the
/// answer ends with the connection): the status and the body, chunked or
/// not.
fn unix_request(method: &str, socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer");
    let (head, mut rest) = answer.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Ok((status, rest.to_owned()));
    }
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").ok_or_else(bad)?;
        let size = usize::from_str_radix(size.trim(), 16).map_err(|_| bad())?;
        if size == 0 {
            return Ok((status, body));
        }
        body.push_str(after.get(..size).ok_or_else(bad)?);
        rest = after.get(size + 2..).ok_or_else(bad)?;
    }
}

/// An answer: its status, its headers (names lowercase) and its body.
pub type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// One request on a fresh connection with `headers` (and no `connection`
/// header of its own: the answer's says what the server wants), within
/// 10 s: the status, the answer's headers (names lowercase) and its body.
pub fn http_with_headers(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    http_with_headers_within(method, addr, path, headers, Duration::from_secs(10))
}

/// `http_with_headers` within `timeout`.
pub fn http_with_headers_within(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Answer> {
    let mut builder = build(method, addr, path)?;
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(()).map_err(std::io::Error::other)?;
    answer(client(), request, timeout)
}

pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http("GET", addr, path)
}

/// `http` with a caller-chosen timeout. The answer is read by its framing
/// (content-length, chunked, or to the end), so a draining Envoy that keeps
/// the socket open a while after `connection: close` does not hold it up.
pub fn http_timeout(method: &str, addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let request = build(method, addr, path)?
        .header("connection", "close")
        .body(())
        .map_err(std::io::Error::other)?;
    exchange(client(), request, timeout)
}

/// A client that keeps its connection open between requests (the
/// benchmark probes in a tight loop on one keep-alive connection).
pub struct KeepAliveClient(ureq::Agent);

impl KeepAliveClient {
    pub fn new() -> KeepAliveClient {
        KeepAliveClient(new_client(1))
    }

    pub fn get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
        let request = build("GET", addr, path)?.body(()).map_err(std::io::Error::other)?;
        exchange(&self.0, request, timeout)
    }
}

/// A keep-alive client connection: sends one request, reads the answer and
/// keeps the socket open (idle) until dropped. Raw on purpose: the test is
/// about the idle socket, which a pooling client would hide.
pub fn idle_keepalive_connection(addr: SocketAddr, path: &str) -> TcpStream {
    use std::io::{Read, Write};
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
