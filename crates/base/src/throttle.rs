//! A log line that can repeat without bound (a refused connection, a
//! failed read) goes through a [`Throttle`]: one line per period, saying
//! how many it held back.

use std::time::Duration;

use tokio::time::Instant;

/// Lets a repeated log line through at most once per period, and counts
/// the occurrences it held back, so a flood of one event is one line that
/// says how many there were.
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            held: 0,
        }
    }

    /// Whether a line is due at `now`; when it is not, this occurrence is
    /// counted as held back.
    pub fn due(&mut self, now: Instant) -> bool {
        let due = self.last.is_none_or(|t| now.duration_since(t) >= self.every);
        match due {
            true => self.last = Some(now),
            false => self.held += 1,
        }
        due
    }

    /// How many occurrences were held back since the last line; resets.
    pub fn take_held(&mut self) -> u64 {
        std::mem::take(&mut self.held)
    }
}
