//! What one status connection may hold, and for how long.
//!
//! - `ConnectionSlots`: the connection slots of the status server, shared
//!   fairly. Loopback peers (Envoy's `agent` cluster, the pod's hooks, the
//!   app) may take any free slot; peers from other hosts share what is left
//!   after a reserve kept for loopback, and each of them (an IPv4 address,
//!   an IPv6 /64) may hold only a few. So no remote peer, nor all of them
//!   together, can take the slots the probe path needs.
//! - [`TimedIo`]: an IO wrapper that fails a write which makes no progress
//!   for a while, so a peer that does not take its response cannot hold the
//!   connection (and the response's memory) open; and fails a read once the
//!   connection has served nothing for a while ([`Activity`]: since it was
//!   accepted or since its last answer, the next request's headers
//!   included), so a slow or idle peer cannot hold a slot. hyper's own
//!   header-read timeout would do the second, with a timer made and
//!   dropped for every request; this one's timer is made once per
//!   connection and moved only when it fires.

use lifeguard_base::peer::PeerKey;
use lifeguard_base::url::is_loopback;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How the status server's connection slots are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Open connections at most, all peers together.
    pub total: usize,
    /// Slots only loopback peers may take: remote peers together hold at
    /// most `total - loopback_reserve`.
    pub loopback_reserve: usize,
    /// Open connections at most from one remote peer.
    pub per_peer: usize,
}

impl SlotLimits {
    /// The limits for a server that may hold `total` connections: an
    /// eighth kept for loopback, and at most 128 per remote peer (a
    /// Prometheus server or a load balancer needs a handful).
    pub fn for_total(total: usize) -> SlotLimits {
        let total = total.max(2);
        let loopback_reserve = (total / 8).max(1);
        SlotLimits {
            total,
            loopback_reserve,
            per_peer: 128.min(total - loopback_reserve),
        }
    }
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every slot is taken.
    Full,
    /// Remote peers hold every slot they may; the rest is loopback's reserve.
    RemoteFull,
    /// This remote peer holds its share already.
    PeerFull,
}

impl Refused {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refused::Full => "every status connection slot is taken",
            Refused::RemoteFull => "remote peers hold every slot outside the loopback reserve",
            Refused::PeerFull => "this peer holds its share of status connections",
        }
    }
}

/// The connection slots of the status server. Cheap to clone; every clone
/// counts the same slots.
#[derive(Clone)]
pub(crate) struct ConnectionSlots {
    limits: SlotLimits,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    remote: usize,
    /// Open connections per remote peer; an entry is removed at zero, so
    /// the map is as large as the number of peers connected now.
    per_peer: HashMap<PeerKey, usize>,
}

/// One taken slot; given back on drop.
pub(crate) struct Slot {
    counts: Arc<Mutex<Counts>>,
    /// The peer's key, for a remote peer.
    remote: Option<PeerKey>,
}

impl ConnectionSlots {
    pub(crate) fn new(limits: SlotLimits) -> ConnectionSlots {
        ConnectionSlots {
            limits,
            counts: Arc::default(),
        }
    }

    pub(crate) fn limits(&self) -> SlotLimits {
        self.limits
    }

    /// Takes a slot for a connection from `peer`, if its share allows.
    pub(crate) fn try_acquire(&self, peer: IpAddr) -> Result<Slot, Refused> {
        let remote = (!is_loopback(peer)).then(|| PeerKey::of(peer));
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.total >= self.limits.total {
            return Err(Refused::Full);
        }
        if let Some(key) = remote {
            if counts.remote >= self.limits.total - self.limits.loopback_reserve {
                return Err(Refused::RemoteFull);
            }
            let held = counts.per_peer.entry(key).or_insert(0);
            if *held >= self.limits.per_peer {
                return Err(Refused::PeerFull);
            }
            *held += 1;
            counts.remote += 1;
        }
        counts.total += 1;
        Ok(Slot {
            counts: self.counts.clone(),
            remote,
        })
    }

    /// Open connections: all, and from `peer`.
    pub(crate) fn held(&self, peer: Option<IpAddr>) -> (usize, usize) {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let from = peer.map_or(0, |p| {
            if is_loopback(p) {
                counts.total - counts.remote
            } else {
                counts.per_peer.get(&PeerKey::of(p)).copied().unwrap_or(0)
            }
        });
        (counts.total, from)
    }

