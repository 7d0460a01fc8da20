//! Durations written the way Go (and so Istio's users) write them:
//! `500ms`, `5s`, `1m30s`, `1.5h`, `0`.
//!
//! Accepted units: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`. A sign is not
//! accepted: no setting of lifeguard means anything with a negative duration,
//! so `-5s` is an error rather than a surprise. Nor is anything over a year
//! ([`MAX`]): deadlines are instants plus durations, and must not overflow.
//!
//! Written by hand on purpose: it is some 60 lines, and the crates that
//! parse durations read another grammar (`humantime` takes `1h 30m` and no
//! fractions such as `1.5h`; Go takes `1.5h` and no spaces), where a
//! setting moved over from Istio must mean what it meant there.
//!
//! The one parser of durations: the settings (`lifeguard_config`, from every
//! layer), the hooks' flags (the binary's `lifeguard::cli`) and a drain wait's `?timeout=`
//! read them here, each with its floor ([`at_least`], [`positive`]), and a
//! refusal is a [`DurationError`].

use std::fmt;
use std::time::Duration;

/// Why a duration was refused: not a Go duration (the message names the
/// text), or outside the range its setting allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {text:?}: {fault} (write it like 500ms, 5s, 1m30s)")]
    Invalid { text: String, fault: DurationFault },
    /// Zero, where a duration must be positive.
    #[error("must be greater than zero")]
    Zero,
    #[error("must be at least {}", GoDuration(*min))]
    Short { min: Duration },
}

/// What is wrong with a text that is not a Go duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DurationFault {
    #[error("empty")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("missing unit")]
    MissingUnit,
    #[error("expected a number")]
    NoNumber,
    #[error("unknown unit")]
    UnknownUnit,
    #[error("bad number")]
    BadNumber,
    #[error("too large (at most 8760h)")]
    TooLarge,
}

/// The longest duration accepted: 8760h (a year).
pub const MAX: Duration = Duration::from_secs(8760 * 3600);

/// Parses a Go-style duration string, at most [`MAX`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let err = |fault| DurationError::Invalid {
        text: text.to_owned(),
        fault,
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err(DurationFault::Empty));
    }
    if s.starts_with('-') {
        return Err(err(DurationFault::Negative));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(Duration::ZERO);
    }

    let mut rest = s;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err(DurationFault::MissingUnit))?;
        if num_len == 0 {
            return Err(err(DurationFault::NoNumber));
        }
        let (number, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            _ => return Err(err(DurationFault::UnknownUnit)),
        };
        let value = scaled(number, unit_nanos).ok_or_else(|| err(DurationFault::BadNumber))?;
        total_nanos = total_nanos.saturating_add(value);
        if total_nanos > MAX.as_nanos() {
            return Err(err(DurationFault::TooLarge));
        }
        rest = after;
    }
    Ok(Duration::from_nanos(total_nanos as u64))
}

/// `number` (digits with at most one '.') times `unit_nanos`, exactly (at
/// most `u128::MAX`, which is far too large anyway).
fn scaled(number: &str, unit_nanos: u128) -> Option<u128> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut value = int.checked_mul(unit_nanos)?;
    let mut scale = unit_nanos;
    for digit in frac.bytes() {
        scale /= 10;
        if scale == 0 {
            break;
        }
        value = value.saturating_add(u128::from(digit - b'0') * scale);
    }
    Some(value)
}

/// A Go duration (at most [`MAX`]) no shorter than `min`: the settings'
/// and the hooks' flags, each with its floor.
pub fn at_least(text: &str, min: Duration) -> Result<Duration, DurationError> {
    match parse(text)? {
        d if d >= min => Ok(d),
        _ if min == Duration::from_nanos(1) => Err(DurationError::Zero),
        _ => Err(DurationError::Short { min }),
    }
}

/// A Go duration greater than zero.
pub fn positive(text: &str) -> Result<Duration, DurationError> {
    at_least(text, Duration::from_nanos(1))
}

