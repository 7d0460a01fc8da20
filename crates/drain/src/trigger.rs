//! What starts a drain: a signal ([`Signal`]), the proxy's preStop hook,
//! or an operator ([`Trigger`], [`Asker`]). A leaf: the plan asks a
//! trigger whether the pod terminates, the status shows it.

/// A signal that asks for a drain and Envoy's stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
    Quit,
}

impl Signal {
    /// `SIGTERM`, `SIGINT`, `SIGQUIT`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "SIGTERM",
            Signal::Int => "SIGINT",
            Signal::Quit => "SIGQUIT",
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

lifeguard_base::serialize_as_display!(Signal);

/// What started a drain: a signal, the proxy's preStop hook (`POST
/// /drain?prestop`: `lifeguard drain`, `wait-app-exit`), or an operator's
/// `POST /drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Signal(Signal),
    PreStop,
    PostDrain,
}

impl Trigger {
    /// `SIGTERM`, `preStop hook`, `POST /drain`.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Signal(signal) => signal.name(),
            Trigger::PreStop => "preStop hook",
            Trigger::PostDrain => "POST /drain",
        }
    }

    /// Whether the pod's termination started the drain: a signal (the
    /// kubelet stops a container with its stop signal) or the preStop hook.
    pub fn is_termination(self) -> bool {
        !matches!(self, Trigger::PostDrain)
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

lifeguard_base::serialize_as_display!(Trigger);

/// Who asked for a drain through `POST /drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// The proxy container's preStop hook (`?prestop`): the pod terminates.
    PreStop,
    /// An operator: the pod is not terminating, and leaves its Service's
    /// endpoints.
    Operator,
}

impl Asker {
    pub(crate) fn trigger(self) -> Trigger {
        match self {
            Asker::PreStop => Trigger::PreStop,
            Asker::Operator => Trigger::PostDrain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trigger's JSON (`GET /drain`'s `trigger`, `stop_signal`) is its
    /// name, as the log writes it.
    #[test]
    fn a_trigger_is_its_name_in_json() {
        let signals = [Signal::Term, Signal::Int, Signal::Quit];
        let triggers = signals
            .map(Trigger::Signal)
            .into_iter()
            .chain([Trigger::PreStop, Trigger::PostDrain]);
        for trigger in triggers {
            assert_eq!(serde_json::to_value(trigger).unwrap(), trigger.name());
        }
        for signal in signals {
            assert_eq!(serde_json::to_value(signal).unwrap(), signal.name());
        }
        assert_eq!(serde_json::to_value(Trigger::PreStop).unwrap(), "preStop hook");
        assert_eq!(serde_json::to_value(Signal::Term).unwrap(), "SIGTERM");
    }
}
