//! Fake HTTP servers: [`TestServer`] (hyper on a tokio runtime of its own,
//! a handler per request), whole answers ([`reply`]), and the slow test
//! [`App`] behind Envoy.

use std::convert::Infallible;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::ports::{bind_leased, Port};

/// The body of a fake server's answer.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// An answer with `status` and a whole `body`.
pub fn reply(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

/// An HTTP/1.1 server on a reserved loopback port: hyper, with a handler
/// per request, on a one-thread tokio runtime of its own; keep-alive unless
/// a request says `connection: close`. The port listens when `start`
/// returns. `stop` (or drop) closes the listener and every connection, and
/// cancels the requests in progress.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    pub fn start<F, Fut>(port: &Port, handler: F) -> TestServer
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        TestServer::serve(bind_leased(port), handler)
    }

    /// `start` on a listener bound by the caller: in another network
    /// namespace, say (a socket stays in the namespace it was made in, and
    /// so do the connections it accepts: the server's thread need not
    /// enter it).
    pub fn serve<F, Fut>(listener: TcpListener, handler: F) -> TestServer
    where
        F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<Body>> + Send + 'static,
    {
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let handler = Arc::new(handler);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let stream = tokio::select! {
                        _ = &mut stopped => return,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, _)) => stream,
                            Err(_) => continue,
                        },
                    };
                    let handler = handler.clone();
                    let service = hyper::service::service_fn(move |request| {
                        let answer = handler(request);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    tokio::spawn(async move {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    });
                }
            });
            // Dropping the runtime cancels every connection task: their
            // sockets close with it.
        });
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops answering: the listener and every connection close.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// The app behind Envoy

/// A slow app on loopback: `GET /delay/N` answers `done\n` after N seconds
/// (fractions allowed), on keep-alive HTTP/1.1 connections. Stops on drop.
pub struct App {
    _server: TestServer,
}

impl App {
    pub fn start(port: &Port) -> App {
        let server = TestServer::start(port, |request| async move {
            let secs: f64 = request
                .uri()
                .path()
                .strip_prefix("/delay/")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0.0);
            tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            let mut response = reply(200, "done\n");
            response
                .headers_mut()
                .insert("content-type", "text/plain".parse().unwrap());
            response
        });
        App { _server: server }
    }
}
