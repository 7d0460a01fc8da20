//! The producer of a shared read: Envoy's `/stats/prometheus` read chunk by
//! chunk onto the read's list, whole lines only, no faster than its
//! slowest client takes them, until the body ends, the read's deadline
//! passes, the cap is hit or lifeguard shuts down; then the read is kept a
//! while to be shared.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::StatusCode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::app::lines::note_families;
use crate::counters::Incomplete;
use crate::read::{bounded, Read, REUSE_MIN};
use crate::window::{End, List};
use lifeguard_envoy::admin::{AdminClient, CallOutcome, Endpoint};
use lifeguard_envoy::poller::Heartbeat;

/// Largest Envoy body taken into a scrape: far above a 20,000-cluster
/// Envoy's (about 250 MB). Past it the rest is left out, logged and counted.
pub(crate) const ENVOY_BODY_CAP: usize = 1 << 30;
/// Longest line of Envoy's body (a line is the unit a cut scrape keeps).
pub(crate) const LINE_CAP: usize = 1 << 20;

/// Reads Envoy's body into `read.plain` until it ends, the read's deadline
/// passes, the cap is hit, or lifeguard shuts down.
pub(crate) async fn produce(
    read: Arc<Read>,
    admin: AdminClient,
    path: String,
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
) {
    let started = Instant::now();
    let mut bytes = 0usize;
    let mut tail = BytesMut::new();
    let end = tokio::select! {
        end = fill(&read, &admin, &path, &heartbeat, &mut bytes, &mut tail) => end,
        _ = shutdown.cancelled() => End::Cut(Incomplete::Error),
    };
    *read.finished.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    read.plain.end(end);
    let took = started.elapsed();
    let outcome = match end {
        End::Complete => CallOutcome::Ok,
        End::Cut(Incomplete::Timeout) => CallOutcome::Timeout,
        End::Cut(_) => CallOutcome::Error,
    };
    admin.observe(Endpoint::Prometheus, outcome, took);
    // Kept to be shared only when it can be: whole (a body larger than the
    // window was not kept, so no later scrape could start from it).
    let retain = match end {
        _ if !read.plain.holds_start() => Duration::ZERO,
        End::Complete | End::Cut(Incomplete::Timeout) => REUSE_MIN.max(took),
        End::Cut(_) => Duration::ZERO,
    };
    match end {
        End::Complete => tracing::debug!(path, bytes, took_ms = took.as_millis() as u64, "Envoy's metrics read"),
        End::Cut(Incomplete::Cap) => tracing::warn!(
            path,
            bytes,
            "Envoy's metrics passed the {} MiB cap: the rest is left out of the scrape",
            ENVOY_BODY_CAP >> 20
        ),
        End::Cut(Incomplete::Timeout) => tracing::warn!(
            path,
            bytes,
            took_ms = took.as_millis() as u64,
            "Envoy's metrics cut at the scrape timeout"
        ),
        End::Cut(_) => {}
    }
    // A complete (or timed-out) read stays shareable for a while, also
    // when no client is left on it: scrapes in a tight loop then cost
    // Envoy's admin thread at most about half its time.
    tokio::select! {
        _ = tokio::time::sleep(retain) => {}
        _ = read.release.cancelled() => {}
        _ = shutdown.cancelled() => {}
    }
    drop(read);
}

