//! New requests arriving at Envoy's inbound listeners: what tells that load
//! balancers and the mesh have stopped sending to the pod (the
//! [`Traffic`] port of [`lifeguard_drain_wait`]).
//!
//! **Which listeners.** Read from `/config_dump`: static listeners masked
//! to their name, address, stat prefix, direction and filter chains;
//! dynamic ones (a mask cannot reach inside them) by name first, then
//! their configs a few at a time. With the inbound drain scope, the
//! listeners `drain_listeners?inboundonly` drains; with `all`, every one;
//! never one on an ignored port (15021, 15090: probes and scrapes). Read
//! when first asked, again whenever Envoy's listener manager says a
//! listener was added, changed or removed (its counters ride along in the
//! same stats read), so a drain usually starts with no dump at all. When
//! the dump cannot be read (Envoy's `allow_paths` may forbid it) or names
//! no inbound listener, every listener counts but the admin, internal and
//! ignored-port ones, by new connections and completed requests, and the
//! log says so.
//!
//! **What counts, on the counted listeners.** Each HTTP connection
//! manager's `downstream_rq_total` (a request counts when it *arrives*, on
//! a new or a kept-alive connection, HTTP/1.1 or HTTP/2) less its
//! `tracing.health_check` (the requests Envoy's `health_check` filter
//! recognised as a load balancer's check: they go on after the pod is out
//! of rotation, and are not traffic); each TCP proxy's
//! `downstream_cx_total`; a listener with neither, its own
//! `downstream_cx_total`. Only whether the total moved matters. The count
//! rides on the read the drain makes too ([`CountsReader`]: one admin call
//! serves both).
//!
//! **Failing the load balancers' checks.** When readiness turns 503,
//! `POST /healthcheck/fail` makes Envoy's `health_check` filter answer 503
//! to the checks it recognises, wherever the load balancer sends them (the
//! pod's traffic port too), while real requests are still served; each
//! response then carries `x-envoy-immediate-health-check-fail`, which an
//! Envoy in front takes as an immediate failure.

use crate::admin::{AdminClient, AdminError, Endpoint};
use crate::counts::{control_error, CountsReader};
use crate::listeners::{dumped_listeners, DumpError, Listener};
use crate::stats::{lines, StatValue};
use lifeguard_base::url::query_encode;
use lifeguard_drain::{DrainScope, PACE};
use lifeguard_drain_wait::{Arrivals, Traffic, TrafficError, READ_EVERY};

/// The largest listener dump read (one call).
const DUMP_LIMIT: usize = 16 << 20;
/// Static listeners, masked to what names them and their direction.
const STATIC_DUMP: &str = "/config_dump?resource=static_listeners&mask=listener.name,listener.address,listener.stat_prefix,listener.traffic_direction";
/// Static listeners' filter chains (asked `name_regex` of the counted ones).
const STATIC_CHAINS: &str =
    "/config_dump?resource=static_listeners&mask=listener.name,listener.filter_chains,listener.default_filter_chain";
/// The names of the dynamic listeners (a mask cannot reach inside them).
const DYNAMIC_NAMES: &str = "/config_dump?resource=dynamic_listeners&mask=name";
/// Dynamic listeners whole (asked `name_regex` of a few at a time).
const DYNAMIC_WHOLE: &str = "/config_dump?resource=dynamic_listeners";
/// Dynamic listeners read whole, this many a call.
const DYNAMIC_BATCH: usize = 32;
/// After a dump that could not be read, the next try comes no sooner
/// (then twice as long after each failure in a row, up to 80 s).
const RETRY_LEARNING: std::time::Duration = std::time::Duration::from_secs(10);
/// The first retry after a learn that timed out, or that failed before
/// any learn succeeded.
const RETRY_SOON: std::time::Duration = std::time::Duration::from_secs(1);
/// How long after a failed learn to try again, after `failures` in a row
/// (`learned`: a learn has succeeded before):
/// - at the next read when Envoy's admin refused the connection (it is not
///   listening yet: lifeguard starts before Envoy, and a drain may begin
///   seconds later; a refused connection costs nothing);
/// - after [`RETRY_SOON`] doubled for each failure before, up to 64 s, when
///   the read timed out (a busy node's admin answers a second later), or
///   whatever the failure when no learn has succeeded yet (an Envoy still
///   starting answers otherwise a second later): until the dump is read,
///   load balancers probing through Envoy are told apart by `User-Agent`
///   alone (seen for 11 s, then 12 s, in busy runs);
/// - else after [`RETRY_LEARNING`] doubled for each failure before, up to
///   80 s (this Envoy's dump was read before, and it will likely answer
///   the same again).
fn retry_after(why: &LearnError, failures: u32, learned: bool) -> std::time::Duration {
    match why {
        LearnError::Admin(AdminError::Connect { .. }) => std::time::Duration::ZERO,
        _ if !learned || matches!(why, LearnError::Admin(AdminError::Timeout { .. })) => {
            RETRY_SOON * 2u32.pow(failures.min(6))
        }
        _ => RETRY_LEARNING * 2u32.pow(failures.min(3)),
    }
}

