//! Who health-checks the pod, learned from the readiness probes themselves.
//!
//! Every answer to `/healthz/ready` is recorded against its checker: the
//! caller's address and its `User-Agent` (two load balancers behind one
//! address, an ELB and a GoogleHC say, are two checkers). A probe that
//! came through Envoy's status listener reaches lifeguard from loopback;
//! its real peer is the last `x-forwarded-for` entry, which Envoy appends
//! when the status listener sets `use_remote_address` (the shipped
//! bootstraps do). That header is trusted from loopback only: a remote
//! caller cannot pose as another checker. Without it (Istio's bootstrap),
//! the probes through Envoy are one checker, `127.0.0.1`.
//!
//! The kubelet (`User-Agent: kube-probe/…`) is not a load balancer: on
//! deletion its Service endpoints drop the pod whatever the probes say, so
//! its probes are not recorded.
//!
//! The table is on the probe's hot path: a lock held for a scan of at most
//! [`MAX_CHECKERS`] small entries, no allocation (keys are fixed-size
//! copies, the table is allocated once).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::{HeaderMap, USER_AGENT};
use tokio::time::Instant;

use crate::url::is_loopback;

/// At most this many checkers are remembered; a new one then replaces the
/// one heard from least recently.
pub(crate) const MAX_CHECKERS: usize = 32;
/// Bytes of a `User-Agent` kept to tell checkers apart.
const AGENT_BYTES: usize = 40;
/// A gap between two probes longer than this is not a checking interval
/// (the longest cloud default is 300 s): the checker starts over.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(300);
/// Gaps remembered per checker; its interval is the longest of them.
const GAPS: usize = 4;

/// Who sent a probe: an address and the start of its `User-Agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckerKey {
    pub(crate) ip: IpAddr,
    /// The peer came from `x-forwarded-for` (a probe through Envoy).
    pub(crate) forwarded: bool,
    agent: [u8; AGENT_BYTES],
    agent_len: u8,
}

impl CheckerKey {
    /// The checker of a readiness probe from `peer` with `headers`; None for
    /// the kubelet and for callers without an address (the control socket).
    pub(crate) fn of(peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<CheckerKey> {
        let peer = peer?.ip();
        let agent = headers.get(USER_AGENT).map_or(&b""[..], |v| v.as_bytes());
        if agent.starts_with(b"kube-probe/") {
            return None;
        }
        let forwarded = is_loopback(peer).then(|| forwarded_peer(headers)).flatten();
        let mut key = CheckerKey {
            ip: forwarded.unwrap_or(peer),
            forwarded: forwarded.is_some(),
            agent: [0; AGENT_BYTES],
            agent_len: 0,
        };
        let n = agent.len().min(AGENT_BYTES);
        key.agent[..n].copy_from_slice(&agent[..n]);
        key.agent_len = n as u8;
        Some(key)
    }

    /// The `User-Agent` as sent (its first bytes), if any.
    pub(crate) fn agent(&self) -> Option<String> {
        let agent = &self.agent[..self.agent_len as usize];
        (!agent.is_empty()).then(|| String::from_utf8_lossy(agent).into_owned())
    }
}

/// `10.0.0.5`, `10.0.0.5 (ELB-HealthChecker/2.0)`.
impl std::fmt::Display for CheckerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.ip)?;
        match self.agent() {
            Some(agent) => write!(f, " ({agent})"),
            None => Ok(()),
        }
    }
}

/// The last entry of `x-forwarded-for`: the peer Envoy appended.
fn forwarded_peer(headers: &HeaderMap) -> Option<IpAddr> {
    let last = headers.get_all("x-forwarded-for").iter().next_back()?;
    let text = std::str::from_utf8(last.as_bytes()).ok()?;
    text.rsplit(',').next()?.trim().parse().ok()
}

/// One checker as the rule sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checker {
    pub(crate) key: CheckerKey,
    pub(crate) probes: u64,
    pub(crate) last_seen: Instant,
    /// The longest of its recent gaps between probes; None after a single
    /// probe.
    pub(crate) interval: Option<Duration>,
    /// Probes answered other than 200 since its last 200.
    pub(crate) failures_in_row: u32,
}

struct Entry {
    key: CheckerKey,
    probes: u64,
    last_seen: Instant,
    gaps: [Duration; GAPS],
    gap_count: usize,
    failures_in_row: u32,
}

impl Entry {
    fn view(&self) -> Checker {
        let gaps = &self.gaps[..self.gap_count.min(GAPS)];
        Checker {
            key: self.key,
            probes: self.probes,
            last_seen: self.last_seen,
            interval: gaps.iter().max().copied(),
            failures_in_row: self.failures_in_row,
        }
    }
}

/// The checkers heard from. Cloning shares the table.
#[derive(Clone)]
pub struct Checkers {
    table: Arc<Mutex<Vec<Entry>>>,
}

impl Default for Checkers {
    fn default() -> Self {
        Self {
            table: Arc::new(Mutex::new(Vec::with_capacity(MAX_CHECKERS))),
        }
    }
}

