//! The app's metrics fitted into the merged scrape line by line
//! (scrape/app/lines.rs): the line filter between text and OpenMetrics,
//! the families already in the answer, the `# EOF` rule; the answer's
//! format from the client's `Accept` and a source's `Content-Type`.
//!
//! Input: a flags byte (the app's format, the answer's, where the text is
//! cut into pushes), then NUL-separated: `Accept` values (one a line), the
//! text before the app's (its `# TYPE` families are taken), the app's text.
//! Holds: no blank line, no plain comment and no `# EOF` comes out; only
//! `# HELP`/`# TYPE` (and `# UNIT` into OpenMetrics), with the types the
//! answer's format has; no family already in the answer is declared again
//! or sampled under its own name; a sample comes out as it came in, or cut
//! to `name{labels} value` when converted; the output is bounded by the
//! input; pushing the text in pieces
//! (whole lines) gives what pushing it whole gives; what is reported
//! dropped did clash; the families the app kept join the answer's.

use std::collections::HashSet;

use super::{accept_headers, fields, flags};
use lifeguard::fuzzing::{note_families, Format, LineFilter};

const FORMATS: [Format; 3] = [
    Format::Text,
    Format::OpenMetrics { v1: true },
    Format::OpenMetrics { v1: false },
];
const SUFFIXES: [&str; 9] = [
    "_total", "_created", "_bucket", "_sum", "_count", "_gsum", "_gcount", "_info", "_max",
];

fn clashes(taken: &HashSet<String>, name: &str) -> bool {
    taken.contains(name)
        || taken.contains(&format!("{name}_total"))
        || name.strip_suffix("_total").is_some_and(|n| taken.contains(n))
}

/// The filter's output for `app`, pushed at once or in pieces of whole lines.
fn filtered(
    from: Format,
    to: Format,
    taken: &HashSet<String>,
    app: &[u8],
    piece: usize,
) -> (Vec<u8>, Vec<String>, HashSet<String>) {
    let mut filter = LineFilter::new(from, to);
    let mut out = Vec::new();
    let mut lines = app.split_inclusive(|&b| b == b'\n').peekable();
    while lines.peek().is_some() {
        let chunk: Vec<u8> = lines.by_ref().take(piece.max(1)).flatten().copied().collect();
        filter.push(&chunk, taken, &mut out);
    }
    let mut after = taken.clone();
    let dropped = filter.finish(&mut after);
    (out, dropped, after)
}

