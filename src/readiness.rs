//! The readiness snapshot: one small type that the poller writes and the
//! probe reads, without locks and without ever waiting on Envoy.
//!
//! The poller stores a [`Verdict`] (ready or not, and the response body,
//! formatted once) after every admin read. The probe handler loads the
//! latest verdict — an atomic pointer load — and checks two things the
//! verdict cannot know by itself:
//!
//! - **draining**: set by the drain the moment it begins, before any network
//!   call; from then on every probe answers 503 `draining`, whatever Envoy
//!   says.
//! - **staleness**: a verdict older than the stale bound is not trusted. If
//!   the poller stopped producing answers, a probe that reaches the agent
//!   directly must not be told "ready" about an Envoy that may be gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;

use crate::duration::Display as D;

/// What the probe answers: ready or not, and the body to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub ready: bool,
    pub body: Bytes,
}

/// One admin read turned into a readiness decision.
#[derive(Debug)]
pub struct Verdict {
    ready: bool,
    /// One line of plain text, newline-terminated: `ready` or the reason.
    body: Bytes,
    /// When the read that produced this verdict completed.
    at: Instant,
}

impl Verdict {
    pub fn ready(at: Instant) -> Self {
        Self {
            ready: true,
            body: Bytes::from_static(b"ready\n"),
            at,
        }
    }

    pub fn not_ready(reason: &str, at: Instant) -> Self {
        Self {
            ready: false,
            body: Bytes::from(format!("not ready: {reason}\n")),
            at,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Time since the read that produced this verdict.
    pub fn age(&self) -> Duration {
        self.at.elapsed()
    }

    /// The reason it is not ready (or `ready`), without the trailing newline.
    pub fn text(&self) -> &str {
        let text = std::str::from_utf8(&self.body).unwrap_or("").trim_end();
        text.strip_prefix("not ready: ").unwrap_or(text)
    }
}

/// The shared readiness state. Cloning gives another handle to the same state.
#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

struct Inner {
    verdict: ArcSwap<Verdict>,
    draining: AtomicBool,
    stale_after: Duration,
    draining_body: Bytes,
    stale_body: Bytes,
}

impl Readiness {
    /// A new snapshot that says "not ready: no admin read yet" until the
    /// poller stores its first verdict.
    pub fn new(stale_after: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                verdict: ArcSwap::from_pointee(Verdict::not_ready("no answer from Envoy admin yet", Instant::now())),
                draining: AtomicBool::new(false),
                stale_after,
                draining_body: Bytes::from_static(b"not ready: draining\n"),
                stale_body: Bytes::from(format!(
                    "not ready: no successful Envoy admin read in the last {}\n",
                    D(stale_after)
                )),
            }),
        }
    }

    /// The probe's answer. Never blocks, never allocates.
    #[inline]
    pub fn answer(&self) -> Answer {
        let inner = &*self.inner;
        if inner.draining.load(Ordering::Acquire) {
            return Answer {
                ready: false,
                body: inner.draining_body.clone(),
            };
        }
        let verdict = inner.verdict.load();
        if verdict.ready && verdict.at.elapsed() > inner.stale_after {
            return Answer {
                ready: false,
                body: inner.stale_body.clone(),
            };
        }
        Answer {
            ready: verdict.ready,
            body: verdict.body.clone(),
        }
    }

    /// Stores the poller's latest verdict; returns the previous one.
    pub fn store(&self, verdict: Verdict) -> Arc<Verdict> {
        self.inner.verdict.swap(Arc::new(verdict))
    }

    /// The latest verdict stored by the poller (draining not applied).
    pub fn verdict(&self) -> Arc<Verdict> {
        self.inner.verdict.load_full()
    }

    /// Turns readiness to 503 `draining` for good. Returns true for the
    /// call that made the change.
    pub fn start_draining(&self) -> bool {
        !self.inner.draining.swap(true, Ordering::AcqRel)
    }

    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_not_ready_with_a_reason() {
        let r = Readiness::new(Duration::from_secs(4));
        let a = r.answer();
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: no answer from Envoy admin yet\n");
    }

    #[test]
    fn serves_the_stored_verdict() {
        let r = Readiness::new(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(
            r.answer(),
            Answer {
                ready: true,
                body: Bytes::from_static(b"ready\n")
            }
        );
        r.store(Verdict::not_ready("server.state is INITIALIZING", Instant::now()));
        let a = r.answer();
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: server.state is INITIALIZING\n");
    }

    #[test]
    fn draining_wins_over_ready_and_is_sticky() {
        let r = Readiness::new(Duration::from_secs(4));
        r.store(Verdict::ready(Instant::now()));
        assert!(r.start_draining());
        assert!(!r.start_draining());
        r.store(Verdict::ready(Instant::now()));
        assert_eq!(r.answer().body, "not ready: draining\n");
        assert!(!r.answer().ready);
    }

    #[test]
    fn an_old_ready_verdict_is_not_trusted() {
        let r = Readiness::new(Duration::from_millis(50));
        let old = Instant::now().checked_sub(Duration::from_millis(60)).unwrap();
        r.store(Verdict::ready(old));
        let a = r.answer();
        assert!(!a.ready);
        assert_eq!(a.body, "not ready: no successful Envoy admin read in the last 50ms\n");
    }
}
