//! Who health-checks the pod, learned from the readiness probes themselves,
//! in a table no prober can corrupt.
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
//! Anything that can reach the pod's address can probe, with any headers
//! at any rate, so what a prober sends is untrusted:
//!
//! - a checker that has **established** an interval (two probes) and still
//!   probes is never replaced: a new one takes a free entry, or the entry
//!   of one that is not established or has stopped probing, the least
//!   recently heard; when there is none, its probe is **not counted**;
//! - one address has at most `MAX_PER_ADDRESS` checkers (agents): more
//!   agents from it replace only its own unestablished ones, or are not
//!   counted;
//! - with `--drain-wait-checker-ranges`, only probes from those ranges
//!   (cloud health checkers publish theirs) are recorded at all.
//!
//! Each probe not counted is counted by reason (`GET /drain`, the metric
//! `lifeguard_drain_wait_probes_not_counted_total`), and the first of each
//! reason is logged. How long a checker may hold the wait is the drain
//! wait's rule (`lifeguard_drain_wait::rule`).
//!
//! A probe not counted for lack of room is still evidence that someone
//! checks the pod: a real load balancer may be among the probers the table
//! could not take (a peer at its address, flooding under many agents).
//! Such probes are kept apart, in a second table of `MAX_UNPLACED`
//! entries (`Checker::counted` false), so that the rule holds the wait
//! until each of those probers has failed its threshold or stopped, and
//! never ends it for them; past that table too, the last such probe is
//! remembered (`Checkers::overflow`), and holds the wait until the
//! checker timeout. Probes from outside `--drain-wait-checker-ranges` are
//! not load balancers by the operator's word, and hold nothing.
//!
//! The table is on the probe's hot path: a lock held for a scan of at most
//! `MAX_CHECKERS` small entries (and, for a probe through an Envoy that
//! appends its prober's address, of the probers followed apart, by a flag
//! each), no allocation (keys are fixed-size copies, the table is allocated
//! once).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, USER_AGENT};
use ipnet::IpNet;
use metrics::Counter;
use tokio::time::Instant;

use lifeguard_base::peer::PeerKey;
use lifeguard_base::reason::{ByReason, Label};
use lifeguard_base::url::is_loopback;
use lifeguard_drain::CheckerKey;

/// At most this many checkers are remembered.
pub(crate) const MAX_CHECKERS: usize = 32;
/// At most this many checkers (agents) per address.
pub(crate) const MAX_PER_ADDRESS: usize = 4;
/// At most this many probers not counted for lack of room are followed
/// (they hold the wait, never end it).
pub(crate) const MAX_UNPLACED: usize = 64;
/// A gap between two probes longer than this is not a checking interval
/// (the longest cloud default is 300 s): the checker starts over.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(300);
/// Gaps remembered per checker; its interval is the longest of them.
const GAPS: usize = 4;
/// A checker that has not probed for this long past twice its interval has
/// stopped checking.
pub(crate) const VANISH_SLACK: Duration = Duration::from_secs(1);

/// The checker of a readiness probe from `peer` with `headers`; None for
/// the kubelet and for callers without an address (the control socket).
/// A loopback peer's `x-forwarded-for` names the prober only when
/// `forwarded` says Envoy's status listener appends the prober's own
/// address there (else a prober could write any address).
pub(crate) fn checker_key(peer: Option<SocketAddr>, headers: &HeaderMap, forwarded: bool) -> Option<CheckerKey> {
    let peer = peer?.ip().to_canonical();
    let agent = headers.get(USER_AGENT).map_or(&b""[..], |v| v.as_bytes());
    let forwarded = (forwarded && is_loopback(peer))
        .then(|| forwarded_peer(headers))
        .flatten();
    CheckerKey::new(forwarded.unwrap_or(peer), forwarded.is_some(), agent)
}