    #[cfg(test)]
    /// How many remote peers hold a connection now.
    pub(crate) fn remote_peers(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).per_peer.len()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.total -= 1;
        if let Some(key) = self.remote {
            counts.remote -= 1;
            if let Some(held) = counts.per_peer.get_mut(&key) {
                *held -= 1;
                if *held == 0 {
                    counts.per_peer.remove(&key);
                }
            }
        }
    }
}

/// An IO stream whose writes fail with `TimedOut` once one has waited
/// `limit` without the peer taking a single byte (nginx's `send_timeout`
/// works the same way: between two successive writes, not for the whole
/// response); and, [`watching`](TimedIo::watching) an [`Activity`], whose
/// reads fail with `TimedOut` once the connection has been idle (serving no
/// request) for the idle limit.
///
/// A write that completes at once costs a flag reset: the timer is made on
/// the first write that has to wait, and reused after that. A read that
/// waits polls the idle timer, which is made once and moved only when it
/// fires.
pub struct TimedIo<S> {
    io: S,
    limit: Duration,
    /// The idle watch of [`TimedIo::watching`].
    idle: Option<IdleWatch>,
    /// Armed while a write waits; None until the first write ever waits.
    timer: Option<Pin<Box<Sleep>>>,
    waiting: bool,
    /// The last read took all the peer had sent (it did not fill the
    /// buffer, or found nothing): nothing is left unread in the socket.
    drained: bool,
}

impl<S> TimedIo<S> {
    /// The same stream, its reads failing once `activity` shows the
    /// connection idle for `limit` (no request served since it was
    /// accepted, or since its last answer, its next request's headers
    /// included).
    pub fn watching(self, activity: Activity, limit: Duration) -> Self {
        let timer = Box::pin(tokio::time::sleep_until(activity.0.origin + limit));
        TimedIo {
            idle: Some(IdleWatch { activity, limit, timer }),
            ..self
        }
    }

    pub fn new(io: S, limit: Duration) -> Self {
        TimedIo {
            io,
            limit,
            idle: None,
            timer: None,
            waiting: false,
            drained: true,
        }
    }

    /// Handles a write (or flush) that returned `poll`: progress disarms
    /// the timer, a wait arms it (once), and a wait past the limit fails.
    fn watch<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.waiting = false;
            return poll;
        }
        if !self.waiting {
            self.waiting = true;
            let deadline = Instant::now() + self.limit;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let timer = self.timer.as_mut().expect("armed above");
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer took no response bytes for {:?}", self.limit),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining());
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        self.drained = match &poll {
            Poll::Ready(Ok(())) => buf.filled().len() - before < room,
            Poll::Ready(Err(_)) | Poll::Pending => true,
        };
        match (&poll, &mut self.idle) {
            (Poll::Pending, Some(idle)) => idle.poll(cx),
            _ => poll,
        }
    }
}

/// What a connection is doing, shared by its service (a request begins
/// and, when its body is done, ends: [`Served`]) and its [`TimedIo`]. One
/// connection's service and IO run in one task; the atomics only make it
/// `Sync`.
#[derive(Clone)]
pub struct Activity(Arc<ActivityState>);

struct ActivityState {
    /// The clock's origin for `idle_since`.
    origin: Instant,
    /// Requests begun and not yet answered in full.
    serving: AtomicU32,
    /// Nanoseconds from `origin` to the last answer's end (or the accept).
    idle_since: AtomicU64,
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Activity {
        Activity(Arc::new(ActivityState {
            origin: Instant::now(),
            serving: AtomicU32::new(0),
            idle_since: AtomicU64::new(0),
        }))
    }

    /// A request begins; it ends when the returned value drops (with its
    /// response's body).
    pub(crate) fn begin(&self) -> Served {
        self.0.serving.fetch_add(1, Ordering::Relaxed);
        Served(self.clone())
    }

    /// Requests begun and not yet answered in full.
    #[cfg(test)]
    pub(crate) fn serving(&self) -> u32 {
        self.0.serving.load(Ordering::Relaxed)
    }

