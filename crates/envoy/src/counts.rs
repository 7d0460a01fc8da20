//! Envoy's downstream counts: one read of `/stats` ([`CountsReader`])
//! serves the drain (the active connections and requests, [`active`]) and,
//! while it watches, the drain wait (new requests on the inbound
//! listeners, `crate::inbound`, which adds their lines to the
//! read's filter), which would otherwise each make the same costly call: a
//! `/stats` filter is matched against every stat Envoy has, whatever it
//! matches.
//! The active counts take each connection and request once, whatever
//! Envoy's per-worker and per-layer lines repeat, and leave out the admin,
//! status and internal listeners.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::admin::{AdminClient, AdminError, Endpoint, ACTIVE_LIMIT};
use crate::stats::{lines, StatValue};
use lifeguard_base::url::query_encode;
use lifeguard_drain::{Active, ControlError, Patience, PACE};

/// HTTP stat prefixes of Envoy's own and the agent-facing managers: the
/// admin API, the status listener (`agent` in Istio's bootstrap, `status`
/// in ours) and the Prometheus listener (`stats`).
pub(crate) const IGNORED_HTTP_PREFIXES: [&str; 4] = ["admin", "agent", "status", "stats"];

/// The admin query for [`active`]: both families in one read.
pub const ACTIVE_STATS: &str = "/stats?usedonly&filter=downstream_%28cx%7Crq%29_active%24";
/// The filter of [`ACTIVE_STATS`], unencoded.
const ACTIVE_FILTER: &str = "downstream_(cx|rq)_active$";

/// Reads Envoy's downstream counts ([`ACTIVE_STATS`], and the inbound
/// listeners' totals while the drain wait watches) for the drain and
/// the drain wait: a read is shared with whoever finds it fresh enough,
/// and reads never overlap. Cloning shares it.
#[derive(Clone)]
pub struct CountsReader {
    admin: AdminClient,
    last: Arc<tokio::sync::Mutex<Option<Reading>>>,
    /// How long the next read is waited for: as long as the last needed,
    /// longer after one that timed out ([`Patience`], learned from every
    /// read, the drain's and the drain wait's: they cost Envoy alike).
    /// The one record of it: the drain asks for it
    /// ([`CountsReader::read_timeout`]) rather than keep its own. Apart
    /// from the read's lock, so that asking never waits for a read.
    patience: Arc<std::sync::Mutex<Patience>>,
    /// While the drain wait watches: the admin query that reads the
    /// inbound listeners' totals too (None: the active counts alone), and
    /// a number that changes with it.
    inbound: Arc<std::sync::Mutex<(Option<String>, u64)>>,
}

/// One read: when it began, how long Envoy took, which of the drain
/// wait's queries it carries (None: the active counts alone), and its body
/// or why there is none.
#[derive(Clone)]
pub(crate) struct Reading {
    /// Which read this is: each new read of Envoy gets the next number (a
    /// read handed out again, kept while fresh, keeps its number).
    pub(crate) seq: u64,
    pub(crate) began: Instant,
    pub(crate) took: Duration,
    pub(crate) inbound: Option<u64>,
    pub(crate) body: Result<Arc<str>, ControlError>,
}

impl CountsReader {
    pub(crate) fn new(admin: AdminClient) -> Self {
        Self {
            admin,
            last: Arc::new(tokio::sync::Mutex::new(None)),
            patience: Arc::new(std::sync::Mutex::new(Patience::default())),
            inbound: Arc::new(std::sync::Mutex::new((None, 0))),
        }
    }

    /// While the drain wait watches: reads carry, besides the active
    /// counts, the lines that `filter` (a regex) matches; None: the active
    /// counts alone. One read, one pass over Envoy's stats.
    pub(crate) fn want_inbound(&self, filter: Option<&str>) {
        let path = filter.map(|f| {
            format!(
                "/stats?usedonly&filter={}",
                query_encode(&format!("{ACTIVE_FILTER}|{f}"))
            )
        });
        let mut inbound = self.inbound.lock().unwrap_or_else(|e| e.into_inner());
        *inbound = (path, inbound.1 + 1);
    }