/// The listener manager's counters of listener changes.
const CHANGES: &str = r"listener_manager\.listener_(added|modified|removed)";

/// Which lines count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// The listeners the dump named.
    Chosen(Selection),
    /// Every listener but the admin, internal and ignored-port ones, by new
    /// connections and completed requests (the dump could not be read).
    Every,
}

/// The counted listeners, by what each counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Every counted listener's stat name (for words).
    pub listeners: Vec<String>,
    /// HTTP connection managers' stat prefixes: requests at arrival, health
    /// checks aside.
    pub http: Vec<String>,
    /// TCP proxies' stat prefixes: new connections.
    pub tcp: Vec<String>,
    /// Listeners with neither: their own new connections.
    pub bare: Vec<String>,
    /// A counted HTTP manager has Envoy's `health_check` filter: the load
    /// balancers' checks it recognises fail with `/healthcheck/fail`.
    pub health_checks: bool,
}

/// Envoy's inbound traffic, through its admin API.
pub struct Inbound {
    admin: AdminClient,
    counts: CountsReader,
    scope: DrainScope,
    ignored_ports: Vec<u16>,
    counted: Counted,
    /// The selection the totals are of: bumped when a learn chose others (0: none yet).
    generation: u64,
    /// The listener manager's change count the first read after learning
    /// saw (None: no read since). A change between the dump and that read
    /// is not seen: a window of one read.
    changes: Option<u64>,
    /// The dumps could not be read: when to try again.
    retry_at: Option<tokio::time::Instant>,
    /// How many learns in a row failed (each retry waits twice the last).
    failures: u32,
    /// A learn has succeeded.
    learned: bool,
    /// The last failure logged, in words (each new one is logged once).
    logged_failure: Option<String>,
    /// Envoy's status listener appends the prober's address to
    /// `x-forwarded-for` (false until the dumps say so).
    peer_forwarded: bool,
    /// What was learned, in words.
    words: String,
}

impl Inbound {
    pub fn new(admin: AdminClient, counts: CountsReader, scope: DrainScope, ignored_ports: Vec<u16>) -> Inbound {
        Inbound {
            admin,
            counts,
            scope,
            ignored_ports,
            counted: Counted::Every,
            generation: 0,
            changes: None,
            retry_at: None,
            failures: 0,
            learned: false,
            logged_failure: None,
            peer_forwarded: false,
            words: String::new(),
        }
    }

    /// Whether the last learning failed and its retry is due.
    fn retry_due(&self) -> bool {
        self.retry_at.is_some_and(|at| tokio::time::Instant::now() >= at)
    }

    /// Learns the listeners again and, when they were read and what is
    /// counted changed, says so: `why` it was learned again (a failure is
    /// said by [`Inbound::relearn`]).
    async fn relearn_saying(&mut self, why: &str) {
        let words = std::mem::take(&mut self.words);
        if self.relearn().await && self.words != words {
            tracing::info!("drain wait: {why}; counting {}", self.words);
        }
    }

