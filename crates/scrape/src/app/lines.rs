//! The app's text fitted into the merged answer line by line. Envoy's and
//! lifeguard's parts are the Prometheus text format (0.0.4); the answer's
//! format is [`crate::format`]'s, and each app target is asked for it.
//! What a target sends anyway is converted:
//!
//! - OpenMetrics into text: `# EOF` and `# UNIT` lines dropped, the types
//!   text lacks (`unknown`, `info`, `stateset`, `gaugehistogram`) become
//!   `untyped`, and a sample keeps its name, labels and value (an exemplar
//!   and a timestamp, in seconds in OpenMetrics, are dropped);
//! - text into OpenMetrics: `untyped` becomes `unknown`, a sample's
//!   timestamp (milliseconds in text) is dropped;
//! - always: blank lines and plain comments are dropped, and `# EOF`
//!   (one is written at the very end of an OpenMetrics answer); a line's
//!   leading blanks, which the text format ignores, are dropped (so an
//!   indented `# TYPE` is one);
//! - a family already in the answer (Envoy's, lifeguard's, or an earlier
//!   target's) is left out of the app's part — its `# HELP`, `# TYPE`,
//!   `# UNIT` and samples — since a family declared twice breaks the
//!   whole scrape. Names match with or without `_total`.

use std::collections::HashSet;

use crate::format::Format;

