//! Envoy's version: read once, when Envoy's admin first answers, and logged.
//!
//! The read is `GET /server_info` (about 100 KB, most of it the node's list
//! of extensions; a few milliseconds of Envoy's main thread even with
//! 20,000 clusters), made once: until the admin answers, a refused
//! connection costs Envoy nothing. The same read works for an Envoy
//! lifeguard launched and for one running beside it. The version is for people (the
//! log line, with a warning outside the versions the suite runs against):
//! nothing lifeguard does depends on it, because every request lifeguard
//! makes means the same to Envoy 1.36 through 1.40:
//!
//! - **the drain** always asks `drain_listeners` with `graceful`. Up to
//!   1.39 `skip_exit` without `graceful` is refused (400) and a plain drain
//!   never tells open connections to close; 1.40 changed both. With
//!   `graceful` every version drains alike.
//! - **the merged scrape** never asks Envoy for protobuf: no `Accept` is
//!   sent, and a client's `prom_protobuf` is taken out of the query string
//!   passed on (Envoy 1.38 and later answer protobuf to it, which cannot be
//!   joined to text; earlier ones ignore it).
//!
//! `tests/envoy_versions.rs` shows each of these against the Envoy the
//! suite runs; `scripts/test` runs the Envoy-facing tests against the oldest
//! supported Envoy as well as the newest.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::admin::{AdminClient, AdminError, Endpoint};

/// The oldest and the newest Envoy (major, minor) the test suite runs
/// against (docs/deploy.md: supported Envoy versions).
pub(crate) const OLDEST_TESTED: (u32, u32) = (1, 36);
pub(crate) const NEWEST_TESTED: (u32, u32) = (1, 40);

/// Largest `/server_info` answer read (Envoy's is about 100 KB; a large
/// node metadata makes it grow).
const SERVER_INFO_LIMIT: usize = 4 << 20;

/// An Envoy version as `/server_info` states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The whole build string: `<commit>/<x.y.z>/<Clean|Modified>/<RELEASE|DEBUG>/<TLS library>`.
    pub(crate) build: String,
}

/// Why a `/server_info` answer says no version.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("/server_info is not JSON: {0}")]
    NotJson(#[from] serde_json::Error),
    #[error("/server_info has no version")]
    NoVersion,
    #[error("{0:?} is not an Envoy build string (commit/x.y.z/...)")]
    NotABuild(String),
}

impl EnvoyVersion {
    /// The version of a `/server_info` answer (its `version` field).
    pub fn from_server_info(body: &str) -> Result<EnvoyVersion, VersionError> {
        let info: serde_json::Value = serde_json::from_str(body)?;
        let build = info
            .get("version")
            .and_then(|v| v.as_str())
            .ok_or(VersionError::NoVersion)?;
        EnvoyVersion::from_build(build)
    }

    /// The version in a build string: its second `/`-separated field,
    /// `x.y.z` (a suffix such as `-dev` is dropped).
    pub(crate) fn from_build(build: &str) -> Result<EnvoyVersion, VersionError> {
        let bad = || VersionError::NotABuild(build.to_owned());
        let number = build.split('/').nth(1).ok_or_else(bad)?;
        let number = number.split(['-', '+']).next().unwrap_or(number);
        let mut parts = number.split('.').map(|p| p.parse::<u32>());
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch)), None) => Ok(EnvoyVersion {
                major,
                minor,
                patch,
                build: build.to_owned(),
            }),
            _ => Err(bad()),
        }
    }

    /// `x.y.z`.
    pub(crate) fn number(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }

    /// Where this version stands against the ones the suite runs.
    pub(crate) fn tested(&self) -> Tested {
        let v = (self.major, self.minor);
        if v < OLDEST_TESTED {
            Tested::Older
        } else if v > NEWEST_TESTED {
            Tested::Newer
        } else {
            Tested::Yes
        }
    }
}

/// Whether the suite runs against an Envoy of this version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tested {
    Yes,
    Older,
    Newer,
}

/// Reads Envoy's version once its admin answers and logs it: retried
/// every `every` while the admin refuses (not up yet, as the poller's
/// reads are), at most `TIMEOUTS` times when it does not answer in time
/// (a busy admin thread is not asked again and again), until `shutdown`.
pub async fn log_once(admin: AdminClient, every: Duration, shutdown: CancellationToken) {
    let mut timeouts = 0;
    loop {
        let read = tokio::select! {
            _ = shutdown.cancelled() => return,
            read = admin.get_text(Endpoint::ServerInfo, "/server_info", SERVER_INFO_LIMIT) => read,
        };
        match read {
            Ok(body) => return log(EnvoyVersion::from_server_info(&body)),
            Err(AdminError::Connect { .. }) => {}
            Err(AdminError::Timeout { .. }) if timeouts + 1 < TIMEOUTS => timeouts += 1,
            Err(e) => return tracing::info!(error = %e, "Envoy's version is unknown"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// How many `/server_info` reads may time out before the version is given up.
const TIMEOUTS: u32 = 3;

fn log(version: Result<EnvoyVersion, VersionError>) {
    let version = match version {
        Ok(v) => v,
        Err(why) => return tracing::info!(error = %why, "Envoy's version is unknown"),
    };
    let (number, build) = (version.number(), version.build.as_str());
    let range = format!(
        "{}.{}-{}.{}",
        OLDEST_TESTED.0, OLDEST_TESTED.1, NEWEST_TESTED.0, NEWEST_TESTED.1
    );
    match version.tested() {
        Tested::Yes => tracing::info!(version = %number, build, "Envoy version"),
        Tested::Older => tracing::warn!(
            version = %number, build, tested = %range,
            "Envoy version: older than any lifeguard is tested with"
        ),
        Tested::Newer => tracing::info!(
            version = %number, build, tested = %range,
            "Envoy version: newer than any lifeguard is tested with"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_of_a_build_string() {
        let v = EnvoyVersion::from_build("9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL")
            .unwrap();
        assert_eq!((v.major, v.minor, v.patch), (1, 40, 0));
        assert_eq!(v.number(), "1.40.0");
        assert_eq!(v.tested(), Tested::Yes);
        let dev = EnvoyVersion::from_build("abc/1.41.0-dev/Modified/DEBUG/BoringSSL").unwrap();
        assert_eq!((dev.number(), dev.tested()), ("1.41.0".to_owned(), Tested::Newer));
        let old = EnvoyVersion::from_build("abc/1.35.7/Clean/RELEASE/BoringSSL").unwrap();
        assert_eq!(old.tested(), Tested::Older);
    }

    #[test]
    fn a_server_info_without_a_version_is_an_error_not_a_panic() {
        let v =
            EnvoyVersion::from_server_info(r#"{"version":"bad8280d/1.36.4/Clean/RELEASE/BoringSSL","state":"LIVE"}"#);
        assert_eq!(v.unwrap().number(), "1.36.4");
        for body in [
            "",
            "listener_manager.workers_started: 1\n",
            "{}",
            r#"{"version":7}"#,
            r#"{"version":"1.40.0"}"#,
            r#"{"version":"x/1.40/y"}"#,
            r#"{"version":"x/1.40.0.1/y"}"#,
            r#"{"version":"x/one.two.three/y"}"#,
        ] {
            assert!(EnvoyVersion::from_server_info(body).is_err(), "{body:?}");
        }
    }
}