    /// Reads which listeners count, and asks the counts read for their
    /// lines; whether the listeners were read.
    async fn relearn(&mut self) -> bool {
        let learned = self.listeners().await;
        let read = learned.is_ok();
        let (counted, words) = match learned {
            Ok(listeners) => {
                (self.retry_at, self.failures, self.learned) = (None, 0, true);
                self.logged_failure = None;
                self.peer_forwarded = status_appends_peer(&listeners);
                choose(&listeners, self.scope, &self.ignored_ports)
            }
            Err(why) => {
                let wait = retry_after(&why, self.failures, self.learned);
                if !wait.is_zero() {
                    self.failures += 1;
                }
                // A refused connection is Envoy not listening (not started
                // yet, or restarting): the next that answers starts anew;
                // tried again at each read, and not worth a line each time.
                let refused = matches!(why, LearnError::Admin(AdminError::Connect { .. }));
                self.learned &= !refused;
                self.retry_at = Some(tokio::time::Instant::now() + wait);
                let words = why.to_string();
                if !refused && self.logged_failure.as_deref() != Some(words.as_str()) {
                    tracing::warn!(
                        "drain wait: Envoy's listeners could not be read ({words}); trying again in {}",
                        lifeguard_base::duration::GoDuration(wait)
                    );
                    self.logged_failure = Some(words.clone());
                }
                (Counted::Every, every_words(&words))
            }
        };
        self.counts.want_inbound(Some(&filter(&counted)));
        // The same selection sums the same counters: its totals stay
        // comparable, and the quiet seen so far holds.
        if self.generation == 0 || counted != self.counted {
            self.generation += 1;
        }
        self.counted = counted;
        self.words = words;
        self.changes = None;
        read
    }

    /// Every listener of the dumps, with the filter chains of those that
    /// may count, or why they cannot be read. Each call is paced like the
    /// counts reads (the next begins no sooner than [`PACE`] times the last
    /// one's time after it ended): a large config costs Envoy's admin
    /// thread about a tenth of its time while it is learned.
    async fn listeners(&self) -> Result<Vec<Listener>, LearnError> {
        let mut pace = Pace::default();
        let mut listeners = self.dump(&mut pace, STATIC_DUMP).await?;
        // The chains of the listeners that may count, and of the status
        // listener (does it append the prober's address?).
        let wanted = |l: &Listener| {
            let counts = (self.scope == DrainScope::All || l.inbound)
                && !l.port.is_some_and(|p| self.ignored_ports.contains(&p));
            counts || l.port == Some(STATUS_LISTENER_PORT)
        };
        let names: Vec<String> = listeners.iter().filter(|l| wanted(l)).map(|l| l.name.clone()).collect();
        let chains = self.by_name(&mut pace, &names, STATIC_CHAINS).await?;
        for l in &mut listeners {
            if let Some(c) = chains.iter().find(|c| c.name == l.name) {
                (l.http, l.tcp) = (c.http.clone(), c.tcp.clone());
                (l.health_check_filter, l.appends_peer) = (c.health_check_filter, c.appends_peer);
            }
        }
        let dynamic: Vec<String> = self
            .dump(&mut pace, DYNAMIC_NAMES)
            .await?
            .into_iter()
            .map(|l| l.name)
            .collect();
        listeners.extend(self.by_name(&mut pace, &dynamic, DYNAMIC_WHOLE).await?);
        Ok(listeners)
    }

    /// The listeners named, a batch at a time (`name_regex`), each
    /// `resource` query answered whole or as masked.
    async fn by_name(&self, pace: &mut Pace, names: &[String], query: &str) -> Result<Vec<Listener>, LearnError> {
        let mut out = Vec::new();
        for batch in names.chunks(DYNAMIC_BATCH) {
            let alternatives: Vec<String> = batch.iter().map(|n| regex_escape(n)).collect();
            let regex = format!("^({})$", alternatives.join("|"));
            out.extend(
                self.dump(pace, &format!("{query}&name_regex={}", query_encode(&regex)))
                    .await?,
            );
        }
        Ok(out)
    }

    /// One dump, after the pace of the last.
    async fn dump(&self, pace: &mut Pace, path: &str) -> Result<Vec<Listener>, LearnError> {
        pace.wait().await;
        let began = tokio::time::Instant::now();
        let body = self.admin.get_text(Endpoint::ConfigDump, path, DUMP_LIMIT).await;
        pace.took(began);
        Ok(dumped_listeners(&body?)?)
    }
}

