//! One key for a peer, wherever lifeguard limits or tables by peer (the
//! status port's connection slots, the drain wait's checkers and its waits
//! from outside the pod): an IPv4 address, an IPv4-mapped IPv6 address as
//! its IPv4 one, and an IPv6 address as its /64, which one host usually
//! holds whole (a peer that rotates through its /64 is still one peer).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A peer, as every per-peer limit and table counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerKey(IpAddr);

impl PeerKey {
    /// The peer that `ip` belongs to.
    pub fn of(ip: IpAddr) -> PeerKey {
        let ip = match ip.to_canonical() {
            IpAddr::V6(a) => {
                let s = a.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
            v4 => v4,
        };
        PeerKey(ip)
    }
}

/// `10.0.0.5`, `2001:db8::/64`.
impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_a_peer_ipv4_mapped_as_ipv4_and_ipv6_by_its_64() {
        let key = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(key("10.0.0.5"), key("::ffff:10.0.0.5"));
        assert_ne!(key("10.0.0.5"), key("10.0.0.6"));
        assert_eq!(key("2001:db8:0:1::5"), key("2001:db8:0:1:ffff::9"));
        assert_ne!(key("2001:db8:0:1::5"), key("2001:db8:0:2::5"));
        assert_eq!(key("2001:db8:0:1::5").to_string(), "2001:db8:0:1::/64");
        assert_eq!(key("::ffff:10.0.0.5").to_string(), "10.0.0.5");
    }
}