async fn fill(
    read: &Read,
    admin: &AdminClient,
    path: &str,
    heartbeat: &Heartbeat,
    bytes: &mut usize,
    tail: &mut BytesMut,
) -> End {
    // Envoy's silence is put down to this read for the first client's
    // budget at most (never past MAX_BEATING), however late others join.
    let beat_until = read.deadline().min(read.started + MAX_BEATING);
    let (status, mut body) = match bounded(read, beating(heartbeat, beat_until, admin.open(path))).await {
        None => return End::Cut(Incomplete::Timeout),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "Envoy's metrics left out of the scrape");
            return End::Cut(Incomplete::Error);
        }
        Some(Ok(answer)) => answer,
    };
    if status != StatusCode::OK {
        let mut text = Vec::new();
        while let Some(Ok(Some(chunk))) = bounded(read, body.chunk()).await {
            text.extend_from_slice(&chunk[..chunk.len().min(4096 - text.len().min(4096))]);
            if text.len() >= 4096 {
                break;
            }
        }
        let error = lifeguard_envoy::admin::check_status(status, Bytes::from(text), path).err();
        tracing::debug!(error = %error.map(|e| e.to_string()).unwrap_or_default(), "Envoy's metrics left out of the scrape");
        return End::Cut(Incomplete::Error);
    }
    loop {
        let chunk = match bounded(read, beating(heartbeat, beat_until, body.chunk())).await {
            None => return End::Cut(Incomplete::Timeout),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "Envoy's metrics broke off");
                return End::Cut(Incomplete::Error);
            }
            Some(Ok(None)) => {
                if !tail.is_empty() {
                    // A last line without its newline: ended, and its
                    // family noted like every other line's.
                    tail.extend_from_slice(b"\n");
                    let last = tail.split().freeze();
                    if let Some(families) = &read.families {
                        note_families(&last, &mut families.lock().unwrap_or_else(|e| e.into_inner()));
                    }
                    read.plain.push(last);
                }
                return End::Complete;
            }
            Some(Ok(Some(chunk))) => chunk,
        };
        heartbeat.beat();
        *bytes += chunk.len();
        if *bytes > ENVOY_BODY_CAP {
            return End::Cut(Incomplete::Cap);
        }
        let before = read.plain.len();
        if !push_lines(&read.plain, tail, chunk) {
            tracing::warn!(path, "a line of Envoy's metrics is longer than {} KiB", LINE_CAP >> 10);
            return End::Cut(Incomplete::Error);
        }
        if let Some(families) = &read.families {
            let mut families = families.lock().unwrap_or_else(|e| e.into_inner());
            read.plain.each_from(before, |item| note_families(item, &mut families));
        }
        // Back-pressure: no more than the window ahead of the slowest reader.
        match bounded(read, read.plain.room(read.deadline())).await {
            Some(Ok(())) => {}
            Some(Err(end)) => return end,
            None => return End::Cut(Incomplete::Timeout),
        }
    }
}

/// Pushes the complete lines of `chunk` (after the partial line in
/// `tail`) onto `list`; keeps the new partial line in `tail`. Whole lines
/// are slices of `chunk`; only a line split across chunks is copied.
/// False when a line is longer than [`LINE_CAP`].
pub(crate) fn push_lines(list: &List<Bytes>, tail: &mut BytesMut, mut chunk: Bytes) -> bool {
    if !tail.is_empty() {
        match chunk.iter().position(|&b| b == b'\n') {
            None => {
                tail.extend_from_slice(&chunk);
                return tail.len() <= LINE_CAP;
            }
            Some(nl) => {
                tail.extend_from_slice(&chunk.split_to(nl + 1));
                list.push(tail.split().freeze());
            }
        }
    }
    match chunk.iter().rposition(|&b| b == b'\n') {
        Some(last) => {
            let lines = chunk.split_to(last + 1);
            list.push(lines);
            tail.extend_from_slice(&chunk);
        }
        None => tail.extend_from_slice(&chunk),
    }
    tail.len() <= LINE_CAP
}

/// How often a read waiting on Envoy says so to the poller.
const BEAT_EVERY: Duration = Duration::from_millis(250);
/// The longest a read waiting on Envoy vouches for it.
const MAX_BEATING: Duration = Duration::from_secs(30);