/// Spaces a series of admin calls: each begins no sooner than [`PACE`]
/// times the last one's time after it ended.
#[derive(Default)]
struct Pace(Option<tokio::time::Instant>);

impl Pace {
    async fn wait(&self) {
        if let Some(next) = self.0 {
            tokio::time::sleep_until(next).await;
        }
    }

    fn took(&mut self, began: tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        self.0 = Some(now + now.duration_since(began) * PACE);
    }
}

/// The wait is over: the drain's reads need the active counts alone again.
impl Drop for Inbound {
    fn drop(&mut self) {
        self.counts.want_inbound(None);
    }
}

impl Traffic for Inbound {
    async fn learn(&mut self) -> String {
        if self.generation == 0 {
            self.relearn().await;
        } else if self.retry_due() {
            self.relearn_saying("Envoy's listeners learned after a failure").await;
        }
        self.words.clone()
    }

    fn learn_due(&self) -> Option<tokio::time::Instant> {
        self.retry_at
    }

    async fn arrivals(&mut self) -> Result<Arrivals, TrafficError> {
        if self.generation == 0 {
            self.relearn().await;
        } else if self.retry_due() {
            self.relearn_saying("Envoy's listeners learned after a failure").await;
        }
        let reading = self.counts.read_recent(READ_EVERY).await;
        let body = reading.body?;
        let (total, changes) = total(&body, &self.counted, &self.ignored_ports);
        let arrivals = Arrivals {
            seq: reading.seq,
            total,
            generation: self.generation,
            read: reading.began,
            took: reading.took,
        };
        match self.changes {
            None => self.changes = Some(changes),
            Some(seen) if seen != changes => {
                // Envoy's listeners changed: learn them again. This read's
                // total is of the old ones; the next is of the new selection.
                self.relearn_saying("Envoy's listeners changed").await;
            }
            Some(_) => {}
        }
        Ok(arrivals)
    }

    fn peer_forwarded(&self) -> bool {
        self.peer_forwarded
    }

    async fn fail_health_checks(&mut self) -> Result<bool, TrafficError> {
        if !matches!(&self.counted, Counted::Chosen(s) if s.health_checks) {
            return Ok(false);
        }
        let call = self.admin.post(Endpoint::HealthcheckFail, "/healthcheck/fail").await;
        call.map(|_| true).map_err(|e| TrafficError(control_error(e)))
    }
}

/// Whether every listener on the status port appends the prober's address
/// to `x-forwarded-for` (false when none is known).
fn status_appends_peer(listeners: &[Listener]) -> bool {
    let mut status = listeners
        .iter()
        .filter(|l| l.port == Some(STATUS_LISTENER_PORT))
        .peekable();
    status.peek().is_some() && status.all(|l| l.appends_peer == Some(true))
}

/// What is counted, and in words.
pub fn choose(listeners: &[Listener], scope: DrainScope, ignored_ports: &[u16]) -> (Counted, String) {
    let (selection, skipped) = select(listeners, scope, ignored_ports);
    if selection.listeners.is_empty() {
        let why = match scope {
            DrainScope::Inbound => "no listener has traffic_direction INBOUND",
            DrainScope::All => "Envoy has no listener",
        };
        return (Counted::Every, every_words(why));
    }
    let mut words = format!("listeners {}", selection.listeners.join(", "));
    if !skipped.is_empty() {
        words.push_str(&format!(" (not counted: {})", skipped.join(", ")));
    }
    (Counted::Chosen(selection), words)
}

fn every_words(why: &str) -> String {
    format!("every listener but the admin, internal and ignored-port ones (cannot tell inbound ones: {why})")
}

/// The regex of the lines [`total`] reads: each counted manager's and
/// proxy's, the listener manager's changes; with no selection, every
/// listener's new connections and completed requests.
pub fn filter(counted: &Counted) -> String {
    let mut parts = Vec::new();
    match counted {
        Counted::Chosen(s) => {
            let any = |names: &[String]| names.iter().map(|n| regex_escape(n)).collect::<Vec<_>>().join("|");
            if !s.http.is_empty() {
                parts.push(format!(
                    r"http\.({})\.(downstream_rq_total|tracing\.health_check)",
                    any(&s.http)
                ));
            }
            if !s.tcp.is_empty() {
                parts.push(format!(r"tcp\.({})\.downstream_cx_total", any(&s.tcp)));
            }
            if !s.bare.is_empty() {
                parts.push(format!(r"listener\.({})\.downstream_cx_total", any(&s.bare)));
            }
        }
        Counted::Every => parts.push(r"listener\.(.+)\.(downstream_cx_total|http\..+\.downstream_rq_completed)".into()),
    }
    parts.push(CHANGES.into());
    format!("^({})$", parts.join("|"))
}

