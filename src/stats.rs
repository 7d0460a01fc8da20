//! Parsing Envoy's plain-text `/stats` answer.
//!
//! The admin API answers `GET /stats` with one `name: value` line per stat.
//! Counters and gauges carry an unsigned integer; histograms carry a list of
//! quantiles that is not a number. This module turns that text into typed
//! values and never panics on what it reads: a line that does not parse is
//! reported as such, so the caller can turn it into a reason.

/// One line of a `/stats` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    pub name: &'a str,
    pub value: Value<'a>,
}

/// The value of one stat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// A counter or gauge that fits a signed 64-bit integer.
    Number(u64),
    /// A gauge above `i64::MAX`: Envoy gauges are unsigned and wrap when
    /// decremented below zero, so 18446744073709551615 means "-1", a bug in
    /// the accounting, never a real count.
    Wrapped(u64),
    /// Anything else (a histogram summary, garbage), kept for the reason text.
    Unparsable(&'a str),
}

/// Iterates over the stat lines of a `/stats` body, skipping blank lines.
/// A line without a `:` is returned with the whole line as its name and an
/// unparsable value, so nothing read is silently dropped.
pub fn lines(body: &str) -> impl Iterator<Item = Line<'_>> {
    body.lines().filter_map(|raw| {
        let line = raw.trim();
        if line.is_empty() {
            return None;
        }
        // Stat names never hold ": " (Envoy writes IPv6 listener names as
        // `listener.[__1]_15006`), so the first colon separates the value.
        let Some((name, value)) = line.split_once(':') else {
            return Some(Line {
                name: line,
                value: Value::Unparsable(line),
            });
        };
        let value = value.trim();
        let value = match value.parse::<u64>() {
            Ok(v) if v > i64::MAX as u64 => Value::Wrapped(v),
            Ok(v) => Value::Number(v),
            Err(_) => Value::Unparsable(value),
        };
        Some(Line {
            name: name.trim(),
            value,
        })
    })
}

/// Finds one stat by exact name.
pub fn find<'a>(body: &'a str, name: &str) -> Option<Value<'a>> {
    lines(body).find(|l| l.name == name).map(|l| l.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_envoy_live_answer() {
        let body = "listener_manager.workers_started: 1\nserver.state: 0\n";
        let got: Vec<_> = lines(body).collect();
        assert_eq!(
            got,
            vec![
                Line {
                    name: "listener_manager.workers_started",
                    value: Value::Number(1)
                },
                Line {
                    name: "server.state",
                    value: Value::Number(0)
                },
            ]
        );
        assert_eq!(find(body, "server.state"), Some(Value::Number(0)));
    }

    #[test]
    fn empty_body_has_no_lines() {
        assert_eq!(lines("").count(), 0);
        assert_eq!(lines("\n\n").count(), 0);
        assert_eq!(find("", "server.state"), None);
    }

    #[test]
    fn missing_line_is_none_and_extra_lines_are_ignored() {
        let body = "server.state: 2\ncluster_manager.cds.update_success: 3\nfoo.bar: 9\n";
        assert_eq!(find(body, "listener_manager.workers_started"), None);
        assert_eq!(find(body, "server.state"), Some(Value::Number(2)));
        assert_eq!(lines(body).count(), 3);
    }

    #[test]
    fn tolerates_spaces_around_name_and_value() {
        assert_eq!(
            find("  server.state :   3  \r\n", "server.state"),
            Some(Value::Number(3))
        );
    }

    #[test]
    fn value_that_does_not_parse_is_reported() {
        assert_eq!(
            find("server.state: live", "server.state"),
            Some(Value::Unparsable("live"))
        );
        assert_eq!(find("server.state: -1", "server.state"), Some(Value::Unparsable("-1")));
        assert_eq!(find("server.state:", "server.state"), Some(Value::Unparsable("")));
        let garbage: Vec<_> = lines("<html>oops</html>").collect();
        assert_eq!(garbage[0].value, Value::Unparsable("<html>oops</html>"));
        let histogram = "cluster.x.upstream_rq_time: P0(nan,0) P25(nan,1)";
        assert!(matches!(lines(histogram).next().unwrap().value, Value::Unparsable(_)));
    }

    #[test]
    fn wrapped_gauge_is_not_a_number() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551615";
        assert_eq!(lines(body).next().unwrap().value, Value::Wrapped(u64::MAX));
        // A value larger than u64 does not parse at all.
        assert!(matches!(
            find("x: 18446744073709551616", "x"),
            Some(Value::Unparsable(_))
        ));
    }

    #[test]
    fn ipv6_listener_names_keep_their_brackets() {
        let body = "listener.[__1]_15006.downstream_cx_active: 2\n\
                    listener.[__1]_15006.worker_0.downstream_cx_active: 2\n";
        let got: Vec<_> = lines(body).map(|l| l.name).collect();
        assert_eq!(
            got,
            vec![
                "listener.[__1]_15006.downstream_cx_active",
                "listener.[__1]_15006.worker_0.downstream_cx_active"
            ]
        );
    }
}

