//! TCP sockets of this network namespace (`/proc/net/tcp` and `tcp6`) and
//! the processes that hold them (their `/proc/<pid>/fd` links, where
//! permissions allow), read through the `procfs` crate.
//! [`crate::app`] turns them into "what the app still holds".

use std::collections::HashMap;
use std::net::SocketAddr;

use procfs::net::{TcpNetEntry, TcpState};
use procfs::process::FDTarget;

/// One TCP socket of the namespace, in any state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Socket {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) listening: bool,
    /// 0 for a socket no process holds any more (TIME_WAIT, an orphaned
    /// FIN_WAIT2...).
    pub(crate) inode: u64,
}

impl From<TcpNetEntry> for Socket {
    fn from(e: TcpNetEntry) -> Self {
        Socket {
            local: e.local_address,
            remote: e.remote_address,
            listening: e.state == TcpState::Listen,
            inode: e.inode,
        }
    }
}

/// Every TCP socket of this network namespace, IPv4 and IPv6.
pub(crate) fn sockets() -> std::io::Result<Vec<Socket>> {
    let mut out: Vec<Socket> = procfs::net::tcp().map_err(io)?.into_iter().map(Socket::from).collect();
    match procfs::net::tcp6() {
        Ok(v6) => out.extend(v6.into_iter().map(Socket::from)),
        // No IPv6 in this kernel: only tcp6 may be missing.
        Err(procfs::ProcError::NotFound(_)) => {}
        Err(e) => return Err(io(e)),
    }
    Ok(out)
}

fn io(e: procfs::ProcError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Socket inode → the pid of the process holding it, among the processes
/// `among` (None: every process) whose file descriptors this process may
/// read; the others are left out. Reading only the proxy's processes is
/// enough to tell its sockets, and spares the app's (maybe many)
/// descriptors on every read of the drain.
pub(crate) fn holders(among: Option<&[u32]>) -> HashMap<u64, u32> {
    let processes: Vec<procfs::process::Process> = match among {
        Some(pids) => pids
            .iter()
            .filter_map(|&pid| procfs::process::Process::new(pid as i32).ok())
            .collect(),
        None => match procfs::process::all_processes() {
            Ok(all) => all.flatten().collect(),
            Err(_) => Vec::new(),
        },
    };
    let mut map = HashMap::new();
    for process in processes {
        let Ok(fds) = process.fd() else { continue };
        for fd in fds.flatten() {
            if let FDTarget::Socket(inode) = fd.target {
                map.entry(inode).or_insert(process.pid as u32);
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_its_own_listening_socket_and_owner() {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let found = sockets().unwrap();
        let mine = found
            .iter()
            .find(|s| s.listening && s.local.port() == port)
            .expect("our socket is listed");
        let me = std::process::id();
        assert_eq!(holders(None).get(&mine.inode), Some(&me), "our own fds are readable");
        assert_eq!(holders(Some(&[me])).get(&mine.inode), Some(&me));
        assert_eq!(holders(Some(&[])).get(&mine.inode), None);
    }

    /// The kernel fact the app's rules stand on: the end that closed first
    /// (FIN_WAIT2, then TIME_WAIT) is held by no process (inode 0), while
    /// the end whose peer closed (CLOSE_WAIT) is still held by its process.
    #[test]
    fn a_closed_end_is_no_ones_and_a_half_closed_one_is_still_held() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (closer, holder) = (client.local_addr().unwrap(), server.local_addr().unwrap());
        drop(client);
        let state = |addr: SocketAddr, remote: SocketAddr| {
            let table = procfs::net::tcp().unwrap();
            let entry = table
                .into_iter()
                .find(|e| e.local_address == addr && e.remote_address == remote);
            entry.map(|e| (e.state, e.inode))
        };
        // The close done: the FIN taken (the holder in CLOSE_WAIT) and its
        // ACK taken too (the closer past FIN_WAIT1).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let closed_end = |s: TcpState| matches!(s, TcpState::FinWait2 | TcpState::TimeWait);
        while !(state(holder, closer).is_some_and(|(s, _)| s == TcpState::CloseWait)
            && state(closer, holder).is_some_and(|(s, _)| closed_end(s)))
        {
            assert!(std::time::Instant::now() < deadline, "the close not done within 5 s");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (closed, closed_inode) = state(closer, holder).expect("the closed end is listed");
        assert!(matches!(closed, TcpState::FinWait2 | TcpState::TimeWait), "{closed:?}");
        assert_eq!(closed_inode, 0);
        let (_, held) = state(holder, closer).unwrap();
        assert_eq!(holders(None).get(&held), Some(&std::process::id()));
        let listed = sockets().unwrap();
        assert!(listed.iter().any(|s| s.inode == held && s.remote == closer));
        drop(server);
    }
}
