//! The merged scrape's words and its counters of them: how a scrape got
//! Envoy's metrics ([`ScrapeRead`]), why a part of it is missing or cut
//! short ([`Incomplete`]); their families are `lifeguard_metrics`' (one
//! list of names), registered when the scrape is built, every series there
//! from the start.

use metrics::Counter;

use lifeguard_base::reason::ByReason;
use lifeguard_metrics::{CounterFamily, Metrics, ScrapeSource};

/// Why a merged scrape carries less than Envoy's (or an app target's)
/// whole body: its `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Incomplete {
    /// The scrape's time budget ran out first.
    Timeout,
    /// Envoy could not be read, answered an error, or broke off.
    Error,
    /// Envoy's body passed the size cap.
    Cap,
    /// Too many Envoy reads were already held for slow clients.
    Busy,
    /// The client held the shared window full while others waited, and
    /// was let go (see the shared window, `window`).
    Slow,
}

/// How a merged scrape got Envoy's metrics: its `read` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ScrapeRead {
    /// A read of its own.
    New,
    /// One shared with other scrapes already reading.
    Joined,
}

/// Envoy's part of the merged scrape, counted: how each scrape read it
/// (`lifeguard_scrape_envoy_reads_total{read}`) and why it was missing or
/// cut short (`lifeguard_scrape_envoy_incomplete_total{reason}`, each also
/// in `lifeguard_scrape_failures_total{source="envoy"}`).
pub(crate) struct EnvoyCounters {
    reads: ByReason<ScrapeRead, Counter>,
    incomplete: ByReason<Incomplete, Counter>,
}

impl EnvoyCounters {
    pub(crate) fn new(metrics: &Metrics) -> EnvoyCounters {
        let incomplete = metrics.counters(CounterFamily::SCRAPE_ENVOY_INCOMPLETE, &[], |_| true);
        EnvoyCounters {
            reads: metrics.counters(CounterFamily::SCRAPE_ENVOY_READS, &[], |_| true),
            incomplete: metrics.scrape_failures(ScrapeSource::Envoy, incomplete),
        }
    }

    /// A scrape got Envoy's metrics from a new read or a shared one.
    pub(crate) fn read(&self, read: ScrapeRead) {
        self.reads.get(read).increment(1);
    }

    /// A scrape's Envoy part is missing or cut short.
    pub(crate) fn incomplete(&self, why: Incomplete) {
        self.incomplete.get(why).increment(1);
    }
}

/// One app metrics target's failures:
/// `lifeguard_scrape_app_incomplete_total{target,reason}`, each also counted
/// in `lifeguard_scrape_failures_total{source="app"}`.
pub(crate) struct AppFailures {
    by_reason: ByReason<Incomplete, Counter>,
}

impl AppFailures {
    /// The counters of the target labelled `target` (its port and path).
    /// An app read has no shared window, so it is never let go as
    /// [`Incomplete::Slow`]; were it, it counts as a failure of the app
    /// source, with no reason series of its own.
    pub(crate) fn new(metrics: &Metrics, target: &str) -> AppFailures {
        let fixed = [("target", target)];
        let counters = metrics.counters(CounterFamily::SCRAPE_APP_INCOMPLETE, &fixed, |why| {
            why != Incomplete::Slow
        });
        AppFailures {
            by_reason: metrics.scrape_failures(ScrapeSource::App, counters),
        }
    }

    /// One scrape whose part from the target is missing or cut short.
    pub(crate) fn count(&self, why: Incomplete) {
        self.by_reason.get(why).increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeguard_base::reason::Label;
    use lifeguard_drain::{DrainUntil, Status};
    use lifeguard_envoy::readiness::Readiness;
    use std::time::Duration;
    use tokio::time::Instant;

    fn rendered(metrics: &Metrics) -> String {
        let status = Status::initial(DrainUntil::Requests, String::new());
        metrics.render(&Readiness::standalone(Duration::from_secs(4)), Some(&status), None)
    }

    /// Every reason counts for an app target, none panics: each of an app
    /// read's own in its series; `slow` (never an app read's) in the app
    /// source's total only, with no series of its own.
    #[test]
    fn every_reason_counts_for_an_app_target() {
        let metrics = Metrics::new(Instant::now());
        let failures = AppFailures::new(&metrics, "8080/metrics");
        for why in Incomplete::all() {
            failures.count(why);
        }
        let text = rendered(&metrics);
        for reason in ["timeout", "error", "cap", "busy"] {
            let series =
                format!("lifeguard_scrape_app_incomplete_total{{target=\"8080/metrics\",reason=\"{reason}\"}} 1\n");
            assert!(text.contains(&series), "{series}{text}");
        }
        let app_slow =
            |l: &str| l.starts_with("lifeguard_scrape_app_incomplete_total") && l.contains("reason=\"slow\"");
        assert!(!text.lines().any(app_slow), "{text}");
        assert!(
            text.contains("lifeguard_scrape_failures_total{source=\"app\"} 5\n"),
            "{text}"
        );
    }

    /// Envoy's part counts every reason in its own series, and each read.
    #[test]
    fn every_reason_counts_for_envoy() {
        let metrics = Metrics::new(Instant::now());
        let counters = EnvoyCounters::new(&metrics);
        for why in Incomplete::all() {
            counters.incomplete(why);
        }
        counters.read(ScrapeRead::Joined);
        let text = rendered(&metrics);
        for reason in ["timeout", "error", "cap", "busy", "slow"] {
            let series = format!("lifeguard_scrape_envoy_incomplete_total{{reason=\"{reason}\"}} 1\n");
            assert!(text.contains(&series), "{series}{text}");
        }
        assert!(
            text.contains("lifeguard_scrape_failures_total{source=\"envoy\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("lifeguard_scrape_envoy_reads_total{read=\"new\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("lifeguard_scrape_envoy_reads_total{read=\"joined\"} 1\n"),
            "{text}"
        );
    }
}