/// Displays a duration the Go way, so `check` and the logs print what a user
/// would have typed: `1m30s`, `500ms`, `0s`.
pub struct GoDuration(pub Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        let nanos = d.as_nanos();
        if nanos < 1_000_000_000 {
            // Like Go: the largest unit below a second, with a fraction.
            let (unit, scale) = match nanos {
                n if n >= 1_000_000 => ("ms", 1_000_000),
                n if n >= 1_000 => ("us", 1_000),
                _ => ("ns", 1),
            };
            let whole = nanos / scale;
            let frac = nanos % scale;
            if frac == 0 {
                return write!(f, "{whole}{unit}");
            }
            let digits = scale.ilog10() as usize;
            let frac = format!("{frac:0digits$}");
            return write!(f, "{whole}.{}{unit}", frac.trim_end_matches('0'));
        }
        let secs = d.as_secs();
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if h > 0 || m > 0 {
            write!(f, "{m}m")?;
        }
        let sub = d.subsec_nanos();
        if sub == 0 {
            write!(f, "{s}s")
        } else {
            let frac = format!("{sub:09}");
            write!(f, "{s}.{}s", frac.trim_end_matches('0'))
        }
    }
}

/// The wall clock as Unix seconds, for the times lifeguard publishes (the
/// drain's start and deadline, the last admin success). Durations are
/// measured on tokio's clock instead, which tests can pause.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn parses_what_istio_users_type() {
        assert_eq!(parse("500ms"), Ok(ms(500)));
        assert_eq!(parse("5s"), Ok(ms(5_000)));
        assert_eq!(parse("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse("1.5s"), Ok(ms(1_500)));
        assert_eq!(parse(".5s"), Ok(ms(500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse("10ns"), Ok(Duration::from_nanos(10)));
        assert_eq!(parse("1h2m3s4ms"), Ok(ms(3_723_004)));
    }

    #[test]
    fn a_floor_is_named() {
        assert_eq!(positive("1ns"), Ok(Duration::from_nanos(1)));
        assert_eq!(positive("0s"), Err(DurationError::Zero));
        assert_eq!(positive("0s").unwrap_err().to_string(), "must be greater than zero");
        let short = at_least("9ms", ms(10)).unwrap_err();
        assert_eq!(short, DurationError::Short { min: ms(10) });
        assert_eq!(short.to_string(), "must be at least 10ms");
        assert_eq!(at_least("0", Duration::ZERO), Ok(Duration::ZERO));
        assert!(matches!(
            at_least("5x", Duration::ZERO),
            Err(DurationError::Invalid {
                fault: DurationFault::UnknownUnit,
                ..
            })
        ));
    }

    #[test]
    fn refuses_what_go_would_refuse_and_negatives() {
        for bad in ["", "5", "s", "-5s", "5x", "1..5s", "5 s", "abc", "1m30"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn refuses_more_than_a_year() {
        assert_eq!(parse("8760h"), Ok(MAX));
        for big in [
            "8760h1ns",
            "8761h",
            "18446744073709551615s",
            "1h340282366920938463463374607431768211455ns",
        ] {
            let e = parse(big).expect_err(big);
            assert!(e.to_string().contains("too large"), "{e}");
        }
    }

    /// Found while writing its fuzz target (fuzz/fuzz_targets/go_duration.rs,
    /// which fails on it): a number whose whole part just fits in u128
    /// nanoseconds overflowed when its fraction was added, a panic in a
    /// debug build and a wrap to a short duration in a release build
    /// (131.788544ms here).
    #[test]
    fn a_fraction_past_the_largest_number_is_too_large_not_wrapped() {
        for big in [
            "340282366920938463463374607431.9s",
            "94522879700260684295381835.9h",
            "1h340282366920938463463374607431768211.9us",
        ] {
            let e = parse(big).expect_err(big);
            assert!(e.to_string().contains("too large"), "{e}");
        }
    }

    #[test]
    fn displays_round_trip() {
        for text in [
            "0s",
            "500ms",
            "5s",
            "1m30s",
            "1h0m0s",
            "1.5s",
            "250us",
            "520.976182ms",
            "1.5us",
            "7ns",
        ] {
            let d = parse(text).unwrap();
            assert_eq!(GoDuration(d).to_string(), text);
        }
    }
}
