//! An app probe's HTTP call and the app's answer (status/app_probe/call.rs):
//! the headers sent (the kubelet's and the probe's own), the exchange over
//! HTTP/1.1 or HTTP/2 with whatever bytes the app writes back, and where a
//! redirect leads.
//!
//! Input: a flags byte (HTTP/2, the probe's scheme), a write size, then
//! NUL-separated: the kubelet's headers (`name: value` a line), the probe's
//! own, the probe's path, a `Location`, the app's raw answer.
//! Holds: the headers sent carry no hop-by-hop header and a Host that names
//! the app's port when the kubelet's named the status port; the exchange
//! ends (the app closed its side); its body is at most the cap, and empty
//! for a redirect; a redirect is followed only to a path on the app's own
//! host; nothing panics.

use std::net::SocketAddr;
use std::time::Duration;

use super::{fields, header_map, runtime, text};
use hyper::header::{HeaderMap, HOST};
use hyper_util::rt::TokioIo;
use lifeguard::fuzzing::{app_probe_exchange, app_probe_headers, app_probe_redirect, HttpCall, APP_PROBE_BODY_CAP};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const STATUS_PORT: u16 = 15020;
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

/// A probe's first call to `app`, over `https` or not.
fn call(app: SocketAddr, https: bool, path: String, headers: HeaderMap) -> HttpCall {
    HttpCall {
        port: app.port(),
        https,
        path,
        headers,
    }
}

fn check_redirect(app: SocketAddr, https: bool, location: &str) {
    let first = call(app, https, "/".into(), HeaderMap::new());
    let Some((_, _, path)) = app_probe_redirect(&first, location, app.ip()) else {
        return;
    };
    assert!(path.starts_with('/'), "{location:?} led to {path:?}");
    if !location.starts_with('/') {
        // An absolute URL: only to the app's own address.
        let uri: hyper::Uri = location.parse().expect("it was followed, so it parsed");
        let host = uri.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']');
        assert_eq!(host.parse::<std::net::IpAddr>().ok(), Some(app.ip()), "{location:?}");
    }
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((&write, rest)) = rest.split_first() else {
        return;
    };
    let (h2, https) = (flags & 1 == 1, flags & 2 == 2);
    let f = fields(rest, 5);
    let app: SocketAddr = "10.0.0.5:8080".parse().unwrap();

    let kubelet = header_map(f[0]);
    let probe: Vec<(String, String)> = text(f[1])
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_owned(), v.trim_start().to_owned()))
        .collect();
    let sent = app_probe_headers(&kubelet, &probe, STATUS_PORT, app);
    for name in HOP_BY_HOP {
        assert!(!sent.contains_key(name), "{name} sent to the app");
    }
    let host = sent.get(HOST).expect("a Host is always sent").to_str().unwrap_or("");
    let kubelet_host = kubelet.get(HOST).and_then(|h| h.to_str().ok());
    if let Some((_, port)) = kubelet_host.and_then(|h| h.rsplit_once(':')) {
        if port.parse() == Ok(STATUS_PORT) {
            assert!(host.ends_with(":8080"), "{kubelet_host:?} became {host:?}");
        }
    }

    let location = text(f[3]);
    check_redirect(app, https, &location);

    let path = format!("/{}", text(f[2]).trim_start_matches('/'));
    let answer = f[4].to_vec();
    let write = usize::from(write) + 1;
    let result = runtime().block_on(async move {
        let (client, mut server) = tokio::io::duplex(64 * 1024);
        let app_side = tokio::spawn(async move {
            for chunk in answer.chunks(write) {
                if server.write_all(chunk).await.is_err() {
                    return;
                }
            }
            let _ = server.shutdown().await;
            let mut request = Vec::new();
            let _ = server.read_to_end(&mut request).await;
        });
        let call = call(app, h2, path, sent);
        let exchange = app_probe_exchange(TokioIo::new(client), h2, &call, app.ip());
        let result = tokio::time::timeout(Duration::from_secs(5), exchange).await;
        app_side.abort();
        result
    });
    match result.expect("the exchange ends once the app has closed its side") {
        Ok((status, location, body)) => {
            assert!(body.len() <= APP_PROBE_BODY_CAP);
            if status.is_redirection() {
                assert!(body.is_empty());
                if let Some(location) = location {
                    check_redirect(app, https, &location);
                }
            }
        }
        Err(why) => assert!(!why.to_string().is_empty()),
    }
}