    /// How long the connection may stay as it is before it has been idle
    /// for `limit`: `limit` while it serves a request, zero once it has
    /// been idle that long.
    fn idle_left(&self, limit: Duration, now: Instant) -> Duration {
        let state = &self.0;
        if state.serving.load(Ordering::Relaxed) > 0 {
            return limit;
        }
        let since = state.origin + Duration::from_nanos(state.idle_since.load(Ordering::Relaxed));
        limit.saturating_sub(now.saturating_duration_since(since))
    }
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

/// A request being served; its drop (with its response's body) ends it.
pub struct Served(Activity);

impl Drop for Served {
    fn drop(&mut self) {
        let state = &(self.0).0;
        let since = Instant::now().saturating_duration_since(state.origin).as_nanos();
        state
            .idle_since
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
        state.serving.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The read side's idle limit: one timer per connection, moved only when
/// it fires (to when the connection will have been idle for the limit).
struct IdleWatch {
    activity: Activity,
    limit: Duration,
    timer: Pin<Box<Sleep>>,
}

impl IdleWatch {
    /// A read waits: Ready(Err) once the connection has been idle for the
    /// limit, else Pending (the timer wakes the task to look again).
    fn poll<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            let left = self.activity.idle_left(self.limit, now);
            if left.is_zero() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no request for {:?}", self.limit),
                )));
            }
            self.timer.as_mut().reset(now + left);
        }
        Poll::Pending
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll)
    }

    /// hyper shuts the write side down before it drops a connection it
    /// closes. When the peer sent nothing that is still unread, the close
    /// right after sends the same FIN, and the `shutdown(2)` is left out:
    /// one system call less per probe (a new connection each, as kubelets
    /// and load balancers probe). When bytes may be left unread (a body the
    /// route does not read), the close would answer them with a reset,
    /// which can beat the answer to the peer: the FIN goes first then, as
    /// before (`tests/hardening.rs` checks both).
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.drained {
            return Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, poll)
    }
}

/// How many connections may be open at once; more are closed on accept.
/// Fewer when the process may not open that many files: see
/// [`connection_limit`]. How they are shared: [`SlotLimits::for_total`].
///
/// This is what bounds lifeguard's memory under any number of peers: a
/// connection hyper serves holds about 16 KiB of read and write buffers
/// (about 36 KiB per slow reader of the merged scrape with its task and its
/// own part, measured in a debug build), so 768 of them keep lifeguard
/// inside 64 MiB; a connection that has sent nothing yet holds no buffer at
/// all (hyper gets it only once it is readable). Probes, Prometheus and a
/// load balancer need a handful.
pub const MAX_CONNECTIONS: usize = 768;
/// File descriptors kept free for everything but status connections.
const SPARE_FDS: u64 = 64;

