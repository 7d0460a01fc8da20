//! Loopback HTTP addresses: Envoy's admin API, the agent, the readiness URL
//! of `wait`. Only loopback hosts are accepted, so nothing lifeguard is
//! configured with can send a request off the host.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

/// A loopback HTTP address: `http://` plus a loopback host and a port
/// (Envoy's admin API, the agent, the readiness URL of `wait`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoopbackUrl {
    addr: SocketAddr,
    authority: String,
}

impl LoopbackUrl {
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub(crate) fn authority(&self) -> &str {
        &self.authority
    }
}

impl fmt::Display for LoopbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}", self.authority)
    }
}

impl FromStr for LoopbackUrl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (url, path) = parse_loopback_url(s)?;
        if path != "/" {
            return Err("must not have a path".into());
        }
        Ok(url)
    }
}

/// Parses `http://HOST:PORT[/PATH]` where HOST is a loopback address (or
/// `localhost`); returns the address and the path (`/` when none).
pub(crate) fn parse_loopback_url(s: &str) -> Result<(LoopbackUrl, String), String> {
    let rest = s
        .strip_prefix("http://")
        .ok_or("must start with http:// (plain HTTP on loopback)")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = Some(path)
        .filter(|p| !p.trim_end_matches('/').is_empty())
        .unwrap_or("/");
    let addr: SocketAddr = if let Some(port) = authority.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| "bad port")?;
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    } else {
        authority
            .parse()
            .map_err(|_| "expected http://IP:PORT, for example http://127.0.0.1:15000")?
    };
    if !addr.ip().is_loopback() {
        return Err("must be a loopback address (127.0.0.0/8, ::1 or localhost)".into());
    }
    if addr.port() == 0 {
        return Err("port 0 is not allowed".into());
    }
    let url = LoopbackUrl {
        addr,
        authority: authority.to_owned(),
    };
    Ok((url, path.to_owned()))
}