    /// How long a new read would wait for Envoy now: the admin timeout,
    /// stretched as the record of reads says ([`Patience`]).
    pub(crate) fn read_timeout(&self) -> Duration {
        self.patience().timeout(self.admin.timeout())
    }

    fn patience(&self) -> std::sync::MutexGuard<'_, Patience> {
        self.patience.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A read under way now or begun later, a new one waiting at most
    /// `timeout` for Envoy: the drain paces its own reads, and only a count
    /// read now may end it.
    pub(crate) async fn read_now(&self, timeout: Duration) -> Reading {
        let asked = Instant::now();
        self.read(|r| r.began + r.took >= asked, Some(timeout)).await
    }

    /// A read with the listeners' totals no older than `period`, or than
    /// [`PACE`] times what the last read took, whichever is longer: the
    /// drain's reads serve. A read made here begins no sooner than [`PACE`]
    /// times the last read's time after it, even when that one cannot serve
    /// (the drain's, begun before the wait asked for the totals), so it
    /// costs Envoy's admin thread at most about a tenth of its time, like
    /// the drain's.
    pub(crate) async fn read_recent(&self, period: Duration) -> Reading {
        let asked = Instant::now();
        let wanted = self.inbound.lock().unwrap_or_else(|e| e.into_inner()).1;
        let fresh = |r: &Reading| {
            r.inbound == Some(wanted) && asked.saturating_duration_since(r.began) < period.max(r.took * PACE)
        };
        let paced = match self.last.lock().await.as_ref() {
            Some(r) if fresh(r) => return r.clone(),
            Some(r) => r.began + r.took * PACE,
            None => asked,
        };
        // A read the drain begins meanwhile serves (it began after `asked`).
        tokio::time::sleep_until(paced).await;
        self.read(fresh, None).await
    }

    /// The last read when `fresh` says it will do, else a new one, waiting
    /// `timeout` for Envoy (None: as the record of reads says). A caller
    /// that arrives while a read is under way waits for it.
    async fn read(&self, fresh: impl Fn(&Reading) -> bool, timeout: Option<Duration>) -> Reading {
        let mut last = self.last.lock().await;
        if let Some(reading) = last.as_ref().filter(|r| fresh(r)) {
            return reading.clone();
        }
        let (path, generation) = self.inbound.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let inbound = path.is_some().then_some(generation);
        let began = Instant::now();
        let path = path.as_deref().unwrap_or(ACTIVE_STATS);
        let admin = self.admin.waiting(timeout.unwrap_or_else(|| self.read_timeout()));
        // A read its caller gave up on before the answer (the drain's own
        // deadline, a few ms before this client's; the drain wait's read
        // as the drain begins) ran on in Envoy all the same: counted as
        // timed out when dropped so.
        let mut unanswered = Unanswered(Some(self));
        let body = admin.get_text(Endpoint::Stats, path, ACTIVE_LIMIT).await;
        unanswered.0 = None;
        let took = began.elapsed();
        match &body {
            Ok(_) => self.patience().answered(took, self.admin.timeout()),
            Err(e) if e.is_timeout() => self.patience().timed_out(),
            Err(_) => self.patience().reset(),
        }
        let seq = last.as_ref().map_or(1, |r| r.seq + 1);
        let reading = Reading {
            seq,
            began,
            took,
            inbound,
            body: body.map(Arc::from).map_err(control_error),
        };
        *last = Some(reading.clone());
        reading
    }
}

/// A read under way: dropped before its answer, it is counted in the
/// record as timed out.
struct Unanswered<'a>(Option<&'a CountsReader>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(reader) = self.0 {
            reader.patience().timed_out();
        }
    }
}

/// An admin call's failure as the drain sees it: refused (an external
/// Envoy that keeps refusing is gone), or another reason (a timeout is
/// the reader's own record's to learn from, not the drain's).
pub(crate) fn control_error(e: AdminError) -> ControlError {
    match e {
        AdminError::Connect { .. } => ControlError::Refused(e.to_string()),
        _ => ControlError::Failed(e.to_string()),
    }
}