/// `x-forwarded-for`, named once (a name given as text is parsed at every
/// lookup).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The last entry of `x-forwarded-for`: the peer Envoy appended.
fn forwarded_peer(headers: &HeaderMap) -> Option<IpAddr> {
    let last = headers.get_all(&X_FORWARDED_FOR).iter().next_back()?;
    let text = std::str::from_utf8(last.as_bytes()).ok()?;
    text.rsplit(',')
        .next()?
        .trim()
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// One checker as the rule sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Checker {
    pub key: CheckerKey,
    /// Whether its probes are counted (in the table); false for a prober
    /// the table had no room for: it may hold the wait, never end it.
    pub counted: bool,
    pub probes: u64,
    pub last_seen: Instant,
    /// The longest of its recent gaps between probes; None after a single
    /// probe.
    pub interval: Option<Duration>,
    /// Probes answered other than 200 since its last 200.
    pub failures_in_row: u32,
}

impl Checker {
    /// Silent for longer than twice its interval and a second: it stopped
    /// checking (None: it has no interval).
    pub fn silent_after(&self) -> Option<Duration> {
        self.interval.map(|i| i.saturating_mul(2) + VANISH_SLACK)
    }
}

/// Why a probe was not counted: the `reason` label of the metric, and
/// the key in `GET /drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum NotCounted {
    /// Every entry holds a checker that established an interval and still
    /// probes.
    TableFull,
    /// Its address already has `MAX_PER_ADDRESS` checkers, all established.
    TooManyAgents,
    /// Not from `--drain-wait-checker-ranges`.
    OutsideRanges,
}

impl NotCounted {
    fn words(self) -> String {
        match self {
            NotCounted::TableFull => {
                format!("the table of checkers is full ({MAX_CHECKERS}, each established and still probing)")
            }
            NotCounted::TooManyAgents => {
                format!("its address already has {MAX_PER_ADDRESS} checkers (User-Agents), each established")
            }
            NotCounted::OutsideRanges => "it is outside --drain-wait-checker-ranges".into(),
        }
    }
}

/// Probes not counted so far, by reason (`GET /drain`: each reason's
/// label, its count).
pub type NotCountedReport = ByReason<NotCounted, u64>;

struct Entry {
    key: CheckerKey,
    probes: u64,
    last_seen: Instant,
    gaps: [Duration; GAPS],
    gap_count: usize,
    failures_in_row: u32,
    /// Keyed by the address Envoy connects from (127.0.0.1) before the
    /// drain wait learned that Envoy appends each prober's own address:
    /// when it learned that. Such an entry may be a load balancer now keyed
    /// by its own address; it stops counting, and gives its place up, once
    /// a prober with its `User-Agent` has probed under its own address
    /// since then (counted or followed apart), and is itself again when it
    /// probes as it did.
    keyed_before_trust: Option<Instant>,
    /// Keyed before the trust, and a prober with its `User-Agent` has
    /// probed under an address Envoy appended since ([`Table::rekey`]):
    /// the entry is that prober's past.
    rekeyed: bool,
}

impl Entry {
    fn fresh(key: CheckerKey, now: Instant) -> Entry {
        Entry {
            key,
            probes: 0,
            last_seen: now,
            gaps: [Duration::ZERO; GAPS],
            gap_count: 0,
            failures_in_row: 0,
            keyed_before_trust: None,
            rekeyed: false,
        }
    }

    fn view(&self, counted: bool) -> Checker {
        let gaps = &self.gaps[..self.gap_count.min(GAPS)];
        Checker {
            key: self.key,
            counted,
            probes: self.probes,
            last_seen: self.last_seen,
            interval: gaps.iter().max().copied(),
            failures_in_row: self.failures_in_row,
        }
    }

    /// Whether a new checker may take this entry at `now`: this one has no
    /// interval yet, or has stopped probing.
    fn replaceable(&self, now: Instant) -> bool {
        let view = self.view(true);
        view.silent_after()
            .is_none_or(|after| now.saturating_duration_since(self.last_seen) > after)
    }
}

/// The checkers heard from. Cloning shares the table.
#[derive(Clone)]
pub struct Checkers {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    /// Only probes from these count (empty: from anywhere).
    ranges: Vec<IpNet>,
    not_counted: ByReason<NotCounted, AtomicU64>,
    counters: ByReason<NotCounted, Counter>,
    logged: ByReason<NotCounted, AtomicBool>,
    /// Whether Envoy's status listener appends the prober's address to
    /// `x-forwarded-for`, learned from its config (only then is the header
    /// read).
    forwarded: ForwardedCell,
}

