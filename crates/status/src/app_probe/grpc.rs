//! The gRPC probe: one unary `grpc.health.v1.Health/Check` over HTTP/2
//! (plain text, as the kubelet's), written by hand: the request is one
//! string field and the answer one enum, so a gRPC stack would add far
//! more code than it saves. Tested against a real gRPC health server
//! (tests/app_probes.rs).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, TE, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::call::ProbeTarget;
use super::error::ProbeError;

/// The largest answer read: a health answer is a few bytes.
const ANSWER_CAP: usize = 64 * 1024;

/// The health service's answer to a Check, or why there is none.
#[derive(Debug, PartialEq)]
pub enum Health {
    /// The status the service gave.
    Status(ServingStatus),
    /// The call failed with this gRPC status (code name, message).
    Failed(String),
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServingStatus {
    /// 0, and any value the protocol does not define.
    Unknown,
    /// 1.
    Serving,
    /// 2.
    NotServing,
    /// 3 (meant for `Watch`, but a server may answer it).
    ServiceUnknown,
}

impl ServingStatus {
    /// The status of its value on the wire.
    fn of(value: u64) -> ServingStatus {
        match value {
            1 => ServingStatus::Serving,
            2 => ServingStatus::NotServing,
            3 => ServingStatus::ServiceUnknown,
            _ => ServingStatus::Unknown,
        }
    }

    /// Its name in the protocol: `SERVING`, `NOT_SERVING`, `UNKNOWN`,
    /// `SERVICE_UNKNOWN`.
    pub fn name(self) -> &'static str {
        match self {
            ServingStatus::Unknown => "UNKNOWN",
            ServingStatus::Serving => "SERVING",
            ServingStatus::NotServing => "NOT_SERVING",
            ServingStatus::ServiceUnknown => "SERVICE_UNKNOWN",
        }
    }
}

/// Asks the app's health service on `port` about `service`; `user_agent`
/// is the kubelet's, passed on as the kubelet's own gRPC probe does.
pub(crate) async fn check(
    target: &ProbeTarget,
    port: u16,
    service: &str,
    user_agent: Option<&HeaderValue>,
) -> Result<Health, ProbeError> {
    let tcp = target.connect_to_probe(port).await?;
    let failed = ProbeError::Grpc;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .map_err(failed)?;
    let mut request = Request::post(format!(
        "http://{}/grpc.health.v1.Health/Check",
        std::net::SocketAddr::new(target.dest, port)
    ))
    .body(Full::new(request_message(service)))
    .map_err(ProbeError::GrpcRequest)?;
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(TE, HeaderValue::from_static("trailers"));
    if let Some(agent) = user_agent {
        headers.insert(USER_AGENT, agent.clone());
    }
    let ask = async move {
        let answer = sender.send_request(request).await.map_err(failed)?;
        if answer.status() != StatusCode::OK {
            return Err(ProbeError::GrpcHttpStatus(answer.status()));
        }
        let head = answer.headers().clone();
        let collected = Limited::new(answer.into_body(), ANSWER_CAP)
            .collect()
            .await
            .map_err(ProbeError::GrpcBody)?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        read_answer(&head, &trailers, collected.to_bytes())
    };
    let (answer, _) = tokio::join!(ask, conn);
    answer
}

/// `HealthCheckRequest { service = 1 }`, in gRPC's length-prefixed frame.
fn request_message(service: &str) -> Bytes {
    let mut message = BytesMut::new();
    if !service.is_empty() {
        message.put_u8(0x0a); // field 1, length-delimited
        put_varint(&mut message, service.len() as u64);
        message.put_slice(service.as_bytes());
    }
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0); // not compressed
    frame.put_u32(message.len() as u32);
    frame.put_slice(&message);
    frame.freeze()
}

fn put_varint(out: &mut BytesMut, mut n: u64) {
    while n >= 0x80 {
        out.put_u8((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.put_u8(n as u8);
}

fn get_varint(buf: &mut Bytes) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return None;
        }
        let b = buf.get_u8();
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(n);
        }
    }
    None
}

/// The call's outcome from its `grpc-status` (in the trailers, or in the
/// headers of a trailers-only answer) and its message.
pub fn read_answer(head: &HeaderMap, trailers: &HeaderMap, mut body: Bytes) -> Result<Health, ProbeError> {
    let code = trailers
        .get("grpc-status")
        .or_else(|| head.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or(ProbeError::NoGrpcStatus)?;
    if code != 0 {
        let message = trailers.get("grpc-message").or_else(|| head.get("grpc-message"));
        let message = message.and_then(|m| m.to_str().ok()).unwrap_or("");
        return Ok(Health::Failed(
            format!("{} {message}", code_name(code)).trim_end().to_owned(),
        ));
    }
    if body.len() < 5 || body[0] != 0 {
        return Err(ProbeError::NotOneMessage);
    }
    body.advance(5);
    let mut status = 0; // a field left out is its default, UNKNOWN
    while body.has_remaining() {
        let key = get_varint(&mut body).ok_or(ProbeError::NotProtobuf)?;
        match key & 7 {
            0 => {
                let value = get_varint(&mut body).ok_or(ProbeError::NotProtobuf)?;
                if key >> 3 == 1 {
                    status = value;
                }
            }
            2 => {
                let len = get_varint(&mut body).ok_or(ProbeError::NotProtobuf)? as usize;
                if len > body.remaining() {
                    return Err(ProbeError::CutShort);
                }
                body.advance(len);
            }
            _ => return Err(ProbeError::NotProtobuf),
        }
    }
    Ok(Health::Status(ServingStatus::of(status)))
}

fn code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("UNKNOWN_CODE")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_frame() {
        assert_eq!(&request_message("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(&request_message("x")[..], &[0, 0, 0, 0, 3, 0x0a, 1, b'x']);
        let long = "s".repeat(200);
        let frame = request_message(&long);
        assert_eq!(&frame[5..8], &[0x0a, 0xc8, 0x01]);
        assert_eq!(frame.len(), 5 + 3 + 200);
    }

    #[test]
    fn answers() {
        let ok: HeaderMap = [("grpc-status", "0")]
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect();
        let frame = |msg: &[u8]| {
            let mut b = vec![0, 0, 0, 0, msg.len() as u8];
            b.extend_from_slice(msg);
            Bytes::from(b)
        };
        let none = HeaderMap::new();
        let read = |head, trailers, body| read_answer(head, trailers, body).unwrap();
        let status = Health::Status;
        assert_eq!(read(&none, &ok, frame(&[0x08, 1])), status(ServingStatus::Serving));
        assert_eq!(read(&none, &ok, frame(&[0x08, 2])), status(ServingStatus::NotServing));
        assert_eq!(
            read(&none, &ok, frame(&[0x08, 3])),
            status(ServingStatus::ServiceUnknown)
        );
        assert_eq!(read(&none, &ok, frame(&[0x08, 9])), status(ServingStatus::Unknown));
        assert_eq!(read(&none, &ok, frame(&[])), status(ServingStatus::Unknown));
        let not_found: HeaderMap = [("grpc-status", "5"), ("grpc-message", "unknown service")]
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect();
        assert_eq!(
            read(&not_found, &none, Bytes::new()),
            Health::Failed("NOT_FOUND unknown service".into())
        );
        let refused = |head, trailers, body| read_answer(head, trailers, body).unwrap_err();
        assert!(matches!(refused(&none, &none, Bytes::new()), ProbeError::NoGrpcStatus));
        assert!(matches!(refused(&none, &ok, frame(&[0x08])), ProbeError::NotProtobuf));
    }
}