/// `text` matched literally by a regex.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Envoy's status listener's port (Istio's, and the shipped bootstraps'):
/// the probes of the pod's readiness come through it.
pub(crate) const STATUS_LISTENER_PORT: u16 = 15021;

/// Why the listeners could not be learned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LearnError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("Envoy's listener dump: {0}")]
    Dump(#[from] DumpError),
}

/// The listeners whose traffic counts under `scope`, and those left out
/// though wanted (as words).
pub(crate) fn select(listeners: &[Listener], scope: DrainScope, ignored_ports: &[u16]) -> (Selection, Vec<String>) {
    let mut s = Selection::default();
    let mut skipped = Vec::new();
    for l in listeners {
        let wanted = scope == DrainScope::All || l.inbound;
        let ignored = l.port.is_some_and(|p| ignored_ports.contains(&p));
        if !wanted || ignored {
            continue;
        }
        let Some(stat_name) = &l.stat_name else {
            skipped.push(format!("{} on port {:?}, without a stat name", l.name, l.port));
            continue;
        };
        s.listeners.push(stat_name.clone());
        s.health_checks |= l.health_check_filter;
        s.http.extend(l.http.iter().cloned());
        s.tcp.extend(l.tcp.iter().cloned());
        if l.http.is_empty() && l.tcp.is_empty() {
            s.bare.push(stat_name.clone());
        }
    }
    for names in [&mut s.listeners, &mut s.http, &mut s.tcp, &mut s.bare] {
        names.sort();
        names.dedup();
    }
    (s, skipped)
}

/// The arrivals on the counted listeners in an answer to the counts read,
/// and the listener manager's change count (listeners added, modified and
/// removed: the lines the filter asks for, never its other
/// `listener_manager.listener_*` stats). Values that are not numbers are
/// left out.
pub fn total(body: &str, counted: &Counted, ignored_ports: &[u16]) -> (u64, u64) {
    let (mut plus, mut minus, mut changes) = (0u64, 0u64, 0u64);
    for line in lines(body) {
        let StatValue::Number(n) = line.value else { continue };
        let name = line.name;
        let change = name
            .strip_prefix("listener_manager.listener_")
            .is_some_and(|what| matches!(what, "added" | "modified" | "removed"));
        let sum = if change {
            Some(&mut changes)
        } else {
            match counted {
                Counted::Chosen(s) => chosen_line(name, s).map(|health_check| match health_check {
                    true => &mut minus,
                    false => &mut plus,
                }),
                Counted::Every => every_line(name, ignored_ports).then_some(&mut plus),
            }
        };
        if let Some(sum) = sum {
            *sum = sum.saturating_add(n);
        }
    }
    (plus.saturating_sub(minus), changes)
}

/// Whether a line counts for `s`: Some(true) for health checks (subtracted),
/// Some(false) for arrivals.
fn chosen_line(name: &str, s: &Selection) -> Option<bool> {
    let of = |names: &[String], rest: &str| names.iter().any(|n| n == rest);
    if let Some(rest) = name.strip_prefix("http.") {
        if let Some(p) = rest.strip_suffix(".downstream_rq_total") {
            return of(&s.http, p).then_some(false);
        }
        if let Some(p) = rest.strip_suffix(".tracing.health_check") {
            return of(&s.http, p).then_some(true);
        }
        return None;
    }
    let (names, rest) = match name.split_once('.') {
        Some(("tcp", rest)) => (&s.tcp, rest),
        Some(("listener", rest)) => (&s.bare, rest),
        _ => return None,
    };
    let rest = rest.strip_suffix(".downstream_cx_total")?;
    of(names, rest).then_some(false)
}

