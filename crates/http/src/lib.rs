//! One HTTP/1.1 request to a local URL (loopback TCP or a Unix socket, a
//! [`LoopbackUrl`]) on a fresh connection, its body read up to a limit:
//! what Envoy's admin client (`lifeguard_envoy::admin`, which words the
//! errors as Envoy's) and the hooks calling lifeguard's own port
//! (`lifeguard_hooks`) share. No timeout here: callers bound it.
//!
//! A crate of its own so that hyper's client is built for those two
//! alone: the vocabulary (`lifeguard_base`), and the drain on it, need
//! no HTTP.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use lifeguard_base::url::LoopbackUrl;

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
    let stream = url.connect().await.map_err(|source| FetchError::Connect {
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
