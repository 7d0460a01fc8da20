//! What a route answers: the body of every response (whole, or the merged
//! scrape's stream) and the future that yields it (ready at once, or
//! waiting on the drain, the drain wait or an app probe).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::Full;
use hyper::body::{Frame, SizeHint};
use hyper::Response;

use super::connections::Served;

/// The response body of every route: a whole body (every route but one,
/// the probe's with no allocation), or the merged scrape's stream; and the
/// request it answers, which ends when the body is dropped (hyper drops it
/// once the last byte is written, or the connection is gone).
pub struct Body {
    kind: Kind,
    served: Option<Served>,
}

enum Kind {
    Full(Full<Bytes>),
    Stream(Pin<Box<dyn Stream<Item = Bytes> + Send>>),
}

impl Body {
    pub(crate) fn full(bytes: Bytes) -> Self {
        Body {
            kind: Kind::Full(Full::new(bytes)),
            served: None,
        }
    }

    pub(crate) fn stream(stream: Pin<Box<dyn Stream<Item = Bytes> + Send>>) -> Self {
        Body {
            kind: Kind::Stream(stream),
            served: None,
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().kind {
            Kind::Full(full) => hyper::body::Body::poll_frame(Pin::new(full), cx),
            Kind::Stream(stream) => stream.as_mut().poll_next(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(full) => hyper::body::Body::is_end_stream(full),
            Kind::Stream(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(full) => hyper::body::Body::size_hint(full),
            Kind::Stream(_) => SizeHint::default(),
        }
    }
}

/// The future of one response: ready at once for every route but the
/// few that wait (on the drain, the drain wait or an app probe). The
/// request counts as served on its connection until the response's body
/// is dropped: a ready answer carries its mark in its body from the start
/// (no second future around it, nothing moved again on the probe's path);
/// a waiting one, beside its future until the answer is out.
pub enum ResponseFuture {
    Ready(Option<Response<Body>>),
    Waiting(Pin<Box<dyn Future<Output = Response<Body>> + Send>>, Option<Served>),
}

impl ResponseFuture {
    /// A waiting answer (not yet counted as served on a connection).
    pub(crate) fn waiting(fut: impl Future<Output = Response<Body>> + Send + 'static) -> Self {
        ResponseFuture::Waiting(Box::pin(fut), None)
    }

    /// Counts the request as served on its connection (`served`) until
    /// the response's body is dropped.
    pub(crate) fn track(&mut self, served: Served) {
        match self {
            ResponseFuture::Ready(Some(response)) => response.body_mut().served = Some(served),
            ResponseFuture::Ready(None) => {}
            ResponseFuture::Waiting(_, slot) => *slot = Some(served),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ResponseFuture::Ready(response) => Poll::Ready(Ok(response.take().expect("polled after completion"))),
            ResponseFuture::Waiting(fut, served) => fut.as_mut().poll(cx).map(|mut response| {
                response.body_mut().served = served.take();
                Ok(response)
            }),
        }
    }
}