/// What Envoy's status listener does with `x-forwarded-for`, as learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Forwarded {
    /// Not learned yet.
    Unknown = 0,
    /// It appends each prober's own address: the last entry is the prober.
    Appended = 1,
    /// It does not (or its config cannot be read): the header says nothing.
    NotAppended = 2,
}

/// A [`Forwarded`] read on the probe's path without a lock.
#[derive(Debug, Default)]
struct ForwardedCell(AtomicU8);

impl ForwardedCell {
    fn get(&self) -> Forwarded {
        Forwarded::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Sets it; what it was.
    fn swap(&self, to: Forwarded) -> Forwarded {
        Forwarded::from_bits(self.0.swap(to as u8, Ordering::Relaxed))
    }
}

impl Forwarded {
    fn from_bits(bits: u8) -> Forwarded {
        [Forwarded::Unknown, Forwarded::Appended, Forwarded::NotAppended]
            .into_iter()
            .find(|f| *f as u8 == bits)
            .unwrap_or(Forwarded::Unknown)
    }
}

/// The checkers, and the probers not counted for lack of room.
struct Table {
    entries: Vec<Entry>,
    /// Probers whose probes were not counted for lack of room: followed so
    /// that they hold the wait.
    unplaced: Vec<Entry>,
    /// The last probe not counted for lack of room that no entry of
    /// `unplaced` could follow either.
    overflow: Option<Instant>,
}

impl Default for Checkers {
    fn default() -> Self {
        Checkers::new(Vec::new(), ByReason::new(|_| Counter::noop()))
    }
}

impl Checkers {
    /// A table counting only probes from `ranges` (empty: any), telling
    /// `counters` (by [`NotCounted`]) of each probe not counted.
    pub fn new(ranges: Vec<IpNet>, counters: ByReason<NotCounted, Counter>) -> Checkers {
        Checkers {
            inner: Arc::new(Inner {
                table: Mutex::new(Table {
                    entries: Vec::with_capacity(MAX_CHECKERS),
                    unplaced: Vec::new(),
                    overflow: None,
                }),
                ranges,
                not_counted: Default::default(),
                counters,
                logged: Default::default(),
                forwarded: ForwardedCell::default(),
            }),
        }
    }

    /// The checker of a readiness probe from `peer` with `headers`, its
    /// `x-forwarded-for` trusted as the drain wait learned it may be.
    pub fn key_of(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<CheckerKey> {
        checker_key(peer, headers, self.inner.forwarded.get() == Forwarded::Appended)
    }

    /// Whether Envoy's status listener appends the prober's address to
    /// `x-forwarded-for`, as learned; true when that is news.
    pub fn trust_forwarded(&self, trusted: bool) -> bool {
        let state = match trusted {
            true => Forwarded::Appended,
            false => Forwarded::NotAppended,
        };
        let was = self.inner.forwarded.swap(state);
        if was != state && trusted {
            // The probes through Envoy were keyed by 127.0.0.1 until now;
            // from now on by the prober's own address.
            let now = Instant::now();
            let mut guard = self.inner.table.lock().unwrap_or_else(|e| e.into_inner());
            let table = &mut *guard;
            for entry in table.entries.iter_mut().chain(table.unplaced.iter_mut()) {
                if is_loopback(entry.key.ip) && !entry.key.forwarded {
                    (entry.keyed_before_trust, entry.rekeyed) = (Some(now), false);
                }
            }
        }
        was != state
    }

    /// A probe from `key` was answered at `now`, 200 or not (`ok`).
    pub fn record(&self, key: CheckerKey, now: Instant, ok: bool) {
        if let Err(why) = self.try_record(key, now, ok) {
            self.refused(key, why);
        }
    }

    fn try_record(&self, key: CheckerKey, now: Instant, ok: bool) -> Result<(), NotCounted> {
        let inner = &*self.inner;
        if !inner.ranges.is_empty() && !inner.ranges.iter().any(|r| r.contains(&key.ip)) {
            return Err(NotCounted::OutsideRanges);
        }
        let mut guard = inner.table.lock().unwrap_or_else(|e| e.into_inner());
        let table = &mut *guard;
        let i = match table.entries.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => match admit(&table.entries, key, now) {
                Ok(place) => {
                    // A prober followed apart until now keeps its history.
                    let entry = match table.unplaced.iter().position(|e| e.key == key) {
                        Some(u) => table.unplaced.swap_remove(u),
                        None => Entry::fresh(key, now),
                    };
                    match place {
                        Place::Push => {
                            table.entries.push(entry);
                            table.entries.len() - 1
                        }
                        Place::Replace(i) => {
                            // The one it replaces is followed apart, with its
                            // history: a flood of agents that keeps
                            // replacing entries cannot make a checker lose
                            // its probes before it is established. One
                            // that is the past of a prober now heard under
                            // its own address holds nothing: followed
                            // apart only where there is room (it is itself
                            // again if it probes as before).
                            let replaced = std::mem::replace(&mut table.entries[i], entry);
                            match replaced.rekeyed {
                                false => _ = table.set_aside(replaced, now),
                                true if table.unplaced.len() < MAX_UNPLACED => table.unplaced.push(replaced),
                                true => {}
                            }
                            i
                        }
                    }
                }
                Err(why) => {
                    table.follow_unplaced(key, now, ok);
                    table.rekey(key);
                    return Err(why);
                }
            },
        };
        table.entries[i].probed(now, ok);
        table.rekey(key);
        Ok(())
    }

