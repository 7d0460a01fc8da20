//! New requests reaching Envoy's inbound listeners: what tells that load
//! balancers and the mesh have stopped sending to the pod (the
//! [`Traffic`] port of [`crate::rotation`]).
//!
//! Which listeners are inbound is read once, when the drain begins, from
//! `/config_dump` (static and dynamic listeners, masked to their name,
//! address, stat prefix and `traffic_direction`: a few hundred bytes a
//! listener): with the inbound drain scope, the listeners Envoy's
//! `drain_listeners?inboundonly` drains; with `all`, every listener. When
//! the dump cannot be read (Envoy's `allow_paths` may forbid it) or names no
//! inbound listener, every listener counts but the admin, internal and
//! ignored-port ones (15021, 15090: probes and scrapes), and the log says so.
//!
//! The count is each listener's `downstream_cx_total` (new connections)
//! plus its per-listener HTTP `downstream_rq_completed` (requests on
//! connections kept alive), from the counts read the drain makes too
//! ([`CountsReader`]: one admin call serves both): only whether the total
//! moved matters. During Envoy's drain every HTTP/1.1
//! response closes its connection, so each new request is a new
//! connection too.

use std::net::IpAddr;

use serde_json::Value as Json;

use crate::drain::DrainScope;
use crate::envoy::admin::{AdminClient, Endpoint};
use crate::envoy::counts::CountsReader;
use crate::envoy::stats::{lines, Value};
use crate::rotation::{Traffic, TrafficError, READ_EVERY};
/// The largest listener dump read (masked, about 200 bytes a listener).
const DUMP_LIMIT: usize = 16 << 20;
/// The listener dumps, masked to what names a listener and its direction.
const STATIC_DUMP: &str = "/config_dump?resource=static_listeners&mask=listener.name,listener.address,listener.stat_prefix,listener.traffic_direction";
const DYNAMIC_DUMP: &str = "/config_dump?resource=dynamic_listeners&mask=name,active_state.listener.name,active_state.listener.address,active_state.listener.stat_prefix,active_state.listener.traffic_direction";

/// Which listeners' traffic counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Counted {
    /// These listeners' stat names (`0.0.0.0_15006`, `[__]_15006`, a stat
    /// prefix).
    Named(Vec<String>),
    /// Every listener but the admin, internal and ignored-port ones.
    Every,
}

/// Envoy's inbound traffic, through its admin API: the listener dumps, and
/// the counts read shared with the drain (a read of the drain's serves
/// while fresh).
pub(crate) struct Inbound {
    admin: AdminClient,
    counts: CountsReader,
    scope: DrainScope,
    ignored_ports: Vec<u16>,
    counted: Counted,
}

impl Inbound {
    pub(crate) fn new(admin: AdminClient, counts: CountsReader, scope: DrainScope, ignored_ports: Vec<u16>) -> Inbound {
        Inbound {
            admin,
            counts,
            scope,
            ignored_ports,
            counted: Counted::Every,
        }
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
        let words = self.select_listeners().await;
        self.counts.want_inbound(Some(&filter(&self.counted)));
        words
    }

    async fn inbound_total(&mut self) -> Result<u64, TrafficError> {
        let reading = self.counts.read_recent(READ_EVERY).await;
        let body = reading.body?;
        Ok(total(&body, &self.counted, &self.ignored_ports))
    }
}

impl Inbound {
    /// Reads which listeners count from Envoy's listener dumps; says which.
    async fn select_listeners(&mut self) -> String {
        let mut listeners = Vec::new();
        for path in [STATIC_DUMP, DYNAMIC_DUMP] {
            match self.admin.get_text(Endpoint::ConfigDump, path, DUMP_LIMIT).await {
                Ok(body) => match dumped_listeners(&body) {
                    Ok(found) => listeners.extend(found),
                    Err(why) => return self.every(&format!("Envoy's listener dump: {why}")),
                },
                Err(e) => return self.every(&e.to_string()),
            }
        }
        let (counted, skipped) = select(&listeners, self.scope, &self.ignored_ports);
        if counted.is_empty() {
            return self.every("no listener has traffic_direction INBOUND");
        }
        let words = format!("listeners {}", counted.join(", "));
        self.counted = Counted::Named(counted);
        match skipped.is_empty() {
            true => words,
            false => format!("{words} (not counted: {})", skipped.join(", ")),
        }
    }

