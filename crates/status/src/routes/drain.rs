//! The drain's routes: `GET /drain` (its status), `POST /drain` and
//! `POST /quitquitquit` (who may drain and stop), and the waits that hooks
//! hold open: `GET /drain/wait` (the app's, until out of rotation) and
//! `GET /drain/stopped` (Envoy's own container's, until lifeguard has
//! stopped Envoy).

use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};

use super::{finish, into_headers, respond, Caller, ControlAccess, APPLICATION_JSON};
use crate::response::ResponseFuture;
use lifeguard_base::duration::DurationError;
use lifeguard_drain::{Asker, DrainHandle};
use lifeguard_drain_wait::{DrainWait, RemoteWait};

/// `GET|HEAD /drain`: the drain's status as JSON, with the drain wait's
/// (`drain_wait`).
pub(super) struct DrainStatus {
    pub(super) drain: DrainHandle,
    pub(super) drain_wait: Option<DrainWait>,
}

impl DrainStatus {
    pub(super) fn answer<B>(&self, req: Request<B>) -> ResponseFuture {
        #[derive(serde::Serialize)]
        struct View {
            #[serde(flatten)]
            drain: lifeguard_drain::Status,
            /// The progress line, written now.
            progress: Option<String>,
            drain_wait: Option<lifeguard_drain_wait::DrainWaitStatus>,
        }
        let drain = self.drain.status();
        let view = View {
            progress: drain.progress(lifeguard_base::duration::unix_now()),
            drain,
            drain_wait: self.drain_wait.as_ref().map(DrainWait::status),
        };
        let mut body = serde_json::to_vec(&view).unwrap_or_default();
        body.push(b'\n');
        let method = req.method().clone();
        let mut headers = into_headers(req);
        headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
        finish(headers, &method, (StatusCode::OK, Bytes::from(body)))
    }
}

/// `GET|HEAD /drain/wait[?timeout=D]`: the app container's preStop hook.
/// Answers 200 with one line once the pod is out of rotation, or at its
/// bound (the timeout, the drain's deadline less the app's time, Envoy
/// stopping), saying which; 400 for a timeout that is not a duration.
/// Starts nothing; any caller, those outside the pod a few waits at a
/// time (429 past them).
pub(super) fn drain_wait<B>(wait: &DrainWait, caller: &Caller, req: Request<B>) -> ResponseFuture {
    let busy = b"too many drain waits held open from outside the pod\n";
    let Hold {
        held,
        timeout,
        headers,
        method,
    } = match Hold::admit(wait, caller, req, busy) {
        Ok(hold) => hold,
        Err(answer) => return *answer,
    };
    let wait = wait.clone();
    ResponseFuture::waiting(async move {
        let end = wait.wait(timeout).await;
        drop(held);
        respond(headers, &method, (StatusCode::OK, Bytes::from(end.line + "\n")))
    })
}

/// `GET|HEAD /drain/stopped[?timeout=D]`: the preStop hook of a container
/// whose Envoy must not get the kubelet's SIGTERM before lifeguard is done
/// with it (Envoy beside lifeguard, in a container of its own: Envoy
/// Gateway's, Contour's pods). Answers 200 once the drain has stopped Envoy
/// (or Envoy exited), or at the timeout, saying which; starts nothing. Any
/// caller (the kubelet calls it on the pod's address), those outside the
/// pod a few waits at a time, as `/drain/wait`'s.
pub(super) struct DrainStopped {
    pub(super) drain: DrainHandle,
    /// Who may hold a wait open: the drain wait's admission of callers
    /// from outside the pod.
    pub(super) admission: DrainWait,
}

impl DrainStopped {
    pub(super) fn answer<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let busy = b"too many waits held open from outside the pod\n";
        let Hold {
            held,
            timeout,
            headers,
            method,
        } = match Hold::admit(&self.admission, caller, req, busy) {
            Ok(hold) => hold,
            Err(answer) => return *answer,
        };
        let mut status = self.drain.watch();
        ResponseFuture::waiting(async move {
            let stopped = status.wait_for(|s| s.phase == lifeguard_drain::Phase::Stopped);
            // No timeout: until Envoy stops (the hook's own bound applies).
            let bound = timeout.unwrap_or(Duration::MAX);
            let line = match tokio::time::timeout(bound, stopped).await {
                Ok(_) => None,
                Err(_) => Some(format!(
                    "Envoy NOT stopped yet, stopped waiting at the {} timeout\n",
                    lifeguard_base::duration::GoDuration(bound)
                )),
            };
            drop(held);
            let line = line.unwrap_or_else(|| {
                let took = status.borrow().duration_seconds;
                match took {
                    Some(took) => format!("Envoy stopped, {took:.1}s after the drain began\n"),
                    None => "Envoy stopped\n".to_owned(),
                }
            });
            respond(headers, &method, (StatusCode::OK, Bytes::from(line)))
        })
    }
}

/// A hook's wait, admitted: the place it holds (a caller outside the pod
/// takes one of its address's few), its `?timeout=`, and what its answer
/// is made of.
struct Hold {
    held: Option<RemoteWait>,
    timeout: Option<std::time::Duration>,
    headers: HeaderMap,
    method: Method,
}

