//! What a scrape asks for, from its query string and headers: the query
//! passed to Envoy (never one that asks for protobuf), the time Envoy's part may take (from Prometheus'
//! `X-Prometheus-Scrape-Timeout-Seconds`), gzip, and the answer's format
//! (from `Accept`).

use std::time::Duration;

use hyper::header::{HeaderMap, ACCEPT_ENCODING};

use crate::format::Format;

/// The Envoy part's budget when the client sends no scrape timeout
/// (Prometheus' default scrape timeout).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest scrape timeout honoured.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(120);
/// The header Prometheus sends with its scrape timeout.
pub(crate) const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";

/// What a scrape request asks for, taken from its query and headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeRequest {
    /// The query string passed to Envoy (without the `?`): the client's,
    /// less what would make Envoy answer protobuf ([`envoy_query`]).
    pub(crate) query: String,
    /// How long Envoy's part may take.
    pub(crate) budget: Duration,
    /// Whether the client accepts gzip.
    pub gzip: bool,
    /// The answer's format, by the client's `Accept`.
    pub format: Format,
}

impl ScrapeRequest {
    pub fn new(query: Option<&str>, headers: &HeaderMap) -> Self {
        let timeout = headers
            .get(SCRAPE_TIMEOUT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, |s| {
                Duration::from_secs_f64(s.min(MAX_TIMEOUT.as_secs_f64()))
            });
        Self {
            query: envoy_query(query.unwrap_or("")),
            budget: envoy_budget(timeout),
            gzip: accepts_gzip(headers),
            format: Format::for_accept(headers),
        }
    }
}

/// The client's query string as passed to Envoy: every parameter but
/// `prom_protobuf` (its name compared once percent-decoded, as Envoy reads
/// it), which Envoy 1.38 and later answer with protobuf whatever its value,
/// and which a text answer cannot be joined to; earlier Envoys ignore it,
/// so it goes on no version. The other parameters pass as they came.
pub(crate) fn envoy_query(query: &str) -> String {
    let protobuf = |param: &&str| {
        let name = param.split('=').next().unwrap_or("");
        percent_decoded(name) == b"prom_protobuf"
    };
    query
        .split('&')
        .filter(|param| !param.is_empty() && !protobuf(param))
        .collect::<Vec<_>>()
        .join("&")
}

/// `text` with its `%XX` escapes decoded; a `%` not followed by two hex
/// digits is kept as it is.
fn percent_decoded(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The Envoy part's share of a scrape timeout: a tenth (at least 200 ms)
/// is kept for lifeguard's part and the transfer; at least 50 ms.
pub(crate) fn envoy_budget(timeout: Duration) -> Duration {
    let margin = (timeout / 10).max(Duration::from_millis(200));
    timeout.saturating_sub(margin).max(Duration::from_millis(50))
}

/// Whether `Accept-Encoding` lists gzip (or `*`) with a non-zero weight.
pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn envoy_is_never_asked_for_protobuf_by_the_query() {
        let h = HeaderMap::new();
        let query = |q: &str| ScrapeRequest::new(Some(q), &h).query;
        assert_eq!(query("usedonly&filter=^cluster"), "usedonly&filter=^cluster");
        assert_eq!(query("prom_protobuf=1"), "");
        assert_eq!(query("prom_protobuf"), "");
        assert_eq!(query("usedonly&prom_protobuf=0&filter=x"), "usedonly&filter=x");
        assert_eq!(query("prom%5Fprotobuf=1&usedonly"), "usedonly");
        assert_eq!(query("prom%5fprotobuf&&usedonly&"), "usedonly");
        // Only that name: a value or a longer name is the client's.
        assert_eq!(query("filter=prom_protobuf"), "filter=prom_protobuf");
        assert_eq!(query("prom_protobuf_x=1"), "prom_protobuf_x=1");
        assert_eq!(query("%zz=1&%5"), "%zz=1&%5");
        assert_eq!(ScrapeRequest::new(None, &h).query, "");
    }

    #[test]
    fn scrape_timeout_header_sets_the_budget() {
        let mut h = HeaderMap::new();
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(9));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("1"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(800));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(2250));
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("0.1"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_millis(50));
        for bad in ["-1", "0", "nan", "soon"] {
            h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static(bad));
            assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(9), "{bad}");
        }
        h.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("3600"));
        assert_eq!(ScrapeRequest::new(None, &h).budget, Duration::from_secs(108));
    }

    #[test]
    fn gzip_is_accepted_unless_refused() {
        for (value, want) in [
            ("gzip", true),
            ("deflate, gzip;q=1.0, *;q=0.5", true),
            ("GZIP", true),
            ("*", true),
            ("gzip;q=0", false),
            ("identity", false),
            ("br, deflate", false),
            ("", false),
        ] {
            let mut h = HeaderMap::new();
            h.insert(ACCEPT_ENCODING, HeaderValue::from_static(value));
            assert_eq!(accepts_gzip(&h), want, "{value:?}");
        }
        assert!(!accepts_gzip(&HeaderMap::new()));
    }
}