    fn every(&mut self, why: &str) -> String {
        self.counted = Counted::Every;
        format!("every listener but the admin, internal and ignored-port ones (cannot tell inbound ones: {why})")
    }
}

/// The regex of the lines [`total`] reads: each counted listener's new
/// connections and its HTTP managers' completed requests, so Envoy's
/// answer grows by a few lines per inbound listener, not per listener and
/// worker; with no list, every listener's.
pub(crate) fn filter(counted: &Counted) -> String {
    let names = match counted {
        Counted::Named(names) => names.iter().map(|n| regex_escape(n)).collect::<Vec<_>>().join("|"),
        Counted::Every => ".+".to_owned(),
    };
    format!("^listener\\.({names})\\.(downstream_cx_total|http\\..+\\.downstream_rq_completed)$")
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

/// A listener as the dump shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listener {
    /// Its name in stats (`listener.<this>.…`), when it can be known.
    pub(crate) stat_name: Option<String>,
    pub(crate) inbound: bool,
    pub(crate) port: Option<u16>,
}

/// Why Envoy's listener dump cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DumpError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("\"configs\" is not a list")]
    Configs,
}

/// The listeners of a masked `/config_dump` answer (static or dynamic).
pub(crate) fn dumped_listeners(body: &str) -> Result<Vec<Listener>, DumpError> {
    let dump: Json = serde_json::from_str(body)?;
    let configs = match dump.get("configs") {
        None => return Ok(Vec::new()),
        Some(Json::Array(configs)) => configs,
        Some(_) => return Err(DumpError::Configs),
    };
    let mut out = Vec::new();
    for config in configs {
        // Static: {"listener": {...}}; dynamic: {"active_state": {"listener": {...}}}.
        let listener = config
            .get("listener")
            .or_else(|| config.get("active_state").and_then(|a| a.get("listener")));
        let Some(listener) = listener else { continue };
        out.push(listener_of(listener));
    }
    Ok(out)
}

