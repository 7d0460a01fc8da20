//! What starts a drain: a signal ([`Signal`]), the proxy's preStop hook,
//! or an operator ([`Trigger`], [`Asker`]). A leaf: the plan asks a
//! trigger whether the pod terminates, the status shows it.

use serde::Serialize;

/// A signal that asks for a drain and Envoy's stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Signal {
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGQUIT")]
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

/// What started a drain: a signal, the proxy's preStop hook (`POST
/// /drain?prestop`: `lifeguard drain`, `wait-app-exit`), or an operator's
/// `POST /drain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Trigger {
    Signal(Signal),
    #[serde(serialize_with = "pre_stop")]
    PreStop,
    #[serde(serialize_with = "post_drain")]
    PostDrain,
}

fn post_drain<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(Trigger::PostDrain.name())
}

fn pre_stop<S: serde::Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(Trigger::PreStop.name())
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
