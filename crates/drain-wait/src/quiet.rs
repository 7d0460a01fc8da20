//! How long "no new request" must last before it says the traffic has
//! stopped, rather than that a gap came by chance.
//!
//! Before the drain, the pod's inbound arrivals are sampled every
//! `SAMPLE_EVERY` (`History`); when the drain begins, the rate over the
//! last `WINDOW` gives the quiet period: requests arriving at random at
//! `r` a second leave a gap of `t` seconds with probability `e^(-r·t)`, so
//! a gap of `ln(1/CHANCE) / r` (6.9 / r) comes by chance at most once in
//! `CHANCE`'s thousand. At 2 requests a second that is 3.5 s; at 200 a
//! second 35 ms, so the floor (`--drain-wait-min-quiet-period`, 0.5 s) decides; a pod
//! with no request in the window has nothing to wait for, and gets the
//! floor. The wait's own bound is the ceiling. A pod that had no request
//! before some point (new, not yet in rotation) is measured from then.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::Arrivals;

/// A gap as long as the quiet period comes by chance at most this often.
pub(crate) const CHANCE: f64 = 1e-3;
/// How often the arrivals are sampled before the drain: a stats read
/// costs Envoy's admin thread up to about 200 ms at 20,000 clusters, 2 %
/// of its time at this pace (and no sooner than the read pace allows).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The rate is taken over at most this long before the drain.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// The arrivals sampled before the drain, the last [`WINDOW`] of them.
#[derive(Debug, Default)]
pub(crate) struct History {
    samples: VecDeque<(Instant, Arrivals)>,
}

/// The pod's traffic before the drain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate {
    /// New requests a second over the stretches between samples but the
    /// busiest (a burst, or a flood from a peer that saw the drain coming,
    /// does not shorten the quiet period; with one stretch, its rate). Not
    /// the quietest stretch: at a request a second or two per pod, a 10 s
    /// stretch of half the rate comes by chance, and made the wait last
    /// its bound in one rolling restart of four.
    pub(crate) per_second: f64,
    /// Requests in all, and over how long.
    pub(crate) arrived: u64,
    pub(crate) over: Duration,
}

/// Stretches between samples shorter than this are joined to the one
/// before (the drain's first read may come a moment after a sample).
const STRETCH: Duration = Duration::from_secs(5);

impl History {
    /// One sample, at `at`.
    pub(crate) fn push(&mut self, at: Instant, arrivals: Arrivals) {
        self.samples.push_back((at, arrivals));
        // Keep one sample at least WINDOW old, so the rate spans the window.
        while self.samples.len() > 2 && self.samples[1].0 + WINDOW <= at {
            self.samples.pop_front();
        }
    }

    /// The rate over the samples of the newest one's generation (None:
    /// fewer than two, or less than a second apart). Samples before the
    /// last that saw no new request since the one before are left out: a
    /// pod not yet in rotation (new, its load balancers still adding it)
    /// is not a pod of sparse traffic.
    pub(crate) fn rate(&self) -> Option<Rate> {
        let newest = self.samples.back()?.1;
        let same: Vec<(Instant, u64)> = self
            .samples
            .iter()
            .filter(|(_, a)| a.generation == newest.generation)
            .map(|(at, a)| (*at, a.total))
            .collect();
        // The last sample of the leading run with one total (the first,
        // when no sample saw a request: a pod idle all along).
        let idle = same.iter().take_while(|(_, total)| *total == same[0].1).count();
        let same = &same[if idle == same.len() { 0 } else { idle - 1 }..];
        let (first, last) = (same[0], same[same.len() - 1]);
        let over = last.0.saturating_duration_since(first.0);
        if over < Duration::from_secs(1) {
            return None;
        }
        let per_second = but_the_busiest(stretches(same).map(|((t0, n0), (t1, n1))| {
            (
                n1.saturating_sub(n0) as f64,
                t1.saturating_duration_since(t0).as_secs_f64(),
            )
        }));
        Some(Rate {
            per_second,
            arrived: last.1.saturating_sub(first.1),
            over,
        })
    }
}