/// Active downstream connections and requests, each counted once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Active {
    /// Sum of `listener.<addr>_<port>.downstream_cx_active` over the
    /// listeners that count (not per worker, not the HTTP layer).
    pub connections: u64,
    /// Sum of `http.<prefix>.downstream_rq_active` over the HTTP connection
    /// managers that count.
    pub requests: u64,
    /// Connections that no HTTP connection manager holds (TCP proxy and
    /// other network filters): the listeners' connections less the HTTP
    /// managers' `downstream_cx_active`. Each is work in flight.
    pub tcp: u64,
    /// Lines that were not counted because their value made no sense
    /// (wrapped or unparsable), as text for the log.
    pub skipped: Vec<String>,
}

/// HTTP stat prefixes of Envoy's own and the agent-facing managers: the
/// admin API, the status listener (`agent` in Istio's bootstrap, `status`
/// in ours) and the Prometheus listener (`stats`).
pub const IGNORED_HTTP_PREFIXES: [&str; 4] = ["admin", "agent", "status", "stats"];

/// The admin query for [`active`]: both families in one read.
pub const ACTIVE_STATS: &str = "/stats?usedonly&filter=downstream_%28cx%7Crq%29_active%24";

impl Active {
    /// Work in flight in Envoy: HTTP requests and TCP-proxy connections.
    pub fn work(&self) -> u64 {
        self.requests.saturating_add(self.tcp)
    }
}

/// Counts active downstream connections and requests in an answer to
/// [`ACTIVE_STATS`], leaving out the admin listener, internal listeners
/// (`envoy_internal_*`: their connections come from Envoy itself and are
/// already counted where they entered), listeners on `ignored_ports` (IPv4
/// and IPv6 alike) and the agent-facing HTTP prefixes.
pub fn active(body: &str, ignored_ports: &[u16]) -> Active {
    let mut out = Active::default();
    let mut http_connections = 0u64;
    for line in lines(body) {
        let counted = if let Some(listener) = line
            .name
            .strip_prefix("listener.")
            .and_then(|rest| rest.strip_suffix(".downstream_cx_active"))
        {
            // `listener.X.worker_N.…` and `listener.admin.main_thread.…`
            // repeat the listener's total per thread.
            let per_thread = listener
                .rsplit_once('.')
                .is_some_and(|(_, last)| last.starts_with("worker_") || last == "main_thread");
            let ignored = listener == "admin"
                || listener.starts_with("admin.")
                || listener.starts_with("envoy_internal_")
                || listener_port(listener).is_some_and(|p| ignored_ports.contains(&p));
            (!per_thread && !ignored).then_some(&mut out.connections)
        } else if let Some(prefix) = line
            .name
            .strip_prefix("http.")
            .and_then(|rest| rest.strip_suffix(".downstream_rq_active"))
        {
            (!IGNORED_HTTP_PREFIXES.contains(&prefix)).then_some(&mut out.requests)
        } else if let Some(prefix) = line
            .name
            .strip_prefix("http.")
            .and_then(|rest| rest.strip_suffix(".downstream_cx_active"))
        {
            (!IGNORED_HTTP_PREFIXES.contains(&prefix)).then_some(&mut http_connections)
        } else {
            None
        };
        let Some(sum) = counted else { continue };
        match line.value {
            Value::Number(n) => *sum = sum.saturating_add(n),
            Value::Wrapped(n) => out
                .skipped
                .push(format!("{} = {n} (a gauge that went below zero)", line.name)),
            Value::Unparsable(text) => out.skipped.push(format!("{} = {text:?} (not a number)", line.name)),
        }
    }
    out.tcp = out.connections.saturating_sub(http_connections);
    out
}

