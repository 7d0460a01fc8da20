//! Why a probe got no answer from the app: the kubelet is told the reason
//! (a 500 whose body names it).

use std::io;
use std::net::SocketAddr;

use hyper::StatusCode;

/// Why a probe's call to the app failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: io::Error },
    #[error("TLS handshake with {addr}: {source}")]
    Tls { addr: SocketAddr, source: io::Error },
    #[error("cannot build the request: {0}")]
    Request(#[source] hyper::http::Error),
    #[error("HTTP exchange with the app: {0}")]
    Exchange(#[source] hyper::Error),
    #[error("reading the app's answer: {0}")]
    Body(#[source] hyper::Error),
    /// Redirects followed (the most the kubelet follows), still redirected.
    #[error("stopped after {0} redirects")]
    Redirects(usize),
    #[error("cannot build the gRPC request: {0}")]
    GrpcRequest(#[source] hyper::http::Error),
    #[error("gRPC call to the app: {0}")]
    Grpc(#[source] hyper::Error),
    #[error("gRPC call answered HTTP {0}")]
    GrpcHttpStatus(StatusCode),
    #[error("reading the gRPC answer: {0}")]
    GrpcBody(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the gRPC answer has no grpc-status")]
    NoGrpcStatus,
    #[error("the gRPC answer is not one uncompressed message")]
    NotOneMessage,
    #[error("the health answer is not protobuf")]
    NotProtobuf,
    #[error("the health answer is cut short")]
    CutShort,
}