/// The rate of (requests, seconds) stretches, the busiest left out when
/// there are several.
fn but_the_busiest(stretches: impl Iterator<Item = (f64, f64)>) -> f64 {
    let all: Vec<(f64, f64)> = stretches.collect();
    let busiest = (all.len() > 1)
        .then(|| (0..all.len()).max_by(|&a, &b| (all[a].0 / all[a].1).total_cmp(&(all[b].0 / all[b].1))))
        .flatten();
    let (n, secs) = all
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != busiest)
        .fold((0.0, 0.0), |(n, t), (_, (dn, dt))| (n + dn, t + dt));
    n / secs
}

/// The stretches between samples, each at least [`STRETCH`] long (a
/// shorter one at the end joins the one before), as (start, end) samples.
fn stretches(samples: &[(Instant, u64)]) -> impl Iterator<Item = ((Instant, u64), (Instant, u64))> + '_ {
    let mut bounds = vec![samples[0]];
    for &sample in &samples[1..] {
        let start = bounds[bounds.len() - 1];
        if sample.0.saturating_duration_since(start.0) >= STRETCH {
            bounds.push(sample);
        }
    }
    let last = samples[samples.len() - 1];
    match bounds.len() {
        1 => bounds.push(last),
        n => bounds[n - 1] = last,
    }
    (1..bounds.len()).map(move |i| (bounds[i - 1], bounds[i]))
}