    /// Counts a probe not counted; logs the first of each reason.
    fn refused(&self, key: CheckerKey, why: NotCounted) {
        let inner = &*self.inner;
        inner.not_counted.get(why).fetch_add(1, Ordering::Relaxed);
        inner.counters.get(why).increment(1);
        if !inner.logged.get(why).swap(true, Ordering::Relaxed) {
            tracing::warn!(
                reason = why.label(),
                "drain wait: a readiness probe from {key} was not counted as a load balancer's: {}; \
                 such probes are counted in GET /drain and lifeguard_drain_wait_probes_not_counted_total",
                why.words()
            );
        }
    }

    /// Every checker heard from, as the rule reads them: the counted ones,
    /// then the probers not counted for lack of room.
    pub fn snapshot(&self) -> Vec<Checker> {
        let table = self.inner.table.lock().unwrap_or_else(|e| e.into_inner());
        let counted = table.entries.iter().filter(|e| !e.rekeyed).map(|e| e.view(true));
        let apart = table.unplaced.iter().filter(|e| !e.rekeyed).map(|e| e.view(false));
        counted.chain(apart).collect()
    }

    /// When the last probe came that was not counted for lack of room and
    /// that no entry could follow either (None: never).
    pub fn overflow(&self) -> Option<Instant> {
        self.inner.table.lock().unwrap_or_else(|e| e.into_inner()).overflow
    }

    /// Probes not counted so far, by reason.
    pub fn not_counted(&self) -> NotCountedReport {
        ByReason::new(|why: NotCounted| self.inner.not_counted.get(why).load(Ordering::Relaxed))
    }
}

impl Entry {
    /// One probe at `now`, 200 or not (`ok`).
    fn probed(&mut self, now: Instant, ok: bool) {
        if self.probes > 0 {
            let gap = now.saturating_duration_since(self.last_seen);
            if gap > MAX_INTERVAL {
                self.gap_count = 0;
            } else {
                self.gaps[self.gap_count % GAPS] = gap;
                self.gap_count += 1;
            }
        }
        self.probes += 1;
        self.last_seen = now;
        self.failures_in_row = if ok { 0 } else { self.failures_in_row.saturating_add(1) };
        // Probing as it was keyed: a prober of its own (on the pod's
        // loopback, or through Envoy with no address appended).
        (self.keyed_before_trust, self.rekeyed) = (None, false);
    }
}

impl Table {
    /// A probe from `key` was recorded: when Envoy appended its address,
    /// the entries keyed by 127.0.0.1 before the drain wait learned that
    /// Envoy does so, with its `User-Agent`, are that prober's past
    /// (`Entry::rekeyed`), whether it is counted or followed apart (a
    /// flood of agents at a load balancer's address fills that address's
    /// share: its agents are then followed apart, and their entries from
    /// before would otherwise hold the wait until each went silent for
    /// twice its interval). Such an entry no longer counts and gives its
    /// place up (until then it holds the wait as any checker does: an
    /// empty table would not). One pass over the entries' flags, the
    /// agents compared only for entries keyed before the trust.
    fn rekey(&mut self, key: CheckerKey) {
        if !key.forwarded {
            return;
        }
        for e in self.entries.iter_mut().chain(self.unplaced.iter_mut()) {
            if e.keyed_before_trust.is_some() && !e.rekeyed && e.key.same_agent(&key) {
                e.rekeyed = true;
            }
        }
    }
}

impl Table {
    /// A probe from `key` the table had no room for: followed apart.
    fn follow_unplaced(&mut self, key: CheckerKey, now: Instant, ok: bool) {
        let i = match self.unplaced.iter().position(|e| e.key == key) {
            Some(i) => Some(i),
            None => self.set_aside(Entry::fresh(key, now), now),
        };
        if let Some(i) = i {
            self.unplaced[i].probed(now, ok);
        }
    }

