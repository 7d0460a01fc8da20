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
    pub value: StatValue<'a>,
}

/// The value of one stat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatValue<'a> {
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
                value: StatValue::Unparsable(line),
            });
        };
        let value = value.trim();
        let value = match value.parse::<u64>() {
            Ok(v) if v > i64::MAX as u64 => StatValue::Wrapped(v),
            Ok(v) => StatValue::Number(v),
            Err(_) => StatValue::Unparsable(value),
        };
        Some(Line {
            name: name.trim(),
            value,
        })
    })
}

/// Finds one stat by exact name.
pub fn find<'a>(body: &'a str, name: &str) -> Option<StatValue<'a>> {
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
                    value: StatValue::Number(1)
                },
                Line {
                    name: "server.state",
                    value: StatValue::Number(0)
                },
            ]
        );
        assert_eq!(find(body, "server.state"), Some(StatValue::Number(0)));
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
        assert_eq!(find(body, "server.state"), Some(StatValue::Number(2)));
        assert_eq!(lines(body).count(), 3);
    }

    #[test]
    fn tolerates_spaces_around_name_and_value() {
        assert_eq!(
            find("  server.state :   3  \r\n", "server.state"),
            Some(StatValue::Number(3))
        );
    }

    #[test]
    fn value_that_does_not_parse_is_reported() {
        assert_eq!(
            find("server.state: live", "server.state"),
            Some(StatValue::Unparsable("live"))
        );
        assert_eq!(
            find("server.state: -1", "server.state"),
            Some(StatValue::Unparsable("-1"))
        );
        assert_eq!(find("server.state:", "server.state"), Some(StatValue::Unparsable("")));
        let garbage: Vec<_> = lines("<html>oops</html>").collect();
        assert_eq!(garbage[0].value, StatValue::Unparsable("<html>oops</html>"));
        let histogram = "cluster.x.upstream_rq_time: P0(nan,0) P25(nan,1)";
        assert!(matches!(
            lines(histogram).next().unwrap().value,
            StatValue::Unparsable(_)
        ));
    }

    #[test]
    fn wrapped_gauge_is_not_a_number() {
        let body = "listener.0.0.0.0_15006.downstream_cx_active: 18446744073709551615";
        assert_eq!(lines(body).next().unwrap().value, StatValue::Wrapped(u64::MAX));
        // A value larger than u64 does not parse at all.
        assert!(matches!(
            find("x: 18446744073709551616", "x"),
            Some(StatValue::Unparsable(_))
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