/// The quiet period for a pod that had `rate` before the drain, between
/// `floor` and `ceiling`: the floor when nothing was sending (or nothing
/// is known), the ceiling when only the busiest stretch had requests (a
/// burst is no traffic to measure).
pub(crate) fn quiet_period(rate: Option<Rate>, floor: Duration, ceiling: Duration) -> Duration {
    let ceiling = ceiling.max(floor);
    match rate {
        None => floor,
        Some(r) if r.arrived == 0 => floor,
        Some(r) if r.per_second <= 0.0 => ceiling,
        Some(r) => {
            let secs = (1.0 / CHANCE).ln() / r.per_second;
            Duration::try_from_secs_f64(secs).map_or(ceiling, |d| d.clamp(floor, ceiling))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn of(total: u64, generation: u64) -> Arrivals {
        Arrivals {
            seq: Arrivals::next_seq(),
            total,
            generation,
            read: Instant::now(),
            took: Duration::ZERO,
        }
    }

    fn at(total: u64) -> Arrivals {
        of(total, 1)
    }

    fn rate(per_second: f64) -> Option<Rate> {
        Some(Rate {
            per_second,
            arrived: 100,
            over: WINDOW,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_is_of_the_last_minute_but_its_busiest_stretch_of_one_generation() {
        let t0 = Instant::now();
        let mut h = History::default();
        assert_eq!(h.rate(), None);
        h.push(t0, at(0));
        assert_eq!(h.rate(), None, "one sample is no rate");
        // 2 requests a second for two minutes, sampled every 10 s.
        for k in 1..=12u64 {
            h.push(t0 + SEC * (10 * k as u32), at(20 * k));
        }
        let r = h.rate().unwrap();
        assert_eq!(r.over, Duration::from_secs(60), "the window, not since start");
        assert!((r.per_second - 2.0).abs() < 1e-9, "{r:?}");
        // A burst in the last 10 s (a peer's flood) does not raise it.
        h.push(t0 + SEC * 130, at(240 + 600));
        let r = h.rate().unwrap();
        assert!((r.per_second - 2.0).abs() < 1e-9, "{r:?}");
        assert_eq!(r.arrived, 840 - 140);
        // The drain's first read 2 s after a sample joins the last stretch.
        h.push(t0 + SEC * 132, at(844));
        assert!((h.rate().unwrap().per_second - 2.0).abs() < 1e-9);
        // The listeners changed: only the new generation's samples count.
        h.push(t0 + SEC * 140, of(5, 2));
        assert_eq!(h.rate(), None);
        h.push(t0 + SEC * 150, of(25, 2));
        assert_eq!(h.rate().unwrap().per_second, 2.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_not_yet_in_rotation_is_measured_from_its_first_requests() {
        let t0 = Instant::now();
        let mut h = History::default();
        // Ready at 0, idle until the load balancer adds it at 25 s, then
        // 2 requests a second.
        for (secs, total) in [(0, 0), (10, 0), (20, 0), (30, 10), (40, 30)] {
            h.push(t0 + SEC * secs, at(total));
        }
        let r = h.rate().unwrap();
        assert_eq!(r.over, 20 * SEC, "from the last sample that saw nothing");
        assert_eq!(r.per_second, 1.0, "a low estimate: the first requests came 5 s into it");
        // Nothing at all: no requests, the floor.
        let mut idle = History::default();
        idle.push(t0, at(7));
        idle.push(t0 + 10 * SEC, at(7));
        assert_eq!(idle.rate().unwrap().arrived, 0);
        // Sparse traffic with a stretch of none: the busiest left out
        // (3 in 10 s), 2 in 20 s.
        let mut sparse = History::default();
        for (secs, total) in [(0, 0), (10, 3), (20, 3), (30, 5)] {
            sparse.push(t0 + SEC * secs, at(total));
        }
        let r = sparse.rate();
        assert!((r.unwrap().per_second - 0.1).abs() < 1e-9, "{r:?}");
        assert_eq!(quiet_period(r, SEC, 23 * SEC), 23 * SEC);
        // One burst, then nothing: no traffic to measure, the ceiling.
        let mut burst = History::default();
        for (secs, total) in [(0, 0), (10, 50), (20, 50), (30, 50)] {
            burst.push(t0 + SEC * secs, at(total));
        }
        let r = burst.rate();
        assert_eq!(r.unwrap().per_second, 0.0);
        assert_eq!(quiet_period(r, SEC, 23 * SEC), 23 * SEC);
        // A chance quiet stretch in sparse traffic does not make it the
        // ceiling: 7, 2, 8 in three 10 s stretches (0.67 a second, the
        // pods of a 2-a-second rollout): 9 in 20 s, 15.4 s.
        let mut chance = History::default();
        for (secs, total) in [(0, 0), (10, 7), (20, 9), (30, 17)] {
            chance.push(t0 + SEC * secs, at(total));
        }
        let r = chance.rate();
        assert!((r.unwrap().per_second - 0.45).abs() < 1e-9, "{r:?}");
        assert!(quiet_period(r, SEC, 23 * SEC) < 16 * SEC);
    }

    #[test]
    fn the_quiet_period_is_a_gap_that_comes_by_chance_once_in_a_thousand() {
        let (floor, ceiling) = (SEC, Duration::from_secs(23));
        // 2 a second: ln(1000) / 2 = 3.45 s.
        let q = quiet_period(rate(2.0), floor, ceiling);
        assert_eq!(q.as_millis(), 3453);
        // e^(-2 x 3.45) is one in a thousand.
        assert!(((-2.0 * q.as_secs_f64()).exp() - CHANCE).abs() < 1e-5);
        // Busy pods get the floor; sparse ones the ceiling.
        assert_eq!(quiet_period(rate(200.0), floor, ceiling), floor);
        assert_eq!(quiet_period(rate(0.05), floor, ceiling), ceiling);
        // No traffic at all, or no measure of it: the floor.
        let none = Some(Rate {
            per_second: 0.0,
            arrived: 0,
            over: WINDOW,
        });
        assert_eq!(quiet_period(none, floor, ceiling), floor);
        assert_eq!(quiet_period(None, floor, ceiling), floor);
        // A ceiling under the floor: the floor.
        assert_eq!(quiet_period(rate(0.01), floor, Duration::ZERO), floor);
    }
}