/// Counts active downstream connections and requests in an answer to
/// [`ACTIVE_STATS`], leaving out the admin listener, internal listeners
/// (`envoy_internal_*`: their connections come from Envoy itself and are
/// already counted where they entered), listeners on `ignored_ports` (IPv4
/// and IPv6 alike) and the agent-facing HTTP prefixes.
pub fn active(body: &str, ignored_ports: &[u16]) -> Active {
    let mut out = Active::default();
    let mut http_connections = 0u64;
    for line in lines(body) {
        let counted = if let Some(listener) = line
            .name
            .strip_prefix("listener.")
            .and_then(|rest| rest.strip_suffix(".downstream_cx_active"))
        {
            counted_listener(listener, ignored_ports).then_some(&mut out.connections)
        } else if let Some(prefix) = line
            .name
            .strip_prefix("http.")
            .and_then(|rest| rest.strip_suffix(".downstream_rq_active"))
        {
            (!IGNORED_HTTP_PREFIXES.contains(&prefix)).then_some(&mut out.requests)
        } else if let Some(prefix) = line
            .name
            .strip_prefix("http.")
            .and_then(|rest| rest.strip_suffix(".downstream_cx_active"))
        {
            (!IGNORED_HTTP_PREFIXES.contains(&prefix)).then_some(&mut http_connections)
        } else {
            None
        };
        let Some(sum) = counted else { continue };
        match line.value {
            StatValue::Number(n) => *sum = sum.saturating_add(n),
            StatValue::Wrapped(n) => out
                .skipped
                .push(format!("{} = {n} (a gauge that went below zero)", line.name)),
            StatValue::Unparsable(text) => out.skipped.push(format!("{} = {text:?} (not a number)", line.name)),
        }
    }
    out.tcp = out.connections.saturating_sub(http_connections);
    out
}

/// Whether a listener's stats count, by the name in its stats
/// (`listener.<name>.…`): not the admin's (`admin`, and its per-thread
/// `admin.main_thread`), not an internal listener (`envoy_internal_*`:
/// its connections come from Envoy itself and are counted where they
/// entered), not a per-thread line (`X.worker_N`, `X.main_thread`: they
/// repeat the listener's total), not one on an ignored port (IPv4 and IPv6
/// alike). The active counts and the drain wait's arrivals both ask here.
pub(crate) fn counted_listener(listener: &str, ignored_ports: &[u16]) -> bool {
    let per_thread = listener
        .rsplit_once('.')
        .is_some_and(|(_, last)| last.starts_with("worker_") || last == "main_thread");
    !(listener.is_empty()
        || per_thread
        || listener == "admin"
        || listener.starts_with("admin.")
        || listener.starts_with("envoy_internal_")
        || listener_port(listener).is_some_and(|p| ignored_ports.contains(&p)))
}

/// The port of a listener stat name: `127.0.0.1_15006`, `0.0.0.0_15021`,
/// `[__1]_15006`, `[__]_15006` → the digits after the last `_`. Listeners
/// named by a `stat_prefix` have no port and are always counted.
fn listener_port(listener: &str) -> Option<u16> {
    listener.rsplit_once('_')?.1.parse().ok()
}

#[cfg(test)]
mod active_tests {
    use super::*;

    /// Captured from Envoy 1.40 with one request in flight on 15006 and an
    /// idle connection on the status listener.
    const CAPTURED: &str = "\
http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.inbound_http.downstream_cx_active: 1
http.inbound_http.downstream_rq_active: 1
http.status.downstream_cx_active: 1
http.status.downstream_rq_active: 0
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.0.0.0.0_15021.worker_0.downstream_cx_active: 1
listener.127.0.0.1_15006.downstream_cx_active: 1
listener.127.0.0.1_15006.worker_0.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

    #[test]
    fn counts_each_connection_once_without_admin_and_status() {
        let a = active(CAPTURED, &[15021, 15090]);
        assert_eq!((a.connections, a.requests), (1, 1));
        assert!(a.skipped.is_empty());
    }

