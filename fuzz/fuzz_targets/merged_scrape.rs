//! The merged scrape, end to end (crates/scrape): a
//! `GET /stats/prometheus` through the status service, Envoy's part read
//! from a fake admin on a Unix socket and the app's parts from fake targets
//! on loopback, each body sent in chunks of the input's size.
//!
//! Input: flags (gzip, the client's `Accept`, how many app targets, Envoy
//! missing or failing, a target failing), a chunk size, then NUL-separated:
//! `Accept` values (one a line), Envoy's body, and per app target its
//! `Content-Type` and its body. Between the app targets, and around them,
//! sentinel targets serve one family of their own, so each part can be
//! found in the answer.
//! Holds: the answer comes within its budget, in the format the client's
//! `Accept` picks; gzip decodes whole (the stitched CRC and length hold);
//! Envoy's body comes first, as it was sent (a last line ended; unless the
//! scrape took so long that its budget may have cut Envoy's read); every
//! part follows in order; an app part declares no family already in the
//! answer, has no blank line and no `# EOF`; OpenMetrics ends with the one
//! `# EOF`, text has none (outside Envoy's own body, passed as it is).

use std::collections::HashSet;
use std::convert::Infallible;
use std::io::Read;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use super::{fields, runtime};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Frame;
use hyper::header::HeaderValue;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use lifeguard::fuzzing::{note_families, status_service, AppMetrics, Format, MetricsTarget, StatusOptions};
use tokio::net::{TcpListener, UnixListener};

/// What one fake server answers: its status, `Content-Type`, body chunks.
#[derive(Clone, Default)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    chunks: Vec<Bytes>,
}

/// The answers of this run: Envoy's, then the targets' by index.
static ANSWERS: Mutex<Vec<Answer>> = Mutex::new(Vec::new());

/// The most app targets of one run (and a sentinel around each).
const APPS: usize = 2;

/// A body sent as the frames it was given.
struct Chunks(std::vec::IntoIter<Bytes>);

impl hyper::body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.next().map(|b| Ok(Frame::data(b))))
    }
}

fn respond(index: usize) -> Response<Chunks> {
    let answer = ANSWERS.lock().unwrap().get(index).cloned().unwrap_or_default();
    let mut response = Response::new(Chunks(answer.chunks.into_iter()));
    *response.status_mut() = hyper::StatusCode::from_u16(answer.status).unwrap_or(hyper::StatusCode::OK);
    if let Some(ct) = answer.content_type.and_then(|c| c.parse().ok()) {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, ct);
    }
    response
}

fn serve<IO>(io: IO, index: usize)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| async move {
        Ok::<_, Infallible>(respond(index))
    });
    tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service));
}

/// The fake Envoy admin's socket and the targets' ports, started once.
struct Servers {
    admin: PathBuf,
    ports: Vec<u16>,
}

fn servers() -> &'static Servers {
    static SERVERS: OnceLock<Servers> = OnceLock::new();
    SERVERS.get_or_init(|| {
        runtime().block_on(async {
            let dir = super::scratch_dir().join("scrape");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("a temp dir");
            let admin = dir.join("admin.sock");
            let listener = UnixListener::bind(&admin).expect("the admin socket");
            tokio::spawn(async move {
                while let Ok((io, _)) = listener.accept().await {
                    serve(io, 0);
                }
            });
            let mut ports = Vec::new();
            for index in 1..=2 * APPS + 1 {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
                ports.push(listener.local_addr().expect("its address").port());
                tokio::spawn(async move {
                    while let Ok((io, _)) = listener.accept().await {
                        let _ = io.set_nodelay(true);
                        serve(io, index);
                    }
                });
            }
            Servers { admin, ports }
        })
    })
}

fn chunked(body: &[u8], size: usize) -> Vec<Bytes> {
    body.chunks(size.max(1)).map(Bytes::copy_from_slice).collect()
}

fn sentinel(i: usize) -> (String, Vec<u8>) {
    let name = format!("fuzz_sentinel_{i}");
    (name.clone(), format!("# TYPE {name} gauge\n{name} 1\n").into_bytes())
}

/// Families whose declaration in the app part would break the answer.
fn clashes(taken: &HashSet<String>, name: &str) -> bool {
    taken.contains(name)
        || taken.contains(&format!("{name}_total"))
        || name.strip_suffix("_total").is_some_and(|n| taken.contains(n))
}

fn check_app_part(part: &[u8], before: &[u8], om: bool) {
    let mut taken = HashSet::new();
    note_families(before, &mut taken);
    let part = String::from_utf8_lossy(part);
    for line in part.lines() {
        assert!(!line.trim().is_empty(), "a blank line in an app part");
        // The text format's blanks: spaces and tabs.
        assert_ne!(line.trim_matches([' ', '\t']), "# EOF", "an app's # EOF came through");
        if let Some(comment) = line.trim_start().strip_prefix('#') {
            let mut words = comment.trim_start().split(' ');
            let (kind, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            assert!(
                matches!(kind, "HELP" | "TYPE") || om && kind == "UNIT",
                "{line:?} in an app part"
            );
            assert!(!clashes(&taken, name), "{line:?}: the family is already in the answer");
        }
    }
}

struct Run<'a> {
    gzip: bool,
    accept: Vec<&'a [u8]>,
    envoy: Option<&'a [u8]>,
    apps: Vec<(&'a [u8], &'a [u8])>,
    failing_app: bool,
    chunk: usize,
}

