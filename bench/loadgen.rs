//! A fixed-rate (open-loop) HTTP/1.1 keep-alive load generator for
//! bench/load.sh: `loadgen URL RATE SECONDS [CONNECTIONS]`.
//!
//! Each connection sends its share of RATE requests per second on a fixed
//! schedule (one request in flight per connection); a request's latency is
//! measured from when it was *due*, not from when it was sent, so a stall
//! shows up in the percentiles instead of silently lowering the rate
//! (coordinated omission). One thread, busy-polling: give it its own CPU. Prints one line:
//! `sent=N errors=N rate=R p50_us=.. p90_us=.. p99_us=.. p999_us=.. max_us=..`.
//! Loopback targets only.

// poll(2) on the load's own sockets, each call with its SAFETY note.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: loadgen http://127.0.0.1:PORT/PATH RATE SECONDS [CONNECTIONS]");
        return std::process::ExitCode::from(2);
    }
    let url = args[1].strip_prefix("http://").expect("http:// URL");
    let (authority, path) = url.split_at(url.find('/').unwrap_or(url.len()));
    let path = if path.is_empty() { "/" } else { path }.to_owned();
    let addr: std::net::SocketAddr = authority.parse().expect("IP:PORT");
    assert!(addr.ip().is_loopback(), "loopback only");
    let rate: f64 = args[2].parse().expect("RATE");
    let seconds: f64 = args[3].parse().expect("SECONDS");
    let conns: usize = args.get(4).map_or(16, |c| c.parse().expect("CONNECTIONS"));

    let (mut lat, errors) = run(addr, &path, authority, rate, seconds, conns);
    lat.sort_unstable();
    let pct = |p: f64| -> u64 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
    };
    println!(
        "sent={} errors={} rate={:.0} p50_us={} p90_us={} p99_us={} p999_us={} max_us={}",
        lat.len(),
        errors,
        lat.len() as f64 / seconds,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(0.999),
        lat.last().copied().unwrap_or(0)
    );
    std::process::ExitCode::SUCCESS
}

/// One connection's state in the event loop.
struct Conn {
    stream: TcpStream,
    /// When its next request is due.
    due: Instant,
    /// The request in flight was due at this time.
    waiting: Option<Instant>,
    buf: Vec<u8>,
    have: usize,
}

/// The whole load on one thread: nonblocking sockets and a busy `poll(2)`
/// loop, so send times are precise to microseconds (a sleeping client on a
/// shared core would add its own wake-up delays to every latency).
fn run(
    addr: std::net::SocketAddr,
    path: &str,
    authority: &str,
    rate: f64,
    seconds: f64,
    conns: usize,
) -> (Vec<u64>, usize) {
    use std::os::fd::AsRawFd;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n").into_bytes();
    let interval = Duration::from_secs_f64(conns as f64 / rate);
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs_f64(seconds);
    let mut pool: Vec<Conn> = (0..conns)
        .map(|i| {
            let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            stream.set_nodelay(true).unwrap();
            stream.set_nonblocking(true).unwrap();
            Conn {
                stream,
                // Spread the connections' schedules over one interval.
                due: start + interval.mul_f64(i as f64 / conns as f64),
                waiting: None,
                buf: vec![0u8; 4096],
                have: 0,
            }
        })
        .collect();
    let mut lat = Vec::with_capacity((rate * seconds) as usize + 16);
    let mut errors = 0;
    let mut fds: Vec<libc::pollfd> = pool
        .iter()
        .map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let now = Instant::now();
        let mut active = false;
        for c in pool.iter_mut() {
            if c.waiting.is_none() && c.due < end {
                active = true;
                if c.due <= now {
                    if c.stream.write_all(&request).is_err() {
                        errors += 1;
                        c.due += interval;
                        continue;
                    }
                    c.waiting = Some(c.due);
                    c.have = 0;
                }
            } else if c.waiting.is_some() {
                active = true;
            }
        }
        if !active {
            break;
        }
        // SAFETY: fds points to `fds.len()` valid pollfd structs.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        if ready <= 0 {
            continue;
        }
        for (c, pfd) in pool.iter_mut().zip(fds.iter_mut()) {
            if pfd.revents == 0 {
                continue;
            }
            pfd.revents = 0;
            let Some(due) = c.waiting else { continue };
            let have = c.have;
            match c.stream.read(&mut c.buf[have..]) {
                Ok(0) | Err(_) if c.have == 0 => {}
                Ok(n) => c.have += n,
                Err(_) => {}
            }
            if complete(&c.buf[..c.have]) {
                lat.push(due.elapsed().as_micros() as u64);
                c.waiting = None;
                c.due += interval;
            } else if Instant::now() > due + Duration::from_secs(5) {
                errors += 1;
                c.waiting = None;
                c.due += interval;
            }
        }
    }
    (lat, errors)
}

/// Whether `buf` holds one whole response framed by content-length.
fn complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return false;
    };
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    buf.len() >= end + 4 + len
}
