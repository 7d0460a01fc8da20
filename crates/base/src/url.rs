//! Local HTTP addresses: Envoy's admin API, the agent, the readiness URL of
//! `wait`. Only loopback hosts and Unix sockets are accepted, so nothing
//! lifeguard is configured with can send a request off the host.
//!
//! A Unix socket (`unix:///var/run/lifeguard/admin.sock`) is how only the
//! proxy's container reaches Envoy's admin: every process of the pod shares
//! loopback, but a socket file of mode 0600 in a directory only the proxy
//! container mounts is the proxy's alone.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Whether an address is on this host (127.0.0.0/8, ::1, or either as an
/// IPv4-mapped IPv6 address).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// A local HTTP address: `http://` plus a loopback host and a port, or
/// `unix://` plus the absolute path of a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackUrl {
    to: Address,
    authority: String,
}

/// Where a [`LoopbackUrl`] connects (`lifeguard_http::connect` makes the
/// connection: the vocabulary makes no system call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A loopback address and port (`http://127.0.0.1:15000`, `[::1]`).
    Tcp(SocketAddr),
    /// `localhost:PORT`: 127.0.0.1, else ::1 (an admin bound to one of the
    /// two, as Envoy Gateway binds its own to ::1 on IPv6-only clusters).
    Localhost(u16),
    /// A Unix socket's absolute path (`unix:///var/run/lifeguard/admin.sock`).
    Unix(PathBuf),
}

impl LoopbackUrl {
    /// A Unix socket's URL.
    pub fn unix(path: &Path) -> Self {
        Self {
            to: Address::Unix(path.to_owned()),
            authority: "localhost".into(),
        }
    }

    /// The TCP port, when the address is one (None for a Unix socket).
    pub fn port(&self) -> Option<u16> {
        match &self.to {
            Address::Tcp(addr) => Some(addr.port()),
            Address::Localhost(port) => Some(*port),
            Address::Unix(_) => None,
        }
    }

    /// The `Host` header of a request to it.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// Where it connects.
    pub fn address(&self) -> &Address {
        &self.to
    }
}

impl fmt::Display for LoopbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.to {
            Address::Tcp(_) | Address::Localhost(_) => write!(f, "http://{}", self.authority),
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

crate::serialize_as_display!(LoopbackUrl);

/// Why an address was refused as a local HTTP address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("must start with http:// (plain HTTP on loopback) or unix:// (a Unix socket)")]
    Scheme,
    #[error("expected unix:///ABSOLUTE/PATH, for example unix:///var/run/lifeguard/admin.sock")]
    RelativeSocket,
    #[error("expected http://IP:PORT, for example http://127.0.0.1:15000")]
    NotIpPort,
    #[error("bad port")]
    BadPort,
    #[error("port 0 is not allowed")]
    PortZero,
    /// Not on this host (the address, for who reads the error's fields).
    #[error("must be a loopback address (127.0.0.0/8, ::1 or localhost)")]
    NotLoopback(IpAddr),
    /// A path where only an address is wanted (the path).
    #[error("must not have a path")]
    HasPath(String),
}

impl FromStr for LoopbackUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, UrlError> {
        if let Some(path) = s.strip_prefix("unix://") {
            let path = Path::new(path);
            if !path.is_absolute() {
                return Err(UrlError::RelativeSocket);
            }
            return Ok(Self::unix(path));
        }
        let (url, path) = parse_loopback_url(s)?;
        if path != "/" {
            return Err(UrlError::HasPath(path));
        }
        Ok(url)
    }
}

/// Parses `http://HOST:PORT[/PATH]` where HOST is a loopback address (or
/// `localhost`); returns the address and the path (`/` when none).
pub fn parse_loopback_url(s: &str) -> Result<(LoopbackUrl, String), UrlError> {
    let rest = s.strip_prefix("http://").ok_or(UrlError::Scheme)?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = Some(path)
        .filter(|p| !p.trim_end_matches('/').is_empty())
        .unwrap_or("/");
    let to = if let Some(port) = authority.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| UrlError::BadPort)?;
        if port == 0 {
            return Err(UrlError::PortZero);
        }
        Address::Localhost(port)
    } else {
        let addr: SocketAddr = authority.parse().map_err(|_| UrlError::NotIpPort)?;
        if !addr.ip().is_loopback() {
            return Err(UrlError::NotLoopback(addr.ip()));
        }
        if addr.port() == 0 {
            return Err(UrlError::PortZero);
        }
        Address::Tcp(addr)
    };
    let url = LoopbackUrl {
        to,
        authority: authority.to_owned(),
    };
    Ok((url, path.to_owned()))
}

/// Where the control socket is: a path, or none (`none`, the default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlSocket(pub Option<PathBuf>);

/// Why a control socket's path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlSocketError {
    #[error("must be an absolute path (or none)")]
    Relative,
    #[error("a path cannot contain NUL")]
    Nul,
}

impl FromStr for ControlSocket {
    type Err = ControlSocketError;
    fn from_str(s: &str) -> Result<Self, ControlSocketError> {
        match s {
            "" | "none" => Ok(ControlSocket(None)),
            path if !Path::new(path).is_absolute() => Err(ControlSocketError::Relative),
            path if path.contains('\0') => Err(ControlSocketError::Nul),
            path => Ok(ControlSocket(Some(path.into()))),
        }
    }
}

impl ControlSocket {
    /// The socket's URL when it is set and its file exists, else `url`:
    /// how a hook reaches the agent.
    pub fn or(&self, url: LoopbackUrl) -> LoopbackUrl {
        match &self.0 {
            Some(path) if path.exists() => LoopbackUrl::unix(path),
            _ => url,
        }
    }
}

impl fmt::Display for ControlSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("none"),
            Some(path) => write!(f, "{}", path.display()),
        }
    }
}

crate::serialize_as_display!(ControlSocket);

/// `text` for a query string: every byte but the unreserved ones as `%XX`.
pub fn query_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_is_either_loopback_address_at_a_port() {
        let url: LoopbackUrl = "http://localhost:15000".parse().unwrap();
        assert_eq!(url.port(), Some(15000));
        assert_eq!(url.address(), &Address::Localhost(15000));
        assert_eq!(url.to_string(), "http://localhost:15000");
        assert_eq!("http://localhost:0".parse::<LoopbackUrl>(), Err(UrlError::PortZero));
        assert_eq!("http://localhost:x".parse::<LoopbackUrl>(), Err(UrlError::BadPort));
    }
}