/// With no selection: a listener's new connections and completed requests
/// count unless it is the admin's, internal, per-thread or on an ignored port.
fn every_line(name: &str, ignored_ports: &[u16]) -> bool {
    let Some(rest) = name.strip_prefix("listener.") else {
        return false;
    };
    let listener = if let Some(l) = rest.strip_suffix(".downstream_cx_total") {
        l
    } else if let Some((l, _)) = rest
        .strip_suffix(".downstream_rq_completed")
        .and_then(|r| r.split_once(".http."))
    {
        l
    } else {
        return false;
    };
    crate::counts::counted_listener(listener, ignored_ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With no selection, a listener counts as it does in the drain's
    /// active counts (one rule, `counts::counted_listener`): not the
    /// admin's, on its main thread either; not internal, per-thread or on
    /// an ignored port.
    #[test]
    fn every_listener_counts_but_the_ones_the_active_counts_leave_out() {
        let counts = |name: &str| every_line(name, &[15021]);
        assert!(counts("listener.0.0.0.0_8080.downstream_cx_total"));
        assert!(counts("listener.web.http.inbound.downstream_rq_completed"));
        for left_out in [
            "listener.admin.downstream_cx_total",
            "listener.admin.main_thread.downstream_cx_total",
            "listener.envoy_internal_inner.downstream_cx_total",
            "listener.0.0.0.0_8080.worker_0.downstream_cx_total",
            "listener.0.0.0.0_15021.downstream_cx_total",
            "listener.[__]_15021.downstream_cx_total",
        ] {
            assert!(!counts(left_out), "{left_out}");
        }
    }

    /// Captured from Envoy 1.40 (config/envoy-bootstrap.yaml): three
    /// requests on the inbound listener, one of them a load balancer's
    /// check the `health_check` filter recognised.
    const STATS: &str = "\
http.inbound_http.downstream_rq_total: 3
http.inbound_http.tracing.health_check: 1
http.status.downstream_rq_total: 41
listener.0.0.0.0_15006.downstream_cx_total: 3
listener.0.0.0.0_15006.http.inbound_http.downstream_rq_completed: 2
listener.0.0.0.0_15006.worker_0.downstream_cx_total: 3
listener.0.0.0.0_15021.downstream_cx_total: 40
listener.0.0.0.0_15021.http.status.downstream_rq_completed: 41
listener.127.0.0.1_15001.downstream_cx_total: 9
listener.admin.downstream_cx_total: 1
listener.admin.http.admin.downstream_rq_completed: 1
listener.admin.main_thread.downstream_cx_total: 1
listener_manager.listener_added: 4
";

    /// The masked static dump of config/envoy-bootstrap.yaml, as Envoy 1.40
    /// answers it (shortened to three listeners, one of them outbound).
    const STATIC: &str = r#"{"configs":[
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"status","address":{"socket_address":{"address":"0.0.0.0","port_value":15021}},
   "filter_chains":[{"filters":[{"name":"envoy.filters.network.http_connection_manager","typed_config":{
    "@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix":"status"}}]}]}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"outbound","address":{"socket_address":{"address":"127.0.0.1","port_value":15001}},"traffic_direction":"OUTBOUND",
   "filter_chains":[{"filters":[{"name":"envoy.filters.network.tcp_proxy","typed_config":{
    "@type":"type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy","stat_prefix":"out"}}]}]}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"inbound","address":{"socket_address":{"address":"0.0.0.0","port_value":15006}},"traffic_direction":"INBOUND",
   "filter_chains":[{"filters":[{"name":"envoy.filters.network.http_connection_manager","typed_config":{
    "@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix":"inbound_http"}}]}]}}]}"#;

    fn chosen(listeners: &[Listener], scope: DrainScope) -> Selection {
        match choose(listeners, scope, &[15021, 15090]).0 {
            Counted::Chosen(s) => s,
            Counted::Every => panic!("nothing chosen"),
        }
    }

    #[test]
    fn requests_count_at_arrival_and_the_load_balancers_checks_do_not() {
        let listeners = dumped_listeners(STATIC).unwrap();
        let s = chosen(&listeners, DrainScope::Inbound);
        assert_eq!(s.listeners, ["0.0.0.0_15006"]);
        assert_eq!(
            (s.http.as_slice(), s.tcp.len(), s.bare.len()),
            (&["inbound_http".to_owned()][..], 0, 0)
        );
        // 3 arrived, 1 was a check: 2 requests; the listener manager's count rides along.
        assert_eq!(total(STATS, &Counted::Chosen(s.clone()), &[]), (2, 4));
        // The gateway scope: every listener but the ignored ports.
        let all = chosen(&listeners, DrainScope::All);
        assert_eq!(all.listeners, ["0.0.0.0_15006", "127.0.0.1_15001"]);
        assert_eq!(all.tcp, ["out"]);
        let stats = format!("{STATS}tcp.out.downstream_cx_total: 5\n");
        assert_eq!(total(&stats, &Counted::Chosen(all), &[]).0, 2 + 5);
    }

    #[test]
    fn without_a_selection_every_listener_counts_but_admin_workers_and_ignored_ports() {
        assert_eq!(total(STATS, &Counted::Every, &[15021, 15090]).0, 3 + 2 + 9);
        assert_eq!(total(STATS, &Counted::Every, &[]).0, 3 + 2 + 40 + 41 + 9);
    }

    /// Only listeners added, modified and removed are changes: the filter
    /// asks Envoy for those alone, and a whole answer totals the same (the
    /// inbound fuzz target found the other `listener_manager.listener_*`
    /// stats counted).
    #[test]
    fn only_listeners_added_modified_and_removed_are_changes() {
        let stats = format!(
            "{STATS}listener_manager.listener_modified: 2\nlistener_manager.listener_removed: 1\n\
             listener_manager.listener_create_success: 7\nlistener_manager.listener_in_place_updated: 5\n"
        );
        assert_eq!(total(&stats, &Counted::Every, &[]).1, 4 + 2 + 1);
    }

    #[test]
    fn dynamic_listeners_are_named_then_read_whole() {
        let names = r#"{"configs":[{"name":"virtualInbound"},{"name":"outbound_x"}]}"#;
        let named = dumped_listeners(names).unwrap();
        assert_eq!(
            named.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(),
            ["virtualInbound", "outbound_x"]
        );
        assert!(named.iter().all(|l| l.stat_name.is_none()));
        // Istio's virtualInbound: an HTTP chain and a TCP passthrough chain.
        let whole = r#"{"configs":[{"name":"virtualInbound","active_state":{"listener":{"name":"virtualInbound",
          "address":{"socket_address":{"address":"::","port_value":15006}},"traffic_direction":"INBOUND",
          "filter_chains":[
            {"filters":[{"name":"envoy.filters.network.http_connection_manager","typed_config":{
              "@type":"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
              "stat_prefix":"inbound_0.0.0.0_8080"}}]},
            {"filters":[{"name":"envoy.filters.network.tcp_proxy","typed_config":{
              "@type":"type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
              "stat_prefix":"InboundPassthroughCluster"}}]}]}}}]}"#;
        let s = chosen(&dumped_listeners(whole).unwrap(), DrainScope::Inbound);
        assert_eq!(s.listeners, ["[__]_15006"]);
        let stats = "http.inbound_0.0.0.0_8080.downstream_rq_total: 7\n\
                     http.inbound_0.0.0.0_8080.tracing.health_check: 2\n\
                     tcp.InboundPassthroughCluster.downstream_cx_total: 3\n\
                     listener.[__]_15006.downstream_cx_total: 10\n";
        assert_eq!(
            total(stats, &Counted::Chosen(s), &[]).0,
            5 + 3,
            "the listener's own connections are not counted twice"
        );
    }

    #[test]
    fn ipv6_internal_prefixed_and_filterless_listeners() {
        let dynamic = r#"{"configs":[
          {"name":"v6","active_state":{"listener":{"name":"v6",
            "address":{"socket_address":{"address":"::1","port_value":8443}},"traffic_direction":"INBOUND"}}},
          {"name":"tagged","active_state":{"listener":{"name":"tagged","stat_prefix":"web",
            "address":{"socket_address":{"address":"0.0.0.0","port_value":80}},"traffic_direction":"INBOUND"}}},
          {"name":"inner","active_state":{"listener":{"name":"inner",
            "address":{"envoy_internal_address":{"server_listener_name":"inner"}},"traffic_direction":"INBOUND"}}},
          {"name":"warming-only","warming_state":{}}]}"#;
        let listeners = dumped_listeners(dynamic).unwrap();
        let names: Vec<_> = listeners.iter().map(|l| l.stat_name.clone()).collect();
        assert_eq!(
            names,
            [
                Some("[__1]_8443".into()),
                Some("web".into()),
                Some("envoy_internal_inner".into()),
                None
            ]
        );
        let s = chosen(&listeners, DrainScope::Inbound);
        assert_eq!(s.bare, ["[__1]_8443", "envoy_internal_inner", "web"]);
        let stats = "listener.[__1]_8443.downstream_cx_total: 2\nlistener.web.downstream_cx_total: 5\n";
        assert_eq!(total(stats, &Counted::Chosen(s), &[]).0, 7);
    }

    /// Found by fuzzing (fuzz/fuzz_targets/inbound.rs): a line of no
    /// listener name (`listener..downstream_cx_total`) was counted, though
    /// the filter asked of Envoy leaves it out.
    #[test]
    fn a_line_without_a_listener_name_is_not_counted() {
        let stats = "listener..downstream_cx_total: 40\nlistener..http.x.downstream_rq_completed: 2\n";
        assert_eq!(total(stats, &Counted::Every, &[]).0, 0);
        let s = Selection {
            bare: vec![String::new()],
            ..Selection::default()
        };
        assert_eq!(
            total(stats, &Counted::Chosen(s), &[]).0,
            40,
            "named literally: the empty name's own line"
        );
    }

    #[test]
    fn the_filter_names_each_counted_prefix_literally() {
        let s = Selection {
            listeners: vec!["[__1]_8443".into()],
            http: vec!["inbound_0.0.0.0_8080".into()],
            tcp: vec![],
            bare: vec!["[__1]_8443".into()],
            health_checks: false,
        };
        assert_eq!(
            filter(&Counted::Chosen(s)),
            r"^(http\.(inbound_0\.0\.0\.0_8080)\.(downstream_rq_total|tracing\.health_check)|listener\.(\[__1\]_8443)\.downstream_cx_total|listener_manager\.listener_(added|modified|removed))$"
        );
        assert!(filter(&Counted::Every).starts_with(r"^(listener\.(.+)\."));
    }

    #[test]
    fn a_refused_admin_is_tried_again_at_once_a_slow_or_starting_one_soon_and_a_bad_dump_backs_off() {
        use std::time::Duration;
        let refused = LearnError::Admin(AdminError::Connect {
            url: "http://127.0.0.1:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        });
        let slow = LearnError::Admin(AdminError::Timeout {
            url: "http://127.0.0.1:1".into(),
            timeout: Duration::from_secs(1),
        });
        let garbage = LearnError::Dump(dumped_listeners("not json").unwrap_err());
        for learned in [false, true] {
            assert_eq!(retry_after(&refused, 5, learned), Duration::ZERO);
            let waits: Vec<u64> = (0..8).map(|n| retry_after(&slow, n, learned).as_secs()).collect();
            assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 64]);
        }
        // An Envoy still starting: any failure is tried again soon.
        let waits: Vec<u64> = (0..8).map(|n| retry_after(&garbage, n, false).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 64]);
        // One whose dump was read before: it will likely answer the same.
        let waits: Vec<u64> = (0..5).map(|n| retry_after(&garbage, n, true).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 80]);
    }

    #[test]
    fn no_inbound_listener_or_garbage_counts_every_listener_and_says_why() {
        let (counted, words) = choose(&[], DrainScope::Inbound, &[]);
        assert_eq!(counted, Counted::Every);
        assert!(
            words.ends_with("(cannot tell inbound ones: no listener has traffic_direction INBOUND)"),
            "{words}"
        );
        assert_eq!(dumped_listeners("{}").unwrap(), []);
        assert!(dumped_listeners("not json")
            .unwrap_err()
            .to_string()
            .starts_with("not JSON"));
        assert!(dumped_listeners(r#"{"configs":3}"#).is_err());
        // Values that are not numbers are left out.
        assert_eq!(
            total("listener.a_1.downstream_cx_total: x\n", &Counted::Every, &[]).0,
            0
        );
    }
}
