//! One call to the app, made the way the kubelet makes it: a new
//! connection per probe, to the pod's address, from the source address the
//! capture rules leave alone; TLS without certificate checks; HTTP/2 when
//! the app offers it over TLS; redirects followed on the same host.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, LOCATION};
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

use super::error::ProbeError;

/// The most of an app's answer passed on to the kubelet (as the kubelet
/// itself reads at most this much of a probe's body).
pub const BODY_CAP: usize = 10 * 1024;

/// Redirects followed before the probe fails, as the kubelet.
const MAX_REDIRECTS: usize = 10;

/// Headers of one hop only, never forwarded to the app.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "http2-settings",
];

/// Where the app is reached, and from where.
pub(crate) struct ProbeTarget {
    /// The pod's address (or loopback, in the legacy mode).
    pub(crate) dest: IpAddr,
    /// 127.0.0.6 or ::6: the capture rules do not redirect traffic from it.
    source: IpAddr,
    /// Set once binding the source failed (logged once, then not tried again).
    source_missing: AtomicBool,
    tls: TlsConnector,
}

impl ProbeTarget {
    pub(crate) fn new(dest: IpAddr) -> ProbeTarget {
        let source = match dest {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)),
        };
        ProbeTarget {
            dest,
            source,
            source_missing: AtomicBool::new(false),
            tls: tls_connector(),
        }
    }

    /// A new TCP connection to the app's `port`, or why not.
    pub(crate) async fn connect_to_probe(&self, port: u16) -> Result<TcpStream, ProbeError> {
        self.connect(port).await.map_err(|source| ProbeError::Connect {
            addr: SocketAddr::new(self.dest, port),
            source,
        })
    }

    /// A new TCP connection to the app's `port`.
    async fn connect(&self, port: u16) -> io::Result<TcpStream> {
        let addr = SocketAddr::new(self.dest, port);
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if !self.source_missing.load(Ordering::Relaxed) {
            let _ = lifeguard_sys::bind_address_no_port(&socket);
            if let Err(e) = socket.bind(SocketAddr::new(self.source, 0)) {
                if !self.source_missing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(source = %self.source, error = %e,
                        "app probes cannot use their source address; they go from the pod's own address, \
                         which the capture rules may redirect to Envoy");
                }
            }
        }
        socket.set_nodelay(true)?;
        socket.connect(addr).await
    }
}

/// What an HTTP probe asks: the first request's port, scheme and path,
/// and its headers (Host included).
pub struct HttpCall {
    pub port: u16,
    pub https: bool,
    pub path: String,
    pub headers: HeaderMap,
}

/// The app's answer to an HTTP probe.
#[derive(Debug, PartialEq)]
pub(crate) enum HttpAnswer {
    /// The final answer: its code and at most [`BODY_CAP`] of its body.
    Status(StatusCode, Bytes),
    /// A redirect without a Location, or to another host: a success, as
    /// for the kubelet.
    Redirect(StatusCode),
}

/// Runs an HTTP probe, following redirects on the same host.
pub(crate) async fn http_get(target: &ProbeTarget, mut call: HttpCall) -> Result<HttpAnswer, ProbeError> {
    for _ in 0..=MAX_REDIRECTS {
        let (status, location, body) = http_once(target, &call).await?;
        if !status.is_redirection() {
            return Ok(HttpAnswer::Status(status, body));
        }
        let Some(next) = location.and_then(|l| follow(&call, &l, target.dest)) else {
            return Ok(HttpAnswer::Redirect(status));
        };
        (call.https, call.port, call.path) = next;
    }
    Err(ProbeError::Redirects(MAX_REDIRECTS))
}

/// Where a redirect leads, when it stays on the app's host: scheme, port
/// and path. None: no usable Location, or another host.
pub fn follow(call: &HttpCall, location: &str, dest: IpAddr) -> Option<(bool, u16, String)> {
    if location.starts_with('/') && !location.starts_with("//") {
        return Some((call.https, call.port, location.to_owned()));
    }
    let uri: Uri = location.parse().ok()?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return None,
    };
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<IpAddr>().ok()? != dest {
        return None;
    }
    // A port that is there but not a number is refused, not taken as the
    // scheme's default ("10.0.0.5:80x").
    let authority = uri.authority()?.as_str();
    let port = match uri.port_u16() {
        Some(port) => port,
        None if authority.ends_with(']') || !authority.contains(':') => {
            if https {
                443
            } else {
                80
            }
        }
        None => return None,
    };
    // The path the request line takes: never empty ("http://h?q" is "/?q").
    let mut path = match uri.path() {
        "" => "/".to_owned(),
        p => p.to_owned(),
    };
    if let Some(query) = uri.query() {
        path.push('?');
        path.push_str(query);
    }
    Some((https, port, path))
}

