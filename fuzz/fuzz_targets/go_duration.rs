//! Go durations (duration.rs) and the parsers built on them: the settings'
//! (config/parsers.rs: a bare number of seconds for the grace period, a
//! 10 ms floor for poll intervals, greater than zero, any) through the
//! settings file, and `lifeguard wait`'s two (cli.rs) through clap.
//!
//! Input: a flags byte (which setting), then NUL-separated: the text, and
//! up to 12 bytes of a duration to display.
//! Holds: a refusal names the text (and the flag, or the file's key); an
//! accepted duration is at most a year, not negative, and its display
//! parses back to it; any duration up to a year displays as text that
//! parses back to it; each setting takes exactly what its rule allows.

use std::time::Duration;

use super::{fields, flags, settings_file, settings_table};
use lifeguard::fuzzing::{
    command_line, go_duration, load_settings, Command, ConfigError, GoDuration, Source, GO_DURATION_MAX,
};

/// Settings of each duration parser, and the shortest each takes.
const SETTINGS: [(&str, Duration); 4] = [
    ("termination_grace_period", Duration::from_nanos(1)),
    ("poll_interval", Duration::from_millis(10)),
    ("admin_timeout", Duration::from_nanos(1)),
    ("drain_delay", Duration::ZERO),
];

fn round_trip(d: Duration) {
    let shown = GoDuration(d).to_string();
    assert!(!shown.contains(' '), "{shown:?}");
    assert_eq!(go_duration(&shown), Ok(d), "{d:?} displayed as {shown:?}");
}

fn setting(key: &str, min: Duration, text: &str) {
    let path = settings_file(&format!("{key} = {}\n", toml::Value::String(text.to_owned())));
    let bare = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    let read = if key == "termination_grace_period" && bare {
        go_duration(&format!("{text}s"))
    } else {
        go_duration(text)
    };
    let want = read.ok().filter(|d| *d >= min);
    match load_settings(Some(&path), None) {
        Ok(loaded) => {
            let d = want.unwrap_or_else(|| panic!("{key} = {text:?} taken"));
            let table = settings_table(&loaded);
            assert_eq!(table[key].as_str(), Some(GoDuration(d).to_string().as_str()));
        }
        Err(ConfigError::Invalid { field, origin, why, .. }) if field == key => {
            assert_eq!(origin, Source::File);
            assert!(want.is_none(), "{key} = {text:?} refused: {why}");
        }
        // The grace period must be longer than the shutdown margin (2s).
        Err(ConfigError::Invalid { field, .. }) if key == "termination_grace_period" && field == "shutdown_margin" => {
            assert!(want.is_some_and(|d| d <= Duration::from_secs(2)));
        }
        Err(e) => panic!("{key} = {text:?}: {e:?}"),
    }
}

/// One input, as the fuzz target runs it: panics when a promise above is broken.
pub fn run(data: &[u8]) {
    let (flags, rest) = flags(data);
    let f = fields(rest, 2);
    let Ok(text) = std::str::from_utf8(f[0]) else { return };

    match go_duration(text) {
        Ok(d) => {
            assert!(d <= GO_DURATION_MAX);
            assert!(!text.trim().starts_with('-'));
            round_trip(d);
        }
        Err(e) => assert!(e.to_string().contains(&format!("{text:?}")), "{e}"),
    }

    let mut raw = [0u8; 12];
    let n = f[1].len().min(12);
    raw[..n].copy_from_slice(&f[1][..n]);
    let secs = u64::from_le_bytes(raw[..8].try_into().unwrap()) % (GO_DURATION_MAX.as_secs() + 1);
    let nanos = u32::from_le_bytes(raw[8..].try_into().unwrap()) % 1_000_000_000;
    round_trip(Duration::new(secs, nanos).min(GO_DURATION_MAX));

    let (key, min) = SETTINGS[usize::from(flags) % SETTINGS.len()];
    setting(key, min, text);

    let parsed = go_duration(text).ok();
    let (timeout, period) = (format!("--timeout={text}"), format!("--period={text}"));
    match command_line(&["lifeguard", "wait", &timeout, &period]).map(|cli| cli.command) {
        Ok(Command::Wait(opts)) => {
            assert_eq!(Some(opts.timeout.get()), parsed);
            assert!(!opts.period.get().is_zero());
        }
        Ok(other) => panic!("{text:?}: not the wait command: {other:?}"),
        Err(e) => {
            let why = e.to_string();
            assert!(why.contains("--timeout") || why.contains("--period"), "{why}");
            assert!(parsed.is_none_or(|d| d.is_zero()), "{text:?}: {why}");
        }
    }
}
