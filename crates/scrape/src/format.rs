//! The exposition format of the merged answer, and what each source is
//! asked for: the Prometheus text format (0.0.4) whenever the client
//! accepts it, OpenMetrics only for a client that accepts OpenMetrics and
//! not text, protobuf never (a protobuf body cannot be concatenated with
//! anything). How a source's answer in the other format is fitted in is
//! [`crate::app::lines`]'s.

use hyper::header::{HeaderMap, ACCEPT};

/// The answer's exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text`, version 1.0.0 or 0.0.1.
    OpenMetrics { v1: bool },
}

impl Format {
    /// The format for a client's `Accept` (text without one).
    pub fn for_accept(headers: &HeaderMap) -> Format {
        let (mut text, mut om, mut om_v1) = (false, false, false);
        let values = headers.get_all(ACCEPT).iter().filter_map(|v| v.to_str().ok());
        for item in values.flat_map(|v| v.split(',')) {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0f32, None);
            for p in parts {
                match p
                    .split_once('=')
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"')))
                {
                    Some((k, v)) if k == "q" => q = v.parse().unwrap_or(0.0),
                    Some((k, v)) if k == "version" => version = Some(v.to_owned()),
                    _ => {}
                }
            }
            if q <= 0.0 {
                continue;
            }
            match media.as_str() {
                "text/plain" if version.as_deref().is_none_or(|v| v == "0.0.4") => text = true,
                "text/*" | "*/*" | "*" => text = true,
                "application/openmetrics-text" => {
                    om = true;
                    om_v1 |= version.as_deref().is_none_or(|v| v == "1.0.0");
                }
                "application/*" => om = true,
                _ => {}
            }
        }
        match (text, om) {
            (false, true) => Format::OpenMetrics { v1: om_v1 },
            _ => Format::Text,
        }
    }

    /// The answer's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics { v1: true } => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::OpenMetrics { v1: false } => "application/openmetrics-text; version=0.0.1; charset=utf-8",
        }
    }

    /// The `Accept` an app target is sent: this format first, never
    /// protobuf.
    pub fn accept_for_app(self) -> &'static str {
        match self {
            Format::Text => "text/plain;version=0.0.4",
            Format::OpenMetrics { .. } => {
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.9,text/plain;version=0.0.4;q=0.5"
            }
        }
    }

    pub(crate) fn is_open_metrics(self) -> bool {
        matches!(self, Format::OpenMetrics { .. })
    }

    /// The format of a source's answer, by its `Content-Type`.
    pub fn of_content_type(value: &str) -> Format {
        let media = value.split(';').next().unwrap_or("").trim();
        match media.eq_ignore_ascii_case("application/openmetrics-text") {
            true => Format::OpenMetrics {
                v1: !value.contains("0.0.1"),
            },
            false => Format::Text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn accept(v: &str) -> Format {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_str(v).unwrap());
        Format::for_accept(&h)
    }

    #[test]
    fn text_whenever_the_client_takes_it_openmetrics_only_when_it_does_not() {
        assert_eq!(Format::for_accept(&HeaderMap::new()), Format::Text);
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(accept(prometheus), Format::Text);
        let proto = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.9,text/plain;version=0.0.4;q=0.3";
        assert_eq!(accept(proto), Format::Text);
        assert_eq!(accept("application/vnd.google.protobuf"), Format::Text);
        assert_eq!(
            accept("application/openmetrics-text;version=1.0.0"),
            Format::OpenMetrics { v1: true }
        );
        assert_eq!(
            accept("application/openmetrics-text; version=0.0.1"),
            Format::OpenMetrics { v1: false }
        );
        assert_eq!(
            accept("application/openmetrics-text;version=1.0.0,text/plain;q=0"),
            Format::OpenMetrics { v1: true }
        );
        assert_eq!(
            Format::of_content_type("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            Format::OpenMetrics { v1: true }
        );
        assert_eq!(Format::of_content_type("text/plain; version=0.0.4"), Format::Text);
    }
}