/// One request and its answer: status, Location, the body's first bytes.
async fn http_once(target: &ProbeTarget, call: &HttpCall) -> Result<(StatusCode, Option<String>, Bytes), ProbeError> {
    let tcp = target.connect_to_probe(call.port).await?;
    if !call.https {
        return exchange(TokioIo::new(tcp), false, call, target.dest).await;
    }
    let name = ServerName::IpAddress(target.dest.into());
    let tls = target.tls.connect(name, tcp).await.map_err(|source| ProbeError::Tls {
        addr: SocketAddr::new(target.dest, call.port),
        source,
    })?;
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    exchange(TokioIo::new(tls), h2, call, target.dest).await
}

/// Sends the GET over `io` (HTTP/1.1, or HTTP/2 when `h2`) and reads the
/// answer, driving the connection meanwhile; the connection ends with it.
pub async fn exchange<IO>(
    io: TokioIo<IO>,
    h2: bool,
    call: &HttpCall,
    dest: IpAddr,
) -> Result<(StatusCode, Option<String>, Bytes), ProbeError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let request = build_request(call, h2, dest)?;
    let failed = ProbeError::Exchange;
    if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(failed)?;
        let ask = async move {
            let answer = sender.send_request(request).await.map_err(failed)?;
            read_answer(answer).await
        };
        let (answer, _) = tokio::join!(ask, conn);
        return answer;
    }
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(failed)?;
    let ask = async move {
        let answer = sender.send_request(request).await.map_err(failed)?;
        read_answer(answer).await
    };
    let (answer, _) = tokio::join!(ask, conn);
    answer
}

fn build_request(call: &HttpCall, h2: bool, dest: IpAddr) -> Result<Request<Empty<Bytes>>, ProbeError> {
    let host = call.headers.get(HOST).and_then(|h| h.to_str().ok());
    let uri = match (h2, host) {
        (true, Some(host)) => format!("https://{host}{}", call.path),
        (true, None) => format!("https://{}{}", SocketAddr::new(dest, call.port), call.path),
        (false, _) => call.path.clone(),
    };
    let mut request = Request::get(uri).body(Empty::new()).map_err(ProbeError::Request)?;
    let headers = request.headers_mut();
    for (name, value) in &call.headers {
        if !(h2 && name == HOST) {
            headers.append(name, value.clone());
        }
    }
    if !h2 {
        // One request per connection, as the kubelet: the app closes first,
        // so the closed connection waits out TIME_WAIT on its side.
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(request)
}

/// Reads the status, the Location and the body's first [`BODY_CAP`] bytes.
async fn read_answer(answer: hyper::Response<Incoming>) -> Result<(StatusCode, Option<String>, Bytes), ProbeError> {
    let status = answer.status();
    let location = answer
        .headers()
        .get(LOCATION)
        .and_then(|l| l.to_str().ok())
        .map(str::to_owned);
    let mut body = answer.into_body();
    let mut out = BytesMut::new();
    if status.is_redirection() {
        return Ok((status, location, Bytes::new()));
    }
    while out.len() < BODY_CAP {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data[..data.len().min(BODY_CAP - out.len())]);
                }
            }
            Some(Err(e)) => return Err(ProbeError::Body(e)),
            None => break,
        }
    }
    Ok((status, location, out.freeze()))
}

/// The headers sent to the app: the kubelet's, the probe's own
/// `httpHeaders` where the kubelet's request has none of that name (but
/// never those of one hop, whoever wrote them: the kubelet does not send a
/// probe's `Content-Length` or `Transfer-Encoding` either), and a Host
/// naming the app's port when the kubelet's names the status port (a Host
/// the probe set is kept).
pub fn forwarded_headers(
    incoming: &HeaderMap,
    probe: &[(String, String)],
    status_port: u16,
    app: SocketAddr,
) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(incoming.len() + probe.len() + 1);
    for (name, value) in incoming {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            headers.append(name, value.clone());
        }
    }
    for (name, value) in probe {
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) else {
            continue;
        };
        if !headers.contains_key(&name) && !HOP_BY_HOP.contains(&name.as_str()) {
            headers.insert(name, value);
        }
    }
    let host = headers.get(HOST).and_then(|h| h.to_str().ok()).map(str::to_owned);
    let rewritten = match host {
        None => Some(app.to_string()),
        Some(host) => match host.rsplit_once(':') {
            Some((name, port)) if port.parse() == Ok(status_port) => Some(format!("{name}:{}", app.port())),
            _ => None,
        },
    };
    if let Some(value) = rewritten.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(HOST, value);
    }
    headers
}

