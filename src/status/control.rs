//! The control socket (`--control-socket PATH`): the status service on a
//! Unix socket, where `POST /drain`, `POST /quitquitquit` and `GET /drain`
//! need no loopback check. Every process of a pod shares loopback, the app
//! included; a socket file of mode 0600 in a directory only the proxy's
//! container mounts is reachable by the proxy's container alone (its
//! preStop hooks). With `--loopback-control false` the TCP port refuses the
//! mutating routes, and this socket is the only way to drain or stop.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
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
pub(crate) struct BindError {
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

/// The control socket, bound and not yet serving.
pub(crate) struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlServer {
    /// Binds `path` with mode 0600. A socket file left by an earlier run is
    /// replaced; any other file there is an error, and so is a socket
    /// another process still serves.
    pub(crate) fn bind(path: &Path) -> Result<ControlServer, BindError> {
        Self::listen(path).map_err(|fault| BindError {
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
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(ControlServer {
            listener,
            path: path.to_owned(),
        })
    }

    /// Serves until `shutdown`, then removes the socket file.
    pub(crate) async fn serve(self, service: StatusService, shutdown: CancellationToken) {
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
