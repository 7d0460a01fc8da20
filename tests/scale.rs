//! A production-scale Envoy (a generated 2,000-cluster bootstrap, every
//! stat on): readiness holds while the merged scrape is read in a loop,
//! every merged scrape carries Envoy's series, the query string reaches
//! Envoy, gzip round-trips. And, against a fake admin (what a real Envoy
//! will not do on demand): a hung `/stats/prometheus` with a 1 s scrape
//! timeout, a hung admin and the staleness bound.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// The kit's bootstrap with `n` more STATIC clusters (each to the app).
fn bootstrap_with_clusters(ports: &Ports, n: usize) -> String {
    let mut yaml = bootstrap(ports);
    assert!(yaml.trim_end().ends_with('}'), "the clusters list ends the bootstrap");
    yaml.push('\n');
    for i in 0..n {
        yaml.push_str(&format!(
            "  - name: gen_{i}\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: gen_{i}\n      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }} }}] }}]\n",
            ports.app.port
        ));
    }
    yaml
}

/// `GET path` with `headers` on a fresh connection, within `timeout`.
fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)], timeout: Duration) -> std::io::Result<Answer> {
    request(addr, "GET", path, headers, timeout)
}

/// The bytes of the lines of `text` whose name starts with `prefix`.
fn part_size(text: &str, prefix: &str) -> usize {
    text.lines()
        .filter(|l| {
            l.starts_with(prefix)
                || l.strip_prefix("# TYPE ")
                    .or(l.strip_prefix("# HELP "))
                    .is_some_and(|r| r.starts_with(prefix))
        })
        .map(|l| l.len() + 1)
        .sum()
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn a_2000_cluster_envoy_stays_ready_while_its_merged_scrape_is_read_in_a_loop() {
    let ports = Ports::new();
    let _envoy = start_envoy(&bootstrap_with_clusters(&ports, 2000));
    let _agent = Agent::builder().on(&ports).start();
    let agent = ports.agent.addr();
    wait_status(agent, "/healthz/ready", 200, Duration::from_secs(120));

    // Probes every 50 ms, straight at the agent, while scrapes run.
    let stop = Arc::new(AtomicBool::new(false));
    let (probes, not_200) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let prober = {
        let (stop, probes, not_200) = (stop.clone(), probes.clone(), not_200.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let answer = http_timeout("GET", agent, "/healthz/ready", Duration::from_secs(3));
                probes.fetch_add(1, Ordering::Relaxed);
                match answer {
                    Ok((200, _)) => {}
                    other => not_200.lock().unwrap().push(format!("{other:?}")),
                }
                thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // 5 s of scrapes: several Envoy reads (each is shared for 1 s after it).
    let mut sizes = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while i < 6 || started.elapsed() < Duration::from_secs(5) {
        i += 1;
        let t = Instant::now();
        let scrape = get_with(agent, "/stats/prometheus", &[], Duration::from_secs(30)).unwrap();
        assert_eq!(scrape.status, 200);
        let text = scrape.text();
        // Envoy's series, to the last generated cluster, and ours after them.
        assert!(
            text.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"gen_1999\"}"),
            "scrape {i} lacks Envoy's series ({} bytes)",
            text.len()
        );
        assert_eq!(sample(&text, "lifeguard_ready"), Some(1.0), "scrape {i}");
        assert!(text.ends_with('\n'));
        eprintln!("merged scrape {i}: {} bytes in {:?}", text.len(), t.elapsed());
        sizes.push(text.len());
    }
    let scraping = started.elapsed();

    // ?usedonly reaches Envoy: its part shrinks, ours is whole.
    let full = get_with(agent, "/stats/prometheus", &[], Duration::from_secs(30))
        .unwrap()
        .text();
    let used = get_with(agent, "/stats/prometheus?usedonly", &[], Duration::from_secs(30))
        .unwrap()
        .text();
    let (full_envoy, used_envoy) = (part_size(&full, "envoy_"), part_size(&used, "envoy_"));
    eprintln!("Envoy's part: {full_envoy} bytes, with ?usedonly {used_envoy} bytes");
    assert!(
        used_envoy > 0 && used_envoy * 4 < full_envoy,
        "{used_envoy} vs {full_envoy}"
    );
    assert_eq!(sample(&used, "lifeguard_ready"), Some(1.0));
    // ?filter= too.
    let filtered = get_with(
        agent,
        "/stats/prometheus?filter=gen_7%5C.",
        &[],
        Duration::from_secs(30),
    )
    .unwrap()
    .text();
    assert!(filtered.contains("envoy_name=\"gen_7\"") || filtered.contains("envoy_cluster_name=\"gen_7\""));
    assert!(
        !filtered.contains("envoy_cluster_name=\"gen_8\""),
        "the filter did not reach Envoy"
    );

    // gzip round-trips: one gzip member holding Envoy's part and ours.
    let gz = get_with(
        agent,
        "/stats/prometheus",
        &[
            ("Accept-Encoding", "gzip"),
            ("X-Prometheus-Scrape-Timeout-Seconds", "20"),
        ],
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    let text = gz.decoded();
    eprintln!(
        "gzip scrape: {} bytes on the wire, {} decoded",
        gz.body.len(),
        text.len()
    );
    assert!(text.contains("envoy_cluster_upstream_cx_total{envoy_cluster_name=\"gen_1999\"}"));
    assert_eq!(sample(&text, "lifeguard_ready"), Some(1.0));
    assert!(
        gz.body.len() * 5 < text.len(),
        "compressed {} of {}",
        gz.body.len(),
        text.len()
    );

    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    let not_200 = not_200.lock().unwrap();
    eprintln!(
        "{} probes during {scraping:?} of scrapes and the checks after; not 200: {}",
        probes.load(Ordering::Relaxed),
        not_200.len()
    );
    assert!(not_200.is_empty(), "probes not 200 while scraped: {not_200:?}");
}

// ---------------------------------------------------------------------------
// Against the kit's fake admin: what a real Envoy will not do on demand.

/// How long the fake takes to answer an active-count read, and how many
/// reads report a connection before the count is 0.
const ACTIVE_READ_TAKES: Duration = Duration::from_millis(200);
const ACTIVE_READS_BUSY: usize = 4;

#[test]
fn a_hung_envoy_scrape_with_a_1s_scrape_timeout_still_serves_lifeguards_part_within_it() {
    let fake = FakeAdmin::start(AdminMode::Live);
    let agent = Agent::builder().admin_url(fake.url()).ready();
    // Envoy's part arrives while it answers.
    let scrape = get_with(agent.status, "/stats/prometheus", &[], Duration::from_secs(5)).unwrap();
    assert_eq!(sample(&scrape.text(), "envoy_server_live"), Some(1.0));

    fake.hang_prometheus.store(true, Ordering::Relaxed);
    // Another query string each time: a new Envoy read, not the one above
    // (still shared for a second after it completed).
    for (gzip, path) in [
        (false, "/stats/prometheus?usedonly"),
        (true, "/stats/prometheus?usedonly&x=gzip"),
    ] {
        let mut headers = vec![("X-Prometheus-Scrape-Timeout-Seconds", "1")];
        if gzip {
            headers.push(("Accept-Encoding", "gzip"));
        }
        let t = Instant::now();
        let scrape = get_with(agent.status, path, &headers, Duration::from_secs(5)).unwrap();
        let took = t.elapsed();
        eprintln!("hung Envoy, 1 s scrape timeout, gzip {gzip}: answered in {took:?}");
        assert_eq!(scrape.status, 200);
        // lifeguard gives Envoy's part 0.8 s of the 1 s; the answer's
        // transfer and this thread on a busy machine may take the rest and
        // more. A scrape that waited on the hung read would take the
        // client's 5 s: 2 s tells one from the other, the figure printed.
        assert!(
            took < Duration::from_secs(2),
            "took {took:?}: the hung read was waited for"
        );
        assert_eq!(scrape.header("content-encoding"), gzip.then_some("gzip"));
        let text = scrape.decoded();
        assert_eq!(sample(&text, "lifeguard_ready"), Some(1.0), "{text}");
        assert_eq!(part_size(&text, "envoy_"), 0, "{text}");
        assert!(
            sample(&text, "lifeguard_scrape_envoy_incomplete_total{reason=\"timeout\"}").unwrap() >= 1.0,
            "{text}"
        );
    }
}

#[test]
fn a_hung_admin_turns_readiness_503_within_the_staleness_bound_not_before() {
    let fake = FakeAdmin::start(AdminMode::Live);
    // Stale after 3 × 200 ms + 300 ms = 900 ms.
    let bound = Duration::from_millis(900);
    let agent = Agent::builder()
        .admin_url(fake.url())
        .args(&["--poll-interval", "200ms", "--admin-timeout", "300ms"])
        .ready();
    wait_for("a LIVE answer from the fake", Duration::from_secs(5), || {
        fake.last_live.lock().unwrap().ok_or(())
    });
    fake.hang_all.store(true, Ordering::Relaxed);
    // The agent's last answer came at or after the fake's last LIVE.
    let (first_503, body) = wait_for("readiness 503", Duration::from_secs(5), || {
        match http_timeout("GET", agent.status, "/healthz/ready", Duration::from_secs(2)) {
            Ok((503, body)) => Ok((Instant::now(), body)),
            other => Err(other),
        }
    });
    let last_live = fake.last_live.lock().unwrap().unwrap();
    let after = first_503.duration_since(last_live);
    eprintln!("hung admin: 503 {after:?} after the last LIVE answer (bound {bound:?})");
    assert!(after >= bound, "503 before the staleness bound: {after:?}");
    assert!(after < bound + Duration::from_secs(2), "{after:?}");
    assert!(
        body.contains("no successful Envoy admin read in the last 900ms")
            && body.contains("did not answer within 300ms"),
        "{body}"
    );
}

#[test]
fn while_envoy_is_busy_with_lifeguards_own_scrape_readiness_holds_until_that_read_is_cut() {
    let fake = FakeAdmin::start(AdminMode::Live);
    // Stale after 3 × 200 ms + 300 ms = 900 ms.
    let agent = Agent::builder()
        .admin_url(fake.url())
        .args(&["--poll-interval", "200ms", "--admin-timeout", "300ms"])
        .ready();
    wait_for("a LIVE answer from the fake", Duration::from_secs(5), || {
        fake.last_live.lock().unwrap().ok_or(())
    });
    // Envoy's admin thread is stuck on our metrics read: nothing else is
    // answered meanwhile (admin requests are served one at a time).
    fake.hang_prometheus.store(true, Ordering::Relaxed);
    let addr = agent.status;
    let began = Instant::now();
    let scrape = thread::spawn(move || {
        let headers = [("X-Prometheus-Scrape-Timeout-Seconds", "4")];
        get_with(
            addr,
            "/stats/prometheus?usedonly&busy",
            &headers,
            Duration::from_secs(10),
        )
    });
    wait_for("the scrape read to reach the fake", Duration::from_secs(2), || {
        fake.got_prometheus.load(Ordering::Relaxed).then_some(()).ok_or(())
    });
    fake.hang_all.store(true, Ordering::Relaxed);
    // Well past the 900 ms staleness bound, still ready: Envoy is busy
    // with our read, not hung.
    let held_until = wait_for("2.5 s of a busy Envoy", Duration::from_secs(5), || {
        let (code, body) = http_timeout("GET", addr, "/healthz/ready", Duration::from_secs(2)).unwrap();
        assert_eq!(code, 200, "readiness flapped while Envoy served our own read: {body}");
        if began.elapsed() >= Duration::from_millis(2500) {
            Ok(began.elapsed())
        } else {
            Err(())
        }
    });
    let answered = scrape.join().unwrap().unwrap();
    assert_eq!(answered.status, 200);
    let cut = began.elapsed();
    // Once our read is cut (the 4 s scrape timeout, less a tenth), the
    // silence is Envoy's own: 503 within the staleness bound.
    let (code, body) = wait_status_any(addr, 503, Duration::from_secs(5));
    let turned = began.elapsed();
    eprintln!(
        "Envoy busy with our scrape: ready for {held_until:?} (bound 900ms), read cut at {cut:?}, 503 at {turned:?}"
    );
    assert_eq!(code, 503);
    assert!(body.contains("no successful Envoy admin read"), "{body}");
    assert!(turned < cut + Duration::from_secs(3), "{turned:?}");
}

/// Waits until the probe answers `code`; returns it with the body.
fn wait_status_any(addr: SocketAddr, code: u16, timeout: Duration) -> (u16, String) {
    wait_for("the probe's answer", timeout, || {
        match http_timeout("GET", addr, "/healthz/ready", Duration::from_secs(2)) {
            Ok((c, body)) if c == code => Ok((c, body)),
            other => Err(other),
        }
    })
}

#[test]
fn slow_active_count_reads_make_the_drain_read_less_often() {
    let fake = FakeAdmin::start(AdminMode::Live);
    // Slow reads, as at 20,000 clusters: busy, then the connection gone.
    *fake.active_read_takes.lock().unwrap() = ACTIVE_READ_TAKES;
    let busy = "listener.127.0.0.1_15006.downstream_cx_active: 1\n";
    fake.active_script
        .lock()
        .unwrap()
        .extend(vec![busy.to_owned(); ACTIVE_READS_BUSY]);
    *fake.active_body.lock().unwrap() = "listener.127.0.0.1_15006.downstream_cx_active: 0\n".into();
    let mut agent = Agent::builder()
        .admin_url(fake.url())
        .args(&["--drain-until", "connections", "--minimum-drain-duration", "100ms"])
        // The policy's own reads (not the load balancers' verdict first).
        .args(&["--terminating-readiness", "failing"])
        .ready();
    agent.signal(libc::SIGTERM);
    let code = agent.wait_exit(Duration::from_secs(20)).expect("the drain ends").code();
    assert_eq!(code, Some(0), "{}", agent.output());
    let reads = fake.active_reads.lock().unwrap().clone();
    assert_eq!(
        reads.len(),
        ACTIVE_READS_BUSY + 1,
        "one read past the busy ones ends it"
    );
    let gaps: Vec<Duration> = reads.windows(2).map(|w| w[1] - w[0]).collect();
    let busy = ACTIVE_READ_TAKES * gaps.len() as u32;
    let span = *reads.last().unwrap() - reads[0];
    eprintln!(
        "200 ms active-count reads: {} reads {gaps:?} apart, Envoy's admin busy {:.1} % of the drain",
        reads.len(),
        100.0 * busy.as_secs_f64() / span.as_secs_f64()
    );
    // At the 50 ms cadence of a fast Envoy they would come 250 ms apart.
    for gap in gaps {
        assert!(gap >= Duration::from_millis(1900), "reads {gap:?} apart");
    }
}

/// lifeguard's peak RSS, sampled every 20 ms from another thread until
/// stopped; the peak in KiB.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: i32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(memory_kib(pid).0);
                thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        RssSampler { stop, thread }
    }

    fn peak_kib(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// A scrape budget as long as the client's own wait: the memory test
/// bounds memory, not time (on a busy machine four 40 MB reads at once
/// outlasted the default budget, and the answers came without Envoy's
/// part).
const BUDGET: (&str, &str) = ("X-Prometheus-Scrape-Timeout-Seconds", "55");

/// The bound a user relies on: lifeguard's memory does not follow Envoy's
/// size. A 3,000-cluster Envoy sends about 40 MB of metrics; lifeguard,
/// which holds at most a window of it per read (4 MiB, and 1 MiB of its
/// gzip copy), stays within 32 MiB above its idle RSS (a generous margin;
/// the figures are printed) while 1 and then 4 clients scrape at once, and
/// while a client that stopped reading mid-body sits beside one that reads:
/// the stalled one is let go, the other gets all of Envoy's series.
#[test]
fn memory_stays_bounded_whatever_envoys_size_and_a_stalled_scraper_stalls_no_one() {
    const CLUSTERS: usize = 3000;
    const BOUND_KIB: u64 = 32 * 1024;
    let ports = Ports::new();
    let _envoy = start_envoy(&bootstrap_with_clusters(&ports, CLUSTERS));
    let agent_proc = Agent::builder().on(&ports).start();
    let agent = ports.agent.addr();
    wait_status(agent, "/healthz/ready", 200, Duration::from_secs(120));
    let pid = agent_proc.pid();
    let idle = memory_kib(pid).0;
    let last = format!(
        "envoy_cluster_upstream_cx_total{{envoy_cluster_name=\"gen_{}\"}}",
        CLUSTERS - 1
    );
    let full = |answer: &Answer| answer.status == 200 && answer.text().contains(&last);

    for clients in [1, 4] {
        let sampler = RssSampler::start(pid);
        let started = Instant::now();
        let scrapes: Vec<_> = (0..clients)
            .map(|i| {
                thread::spawn(move || {
                    let headers: &[(&str, &str)] = if i % 2 == 1 {
                        &[BUDGET, ("Accept-Encoding", "gzip")]
                    } else {
                        &[BUDGET]
                    };
                    get_with(agent, "/stats/prometheus", headers, Duration::from_secs(60)).unwrap()
                })
            })
            .collect();
        let answers: Vec<Answer> = scrapes.into_iter().map(|t| t.join().unwrap()).collect();
        let took = started.elapsed();
        let peak = sampler.peak_kib();
        let sizes: Vec<usize> = answers.iter().map(|a| a.body.len()).collect();
        eprintln!(
            "{clients} scraper(s), {CLUSTERS} clusters: bodies {sizes:?} bytes in {took:?}; lifeguard RSS idle {idle} KiB, peak {peak} KiB (+{} KiB)",
            peak.saturating_sub(idle)
        );
        let plain: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.header("content-encoding").is_none())
            .collect();
        assert!(
            plain.iter().all(|a| full(a)),
            "every plain scrape carries all of Envoy's series"
        );
        assert!(sizes[0] > 30_000_000, "Envoy's part is the big one: {sizes:?}");
        assert!(
            peak.saturating_sub(idle) < BOUND_KIB,
            "peak {peak} KiB, idle {idle} KiB"
        );
    }

    // A client that reads a little and then stops, beside one that reads.
    let sampler = RssSampler::start(pid);
    let mut stalled = TcpStream::connect(agent).unwrap();
    // Generous: on a busy machine Envoy's 40 MB took seconds to start.
    stalled.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stalled
        .write_all(format!("GET /stats/prometheus HTTP/1.1\r\nHost: {agent}\r\n\r\n").as_bytes())
        .unwrap();
    let mut first = vec![0u8; 64 * 1024];
    stalled.read_exact(&mut first).unwrap();
    let started = Instant::now();
    let other = get_with(agent, "/stats/prometheus", &[BUDGET], Duration::from_secs(60)).unwrap();
    let took = started.elapsed();
    let peak = sampler.peak_kib();
    eprintln!(
        "beside a stalled scraper: {} bytes in {took:?}; peak {peak} KiB",
        other.body.len()
    );
    assert!(full(&other), "the reading client gets all of Envoy's series");
    assert!(
        peak.saturating_sub(idle) < BOUND_KIB,
        "peak {peak} KiB, idle {idle} KiB"
    );
    drop(stalled);
    let scrape = get_with(agent, "/stats/prometheus", &[BUDGET], Duration::from_secs(60)).unwrap();
    let slow = sample(
        &scrape.text(),
        r#"lifeguard_scrape_envoy_incomplete_total{reason="slow"}"#,
    );
    eprintln!("scrapes let go for holding the window: {slow:?}");
    assert!(full(&scrape));
}