impl Hold {
    /// Admits a wait: callers outside the pod a few at a time (429 past
    /// them, `busy` saying so), a timeout that is a Go duration (400).
    /// Err: the answer, at once (boxed: a ready answer is large).
    fn admit<B>(
        admission: &DrainWait,
        caller: &Caller,
        req: Request<B>,
        busy: &'static [u8],
    ) -> Result<Hold, Box<ResponseFuture>> {
        let timeout = wait_timeout(req.uri().query());
        let method = req.method().clone();
        let headers = into_headers(req);
        let held = match caller.peer {
            Some(peer) if !caller.is_loopback() => match admission.admit_remote(peer.ip()) {
                Some(held) => Some(held),
                None => {
                    let body = Bytes::from_static(busy);
                    return Err(Box::new(finish(
                        headers,
                        &method,
                        (StatusCode::TOO_MANY_REQUESTS, body),
                    )));
                }
            },
            _ => None,
        };
        match timeout {
            Ok(timeout) => Ok(Hold {
                held,
                timeout,
                headers,
                method,
            }),
            Err(why) => {
                let body = Bytes::from(format!("{why}\n"));
                Err(Box::new(finish(headers, &method, (StatusCode::BAD_REQUEST, body))))
            }
        }
    }
}

/// A drain wait's `timeout` that is no Go duration.
#[derive(Debug, thiserror::Error)]
#[error("invalid timeout {value:?}: {why}")]
struct TimeoutError {
    value: String,
    why: DurationError,
}

/// The `timeout` of a drain wait's query string, a Go duration.
fn wait_timeout(query: Option<&str>) -> Result<Option<std::time::Duration>, TimeoutError> {
    let Some(value) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|p| p.strip_prefix("timeout="))
    else {
        return Ok(None);
    };
    match lifeguard_base::duration::parse(value) {
        Ok(timeout) => Ok(Some(timeout)),
        Err(why) => Err(TimeoutError {
            value: value.to_owned(),
            why,
        }),
    }
}

/// `POST /drain[?nowait]` and `POST /quitquitquit`, for the callers this
/// lets through (loopback when allowed, or the control socket): answered
/// once the drain has begun (`nowait`), is drained, or Envoy has stopped.
#[derive(Clone)]
pub(super) struct Control {
    pub(super) drain: DrainHandle,
    pub(super) access: ControlAccess,
}

impl Control {
    /// Whether `caller` may drain or stop; the 403 body when not.
    fn may(&self, caller: &Caller) -> Result<(), Bytes> {
        if caller.control_socket {
            return Ok(());
        }
        if !self.access.loopback {
            let on = self.access.socket.as_deref().map_or("nowhere on TCP".into(), |p| {
                format!("on the control socket {}", p.display())
            });
            return Err(Bytes::from(format!("forbidden: drain and stop are served {on} only\n")));
        }
        match caller.is_loopback() {
            true => Ok(()),
            false => Err(Bytes::from_static(b"forbidden: only loopback callers may do this\n")),
        }
    }

    /// `POST /quitquitquit`: stops Envoy now; answers once it has stopped.
    pub(super) fn quit<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let headers = into_headers(req);
        if let Err(forbidden) = self.may(caller) {
            return finish(headers, &Method::POST, (StatusCode::FORBIDDEN, forbidden));
        }
        let drain = self.drain.clone();
        ResponseFuture::waiting(async move {
            let answer = match drain.quit().await {
                true => (StatusCode::OK, Bytes::from_static(b"OK\n")),
                false => stopping(),
            };
            respond(headers, &Method::POST, answer)
        })
    }

    /// `POST /drain[?nowait][&prestop]`: drains; answers once drained, or
    /// once the drain has begun (`nowait`). `prestop`: the proxy's preStop
    /// hook asks, the pod terminates (else an operator asks, and the pod
    /// leaves its Service's endpoints: the kubelet is answered 503 too).
    pub(super) fn drain<B>(&self, caller: &Caller, req: Request<B>) -> ResponseFuture {
        let has = |name: &str| req.uri().query().is_some_and(|q| q.split('&').any(|p| p == name));
        let (nowait, prestop) = (has("nowait"), has("prestop"));
        let asker = match prestop {
            true => Asker::PreStop,
            false => Asker::Operator,
        };
        let mut headers = into_headers(req);
        if let Err(forbidden) = self.may(caller) {
            return finish(headers, &Method::POST, (StatusCode::FORBIDDEN, forbidden));
        }
        let drain = self.drain.clone();
        ResponseFuture::waiting(async move {
            let (status, drained) = match nowait {
                true => (StatusCode::ACCEPTED, drain.begin(asker).await),
                false => (StatusCode::OK, drain.drain(asker).await),
            };
            let answer = match drained {
                Some(drained) => {
                    headers.insert(CONTENT_TYPE, APPLICATION_JSON.clone());
                    (status, status_json(&drained))
                }
                None => stopping(),
            };
            respond(headers, &Method::POST, answer)
        })
    }
}

fn status_json(status: &lifeguard_drain::Status) -> Bytes {
    let mut body = serde_json::to_vec(status).unwrap_or_default();
    body.push(b'\n');
    Bytes::from(body)
}

fn stopping() -> (StatusCode, Bytes) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Bytes::from_static(b"lifeguard is stopping\n"),
    )
}
