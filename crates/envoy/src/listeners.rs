//! Envoy's listeners as its `/config_dump` shows them: the names, ports,
//! stat prefixes and connection managers [`crate::inbound`] counts
//! new requests on, and whether a manager has the `health_check` filter or
//! appends the peer to `x-forwarded-for`. Only parsing: no admin calls.

use std::net::IpAddr;

use serde_json::Value as Json;

/// A listener as the dump shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    /// Its name in stats (`listener.<this>.…`), when it can be known.
    pub stat_name: Option<String>,
    pub inbound: bool,
    pub port: Option<u16>,
    /// Its HTTP connection managers' and TCP proxies' stat prefixes.
    pub http: Vec<String>,
    pub tcp: Vec<String>,
    /// One of its HTTP managers has Envoy's `health_check` filter.
    pub health_check_filter: bool,
    /// Whether every HTTP manager of it appends the peer's own address to
    /// `x-forwarded-for`, so its last entry is the peer and nothing a
    /// client wrote (`use_remote_address`, no trusted hops, no other way of
    /// finding the client); None: no HTTP manager, or its chains not read.
    pub appends_peer: Option<bool>,
}

/// Why Envoy's listener dump cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("\"configs\" is not a list")]
    Configs,
}

/// The listeners of a `/config_dump` answer (static or dynamic, masked or
/// whole; a dynamic one masked to its name has only its name).
pub fn dumped_listeners(body: &str) -> Result<Vec<Listener>, DumpError> {
    let dump: Json = serde_json::from_str(body)?;
    let configs = match dump.get("configs") {
        None => return Ok(Vec::new()),
        Some(Json::Array(configs)) => configs,
        Some(_) => return Err(DumpError::Configs),
    };
    let mut out = Vec::new();
    for config in configs {
        // Static: {"listener": {...}}; dynamic: {"name": ..., "active_state": {"listener": {...}}}.
        let listener = config
            .get("listener")
            .or_else(|| config.get("active_state").and_then(|a| a.get("listener")));
        match (listener, config.get("name").and_then(Json::as_str)) {
            (Some(listener), _) => out.push(listener_of(listener)),
            (None, Some(name)) if !name.is_empty() => out.push(Listener {
                name: name.to_owned(),
                ..Listener::default()
            }),
            (None, _) => {}
        }
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
    let name = text(l.get("name")).unwrap_or_default();
    let stat_name = text(l.get("stat_prefix")).or_else(|| match (ip, port) {
        (Some(IpAddr::V4(ip)), Some(port)) => Some(format!("{ip}_{port}")),
        (Some(IpAddr::V6(ip)), Some(port)) => Some(format!("[{}]_{port}", ip.to_string().replace(':', "_"))),
        _ if internal && !name.is_empty() => Some(format!("envoy_internal_{name}")),
        _ => None,
    });
    let mut listener = Listener {
        name,
        stat_name,
        inbound: l.get("traffic_direction").and_then(Json::as_str) == Some("INBOUND"),
        port,
        ..Listener::default()
    };
    let chains = l.get("filter_chains").and_then(Json::as_array).into_iter().flatten();
    for chain in chains.chain(l.get("default_filter_chain")) {
        for filter in chain.get("filters").and_then(Json::as_array).into_iter().flatten() {
            let config = filter.get("typed_config");
            let kind = text(config.and_then(|c| c.get("@type"))).unwrap_or_default();
            let Some(config) = config else { continue };
            if kind.ends_with(".HttpConnectionManager") {
                listener.http.extend(text(config.get("stat_prefix")));
                listener.health_check_filter |= has_health_check_filter(config);
                let appends = appends_peer(config);
                listener.appends_peer = Some(listener.appends_peer.unwrap_or(true) && appends);
            } else if kind.ends_with(".TcpProxy") {
                listener.tcp.extend(text(config.get("stat_prefix")));
            }
        }
    }
    listener
}

/// Whether an HTTP manager's filters include Envoy's `health_check`.
fn has_health_check_filter(manager: &Json) -> bool {
    let filters = manager
        .get("http_filters")
        .and_then(Json::as_array)
        .into_iter()
        .flatten();
    filters.into_iter().any(|f| {
        let kind = f
            .get("typed_config")
            .and_then(|c| c.get("@type"))
            .and_then(Json::as_str);
        f.get("name").and_then(Json::as_str) == Some("envoy.filters.http.health_check")
            || kind.is_some_and(|k| k.ends_with(".health_check.v3.HealthCheck"))
    })
}

/// Whether an HTTP manager appends its peer's address to
/// `x-forwarded-for` and trusts nothing a client wrote there.
fn appends_peer(manager: &Json) -> bool {
    let flag = |key: &str| manager.get(key).and_then(Json::as_bool).unwrap_or(false);
    let hops = manager.get("xff_num_trusted_hops").and_then(Json::as_u64).unwrap_or(0);
    let detection = manager
        .get("original_ip_detection_extensions")
        .and_then(Json::as_array)
        .is_some_and(|e| !e.is_empty());
    flag("use_remote_address") && !flag("skip_xff_append") && hops == 0 && !detection
}
