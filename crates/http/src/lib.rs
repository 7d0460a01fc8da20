//! The connection to a local URL (loopback TCP or a Unix socket, a
//! [`LoopbackUrl`]: [`connect`]), and one HTTP/1.1 request on a fresh
//! one, its body read up to a limit ([`fetch`]):
//! what Envoy's admin client (`lifeguard_envoy::admin`, which words the
//! errors as Envoy's) and the hooks calling lifeguard's own port
//! (`lifeguard_hooks`) share. No timeout here: callers bound it.
//!
//! A crate of its own so that hyper's client is built for those two
//! alone: the vocabulary (`lifeguard_base`), and the drain on it, need
//! no HTTP.

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};
use tokio_util::either::Either;

use lifeguard_base::url::{Address, LoopbackUrl};

/// A connection to a [`LoopbackUrl`].
pub type LocalStream = Either<TcpStream, UnixStream>;

/// A new connection to `url` (with `TCP_NODELAY` over TCP). No timeout
/// here: callers bound the whole exchange. `localhost` tries 127.0.0.1,
/// then ::1 when that fails (a refused connection on loopback costs some
/// microseconds); the first failure is the one returned when both do.
pub async fn connect(url: &LoopbackUrl) -> std::io::Result<LocalStream> {
    let tcp = |stream: TcpStream| {
        let _ = stream.set_nodelay(true);
        Either::Left(stream)
    };
    match url.address() {
        Address::Tcp(addr) => Ok(tcp(TcpStream::connect(addr).await?)),
        Address::Localhost(port) => match TcpStream::connect((Ipv4Addr::LOCALHOST, *port)).await {
            Ok(stream) => Ok(tcp(stream)),
            Err(v4) => match TcpStream::connect((Ipv6Addr::LOCALHOST, *port)).await {
                Ok(stream) => Ok(tcp(stream)),
                Err(_) => Err(v4),
            },
        },
        Address::Unix(path) => Ok(Either::Right(UnixStream::connect(path).await?)),
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot connect to {url}: {source}")]
    Connect { url: String, source: std::io::Error },
    #[error("HTTP error: {0}")]
    Http(#[from] hyper::Error),
    #[error("the answer to {path} is larger than {limit} bytes")]
    TooLarge { path: String, limit: usize },
    #[error("{path:?} is not a valid request path")]
    BadPath { path: String },
}

/// One HTTP/1.1 request to a loopback URL on a fresh connection: the status
/// and up to `limit` bytes of body. No timeout here: callers wrap it.
pub async fn fetch(
    url: &LoopbackUrl,
    method: Method,
    path: &str,
    limit: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    let stream = connect(url).await.map_err(|source| FetchError::Connect {
        url: url.to_string(),
        source,
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, url.authority())
        .body(Empty::<Bytes>::new())
        .map_err(|_| FetchError::BadPath { path: path.to_owned() })?;

    let exchange = async {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = Limited::new(response.into_body(), limit)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => FetchError::Http(*e),
                Err(_) => FetchError::TooLarge {
                    path: path.to_owned(),
                    limit,
                },
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::pin!(exchange);
    // Drive the connection and the exchange together. If the connection
    // finishes first (the server closed it after answering), the answer is
    // already buffered and the exchange completes from it.
    tokio::select! {
        biased;
        result = &mut exchange => result,
        conn_result = conn => {
            conn_result?;
            exchange.await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// `localhost` reaches an admin on either loopback address: Envoy
    /// Gateway binds its admin to 127.0.0.1, or to ::1 on IPv6-only
    /// clusters, and one setting serves both.
    #[tokio::test]
    async fn localhost_reaches_an_admin_bound_to_127_0_0_1_or_to_the_ipv6_loopback() {
        for bound in [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)] {
            let listener = tokio::net::TcpListener::bind((bound, 0)).await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let url: LoopbackUrl = format!("http://localhost:{port}").parse().unwrap();
            let connected = connect(&url).await;
            let (_, from) = listener.accept().await.unwrap();
            assert!(connected.is_ok(), "{bound}");
            assert_eq!(from.ip(), bound, "connected over {bound}");
        }
    }
}