    #[test]
    fn internal_listeners_are_not_counted_and_tcp_proxy_connections_are_work() {
        // A tcp_proxy listener on 15001 forwarding into an internal listener
        // with an HTTP manager: the connection is counted once, as TCP work.
        let body = "listener.127.0.0.1_15001.downstream_cx_active: 1\n\
                    listener.envoy_internal_inner.downstream_cx_active: 1\n\
                    http.inner.downstream_cx_active: 0\n\
                    http.inner.downstream_rq_active: 0\n";
        let a = active(body, &[15021, 15090]);
        assert_eq!((a.connections, a.requests, a.tcp, a.work()), (1, 0, 1, 1));
        // An idle pooled HTTP connection into the internal listener: not work.
        let body = "listener.envoy_internal_inner.downstream_cx_active: 1\n\
                    http.inner.downstream_cx_active: 1\n\
                    http.inner.downstream_rq_active: 0\n";
        let a = active(body, &[15021, 15090]);
        assert_eq!((a.connections, a.requests, a.tcp), (0, 0, 0));
        // The captured sidecar: one HTTP request, no TCP work.
        assert_eq!(active(CAPTURED, &[15021, 15090]).tcp, 0);
    }

    #[test]
    fn ipv6_and_extra_ignored_ports() {
        let body = "listener.[__1]_15006.downstream_cx_active: 2\n\
                    listener.[__1]_15006.worker_1.downstream_cx_active: 2\n\
                    listener.[__]_15021.downstream_cx_active: 5\n\
                    listener.[__]_8081.downstream_cx_active: 3\n\
                    listener.my_internal.downstream_cx_active: 1\n";
        assert_eq!(active(body, &[15021, 15090]).connections, 2 + 3 + 1);
        assert_eq!(active(body, &[15021, 15090, 8081]).connections, 2 + 1);
    }

    #[test]
    fn wrapped_and_garbage_values_are_skipped_and_reported() {
        let body = "listener.127.0.0.1_15006.downstream_cx_active: 18446744073709551615\n\
                    listener.127.0.0.1_15001.downstream_cx_active: 2\n\
                    http.inbound_http.downstream_rq_active: zero\n";
        let a = active(body, &[]);
        assert_eq!(a.connections, 2);
        assert_eq!(a.requests, 0);
        assert_eq!(a.skipped.len(), 2);
        assert!(a.skipped[0].contains("18446744073709551615"));
    }

    #[test]
    fn empty_answer_counts_zero() {
        assert_eq!(active("", &[]), Active::default());
    }

    /// A local admin whose every answer takes `takes` of its one thread,
    /// as Envoy's main thread serves its admin API: one at a time, each
    /// finished even when its client gave up on it; its URL.
    async fn slow_admin(takes: Duration) -> lifeguard_base::url::LoopbackUrl {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let thread = Arc::new(tokio::sync::Mutex::new(()));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let thread = thread.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    {
                        let _busy = thread.lock().await;
                        tokio::time::sleep(takes).await;
                    }
                    let body = "listener.127.0.0.1_15006.downstream_cx_active: 1\n";
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
                });
            }
        });
        url
    }

    /// The drain gives up on its read before the admin client does (its
    /// deadline, a few ms earlier): the read ran past its time all the
    /// same, and Envoy finishes it before it begins the next, so the drain
    /// wait's next read, which needs 0.7 s, waits twice the admin timeout
    /// and is answered.
    #[tokio::test]
    async fn a_read_its_caller_gave_up_on_makes_the_next_wait_longer() {
        let usual = Duration::from_millis(500);
        let counts = CountsReader::new(AdminClient::new(slow_admin(Duration::from_millis(400)).await, usual));
        let cut = tokio::time::timeout(Duration::from_millis(100), counts.read_now(usual)).await;
        assert!(cut.is_err(), "the caller gave up first");
        let reading = counts.read_recent(Duration::ZERO).await;
        let counted = reading.body.map(|body| active(&body, &[]).connections);
        assert_eq!(counted, Ok(1), "waited {:?}", reading.took);
        assert!(reading.took > usual, "{:?}", reading.took);
    }
}
