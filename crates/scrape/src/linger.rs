//! The linger: a last scrape can see how the drain ended.
//!
//! lifeguard would exit a few milliseconds after Envoy stops, before any
//! Prometheus scrape could see the `stopped` phase, the final counts or
//! whether the deadline cut the drain. With `--linger D` the status port
//! keeps answering after Envoy stops (readiness 503, `GET /drain`,
//! `/stats/prometheus` with the final state) until either
//!
//! - one scrape of `/stats/prometheus` that began after Envoy stopped has
//!   been served, or
//! - D has passed since Envoy stopped,
//!
//! whichever comes first, and never past the pod's grace period (counted
//! from the start of the drain), so a drain cut by the deadline lingers at
//! most within the shutdown margin.
//!
//! "Began after Envoy stopped" is decided when the scrape begins, from the
//! drain's published phase (the status the scrape renders is read after
//! that, so it is the final one): [`Linger::scrape_begins`] hands the route
//! a [`Scrape`] ticket, and [`Scrape::served`] counts it.

use lifeguard_base::grace::Grace;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use lifeguard_drain::{Phase, Status};

/// Shared by the scrape route (which reports scrapes) and the binary
/// (which waits). Cloning shares it.
#[derive(Clone)]
pub struct Linger {
    status: watch::Receiver<Status>,
    seen: Arc<watch::Sender<bool>>,
}

/// One scrape under way.
#[must_use = "a scrape counts once served"]
pub struct Scrape {
    after_stop: bool,
    seen: Arc<watch::Sender<bool>>,
}

/// Why the linger ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lingered {
    /// A scrape that began after Envoy stopped was served.
    Scraped,
    /// The time ran out first (or there was none to wait).
    TimeUp,
}

impl Linger {
    /// A linger over the drain's published status.
    pub fn new(status: watch::Receiver<Status>) -> Linger {
        Linger {
            status,
            seen: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Called when a scrape of `/stats/prometheus` begins.
    pub fn scrape_begins(&self) -> Scrape {
        Scrape {
            after_stop: self.status.borrow().phase == Phase::Stopped,
            seen: self.seen.clone(),
        }
    }

    /// Waits until a scrape that began after Envoy stopped has been served,
    /// or `bound` has passed.
    pub(crate) async fn wait(&self, bound: Duration) -> Lingered {
        let mut seen = self.seen.subscribe();
        let scraped = tokio::time::timeout(bound, seen.wait_for(|&s| s))
            .await
            .is_ok_and(|r| r.is_ok());
        if scraped {
            Lingered::Scraped
        } else {
            Lingered::TimeUp
        }
    }
}

impl Linger {
    /// After Envoy stops: keeps the status port answering for a last scrape
    /// of the final state, `linger_for` at most and never past the grace
    /// period (counted from the drain's start in `status`).
    pub async fn linger(&self, linger_for: Duration, status: &Status, grace: Grace) {
        let bound = bound(linger_for, status, grace);
        if bound.is_zero() {
            return;
        }
        let up_to = lifeguard_base::duration::GoDuration(bound);
        tracing::info!(%up_to, "Envoy stopped; lingering for a last scrape of /stats/prometheus");
        match self.wait(bound).await {
            Lingered::Scraped => tracing::info!("a scrape saw the final state"),
            Lingered::TimeUp => tracing::info!("no scrape came while lingering"),
        }
    }
}

impl Scrape {
    /// The scrape's answer is ready: it counts if it began after Envoy
    /// stopped.
    pub fn served(self) {
        if self.after_stop {
            self.seen.send_replace(true);
        }
    }
}

/// How long to linger: `linger`, but never past the grace period counted
/// from the start of the drain in `status` (if there was one).
pub(crate) fn bound(linger: Duration, status: &Status, grace: Grace) -> Duration {
    let Some(started) = status.started_at else {
        return linger;
    };
    let now = lifeguard_base::duration::unix_now();
    let left = (started + grace.period().as_secs_f64() - now).max(0.0);
    linger.min(Duration::from_secs_f64(left))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_drain::DrainUntil;

    fn status(phase: Phase) -> (watch::Sender<Status>, Linger) {
        let mut s = Status::initial(DrainUntil::Time, String::new());
        s.phase = phase;
        let (tx, rx) = watch::channel(s);
        (tx, Linger::new(rx))
    }

    #[tokio::test(start_paused = true)]
    async fn a_scrape_begun_after_the_stop_ends_the_linger() {
        let (_tx, linger) = status(Phase::Stopped);
        let waiting = tokio::spawn({
            let linger = linger.clone();
            async move { linger.wait(Duration::from_secs(30)).await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let began = tokio::time::Instant::now();
        linger.scrape_begins().served();
        assert_eq!(waiting.await.unwrap(), Lingered::Scraped);
        assert_eq!(began.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_scrape_begun_before_the_stop_does_not_count() {
        let (tx, linger) = status(Phase::Stopping);
        let early = linger.scrape_begins();
        tx.send_modify(|s| s.phase = Phase::Stopped);
        early.served();
        let start = tokio::time::Instant::now();
        assert_eq!(linger.wait(Duration::from_secs(5)).await, Lingered::TimeUp);
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_scrape_served_before_the_wait_still_counts() {
        let (_tx, linger) = status(Phase::Stopped);
        linger.scrape_begins().served();
        assert_eq!(linger.wait(Duration::from_secs(5)).await, Lingered::Scraped);
    }

    #[test]
    fn never_past_the_grace_period() {
        let grace = Grace::new(Duration::from_secs(30), Duration::from_secs(2)).unwrap();
        let mut s = Status::initial(DrainUntil::Time, String::new());
        assert_eq!(bound(Duration::from_secs(20), &s, grace), Duration::from_secs(20));
        let now = lifeguard_base::duration::unix_now();
        s.started_at = Some(now - 28.0);
        let b = bound(Duration::from_secs(20), &s, grace);
        assert!(b <= Duration::from_secs(2) && b > Duration::from_millis(1900), "{b:?}");
        s.started_at = Some(now - 40.0);
        assert_eq!(bound(Duration::from_secs(20), &s, grace), Duration::ZERO);
    }
}
