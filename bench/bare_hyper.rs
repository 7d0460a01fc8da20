//! A bare hyper 1.x HTTP/1 server answering every request with a static
//! 200 `ready\n`: the practical ceiling for lifeguard's stack in
//! bench/load.sh. Same runtime, same builder settings (TCP_NODELAY,
//! keep-alive), none of lifeguard's routing, readiness or metrics.
//!
//! Run: `cargo run --profile dist --example bare-hyper -- 127.0.0.1:PORT`.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:18080".into());
    let addr: std::net::SocketAddr = addr.parse().expect("ADDR");
    assert!(addr.ip().is_loopback(), "loopback only");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = TcpListener::bind(addr).await.unwrap();
        eprintln!("bare-hyper listening on {addr}");
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ready\n"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}
