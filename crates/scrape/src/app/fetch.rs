//! One read of one app target for one scrape: started when the scrape
//! starts (beside Envoy's read), bounded by the scrape's budget and by
//! [`APP_BODY_CAP`], and handed to the scrape as whole lines through a
//! channel, so the scrape serves it after Envoy's and lifeguard's parts.
//!
//! Memory: what a read holds (queued for its scrape) is at most the cap
//! and a line, and at most [`MAX_APP_READS`] reads hold a slot at once
//! (a slot is kept until the scrape has sent that part): past that, a
//! read waits for a slot within its budget, then is left out (`busy`).

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::counters::Incomplete;
use crate::format::Format;
use lifeguard_istio::annotations::MetricsTarget;

/// The largest body taken from one app target; the rest is left out
/// (cut after the last whole line), logged and counted.
pub(crate) const APP_BODY_CAP: usize = 10 << 20;
/// App reads holding memory at once, across all scrapes.
pub(crate) const MAX_APP_READS: usize = 4;

/// What a read hands its scrape, in order: `Start` (once the app answered
/// 200), `Lines` (whole lines), then `End` (`None`: complete).
pub(crate) enum Piece {
    Start(Format, OwnedSemaphorePermit),
    Lines(Bytes),
    End(Option<Incomplete>, String),
}

/// Starts reading `target`, asking for `format`, until `deadline`; the
/// scrape takes the pieces from the receiver.
pub(crate) fn start(
    target: &MetricsTarget,
    format: Format,
    deadline: Instant,
    slots: Arc<Semaphore>,
) -> mpsc::UnboundedReceiver<Piece> {
    let (tx, rx) = mpsc::unbounded_channel();
    let target = target.clone();
    tokio::spawn(async move {
        let end = match tokio::time::timeout_at(deadline, read(&target, format, deadline, slots, &tx)).await {
            Ok(end) => end,
            Err(_) => (
                Some(Incomplete::Timeout),
                "no complete answer within the scrape's budget".into(),
            ),
        };
        let _ = tx.send(Piece::End(end.0, end.1));
    });
    rx
}

type Outcome = (Option<Incomplete>, String);

async fn read(
    target: &MetricsTarget,
    format: Format,
    deadline: Instant,
    slots: Arc<Semaphore>,
    tx: &mpsc::UnboundedSender<Piece>,
) -> Outcome {
    let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, slots.acquire_owned()).await else {
        return (
            Some(Incomplete::Busy),
            format!("{MAX_APP_READS} app reads already held for other scrapes"),
        );
    };
    let error = |e: &dyn std::fmt::Display| (Some(Incomplete::Error), e.to_string());
    let stream = match TcpStream::connect((Ipv4Addr::LOCALHOST, target.port)).await {
        Ok(stream) => stream,
        Err(e) => return error(&format!("cannot connect: {e}")),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
        Ok(pair) => pair,
        Err(e) => return error(&e),
    };
    tokio::spawn(conn);
    let budget = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let request = Request::get(target.path.as_str())
        .header(HOST, format!("127.0.0.1:{}", target.port))
        .header(ACCEPT, format.accept_for_app())
        .header(USER_AGENT, concat!("lifeguard/", env!("CARGO_PKG_VERSION")))
        .header(
            crate::request::SCRAPE_TIMEOUT_HEADER,
            format!("{:.3}", budget.as_secs_f64()),
        )
        .body(Empty::<Bytes>::new());
    let response = match request {
        Ok(request) => sender.send_request(request).await,
        Err(e) => return error(&e),
    };
    let response = match response {
        Ok(response) => response,
        Err(e) => return error(&e),
    };
    if response.status() != StatusCode::OK {
        return error(&format!("answered {}", response.status()));
    }
    let got = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let _ = tx.send(Piece::Start(Format::of_content_type(got), slot));
    stream_body(response.into_body(), tx).await
}

/// The app's body, as whole lines, up to [`APP_BODY_CAP`].
async fn stream_body(mut body: hyper::body::Incoming, tx: &mpsc::UnboundedSender<Piece>) -> Outcome {
    let error = |e: &dyn std::fmt::Display| (Some(Incomplete::Error), e.to_string());
    let (mut tail, mut bytes) = (BytesMut::new(), 0usize);
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Err(e) => return error(&format!("the answer broke off: {e}")),
        };
        let room = APP_BODY_CAP - bytes;
        let over = data.len() > room;
        let data = if over { data.slice(..room) } else { data };
        bytes += data.len();
        if let Some(lines) = whole_lines(&mut tail, data) {
            let _ = tx.send(Piece::Lines(lines));
        }
        if over {
            return (
                Some(Incomplete::Cap),
                format!("passed the {} MiB cap", APP_BODY_CAP >> 20),
            );
        }
    }
    if !tail.is_empty() {
        tail.extend_from_slice(b"\n");
        let _ = tx.send(Piece::Lines(tail.freeze()));
    }
    (None, String::new())
}

/// The whole lines of `tail` + `chunk`; the partial last line stays in
/// `tail`.
fn whole_lines(tail: &mut BytesMut, chunk: Bytes) -> Option<Bytes> {
    let last = chunk.iter().rposition(|&b| b == b'\n');
    match last {
        None => {
            tail.extend_from_slice(&chunk);
            None
        }
        Some(last) if tail.is_empty() => {
            tail.extend_from_slice(&chunk[last + 1..]);
            Some(chunk.slice(..=last))
        }
        Some(last) => {
            tail.extend_from_slice(&chunk[..=last]);
            let lines = tail.split().freeze();
            tail.extend_from_slice(&chunk[last + 1..]);
            Some(lines)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_become_whole_lines() {
        let mut tail = BytesMut::new();
        let mut got = Vec::new();
        for chunk in ["a 1\nb", " 2\nc 3", "", "\nd 4\n", "e"] {
            got.extend(whole_lines(&mut tail, Bytes::from_static(chunk.as_bytes())));
        }
        assert_eq!(got, ["a 1\n", "b 2\n", "c 3\nd 4\n"]);
        assert_eq!(&tail[..], b"e");
    }
}