fn listener_of(l: &Json) -> Listener {
    let text = |v: Option<&Json>| v.and_then(Json::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let address = l.get("address");
    let socket = address.and_then(|a| a.get("socket_address"));
    let port = socket
        .and_then(|s| s.get("port_value"))
        .and_then(Json::as_u64)
        .and_then(|p| u16::try_from(p).ok());
    let ip = text(socket.and_then(|s| s.get("address"))).and_then(|a| a.parse::<IpAddr>().ok());
    let internal = address.and_then(|a| a.get("envoy_internal_address")).is_some();
    let stat_name = text(l.get("stat_prefix")).or_else(|| match (ip, port) {
        (Some(IpAddr::V4(ip)), Some(port)) => Some(format!("{ip}_{port}")),
        (Some(IpAddr::V6(ip)), Some(port)) => Some(format!("[{}]_{port}", ip.to_string().replace(':', "_"))),
        _ if internal => text(l.get("name")).map(|name| format!("envoy_internal_{name}")),
        _ => None,
    });
    Listener {
        stat_name,
        inbound: l.get("traffic_direction").and_then(Json::as_str) == Some("INBOUND"),
        port,
    }
}

/// The listeners whose traffic counts under `scope` (their stat names),
/// and those left out though inbound (as words).
pub(crate) fn select(listeners: &[Listener], scope: DrainScope, ignored_ports: &[u16]) -> (Vec<String>, Vec<String>) {
    let mut counted = Vec::new();
    let mut skipped = Vec::new();
    for l in listeners {
        let wanted = scope == DrainScope::All || l.inbound;
        let ignored = l.port.is_some_and(|p| ignored_ports.contains(&p));
        match (&l.stat_name, wanted && !ignored) {
            (Some(name), true) => counted.push(name.clone()),
            (None, true) => skipped.push(format!("one on port {:?} without a stat name", l.port)),
            _ => {}
        }
    }
    counted.sort();
    counted.dedup();
    (counted, skipped)
}

/// The sum of new connections and completed requests over the counted
/// listeners, in an answer to [`crate::envoy::counts::COUNTS_STATS`]. Per-worker lines repeat
/// their listener's and are left out; values that are not numbers are too.
pub(crate) fn total(body: &str, counted: &Counted, ignored_ports: &[u16]) -> u64 {
    let mut sum = 0u64;
    for line in lines(body) {
        let Value::Number(n) = line.value else { continue };
        let Some(rest) = line.name.strip_prefix("listener.") else {
            continue;
        };
        let listener = if let Some(l) = rest.strip_suffix(".downstream_cx_total") {
            l
        } else if let Some((l, _)) = rest
            .strip_suffix(".downstream_rq_completed")
            .and_then(|r| r.split_once(".http."))
        {
            l
        } else {
            continue;
        };
        // Envoy names every listener; the filter it is asked for matches a
        // name of one character or more, and so does this.
        if listener.is_empty() {
            continue;
        }
        let counts = match counted {
            Counted::Named(names) => names.iter().any(|n| n == listener),
            Counted::Every => every_counts(listener, ignored_ports),
        };
        if counts {
            sum = sum.saturating_add(n);
        }
    }
    sum
}

/// With no list: a listener counts unless it is the admin's, internal,
/// per-thread or on an ignored port.
fn every_counts(listener: &str, ignored_ports: &[u16]) -> bool {
    let per_thread = listener
        .rsplit_once('.')
        .is_some_and(|(_, last)| last.starts_with("worker_") || last == "main_thread");
    let port = listener.rsplit_once('_').and_then(|(_, p)| p.parse::<u16>().ok());
    !(per_thread
        || listener == "admin"
        || listener.starts_with("envoy_internal_")
        || port.is_some_and(|p| ignored_ports.contains(&p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from Envoy 1.40 (config/envoy-bootstrap.yaml, three requests
    /// on the inbound listener).
    const STATS: &str = "\
listener.0.0.0.0_15006.downstream_cx_total: 3
listener.0.0.0.0_15006.http.inbound_http.downstream_rq_completed: 3
listener.0.0.0.0_15006.worker_0.downstream_cx_total: 3
listener.0.0.0.0_15021.downstream_cx_total: 40
listener.0.0.0.0_15021.http.status.downstream_rq_completed: 41
listener.127.0.0.1_15001.downstream_cx_total: 9
listener.admin.downstream_cx_total: 1
listener.admin.http.admin.downstream_rq_completed: 1
listener.admin.main_thread.downstream_cx_total: 1
";

    /// The masked static dump of config/envoy-bootstrap.yaml, as Envoy 1.40
    /// answers it (shortened to three listeners, one of them outbound).
    const STATIC: &str = r#"{"configs":[
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"status","address":{"socket_address":{"address":"0.0.0.0","port_value":15021}}}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"outbound","address":{"socket_address":{"address":"127.0.0.1","port_value":15001}},"traffic_direction":"OUTBOUND"}},
 {"@type":"type.googleapis.com/envoy.admin.v3.ListenersConfigDump.StaticListener",
  "listener":{"name":"inbound","address":{"socket_address":{"address":"0.0.0.0","port_value":15006}},"traffic_direction":"INBOUND"}}]}"#;

    #[test]
    fn the_inbound_listeners_of_the_dump_are_counted_once_each() {
        let listeners = dumped_listeners(STATIC).unwrap();
        let (counted, skipped) = select(&listeners, DrainScope::Inbound, &[15021, 15090]);
        assert_eq!(counted, ["0.0.0.0_15006"]);
        assert!(skipped.is_empty());
        assert_eq!(total(STATS, &Counted::Named(counted), &[]), 6);
        // The gateway scope: every listener but the ignored ports.
        let (all, _) = select(&listeners, DrainScope::All, &[15021, 15090]);
        assert_eq!(all, ["0.0.0.0_15006", "127.0.0.1_15001"]);
    }

    #[test]
    fn without_a_list_every_listener_counts_but_admin_workers_and_ignored_ports() {
        assert_eq!(total(STATS, &Counted::Every, &[15021, 15090]), 3 + 3 + 9);
        assert_eq!(total(STATS, &Counted::Every, &[]), 3 + 3 + 40 + 41 + 9);
    }

    #[test]
    fn dynamic_ipv6_internal_and_prefixed_listeners_get_their_stat_names() {
        let dynamic = r#"{"configs":[
          {"name":"virtualInbound","active_state":{"listener":{"name":"virtualInbound",
            "address":{"socket_address":{"address":"::","port_value":15006}},"traffic_direction":"INBOUND"}}},
          {"name":"v6","active_state":{"listener":{"name":"v6",
            "address":{"socket_address":{"address":"::1","port_value":8443}},"traffic_direction":"INBOUND"}}},
          {"name":"tagged","active_state":{"listener":{"name":"tagged","stat_prefix":"web",
            "address":{"socket_address":{"address":"0.0.0.0","port_value":80}},"traffic_direction":"INBOUND"}}},
          {"name":"inner","active_state":{"listener":{"name":"inner",
            "address":{"envoy_internal_address":{"server_listener_name":"inner"}},"traffic_direction":"INBOUND"}}},
          {"name":"warming-only","warming_state":{}}]}"#;
        let listeners = dumped_listeners(dynamic).unwrap();
        let names: Vec<_> = listeners.iter().map(|l| l.stat_name.clone().unwrap()).collect();
        assert_eq!(names, ["[__]_15006", "[__1]_8443", "web", "envoy_internal_inner"]);
        let stats = "listener.[__]_15006.downstream_cx_total: 2\nlistener.web.http.web.downstream_rq_completed: 5\n";
        let (counted, _) = select(&listeners, DrainScope::Inbound, &[]);
        assert_eq!(total(stats, &Counted::Named(counted), &[]), 7);
    }

    /// Found by fuzzing (fuzz/fuzz_targets/inbound.rs): a line of no
    /// listener name (`listener..downstream_cx_total`) was counted, though
    /// the filter asked of Envoy leaves it out.
    #[test]
    fn a_line_without_a_listener_name_is_not_counted() {
        let stats = "listener..downstream_cx_total: 40\nlistener..http.x.downstream_rq_completed: 2\n";
        assert_eq!(total(stats, &Counted::Every, &[]), 0);
        assert_eq!(total(stats, &Counted::Named(vec![String::new()]), &[]), 0);
    }

    #[test]
    fn the_filter_names_each_counted_listener_literally() {
        let named = Counted::Named(vec!["0.0.0.0_15006".into(), "[__1]_8443".into()]);
        assert_eq!(
            filter(&named),
            r"^listener\.(0\.0\.0\.0_15006|\[__1\]_8443)\.(downstream_cx_total|http\..+\.downstream_rq_completed)$"
        );
        assert!(filter(&Counted::Every).starts_with(r"^listener\.(.+)\."));
    }

    #[test]
    fn an_empty_dump_has_no_listener_and_garbage_is_an_error() {
        assert_eq!(dumped_listeners("{}").unwrap(), []);
        assert!(dumped_listeners("not json")
            .unwrap_err()
            .to_string()
            .starts_with("not JSON"));
        assert!(dumped_listeners(r#"{"configs":3}"#).is_err());
        // Values that are not numbers are left out.
        assert_eq!(total("listener.a_1.downstream_cx_total: x\n", &Counted::Every, &[]), 0);
    }
}