/// Runs `fut` (a wait on Envoy's answer to our own metrics read) and, while
/// it waits, tells the poller that Envoy's admin thread is busy with that
/// read: Envoy serves admin requests one at a time, so a `/ready` that
/// times out meanwhile is queued behind our read, not unanswered by a hung
/// Envoy. Only until `until` (the first client's budget, at most
/// [`MAX_BEATING`]): a hung Envoy is then seen within that bound plus the
/// staleness bound.
async fn beating<F: std::future::Future>(heartbeat: &Heartbeat, until: Instant, fut: F) -> F::Output {
    tokio::pin!(fut);
    let mut beat = tokio::time::interval(BEAT_EVERY);
    loop {
        tokio::select! {
            out = &mut fut => return out,
            _ = beat.tick(), if Instant::now() < until => heartbeat.beat(),
            _ = tokio::time::sleep_until(until), if Instant::now() < until => {}
        }
        if Instant::now() >= until {
            return fut.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::PLAIN_WINDOW;
    use crate::{ScrapeRequest, Scraper};
    use futures_util::StreamExt;
    use hyper::header::HeaderMap;
    use lifeguard_envoy::readiness::Readiness;
    use lifeguard_istio::annotations::AppMetrics;
    use lifeguard_metrics::Metrics;

    /// Serves `body` to every request on the connection `io`.
    fn serve<IO>(io: IO, body: &'static str)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let service = hyper::service::service_fn(move |_| async move {
            let body = http_body_util::Full::new(Bytes::from_static(body.as_bytes()));
            Ok::<_, std::convert::Infallible>(hyper::Response::new(body))
        });
        let io = hyper_util::rt::TokioIo::new(io);
        tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
    }

    /// Found by fuzzing (fuzz/fuzz_targets/merged_scrape.rs): the last line
    /// of Envoy's body, when it had no newline, was served but its family
    /// not noted, so an app's copy of that family came through too.
    #[tokio::test]
    async fn envoys_last_line_without_a_newline_counts_among_its_families() {
        let dir = std::env::temp_dir().join(format!("lifeguard-scrape-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("admin.sock");
        let admin = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            while let Ok((io, _)) = admin.accept().await {
                serve(io, "envoy_a 1\n# TYPE envoy_server_state gauge");
            }
        });
        let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = app.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((io, _)) = app.accept().await {
                serve(
                    io,
                    "# TYPE envoy_server_state gauge\nenvoy_server_state 42\n# TYPE app_up gauge\napp_up 1\n",
                );
            }
        });
        let metrics = Metrics::new(Instant::now());
        let admin = AdminClient::new(lifeguard_base::url::LoopbackUrl::unix(&socket), Duration::from_secs(2));
        let targets = AppMetrics(vec![lifeguard_istio::annotations::MetricsTarget {
            port,
            path: "/metrics".into(),
        }]);
        let scraper = Scraper::builder(metrics, Readiness::standalone(Duration::from_secs(4)))
            .envoy(Some(admin))
            .app_metrics(&targets)
            .build();
        let body: Vec<Bytes> = scraper
            .body(ScrapeRequest::new(None, &HeaderMap::new()))
            .collect()
            .await;
        let body = String::from_utf8(body.concat()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            body.starts_with("envoy_a 1\n# TYPE envoy_server_state gauge\n"),
            "{body}"
        );
        assert_eq!(body.matches("# TYPE envoy_server_state").count(), 1, "{body}");
        assert!(
            !body.contains("envoy_server_state 42") && body.ends_with("# TYPE app_up gauge\napp_up 1\n"),
            "{body}"
        );
    }

    #[test]
    fn lines_are_pushed_whole_and_split_lines_joined() {
        let list = List::new(PLAIN_WINDOW);
        let mut tail = BytesMut::new();
        for chunk in ["a 1\nb ", "2\nc", " 3", "\nd 4\ne 5\n", "f"] {
            assert!(push_lines(&list, &mut tail, Bytes::from_static(chunk.as_bytes())));
        }
        let mut items: Vec<Bytes> = Vec::new();
        list.each_from(0, |item| items.push(item.clone()));
        assert_eq!(items, ["a 1\n", "b 2\n", "c 3\n", "d 4\ne 5\n"]);
        assert!(items.iter().all(|b| b.ends_with(b"\n")));
        assert_eq!(&tail[..], b"f");
        let mut long = BytesMut::new();
        assert!(!push_lines(&list, &mut long, Bytes::from(vec![b'x'; LINE_CAP + 1])));
    }
}