/// A metric name as the exposition formats allow it (what the filter does
/// with other bytes is unspecified).
fn metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// Where the label set that starts at `at` ends (past its `}`; `at` when
/// there is none), None when it does not close.
fn labels_end(line: &str, at: usize) -> Option<usize> {
    let bytes = line.as_bytes();
    if bytes.get(at) != Some(&b'{') {
        return Some(at);
    }
    let (mut i, mut quoted) = (at, false);
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if quoted => i += 1,
            b'"' => quoted = !quoted,
            b'}' if !quoted => return Some(i + 1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let (flags, rest) = flags(data);
    let (from, to) = (FORMATS[usize::from(flags % 3)], FORMATS[usize::from(flags / 3 % 3)]);
    let piece = usize::from(flags >> 4);
    let f = fields(rest, 3);
    let (accept, before, app) = (f[0], f[1], f[2]);

    let accepts: Vec<&[u8]> = accept.split(|&b| b == b'\n').collect();
    let answer = Format::for_accept(&accept_headers(&accepts));
    let lower = String::from_utf8_lossy(accept).to_ascii_lowercase();
    assert!(answer == Format::Text || lower.contains("openmetrics") || lower.contains("application/*"));
    for format in FORMATS {
        assert_eq!(Format::of_content_type(format.content_type()), format);
    }

    let mut taken = HashSet::new();
    note_families(before, &mut taken);
    let (out, dropped, after) = filtered(from, to, &taken, app, 0);
    if piece > 0 {
        assert_eq!(
            filtered(from, to, &taken, app, piece).0,
            out,
            "pushed in pieces of {piece} lines"
        );
    }
    for name in &dropped {
        assert!(clashes(&taken, name), "{name} reported dropped");
    }
    assert_eq!(
        dropped.iter().collect::<HashSet<_>>().len(),
        dropped.len(),
        "{dropped:?}"
    );
    assert!(after.is_superset(&taken));

    let Ok(out) = std::str::from_utf8(&out) else {
        panic!("the filter wrote bytes that are not UTF-8");
    };
    assert!(out.is_empty() || out.ends_with('\n'));
    // Bounded by the input: a line grows by 4 bytes at most (`#TYPE x info`
    // becomes `# TYPE x untyped`), and a last line gets its newline.
    let lines = app.split(|&b| b == b'\n').count();
    assert!(
        out.len() <= app.len() + 4 * lines + 1,
        "{} bytes out of {}",
        out.len(),
        app.len()
    );
    let to_om = to != Format::Text;
    let inputs: Vec<&str> = app
        .split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l.strip_suffix(b"\r").unwrap_or(l)).ok())
        .map(|l| l.trim_start_matches([' ', '\t']))
        .filter(|l| !l.starts_with('#'))
        .collect();
    // Printable lines (a `\r` only before its `\n`).
    let clean = app.split(|&b| b == b'\n').all(|l| {
        l.strip_suffix(b"\r")
            .unwrap_or(l)
            .iter()
            .all(|&b| matches!(b, b'\t' | b' '..=b'~'))
    });
    let mut at = 0;
    let mut declared = HashSet::new();
    for line in out.lines() {
        assert!(!line.trim().is_empty(), "a blank line");
        // The text format's blanks: spaces and tabs.
        assert_ne!(line.trim_matches([' ', '\t']), "# EOF", "an app's # EOF came through");
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.trim_start().splitn(3, ' ').collect();
            let (kind, name) = (words[0], words.get(1).copied().unwrap_or(""));
            assert!(matches!(kind, "HELP" | "TYPE") || kind == "UNIT" && to_om, "{line:?}");
            assert!(!clashes(&taken, name), "{line:?} is already in the answer");
            // Where the app's text is printable: what the filter does with
            // other bytes in a name is unspecified (a trailing vertical tab
            // is trimmed off a comment, for one).
            if clean {
                assert!(!name.is_empty(), "{line:?}");
                let added = after.contains(name) || kind != "TYPE" || !metric_name(name);
                assert!(added, "{name} not added to the answer's families");
            }
            if kind == "TYPE" {
                let ty = words.get(2).copied().unwrap_or("").trim();
                let bad: &[&str] = if to_om {
                    &["untyped"]
                } else {
                    &["unknown", "info", "stateset", "gaugehistogram"]
                };
                assert!(!bad.contains(&ty), "{line:?}");
            }
            declared.insert(name.to_owned());
            continue;
        }
        let name = &line[..line.find(['{', ' ', '\t']).unwrap_or(line.len())];
        let own = SUFFIXES
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|b| declared.contains(b)));
        assert!(
            !taken.contains(name) || own,
            "{line:?}: {name} is already in the answer"
        );
        while at < inputs.len() && !inputs[at].starts_with(line) {
            at += 1;
        }
        assert!(at < inputs.len(), "{line:?} is no input line, nor its start");
        // Converted lines are cut to `name{labels} value` (checked where
        // the line is printable text: what other bytes do is unspecified).
        let converted = (from != Format::Text) != to_om;
        let printable = line.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
        if let Some(end) = labels_end(line, name.len()).filter(|_| converted && printable) {
            // Blanks and tabs separate a sample's tokens.
            let value = line[end..].split([' ', '\t']).filter(|t| !t.is_empty()).count();
            assert!(value <= 1, "{line:?} kept more than its value");
        }
        at += 1;
    }
}
