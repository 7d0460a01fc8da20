//! The gRPC health answer decoder (status/app_probe/grpc.rs): the app's
//! `grpc-status` and `grpc-message`, in the headers or the trailers, and
//! its `HealthCheckResponse` in gRPC's length-prefixed frame.
//!
//! Input: a flags byte (where `grpc-status` and `grpc-message` go), then
//! NUL-separated: the `grpc-status` value, the `grpc-message` value, the
//! body.
//! Holds: never a panic; a status 0 gives one of the four health states or
//! a reason the answer is no answer; any other status is a failure named by
//! its code; the trailers win over the headers; a well-formed answer made
//! from any status number decodes to that state.

use super::{fields, flags};
use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderValue};
use lifeguard::fuzzing::{grpc_health_answer, Health};

const STATES: [&str; 4] = ["SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", "UNKNOWN"];

fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push(n as u8 & 0x7f | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let (flags, rest) = flags(data);
    let f = fields(rest, 3);
    let (mut head, mut trailers) = (HeaderMap::new(), HeaderMap::new());
    if let Ok(status) = HeaderValue::from_bytes(f[0]) {
        let into = if flags & 1 == 0 { &mut trailers } else { &mut head };
        into.insert("grpc-status", status);
        if flags & 4 != 0 {
            // The other one too, with another code: the trailers must win.
            let other = if flags & 1 == 0 { &mut head } else { &mut trailers };
            other.insert("grpc-status", HeaderValue::from_static("13"));
        }
    }
    if let Ok(message) = HeaderValue::from_bytes(f[1]) {
        let into = if flags & 2 == 0 { &mut trailers } else { &mut head };
        into.insert("grpc-message", message);
    }
    let body = Bytes::copy_from_slice(f[2]);
    let code = trailers
        .get("grpc-status")
        .or_else(|| head.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    match grpc_health_answer(&head, &trailers, body) {
        Ok(Health::Status(state)) => {
            assert_eq!(code, Some(0));
            assert!(STATES.contains(&state.name()));
        }
        Ok(Health::Failed(failed)) => {
            assert!(code.is_some_and(|c| c != 0), "{failed:?}");
            let name = failed.split(' ').next().unwrap_or("");
            assert!(
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{failed:?}"
            );
        }
        Err(why) => assert!(code.is_none_or(|c| c == 0) && !why.to_string().is_empty()),
    }

    // A well-formed answer carrying the status number the input spells.
    let mut number = [0u8; 8];
    let n = f[2].len().min(8);
    number[..n].copy_from_slice(&f[2][..n]);
    let value = u64::from_le_bytes(number);
    let mut message = vec![0x08];
    varint(value, &mut message);
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let ok: HeaderMap = [(
        hyper::header::HeaderName::from_static("grpc-status"),
        HeaderValue::from_static("0"),
    )]
    .into_iter()
    .collect();
    let want = match value {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    };
    match grpc_health_answer(&HeaderMap::new(), &ok, Bytes::from(frame)) {
        Ok(Health::Status(state)) => assert_eq!(state.name(), want),
        other => panic!("{value}: {other:?}, not {want}"),
    }
}