impl Checkers {
    /// A probe from `key` was answered at `now`, 200 or not (`ok`).
    pub(crate) fn record(&self, key: CheckerKey, now: Instant, ok: bool) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let entry = match table.iter().position(|e| e.key == key) {
            Some(i) => &mut table[i],
            None => {
                let fresh = Entry {
                    key,
                    probes: 0,
                    last_seen: now,
                    gaps: [Duration::ZERO; GAPS],
                    gap_count: 0,
                    failures_in_row: 0,
                };
                if table.len() < MAX_CHECKERS {
                    table.push(fresh);
                    table.last_mut().expect("just pushed")
                } else {
                    let oldest = table.iter_mut().min_by_key(|e| e.last_seen).expect("the table is full");
                    *oldest = fresh;
                    oldest
                }
            }
        };
        if entry.probes > 0 {
            let gap = now.saturating_duration_since(entry.last_seen);
            if gap > MAX_INTERVAL {
                entry.gap_count = 0;
            } else {
                entry.gaps[entry.gap_count % GAPS] = gap;
                entry.gap_count += 1;
            }
        }
        entry.probes += 1;
        entry.last_seen = now;
        entry.failures_in_row = if ok { 0 } else { entry.failures_in_row.saturating_add(1) };
    }

    /// Every checker heard from, as the rule reads them.
    pub(crate) fn snapshot(&self) -> Vec<Checker> {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table.iter().map(Entry::view).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn peer(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_checker_is_its_address_and_agent_and_the_kubelet_is_none() {
        let lb = CheckerKey::of(peer("10.0.0.5:4000"), &headers(&[])).unwrap();
        assert_eq!(lb.to_string(), "10.0.0.5");
        assert!(!lb.forwarded);
        let elb = CheckerKey::of(
            peer("10.0.0.5:4001"),
            &headers(&[("user-agent", "ELB-HealthChecker/2.0")]),
        )
        .unwrap();
        assert_ne!(lb, elb, "another agent at the same address is another checker");
        assert_eq!(elb.to_string(), "10.0.0.5 (ELB-HealthChecker/2.0)");
        let kubelet = headers(&[("user-agent", "kube-probe/1.31")]);
        assert_eq!(CheckerKey::of(peer("10.0.0.1:5000"), &kubelet), None);
        assert_eq!(CheckerKey::of(None, &headers(&[])), None);
    }

    #[test]
    fn the_forwarded_peer_is_trusted_from_loopback_only() {
        let via_envoy = headers(&[("x-forwarded-for", "203.0.113.9, 10.1.2.3")]);
        let key = CheckerKey::of(peer("127.0.0.1:5555"), &via_envoy).unwrap();
        assert_eq!(key.ip, "10.1.2.3".parse::<IpAddr>().unwrap());
        assert!(key.forwarded);
        // A remote caller's own header says nothing.
        let key = CheckerKey::of(peer("10.9.9.9:5555"), &via_envoy).unwrap();
        assert_eq!(key.ip, "10.9.9.9".parse::<IpAddr>().unwrap());
        // Loopback without the header (Istio's bootstrap): loopback.
        let key = CheckerKey::of(peer("127.0.0.1:5555"), &headers(&[])).unwrap();
        assert_eq!(key.ip, "127.0.0.1".parse::<IpAddr>().unwrap());
        // Garbage in the header: loopback too.
        let junk = headers(&[("x-forwarded-for", "not an address")]);
        assert!(!CheckerKey::of(peer("[::1]:5555"), &junk).unwrap().forwarded);
        // Two header lines: the last one's last entry.
        let two = headers(&[("x-forwarded-for", "10.0.0.1"), ("x-forwarded-for", "10.0.0.2")]);
        let key = CheckerKey::of(peer("127.0.0.1:1"), &two).unwrap();
        assert_eq!(key.ip, "10.0.0.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_long_agent_is_cut_and_never_allocates_in_the_key() {
        let long = headers(&[("user-agent", "a-very-long-user-agent-string-that-goes-on-and-on/1.0")]);
        let key = CheckerKey::of(peer("10.0.0.5:1"), &long).unwrap();
        assert_eq!(key.agent().unwrap().len(), AGENT_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn intervals_and_failures_in_a_row_are_learned() {
        let checkers = Checkers::default();
        let key = CheckerKey::of(peer("10.0.0.5:1"), &headers(&[])).unwrap();
        let t0 = Instant::now();
        checkers.record(key, t0, true);
        assert_eq!(checkers.snapshot()[0].interval, None);
        checkers.record(key, t0 + Duration::from_secs(1), true);
        checkers.record(key, t0 + Duration::from_millis(2200), false);
        checkers.record(key, t0 + Duration::from_millis(3100), false);
        let c = &checkers.snapshot()[0];
        assert_eq!((c.probes, c.failures_in_row), (4, 2));
        assert_eq!(c.interval, Some(Duration::from_millis(1200)), "the longest recent gap");
        checkers.record(key, t0 + Duration::from_secs(4), true);
        assert_eq!(checkers.snapshot()[0].failures_in_row, 0, "a 200 ends the run");
        // A gap longer than any checking interval starts the checker over.
        checkers.record(key, t0 + Duration::from_secs(1000), true);
        assert_eq!(checkers.snapshot()[0].interval, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_table_forgets_the_least_recently_heard() {
        let checkers = Checkers::default();
        let t0 = Instant::now();
        for i in 0..MAX_CHECKERS + 1 {
            let addr = SocketAddr::from(([10, 0, 1, i as u8], 1));
            let key = CheckerKey::of(Some(addr), &HeaderMap::new()).unwrap();
            checkers.record(key, t0 + Duration::from_millis(i as u64), true);
        }
        let seen = checkers.snapshot();
        assert_eq!(seen.len(), MAX_CHECKERS);
        assert!(!seen.iter().any(|c| c.key.ip == IpAddr::from([10, 0, 1, 0])));
    }
}