/// The port of a listener stat name: `127.0.0.1_15006`, `0.0.0.0_15021`,
/// `[__1]_15006`, `[__]_15006` → the digits after the last `_`. Listeners
/// named by a `stat_prefix` have no port and are always counted.
fn listener_port(listener: &str) -> Option<u16> {
    listener.rsplit_once('_')?.1.parse().ok()
}

#[cfg(test)]
mod active_tests {
    use super::*;

    /// Captured from Envoy 1.40 with one request in flight on 15006 and an
    /// idle connection on the status listener.
    const CAPTURED: &str = "\
http.admin.downstream_cx_active: 1
http.admin.downstream_rq_active: 1
http.inbound_http.downstream_cx_active: 1
http.inbound_http.downstream_rq_active: 1
http.status.downstream_cx_active: 1
http.status.downstream_rq_active: 0
listener.0.0.0.0_15021.downstream_cx_active: 1
listener.0.0.0.0_15021.worker_0.downstream_cx_active: 1
listener.127.0.0.1_15006.downstream_cx_active: 1
listener.127.0.0.1_15006.worker_0.downstream_cx_active: 1
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
";

    #[test]
    fn counts_each_connection_once_without_admin_and_status() {
        let a = active(CAPTURED, &[15021, 15090]);
        assert_eq!((a.connections, a.requests), (1, 1));
        assert!(a.skipped.is_empty());
    }

    #[test]
    fn internal_listeners_are_not_counted_and_tcp_proxy_connections_are_work() {
        // A tcp_proxy listener on 15001 forwarding into an internal listener
        // with an HTTP manager: the connection is counted once, as TCP work.
        let body = "listener.127.0.0.1_15001.downstream_cx_active: 1\n\
                    listener.envoy_internal_inner.downstream_cx_active: 1\n\
                    http.inner.downstream_cx_active: 0\n\
                    http.inner.downstream_rq_active: 0\n";
        let a = active(body, &[15021, 15090]);
        assert_eq!((a.connections, a.requests, a.tcp, a.work()), (1, 0, 1, 1));
        // An idle pooled HTTP connection into the internal listener: not work.
        let body = "listener.envoy_internal_inner.downstream_cx_active: 1\n\
                    http.inner.downstream_cx_active: 1\n\
                    http.inner.downstream_rq_active: 0\n";
        let a = active(body, &[15021, 15090]);
        assert_eq!((a.connections, a.requests, a.tcp), (0, 0, 0));
        // The captured sidecar: one HTTP request, no TCP work.
        assert_eq!(active(CAPTURED, &[15021, 15090]).tcp, 0);
    }

    #[test]
    fn ipv6_and_extra_ignored_ports() {
        let body = "listener.[__1]_15006.downstream_cx_active: 2\n\
                    listener.[__1]_15006.worker_1.downstream_cx_active: 2\n\
                    listener.[__]_15021.downstream_cx_active: 5\n\
                    listener.[__]_8081.downstream_cx_active: 3\n\
                    listener.my_internal.downstream_cx_active: 1\n";
        assert_eq!(active(body, &[15021, 15090]).connections, 2 + 3 + 1);
        assert_eq!(active(body, &[15021, 15090, 8081]).connections, 2 + 1);
    }

    #[test]
    fn wrapped_and_garbage_values_are_skipped_and_reported() {
        let body = "listener.127.0.0.1_15006.downstream_cx_active: 18446744073709551615\n\
                    listener.127.0.0.1_15001.downstream_cx_active: 2\n\
                    http.inbound_http.downstream_rq_active: zero\n";
        let a = active(body, &[]);
        assert_eq!(a.connections, 2);
        assert_eq!(a.requests, 0);
        assert_eq!(a.skipped.len(), 2);
        assert!(a.skipped[0].contains("18446744073709551615"));
    }

    #[test]
    fn empty_answer_counts_zero() {
        assert_eq!(active("", &[]), Active::default());
    }
}
