//! TCP sockets of this network namespace, read from `/proc/net/tcp` and
//! `/proc/net/tcp6`, with their owning processes found through
//! `/proc/<pid>/fd` where permissions allow. [`crate::app`] turns them into
//! "what the app still holds".

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// A process that holds a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    /// The process name (`/proc/<pid>/comm`).
    pub name: String,
}

/// TCP state LISTEN in `/proc/net/tcp*`.
const LISTEN: &str = "0A";

/// One TCP socket of the namespace, in any state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub listening: bool,
    /// 0 for a socket no process holds any more (TIME_WAIT, an orphaned
    /// FIN_WAIT2...).
    pub inode: u64,
}

/// Parses the text of `/proc/net/tcp` or `/proc/net/tcp6`: every socket.
/// Lines that do not parse are skipped.
pub fn parse_sockets(text: &str) -> Vec<Socket> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _slot = fields.next()?;
            let local = parse_hex_addr(fields.next()?)?;
            let remote = parse_hex_addr(fields.next()?)?;
            let state = fields.next()?;
            // tx_queue:rx_queue, tr:tm->when, retrnsmt, uid, timeout, inode
            let inode = fields.nth(5)?.parse().ok()?;
            Some(Socket {
                local,
                remote,
                listening: state == LISTEN,
                inode,
            })
        })
        .collect()
}

/// Every TCP socket of this network namespace, IPv4 and IPv6.
pub fn sockets() -> std::io::Result<Vec<Socket>> {
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(file) {
            Ok(text) => out.extend(parse_sockets(&text)),
            // No IPv6 in this kernel: only tcp6 may be missing.
            Err(e) if file.ends_with('6') && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// `0100007F:1F90` → 127.0.0.1:8080; `00000000000000000000000001000000:20FB`
/// → [::1]:8443. The address is written as 32-bit words in the host's byte
/// order (little-endian here), the port in big-endian hex.
fn parse_hex_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<Vec<u32>>>()?;
    let ip = match words.as_slice() {
        [w] if ip.len() == 8 => IpAddr::V4(Ipv4Addr::from(w.to_ne_bytes())),
        [a, b, c, d] if ip.len() == 32 => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].into_iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Socket inode → owning process, for every process whose file descriptors
/// this process may read. Processes it may not read are left out.
pub fn owners() -> HashMap<u64, Owner> {
    let mut map = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return map;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let name = process_name(&entry.path());
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            map.entry(inode).or_insert_with(|| Owner {
                pid,
                name: name.clone(),
            });
        }
    }
    map
}

fn process_name(proc_dir: &Path) -> String {
    std::fs::read_to_string(proc_dir.join("comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from a network namespace with listeners on 0.0.0.0:8080,
    /// [::1]:8443 and [::]:15006, and one established connection to 8080.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000001 00:00000000 00000000     0        0 88410 2 00000000de3ae198 100 0 0 10 0
   1: 0100007F:EDA4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 88411 2 00000000a9ce0b61 20 0 0 10 -1
   2: 0100007F:1F90 0100007F:EDA4 01 00000000:00000000 00:00000000 00000000     0        0 0 1 00000000c84b37b9 20 0 0 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:3A9E 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 88409 1 000000004b4b0273 100 0 0 10 0
   1: 00000000000000000000000001000000:20FB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 88408 1 000000002f267418 100 0 0 10 0
";

    fn socket(local: &str, remote: &str, listening: bool, inode: u64) -> Socket {
        Socket {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            listening,
            inode,
        }
    }

    #[test]
    fn reads_every_socket_with_its_state_and_inode() {
        assert_eq!(
            parse_sockets(TCP),
            vec![
                socket("0.0.0.0:8080", "0.0.0.0:0", true, 88410),
                socket("127.0.0.1:60836", "127.0.0.1:8080", false, 88411),
                socket("127.0.0.1:8080", "127.0.0.1:60836", false, 0),
            ]
        );
    }

    #[test]
    fn reads_ipv6_any_and_loopback() {
        assert_eq!(
            parse_sockets(TCP6),
            vec![
                socket("[::]:15006", "[::]:0", true, 88409),
                socket("[::1]:8443", "[::]:0", true, 88408),
            ]
        );
    }

    #[test]
    fn loopback_v4_address_and_garbage() {
        let text = "header\n   0: 0100007F:3A98 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0 100 0 0 10 0\n   1: nonsense\n   2: ZZZZ:0050 00000000:0000 0A 0 0 0 0 0 9\n";
        assert_eq!(
            parse_sockets(text),
            vec![socket("127.0.0.1:15000", "0.0.0.0:0", true, 7)]
        );
    }

    #[test]
    fn finds_its_own_listening_socket_and_owner() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let found = sockets().unwrap();
        let mine = found
            .iter()
            .find(|s| s.listening && s.local.port() == port)
            .expect("our socket is listed");
        let owner = owners().remove(&mine.inode).expect("our own fds are readable");
        assert_eq!(owner.pid, std::process::id());
    }
}