impl<'a> Run<'a> {
    fn read(data: &'a [u8]) -> Option<Self> {
        let (&flags, rest) = data.split_first()?;
        let (&chunk, rest) = rest.split_first()?;
        let f = fields(rest, 2 + 2 * APPS);
        let accept = match flags >> 1 & 3 {
            0 => f[0]
                .split(|&b| b == b'\n')
                .filter(|v| HeaderValue::from_bytes(v).is_ok())
                .collect(),
            1 => vec![&b"text/plain;version=0.0.4"[..]],
            2 => vec![&b"application/openmetrics-text;version=1.0.0"[..]],
            _ => vec![&b"application/openmetrics-text; version=0.0.1"[..]],
        };
        let count = usize::from(flags >> 3 & 3).min(APPS);
        Some(Run {
            gzip: flags & 1 == 1,
            accept,
            envoy: (flags & 0x20 == 0).then_some(f[1]),
            apps: (0..count).map(|i| (f[2 + 2 * i], f[3 + 2 * i])).collect(),
            failing_app: flags & 0x40 != 0,
            chunk: usize::from(chunk) + 1,
        })
    }
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    // A fuzzed body that names a sentinel's family would hide the parts.
    if data.windows(13).any(|w| w[0] == b'f' && w == b"fuzz_sentinel") {
        return;
    }
    let Some(run) = Run::read(data) else { return };
    let servers = servers();
    let mut answers = vec![Answer {
        status: 200,
        content_type: None,
        chunks: chunked(run.envoy.unwrap_or_default(), run.chunk),
    }];
    let mut sentinels = Vec::new();
    let mut targets = Vec::new();
    for i in 0..=run.apps.len() {
        let (name, body) = sentinel(i);
        sentinels.push((name, body.clone()));
        targets.push(MetricsTarget {
            port: servers.ports[2 * i],
            path: "/metrics".to_owned(),
        });
        answers.push(Answer {
            status: 200,
            content_type: None,
            chunks: vec![Bytes::from(body)],
        });
        if let Some((content_type, body)) = run.apps.get(i) {
            targets.push(MetricsTarget {
                port: servers.ports[2 * i + 1],
                path: "/metrics".to_owned(),
            });
            answers.push(Answer {
                status: if run.failing_app && i == 0 { 404 } else { 200 },
                content_type: Some(String::from_utf8_lossy(content_type).into_owned()),
                chunks: chunked(body, run.chunk),
            });
        } else {
            answers.push(Answer::default());
        }
    }
    *ANSWERS.lock().unwrap() = answers;
    let opts = StatusOptions {
        scrape: Some(run.envoy.map(|_| servers.admin.clone())),
        app_metrics: AppMetrics(targets),
        ..StatusOptions::default()
    };
    let (mut svc, _readiness) = status_service(&opts);
    let mut req = Request::get("/stats/prometheus");
    for v in &run.accept {
        req = req.header(hyper::header::ACCEPT, *v);
    }
    if run.gzip {
        req = req.header(hyper::header::ACCEPT_ENCODING, "gzip");
    }
    let req = req.header("x-prometheus-scrape-timeout-seconds", "2").body(()).unwrap();
    let asked = std::time::Instant::now();
    let (content_type, encoding, body) = runtime().block_on(async {
        let response = tower::Service::call(&mut svc, req).await.unwrap();
        let header = |name| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let (ct, enc) = (
            header(hyper::header::CONTENT_TYPE),
            header(hyper::header::CONTENT_ENCODING),
        );
        let collect = response.into_body().collect();
        let body = tokio::time::timeout(Duration::from_secs(10), collect).await;
        (
            ct,
            enc,
            body.expect("the scrape ended within its budget").unwrap().to_bytes(),
        )
    });

    let format = Format::for_accept(&super::accept_headers(&run.accept));
    assert_eq!(content_type.as_deref(), Some(format.content_type()));
    assert_eq!(encoding.as_deref(), run.gzip.then_some("gzip"));
    let out = match run.gzip {
        true => {
            let mut plain = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut plain)
                .expect("the gzip answer decodes whole");
            plain
        }
        false => body.to_vec(),
    };

    // Envoy's part has a budget (1.75 s of the 2 s scrape timeout): on a
    // machine too busy to read the fake Envoy by then, it is left out, as
    // the agent promises; the parts are checked when the reads had time.
    if asked.elapsed() >= Duration::from_millis(1500) {
        return;
    }
    let mut envoy = run.envoy.unwrap_or_default().to_vec();
    if !envoy.is_empty() && !envoy.ends_with(b"\n") {
        envoy.push(b'\n');
    }
    assert!(out.starts_with(&envoy), "Envoy's part is not the answer's start");
    let om = format != Format::Text;
    let mut at = envoy.len();
    let mut starts = Vec::new();
    for (name, body) in &sentinels {
        let found = find(&out[at..], body).unwrap_or_else(|| panic!("the sentinel {name} is missing"));
        starts.push(at + found);
        at += found + body.len();
        starts.push(at);
    }
    // starts: [s0, e0, s1, e1, ...]; app part i lies between e_i and s_{i+1}.
    for i in 0..run.apps.len() {
        let (from, to) = (starts[2 * i + 1], starts[2 * i + 2]);
        if run.failing_app && i == 0 {
            assert_eq!(from, to, "a target that answered 404 has a part");
        }
        check_app_part(&out[from..to], &out[..from], om);
    }
    let tail = &out[at..];
    assert_eq!(tail, if om { &b"# EOF\n"[..] } else { b"" }, "the answer's end");
    let eofs = out[envoy.len()..]
        .split(|&b| b == b'\n')
        .filter(|l| String::from_utf8_lossy(l).trim_matches([' ', '\t']) == "# EOF")
        .count();
    assert_eq!(eofs, usize::from(om));
}

/// Where `needle` (whole lines) starts in `haystack`, at a line's start.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at < haystack.len() {
        if haystack[at..].starts_with(needle) {
            return Some(at);
        }
        at += haystack[at..].iter().position(|&b| b == b'\n')? + 1;
    }
    None
}