/// TLS as the kubelet's probes do it: no certificate check (an app's
/// certificate is rarely for its pod address), HTTP/2 offered.
fn tls_connector() -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// Accepts any certificate, as the kubelet's HTTPS probes do; signatures
/// are still checked, so the handshake is a real one.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn host_names_the_app_port_unless_the_probe_set_it() {
        let kubelet = headers(&[
            ("host", "10.0.0.5:15020"),
            ("user-agent", "kube-probe/1.34"),
            ("connection", "close"),
        ]);
        let app: SocketAddr = "10.0.0.5:8080".parse().unwrap();
        let out = forwarded_headers(&kubelet, &[("X-Custom".into(), "1".into())], 15020, app);
        assert_eq!(out["host"], "10.0.0.5:8080");
        assert_eq!(out["user-agent"], "kube-probe/1.34");
        assert_eq!(out["x-custom"], "1");
        assert!(!out.contains_key("connection"));
        let set = headers(&[("host", "example.com")]);
        assert_eq!(forwarded_headers(&set, &[], 15020, app)["host"], "example.com");
        let probe_host = [("Host".to_owned(), "app.local".to_owned())];
        assert_eq!(
            forwarded_headers(&HeaderMap::new(), &probe_host, 15020, app)["host"],
            "app.local"
        );
        assert_eq!(
            forwarded_headers(&HeaderMap::new(), &[], 15020, app)["host"],
            "10.0.0.5:8080"
        );
    }

    /// Found by fuzzing (fuzz/fuzz_targets/app_probe_answer.rs): a probe's
    /// own `Content-Length`, `Transfer-Encoding` or `TE` was sent to the app
    /// (a GET announcing a body it never sends).
    #[test]
    fn headers_of_one_hop_are_not_sent_whoever_wrote_them() {
        let probe: Vec<(String, String)> = [
            ("Content-Length", "5"),
            ("Transfer-Encoding", "chunked"),
            ("TE", "x"),
            ("X-A", "b"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        let app: SocketAddr = "10.0.0.5:8080".parse().unwrap();
        let out = forwarded_headers(&HeaderMap::new(), &probe, 15020, app);
        let names: Vec<_> = out.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["x-a", "host"]);
    }

    /// A plain HTTP call to the app at 10.0.0.5:8080, and that address.
    fn call_to_app() -> (HttpCall, IpAddr) {
        let call = HttpCall {
            port: 8080,
            https: false,
            path: "/a".into(),
            headers: HeaderMap::new(),
        };
        (call, "10.0.0.5".parse().unwrap())
    }

    #[test]
    fn redirects_are_followed_on_the_same_host_only() {
        let (call, dest) = call_to_app();
        assert_eq!(follow(&call, "/b?x=1", dest), Some((false, 8080, "/b?x=1".into())));
        assert_eq!(
            follow(&call, "https://10.0.0.5:8443/c", dest),
            Some((true, 8443, "/c".into()))
        );
        assert_eq!(follow(&call, "http://example.com/", dest), None);
        assert_eq!(follow(&call, "//example.com/", dest), None);
        assert_eq!(follow(&call, "ftp://10.0.0.5/", dest), None);
    }

    /// Found by fuzzing (fuzz/fuzz_targets/app_probe_answer.rs): an empty path with a
    /// query became the request line's "?", and a port that is not a number
    /// became port 80.
    #[test]
    fn a_redirect_always_leads_to_a_path_and_a_port_it_names() {
        let (call, dest) = call_to_app();
        assert_eq!(
            follow(&call, "http://10.0.0.5:8080?x", dest),
            Some((false, 8080, "/?x".into()))
        );
        assert_eq!(follow(&call, "http://10.0.0.5", dest), Some((false, 80, "/".into())));
        assert_eq!(
            follow(&call, "https://[::1]", "::1".parse().unwrap()),
            Some((true, 443, "/".into()))
        );
        assert_eq!(follow(&call, "http://10.0.0.5:8080con405t-lengthple.com?", dest), None);
    }
}
