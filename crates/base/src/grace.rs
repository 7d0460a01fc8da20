//! The pod's grace period and the part of it lifeguard keeps back: one
//! value, made once from the settings, shared by the drain (its deadline,
//! Envoy's stop), the drain wait (its bound and its budget), Envoy's
//! settings and the metrics' linger.

use std::time::Duration;

use crate::duration::GoDuration;

/// The shortest shutdown margin: the time Envoy gets between SIGTERM and
/// SIGKILL, kept back from the grace period.
pub const MIN_SHUTDOWN_MARGIN: Duration = Duration::from_millis(100);

/// The pod's termination grace period (from the kubelet's SIGTERM to its
/// SIGKILL) and the shutdown margin lifeguard keeps back from it to stop
/// Envoy and exit. The drain's deadline is the period less the margin:
/// Envoy is stopped by then, and has the margin to exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grace {
    period: Duration,
    margin: Duration,
}

/// A margin the grace period cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraceError {
    #[error(
        "must be at least {}: Envoy gets this long to exit after SIGTERM, inside the grace period",
        GoDuration(MIN_SHUTDOWN_MARGIN)
    )]
    MarginTooShort(Duration),
    #[error("must be shorter than termination_grace_period ({})", GoDuration(*.period))]
    MarginNotUnderPeriod { margin: Duration, period: Duration },
}

impl GraceError {
    /// The margin refused.
    pub fn margin(&self) -> Duration {
        match self {
            GraceError::MarginTooShort(margin) | GraceError::MarginNotUnderPeriod { margin, .. } => *margin,
        }
    }
}

impl Grace {
    /// A grace period of `period` with `margin` kept back: at least
    /// [`MIN_SHUTDOWN_MARGIN`], and shorter than the period.
    pub fn new(period: Duration, margin: Duration) -> Result<Grace, GraceError> {
        if margin < MIN_SHUTDOWN_MARGIN {
            return Err(GraceError::MarginTooShort(margin));
        }
        if margin >= period {
            return Err(GraceError::MarginNotUnderPeriod { margin, period });
        }
        Ok(Grace { period, margin })
    }

    /// The pod's grace period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What is kept back to stop Envoy and exit: how long Envoy gets
    /// between SIGTERM and SIGKILL.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// From the drain's start to Envoy's stop, at the latest: the period
    /// less the margin.
    pub fn deadline(&self) -> Duration {
        self.period - self.margin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_period_less_the_margin_and_bad_margins_are_refused() {
        let s = Duration::from_secs;
        let grace = Grace::new(s(30), s(2)).unwrap();
        assert_eq!((grace.period(), grace.margin(), grace.deadline()), (s(30), s(2), s(28)));
        assert_eq!(
            Grace::new(s(30), Duration::from_millis(50)),
            Err(GraceError::MarginTooShort(Duration::from_millis(50)))
        );
        let err = Grace::new(s(2), s(2)).unwrap_err();
        assert_eq!(err.to_string(), "must be shorter than termination_grace_period (2s)");
        assert_eq!(err.margin(), s(2));
    }
}