/// The families declared (`# TYPE NAME ...`) in `text`, added to `into`.
pub fn note_families(text: &[u8], into: &mut HashSet<String>) {
    for line in text.split(|&b| b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"# TYPE ") {
            let name = rest.split(|&b| b == b' ').next().unwrap_or_default();
            if !name.is_empty() && !into.contains(std::str::from_utf8(name).unwrap_or_default()) {
                into.insert(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
}

/// Sample-name suffixes that belong to the family before them.
const SUFFIXES: [&str; 9] = [
    "_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount", "_info", "_max",
];

/// Fits one source's lines into the answer (see the module doc).
pub struct LineFilter {
    from_om: bool,
    to_om: bool,
    /// Families this source declared (kept ones), added to the answer's at
    /// the end.
    declared: HashSet<String>,
    family: String,
    dropping: bool,
    /// Families left out, for the log.
    pub(crate) dropped: Vec<String>,
}

impl LineFilter {
    pub fn new(from: Format, to: Format) -> Self {
        Self {
            from_om: from.is_open_metrics(),
            to_om: to.is_open_metrics(),
            declared: HashSet::new(),
            family: String::new(),
            dropping: false,
            dropped: Vec::new(),
        }
    }

    /// Whether `name` clashes with a family already in the answer.
    fn clashes(t: &HashSet<String>, name: &str) -> bool {
        t.contains(name)
            || t.contains(&format!("{name}_total"))
            || name.strip_suffix("_total").is_some_and(|n| t.contains(n))
    }

    fn enter(&mut self, name: &str, taken: &HashSet<String>) {
        if name == self.family {
            return;
        }
        self.family = name.to_owned();
        self.dropping = Self::clashes(taken, name);
        if self.dropping {
            if !self.dropped.iter().any(|d| d == name) {
                self.dropped.push(name.to_owned());
            }
        } else {
            self.declared.insert(name.to_owned());
        }
    }

    /// Appends the lines of `text` (whole lines) that belong in the answer
    /// to `out`, converted; `taken`: the families already in the answer.
    pub fn push(&mut self, text: &[u8], taken: &HashSet<String>, out: &mut Vec<u8>) {
        for line in text.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Ok(line) = std::str::from_utf8(line) {
                self.line(line, taken, out);
            }
        }
    }

    fn line(&mut self, line: &str, taken: &HashSet<String>, out: &mut Vec<u8>) {
        // The text format ignores a line's leading blanks: ` # TYPE x` is
        // a declaration and ` # EOF` a comment, for Prometheus as here.
        let line = line.trim_start_matches([' ', '\t']);
        if line.trim().is_empty() {
            return;
        }
        if let Some(comment) = line.strip_prefix('#') {
            return self.comment(comment.trim_start(), taken, out);
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let name = &line[..name_end];
        let own = name == self.family
            || name
                .strip_prefix(self.family.as_str())
                .is_some_and(|s| SUFFIXES.contains(&s));
        if !own || self.family.is_empty() {
            self.enter(name, taken);
        }
        if self.dropping {
            return;
        }
        match self.from_om == self.to_om {
            true => out.extend_from_slice(line.as_bytes()),
            false => out.extend_from_slice(name_labels_value(line).as_bytes()),
        }
        out.push(b'\n');
    }

    fn comment(&mut self, comment: &str, taken: &HashSet<String>, out: &mut Vec<u8>) {
        // Blanks and tabs separate the words, any number of them, as for
        // Prometheus: `# TYPE x\tgauge` declares `x`.
        let (kind, rest) = first_word(comment);
        let (name, rest) = first_word(rest.unwrap_or(""));
        if !matches!(kind, "HELP" | "TYPE" | "UNIT") || name.is_empty() || (kind == "UNIT" && !self.to_om) {
            return;
        }
        self.enter(name, taken);
        if self.dropping {
            return;
        }
        let rest = match (kind, rest.map(str::trim)) {
            ("TYPE", Some("untyped")) if self.to_om => "unknown",
            ("TYPE", Some("unknown" | "info" | "stateset" | "gaugehistogram")) if !self.to_om => "untyped",
            (_, rest) => rest.unwrap_or(""),
        };
        out.extend_from_slice(format!("# {kind} {name} {rest}").trim_end().as_bytes());
        out.push(b'\n');
    }

    /// Adds the families this source declared to the answer's.
    pub fn finish(self, taken: &mut HashSet<String>) -> Vec<String> {
        taken.extend(self.declared);
        self.dropped
    }
}

/// The first word of `s` and what follows its separator (blanks and tabs).
fn first_word(s: &str) -> (&str, Option<&str>) {
    let s = s.trim_start_matches([' ', '\t']);
    s.split_once([' ', '\t']).map_or((s, None), |(w, rest)| (w, Some(rest)))
}

/// A sample line cut to `name{labels} value`: a timestamp and an exemplar
/// dropped.
fn name_labels_value(line: &str) -> &str {
    let bytes = line.as_bytes();
    let mut i = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    if bytes.get(i) == Some(&b'{') {
        let mut quoted = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b'}' if !quoted => break,
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    let rest = line.get(i..).unwrap_or("");
    let value_start = i + (rest.len() - rest.trim_start().len());
    let value_len = line[value_start.min(line.len())..]
        .find([' ', '\t'])
        .unwrap_or(line.len() - value_start.min(line.len()));
    &line[..(value_start + value_len).min(line.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(from: Format, to: Format, taken: &[&str], text: &str) -> (String, Vec<String>) {
        let mut set: HashSet<String> = taken.iter().map(|s| s.to_string()).collect();
        let mut f = LineFilter::new(from, to);
        let mut out = Vec::new();
        f.push(text.as_bytes(), &set, &mut out);
        (String::from_utf8(out).unwrap(), f.finish(&mut set))
    }

    const OM: Format = Format::OpenMetrics { v1: true };

    #[test]
    fn openmetrics_into_text_drops_what_text_cannot_say() {
        let app = "# HELP req Requests.\n# TYPE req counter\n# UNIT req_seconds seconds\nreq_total{a=\"x y}\"} 3 # {trace_id=\"1\"} 1 1.7e9\nreq_created 1.7e9\n# TYPE up_info info\nup_info{v=\"1\"} 1 1700000000.5\n\n# EOF\n";
        let (out, dropped) = run(OM, Format::Text, &[], app);
        assert_eq!(
            out,
            "# HELP req Requests.\n# TYPE req counter\nreq_total{a=\"x y}\"} 3\nreq_created 1.7e9\n# TYPE up_info untyped\nup_info{v=\"1\"} 1\n"
        );
        assert!(dropped.is_empty());
    }

    #[test]
    fn text_into_openmetrics_and_same_format_pass_through() {
        let app = "# a comment\n# TYPE x untyped\nx 1 1700000000000\n\ny{l=\"v\"} 2\n";
        let (out, _) = run(Format::Text, OM, &[], app);
        assert_eq!(out, "# TYPE x unknown\nx 1\ny{l=\"v\"} 2\n");
        let (out, _) = run(Format::Text, Format::Text, &[], app);
        assert_eq!(out, "# TYPE x untyped\nx 1 1700000000000\ny{l=\"v\"} 2\n");
        let (out, _) = run(OM, OM, &[], "# TYPE c counter\nc_total 1 # {a=\"b\"} 1\n# EOF\n");
        assert_eq!(out, "# TYPE c counter\nc_total 1 # {a=\"b\"} 1\n");
    }

    #[test]
    fn a_family_already_in_the_answer_is_left_out_whole() {
        let app = "# HELP process_cpu_seconds_total CPU.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 9\n# HELP envoy_server_state x\n# TYPE envoy_server_state gauge\nenvoy_server_state 7\n# TYPE app_hits counter\napp_hits_total 4\nloose 1\n";
        let (out, dropped) = run(
            Format::Text,
            Format::Text,
            &["process_cpu_seconds_total", "envoy_server_state"],
            app,
        );
        assert_eq!(out, "# TYPE app_hits counter\napp_hits_total 4\nloose 1\n");
        assert_eq!(dropped, ["process_cpu_seconds_total", "envoy_server_state"]);
        // OpenMetrics counter naming (no _total on the family) clashes too.
        let (out, dropped) = run(
            OM,
            Format::Text,
            &["process_cpu_seconds_total"],
            "# TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 1\n# EOF\n",
        );
        assert_eq!((out.as_str(), dropped.len()), ("", 1));
        // A second target's copy of the first's family is left out.
        let mut taken = HashSet::new();
        for (i, want) in [(0, "# TYPE go_goroutines gauge\ngo_goroutines 5\n"), (1, "")] {
            let mut f = LineFilter::new(Format::Text, Format::Text);
            let mut out = Vec::new();
            f.push(b"# TYPE go_goroutines gauge\ngo_goroutines 5\n", &taken, &mut out);
            f.finish(&mut taken);
            assert_eq!(String::from_utf8(out).unwrap(), want, "target {i}");
        }
    }

    /// Found by fuzzing (fuzz/fuzz_targets/metrics_lines.rs): an indented
    /// line was taken for a sample with no name, so an indented `# TYPE` of
    /// Envoy's family and an indented `# EOF` came through.
    #[test]
    fn indented_lines_are_read_as_the_text_format_reads_them() {
        let app = "  # TYPE envoy_server_state gauge\n\tenvoy_server_state 7\n # EOF\n  # a comment\n  # TYPE app_up gauge\n\t app_up 1 1700000000000\n";
        let (out, dropped) = run(Format::Text, OM, &["envoy_server_state"], app);
        assert_eq!(out, "# TYPE app_up gauge\napp_up 1\n");
        assert_eq!(dropped, ["envoy_server_state"]);
        let (out, _) = run(Format::Text, Format::Text, &[], " x 1\n");
        assert_eq!(out, "x 1\n");
    }

    /// Found by fuzzing (fuzz/fuzz_targets/metrics_lines.rs): a tab
    /// between a comment's words was taken for part of the family's name,
    /// so `# TYPE envoy_server_state\tgauge` declared Envoy's family again.
    #[test]
    fn a_comments_words_are_separated_by_blanks_and_tabs() {
        let app = "# TYPE envoy_server_state\tgauge\nenvoy_server_state 7\n#  TYPE  app_up\t gauge\n# HELP app_up\tUp,  or not.\napp_up 1\n";
        let (out, dropped) = run(Format::Text, Format::Text, &["envoy_server_state"], app);
        assert_eq!(out, "# TYPE app_up gauge\n# HELP app_up Up,  or not.\napp_up 1\n");
        assert_eq!(dropped, ["envoy_server_state"]);
    }

    #[test]
    fn families_are_noted_from_type_lines() {
        let mut set = HashSet::new();
        note_families(b"# TYPE a counter\na 1\n# HELP b x\n# TYPE b gauge\nb 2\n", &mut set);
        assert_eq!(set, HashSet::from(["a".to_owned(), "b".to_owned()]));
    }
}
