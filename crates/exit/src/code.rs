//! The process exit code, decided here and nowhere else: whatever the
//! binary ran reports how it ended ([`Ended`]: a drain's [`Outcome`], a
//! hook's [`HookEnd`], a refused setting, ...), and [`code`] makes it the
//! number. docs/operations.md's table of exit codes is this one.

use lifeguard_drain::Outcome;
use lifeguard_hooks::HookEnd;

/// Envoy was drained and stopped, with nothing left (also after the
/// wait for the load balancers ended at its bound), or `/quitquitquit`
/// was asked for; a
/// hook got what it waited for; `check` found nothing to warn of;
/// `inject` wrote its manifest.
pub(crate) const CLEAN: u8 = 0;
/// A hook gave up or was refused; `check` warned that a duration does
/// not fit the grace period.
pub(crate) const FAILED: u8 = 1;
/// A bad setting, a start-up error, or a manifest `inject` cannot
/// rewrite: nothing was started (or written).
pub(crate) const NOT_STARTED: u8 = 2;
/// Envoy was stopped with work in flight: the deadline cut the drain, or
/// the fixed policy's time ran out with requests still active.
pub(crate) const CUT_BY_DEADLINE: u8 = 3;
/// Envoy exited on its own (crash, OOM kill, bad config) or vanished.
pub(crate) const ENVOY_EXITED: u8 = 4;

/// How one run of the binary ended, whatever it ran. Each failure was
/// reported where it happened (the typed error on stderr or in the log);
/// what is left is the fact the exit code tells.
#[derive(Debug)]
pub enum Ended {
    /// A setting from the command line, the environment or a file was
    /// refused (`lifeguard::cli::BadSetting`): nothing ran.
    BadSetting,
    /// `lifeguard run` could not start (the agent's `StartError`):
    /// nothing was left running.
    StartFailed,
    /// `lifeguard run`: Envoy stopped, and how.
    Stopped(Outcome),
    /// `lifeguard check`: the settings are valid; `warnings` say what
    /// does not fit the grace period.
    Checked { warnings: usize },
    /// `lifeguard wait`, `wait-app-exit` or `drain`.
    Hook(HookEnd),
    /// `lifeguard inject` wrote the rewritten manifest.
    Injected,
    /// `lifeguard completions` or `man` printed its text.
    Printed,
    /// ... or could not (stdout closed).
    NotPrinted,
    /// `lifeguard inject` refused the manifest
    /// (`lifeguard_inject::InjectError`): nothing was written.
    NotInjected,
}

/// The process exit code of a run that `ended` so.
pub fn code(ended: &Ended) -> u8 {
    match ended {
        Ended::BadSetting | Ended::StartFailed | Ended::NotInjected => NOT_STARTED,
        Ended::Stopped(outcome) => of_outcome(outcome),
        Ended::Checked { warnings: 0 } => CLEAN,
        Ended::Checked { .. } => FAILED,
        Ended::Hook(HookEnd::Done) => CLEAN,
        Ended::Hook(HookEnd::GaveUp | HookEnd::Failed) => FAILED,
        Ended::Injected | Ended::Printed => CLEAN,
        Ended::NotPrinted => FAILED,
    }
}

/// The exit code of the agent that ended with `outcome` (also in its exit
/// summary): a cut drain that left nothing in flight is clean.
pub(crate) fn of_outcome(outcome: &Outcome) -> u8 {
    match outcome {
        Outcome::Drained(_) | Outcome::WaitBound(_) | Outcome::Quit(_) => CLEAN,
        Outcome::Cut { left: Some(0), .. } => CLEAN,
        Outcome::Cut { .. } | Outcome::Unfinished { .. } => CUT_BY_DEADLINE,
        Outcome::EnvoyExited(_) | Outcome::EnvoyGone => ENVOY_EXITED,
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::*;
    use lifeguard_drain::Exit;

    #[test]
    fn every_ending_has_its_code() {
        let exit = Exit::Status(ExitStatus::from_raw(0));
        let stopped = |outcome| code(&Ended::Stopped(outcome));
        assert_eq!(stopped(Outcome::Drained(exit)), 0);
        assert_eq!(stopped(Outcome::WaitBound(exit)), 0);
        assert_eq!(stopped(Outcome::Quit(Exit::Quit)), 0);
        assert_eq!(stopped(Outcome::Cut { left: Some(0), exit }), 0);
        assert_eq!(stopped(Outcome::Cut { left: Some(2), exit }), 3);
        assert_eq!(stopped(Outcome::Cut { left: None, exit }), 3);
        assert_eq!(stopped(Outcome::Unfinished { left: 1, exit }), 3);
        assert_eq!(stopped(Outcome::EnvoyExited(ExitStatus::from_raw(9))), 4);
        assert_eq!(stopped(Outcome::EnvoyGone), 4);
        for nothing_started in [Ended::BadSetting, Ended::StartFailed, Ended::NotInjected] {
            assert_eq!(code(&nothing_started), 2, "{nothing_started:?}");
        }
        assert_eq!(code(&Ended::Checked { warnings: 0 }), 0);
        assert_eq!(code(&Ended::Checked { warnings: 2 }), 1);
        assert_eq!(code(&Ended::Hook(HookEnd::Done)), 0);
        assert_eq!(code(&Ended::Hook(HookEnd::GaveUp)), 1);
        assert_eq!(code(&Ended::Hook(HookEnd::Failed)), 1);
        assert_eq!(code(&Ended::Injected), 0);
    }
}
