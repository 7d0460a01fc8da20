//! The control socket (`--control-socket PATH`): the status service on a
//! Unix socket, where `POST /drain`, `POST /quitquitquit` and `GET /drain`
//! need no loopback check. Every process of a pod shares loopback, the app
//! included; a socket file of mode 0600 in a directory only the proxy's
//! container mounts is reachable by the proxy's container alone (its
//! preStop hooks). With `--loopback-control false` the TCP port refuses the
//! mutating routes, and this socket is the only way to drain or stop.
//!
//! The socket is never connectable by anyone but its owner, not even for a
//! moment: it is bound in a directory of its own (mode 0700) beside its
//! path, given mode 0600 there, and only then moved to its path.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::server::HEADER_READ_TIMEOUT;
use super::service::StatusService;

/// The control socket could not be bound: start-up stops, the file in
/// the way left untouched.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind the control socket {}", .path.display())]
pub struct SocketBindError {
    pub(crate) path: PathBuf,
    #[source]
    pub(crate) fault: SocketFault,
}

/// What is in the control socket's way.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketFault {
    #[error("another process serves this socket")]
    Served,
    #[error("a file that is not a socket is in the way")]
    NotASocket,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A socket at `path` that has mode 0600 from the moment it is there:
/// bound in a directory only its owner may enter (0700, beside `path`, on
/// the same file system), given its mode, then moved into place.
fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let private = parent.join(format!(".{name}.{}.binding", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| {
        let inside = private.join("control.sock");
        let listener = UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inside, path)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

/// The control socket, bound and not yet serving.
pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlServer {
    /// Binds `path` with mode 0600. A socket file left by an earlier run is
    /// replaced; any other file there is an error, and so is a socket
    /// another process still serves.
    pub fn bind(path: &Path) -> Result<ControlServer, SocketBindError> {
        Self::listen(path).map_err(|fault| SocketBindError {
            path: path.to_owned(),
            fault,
        })
    }

    fn listen(path: &Path) -> Result<ControlServer, SocketFault> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(SocketFault::Served);
                }
                std::fs::remove_file(path)?;
            }
            Ok(_) => return Err(SocketFault::NotASocket),
            Err(_) => {}
        }
        let listener = bind_private(path)?;
        Ok(ControlServer {
            listener,
            path: path.to_owned(),
        })
    }

    /// Serves until `shutdown`, then removes the socket file.
    pub async fn serve(self, service: StatusService, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "control socket: accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                },
            };
            let (service, http, shutdown) = (service.for_control_socket(), http.clone(), shutdown.clone());
            tracker.spawn(async move {
                let conn = http.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                    }
                }
            });
        }
        tracker.close();
        tracker.wait().await;
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What inotify saw happen to names in a directory: (mask, name).
    #[allow(unsafe_code)]
    fn watch(dir: &Path, during: impl FnOnce()) -> Vec<(u32, String)> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: inotify_init1 and inotify_add_watch take no pointers but
        // the NUL-terminated path, which outlives the call.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0);
        let mask = libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ATTRIB;
        // SAFETY: as above.
        assert!(unsafe { libc::inotify_add_watch(fd, path.as_ptr(), mask) } >= 0);
        during();
        let mut buf = vec![0u8; 64 << 10];
        // SAFETY: reads into a buffer of that length, owned here.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(fd) };
        let mut events = Vec::new();
        let (mut at, n) = (0, n.max(0) as usize);
        while at + 16 <= n {
            let word = |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
            let (mask, len) = (word(4), word(12) as usize);
            let name = &buf[at + 16..at + 16 + len];
            let name = String::from_utf8_lossy(name).trim_end_matches('\0').to_owned();
            events.push((mask, name));
            at += 16 + len;
        }
        events
    }

    /// The socket is never connectable by anyone but its owner,
    /// not even for a moment: it appears at its path whole, moved there
    /// with mode 0600 from a directory only its owner may enter.
    #[tokio::test]
    async fn the_control_socket_appears_at_its_path_with_mode_0600_never_before() {
        let dir = std::env::temp_dir().join(format!("lifeguard-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("control.sock");
        let _ = std::fs::remove_file(&path);
        let mut server = None;
        let events = watch(&dir, || server = Some(ControlServer::bind(&path).unwrap()));
        let ours: Vec<u32> = events
            .iter()
            .filter(|(_, name)| name == "control.sock")
            .map(|(mask, _)| *mask)
            .collect();
        assert!(
            ours.iter().all(|m| m & libc::IN_CREATE == 0),
            "created at its path: {events:?}"
        );
        assert!(ours.iter().any(|m| m & libc::IN_MOVED_TO != 0), "{events:?}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // It serves there, and the private directory is gone.
        assert!(std::os::unix::net::UnixStream::connect(&path).is_ok());
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("control.sock")]);
        drop(server);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