    /// Follows `entry` apart (its probes not counted), unless it has
    /// stopped probing: in a free place, else in the place of one that
    /// stopped, else of the least recently heard with a single probe;
    /// evidence lost that way, or for want of any place, is remembered as
    /// an overflow. Where it went (None: nowhere).
    fn set_aside(&mut self, entry: Entry, now: Instant) -> Option<usize> {
        let stopped = |e: &Entry| {
            e.view(false)
                .silent_after()
                .is_some_and(|after| now.saturating_duration_since(e.last_seen) > after)
        };
        if stopped(&entry) {
            return None;
        }
        let unplaced = &mut self.unplaced;
        if unplaced.len() < MAX_UNPLACED {
            unplaced.push(entry);
            return Some(unplaced.len() - 1);
        }
        if let Some(i) = unplaced.iter().position(stopped) {
            unplaced[i] = entry;
            return Some(i);
        }
        self.overflow = Some(now);
        let single = (0..unplaced.len())
            .filter(|&i| unplaced[i].replaceable(now))
            .min_by_key(|&i| unplaced[i].last_seen)?;
        unplaced[single] = entry;
        Some(single)
    }
}

/// An entry for a checker not in the table: a free one, else one of its
/// address's own that may be replaced (when the address is at its limit),
/// else the least recently heard that may be replaced: one with no
/// interval yet, one that stopped probing, or one keyed by 127.0.0.1
/// before the trust was learned whose prober has probed under its own
/// address since ([`Table::rekey`]). Probes through an Envoy that does
/// not tell their peers apart all come from loopback: there the agents
/// alone tell checkers apart, and the address's limit is the table's.
fn admit(entries: &[Entry], key: CheckerKey, now: Instant) -> Result<Place, NotCounted> {
    let address = PeerKey::of(key.ip);
    let own = |e: &Entry| PeerKey::of(e.key.ip) == address;
    let oldest_replaceable = |same_address: bool| {
        (0..entries.len())
            .filter(|&i| !same_address || own(&entries[i]))
            .filter(|&i| entries[i].replaceable(now) || entries[i].rekeyed)
            .min_by_key(|&i| entries[i].last_seen)
    };
    let limit = if is_loopback(key.ip) {
        MAX_CHECKERS
    } else {
        MAX_PER_ADDRESS
    };
    let of_address = entries.iter().filter(|e| own(e)).count();
    if of_address >= limit {
        oldest_replaceable(true)
            .map(Place::Replace)
            .ok_or(NotCounted::TooManyAgents)
    } else if entries.len() < MAX_CHECKERS {
        Ok(Place::Push)
    } else {
        oldest_replaceable(false)
            .map(Place::Replace)
            .ok_or(NotCounted::TableFull)
    }
}

/// Where a checker new to the table goes.
enum Place {
    /// A free entry.
    Push,
    /// This one's entry (it has no interval yet, or stopped probing).
    Replace(usize),
}

#[cfg(test)]
mod tests;