/// The connection cap for a process that may open `open_files` files
/// (None: unknown or unlimited): [`MAX_CONNECTIONS`], or that limit less
/// some spare descriptors when it is lower. The agent raises the limit at
/// start-up (`lifeguard_sys::tune_for_run`).
pub fn connection_limit(open_files: Option<u64>) -> usize {
    let Some(soft) = open_files else {
        return MAX_CONNECTIONS;
    };
    let usable = soft.saturating_sub(SPARE_FDS).max(16);
    MAX_CONNECTIONS.min(usize::try_from(usable).unwrap_or(MAX_CONNECTIONS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limits() -> SlotLimits {
        SlotLimits {
            total: 10,
            loopback_reserve: 3,
            per_peer: 4,
        }
    }

    #[test]
    fn one_remote_peer_gets_its_share_and_no_more() {
        let slots = ConnectionSlots::new(limits());
        let held: Vec<_> = (0..4).map(|_| slots.try_acquire(ip("10.0.0.9")).unwrap()).collect();
        assert_eq!(slots.try_acquire(ip("10.0.0.9")).err(), Some(Refused::PeerFull));
        // The same peer as an IPv4-mapped IPv6 address is the same peer.
        assert_eq!(slots.try_acquire(ip("::ffff:10.0.0.9")).err(), Some(Refused::PeerFull));
        // Another peer is not affected.
        let other = slots.try_acquire(ip("10.0.0.10")).unwrap();
        assert_eq!(slots.held(Some(ip("10.0.0.9"))), (5, 4));
        drop(held);
        assert_eq!(slots.held(Some(ip("10.0.0.9"))), (1, 0));
        assert_eq!(slots.remote_peers(), 1, "the entry at zero is removed");
        drop(other);
        assert_eq!(slots.remote_peers(), 0);
        assert_eq!(slots.held(None), (0, 0));
    }

    #[test]
    fn remote_peers_together_never_take_the_loopback_reserve() {
        let slots = ConnectionSlots::new(limits());
        let mut held = Vec::new();
        // 7 = total - reserve, spread over peers within their share.
        for i in 0..7 {
            held.push(slots.try_acquire(ip(&format!("10.0.1.{}", i % 2))).unwrap());
        }
        assert_eq!(slots.try_acquire(ip("10.0.2.1")).err(), Some(Refused::RemoteFull));
        // Loopback still gets the reserve, then nothing is left for anyone.
        for _ in 0..3 {
            held.push(slots.try_acquire(ip("127.0.0.1")).unwrap());
        }
        assert_eq!(slots.try_acquire(ip("127.0.0.1")).err(), Some(Refused::Full));
        assert_eq!(slots.try_acquire(ip("::1")).err(), Some(Refused::Full));
        // One remote slot back: a remote peer may take it again.
        held.remove(0);
        assert!(slots.try_acquire(ip("10.0.2.1")).is_ok());
    }

    #[test]
    fn loopback_may_take_every_slot() {
        let slots = ConnectionSlots::new(limits());
        let held: Vec<_> = (0..10)
            .map(|i| {
                slots
                    .try_acquire(ip(if i % 2 == 0 { "127.0.0.1" } else { "::1" }))
                    .unwrap()
            })
            .collect();
        assert_eq!(slots.try_acquire(ip("127.0.0.2")).err(), Some(Refused::Full));
        assert_eq!(slots.try_acquire(ip("10.0.0.1")).err(), Some(Refused::Full));
        assert_eq!(slots.held(Some(ip("127.0.0.1"))), (10, 10));
        drop(held);
        assert_eq!(slots.held(None), (0, 0));
    }

    #[test]
    fn an_ipv6_peer_is_its_slash_64() {
        let slots = ConnectionSlots::new(limits());
        let _held: Vec<_> = (1..=4)
            .map(|i| slots.try_acquire(ip(&format!("2001:db8:0:1::{i}"))).unwrap())
            .collect();
        assert_eq!(
            slots.try_acquire(ip("2001:db8:0:1:ffff::5")).err(),
            Some(Refused::PeerFull)
        );
        assert!(slots.try_acquire(ip("2001:db8:0:2::1")).is_ok());
    }

    #[test]
    fn limits_for_a_total() {
        assert_eq!(
            SlotLimits::for_total(4096),
            SlotLimits {
                total: 4096,
                loopback_reserve: 512,
                per_peer: 128
            }
        );
        let small = SlotLimits::for_total(16);
        assert_eq!((small.loopback_reserve, small.per_peer), (2, 14));
        let tiny = SlotLimits::for_total(0);
        assert_eq!((tiny.total, tiny.loopback_reserve, tiny.per_peer), (2, 1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_makes_no_progress_fails_after_the_limit() {
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut io = TimedIo::new(ours, Duration::from_secs(5));
        let started = Instant::now();
        // The peer takes 64 bytes (the pipe's capacity), then nothing.
        let err = io.write_all(&[b'x'; 1000]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let mut got = [0u8; 64];
        peer.read_exact(&mut got).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_taking_bytes_is_not_cut_off() {
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut io = TimedIo::new(ours, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 1000 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                total += peer.read(&mut buf).await.unwrap();
            }
            total
        });
        let started = Instant::now();
        io.write_all(&[b'x'; 1000]).await.unwrap();
        assert!(started.elapsed() > Duration::from_secs(40));
        assert_eq!(reader.await.unwrap(), 1000);
        // Reads pass through.
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut io = TimedIo::new(ours, Duration::from_secs(5));
        peer.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
    }

    /// The idle watch: a connection that sends nothing, or dribbles its
    /// request's headers, fails its read 5 s after it was accepted; one
    /// serving a request (a held drain wait) does not; once the answer is
    /// out, 5 s without a new request.
    #[tokio::test(start_paused = true)]
    async fn reads_fail_once_the_connection_has_been_idle_for_the_limit() {
        let limit = Duration::from_secs(5);
        // Dribbled headers: bytes keep coming, no request is served.
        let (mut peer, ours) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut io = TimedIo::new(ours, limit).watching(activity.clone(), limit);
        let started = Instant::now();
        let dribble = tokio::spawn(async move {
            while peer.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        });
        let mut buf = [0u8; 64];
        let err = loop {
            match io.read(&mut buf).await {
                Ok(_) => continue,
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), limit);
        drop(io);
        dribble.abort();

        // A request served for 20 s (its answer held), then idle.
        let (_peer, ours) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut io = TimedIo::new(ours, limit).watching(activity.clone(), limit);
        let started = Instant::now();
        let served = activity.begin();
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            drop(served);
        });
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(25), "5 s after the answer");
        ends.await.unwrap();
    }
}
