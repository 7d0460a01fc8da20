//! Our state families in Prometheus text format 0.0.4, written at scrape
//! time from what they describe: the drain's published status and the
//! process (`process_*`, read from /proc by the `metrics-process` crate).

use std::fmt::Write as _;

use super::names::*;
use lifeguard_base::duration::unix_now;
use lifeguard_base::reason::Label;
use lifeguard_drain::{DrainUntil, Kubelet, KubeletAnswer, NotServingBecause, Phase, ReadyOrNot, Status};
use lifeguard_drain_wait::rule::CheckerState;
use lifeguard_drain_wait::{DrainWaitStatus, WaitState};

/// The drain's families, from its published status. Values that do not
/// exist yet have no series.
pub(super) fn drain_families(out: &mut Exposition, status: &Status) {
    out.gauge(
        DRAIN_PHASE,
        "1 for the drain's current phase: serving, delaying (pre-drain delay), draining_ready (draining, readiness not failed yet), leaving_rotation (out-of-rotation: readiness 503, Envoy serving until the load balancers let go), draining, drained (waiting for SIGTERM), stopping (Envoy), stopped (Envoy has stopped).",
    );
    for phase in Phase::all() {
        out.sample(
            DRAIN_PHASE,
            &[("phase", phase.label())],
            f64::from(u8::from(status.phase == phase)),
        );
    }
    out.gauge(
        DRAIN_POLICY,
        "1 for the drain policy in force: app-exit, out-of-rotation, time, connections or requests.",
    );
    for policy in DrainUntil::all() {
        out.sample(
            DRAIN_POLICY,
            &[("policy", policy.label())],
            f64::from(u8::from(status.policy == policy)),
        );
    }
    let Some(started) = status.started_at else {
        return;
    };
    drain_times(out, status, started);
    drain_counts(out, status);
    if let Some(kubelet) = &status.kubelet {
        drain_kubelet(out, kubelet);
    }
}

/// How the kubelet's readiness probe is answered in the drain, what it
/// was answered, and when the drain turned its answer to 503.
fn drain_kubelet(out: &mut Exposition, kubelet: &Kubelet) {
    out.gauge(
        DRAIN_KUBELET_ANSWER,
        "1 for how the kubelet's readiness probe is answered in the drain: follows_envoy (the pod terminates: 200 while Envoy is ready and accepts new connections, for kube-proxy's fallback to a terminating endpoint, for the node's load balancers' time at most) or not_serving (503 from the drain's start, as the load balancers).",
    );
    for answer in KubeletAnswer::all() {
        out.sample(
            DRAIN_KUBELET_ANSWER,
            &[("answer", answer.label())],
            f64::from(u8::from(kubelet.answer == answer)),
        );
    }
    out.gauge(
        DRAIN_KUBELET_PROBES,
        "The kubelet's readiness probes answered since the drain began, by answer: ready (200) or not_ready (503).",
    );
    for answer in ReadyOrNot::all() {
        out.sample(
            DRAIN_KUBELET_PROBES,
            &[("answer", answer.label())],
            kubelet.probes(answer) as f64,
        );
    }
    if let Some(serving_window) = kubelet.serving_window_seconds {
        out.single(
            DRAIN_KUBELET_SERVING_WINDOW,
            "follows_envoy: the longest the kubelet is answered as Envoy is, from the drain's start (the node's load balancers' interval x threshold, and a second for kube-proxy).",
            serving_window,
        );
    }
    if let Some(after) = kubelet.not_serving_after_seconds {
        out.single(
            DRAIN_KUBELET_NOT_SERVING_AFTER,
            "Seconds from the drain's start to when the drain turned the kubelet's answer to 503 (0: at once; lifeguard_drain_kubelet_not_serving_reason says why).",
            after,
        );
    }
    if let Some(because) = kubelet.not_serving_because {
        out.gauge(
            DRAIN_KUBELET_NOT_SERVING_REASON,
            "1 for why the drain turned the kubelet's answer to 503: operator_drain (POST /drain: the pod leaves its endpoints), terminating_readiness_failing, node_load_balancers_time (the node's load balancers have had their time: announcers withdraw the node), out_of_rotation (the drain wait's verdict), envoy_stopping.",
        );
        for reason in NotServingBecause::all() {
            out.sample(
                DRAIN_KUBELET_NOT_SERVING_REASON,
                &[("reason", reason.label())],
                f64::from(u8::from(because == reason)),
            );
        }
    }
}

/// When the drain began, must end, and how long it has taken.
fn drain_times(out: &mut Exposition, status: &Status, started: f64) {
    out.single(DRAIN_STARTED, "Unix time the drain began.", started);
    if let Some(deadline) = status.deadline {
        out.single(DRAIN_DEADLINE, "Unix time by which the drain stops Envoy.", deadline);
    }
    // Envoy exiting mid-drain leaves no final duration: no series then,
    // rather than a figure that keeps growing while lifeguard lingers.
    let duration = match status.duration_seconds {
        Some(took) => Some(took),
        None if status.phase != Phase::Stopped => Some((unix_now() - started).max(0.0)),
        None => None,
    };
    if let Some(duration) = duration {
        out.single(
            DRAIN_DURATION,
            "Seconds the drain has taken: so far while it runs, to drained (or Envoy's stop) once over.",
            duration,
        );
    }
}

/// What the drain saw at its last read, and what Envoy was stopped with.
fn drain_counts(out: &mut Exposition, status: &Status) {
    let counts = [
        (
            DRAIN_ACTIVE_CONNECTIONS,
            "Envoy's active downstream connections at the drain's last read (agent listeners left out).",
            status.active_connections,
        ),
        (
            DRAIN_ACTIVE_REQUESTS,
            "Envoy's active downstream HTTP requests at the drain's last read (agent prefixes left out).",
            status.active_requests,
        ),
        (
            DRAIN_ACTIVE_TCP,
            "Envoy's active TCP-proxy (non-HTTP) connections at the drain's last read.",
            status.active_tcp,
        ),
        (
            DRAIN_APP_SOCKETS,
            "TCP sockets the app still held at the drain's last look (app-exit policy).",
            status.app_sockets,
        ),
        (
            DRAIN_APP_PROCESSES,
            "App processes still running at the drain's last look (app-exit policy, shared process namespace).",
            status.app_processes,
        ),
    ];
    for (name, help, value) in counts {
        if let Some(n) = value {
            out.single(name, help, n as f64);
        }
    }
    if status.duration_seconds.is_some() {
        out.single(
            DRAIN_CUT,
            "1 when the deadline came before the drain's policy was satisfied, 0 when not (a wait for the load balancers that ended at its bound with nothing left is lifeguard_drain_ended_at_wait_bound).",
            f64::from(u8::from(status.cut_by_deadline)),
        );
        out.single(
            DRAIN_AT_WAIT_BOUND,
            "1 when the wait for the load balancers' verdict ended at its bound (GET /drain's held_by says what it still waited for), 0 when not.",
            f64::from(u8::from(status.held_by.is_some())),
        );
    }
    if let Some(left) = status.left_at_stop {
        out.single(
            DRAIN_LEFT_AT_STOP,
            "What the policy counts (connections, requests, or work in flight and app sockets and processes) still active when Envoy was stopped.",
            left as f64,
        );
    }
}

/// The drain wait's families, from its published status: the budget
/// once a checker is learned; the checkers by state, and when each step
/// came, once the drain began. Values that do not exist yet have no series.
pub(super) fn drain_wait_families(out: &mut Exposition, wait: &DrainWaitStatus) {
    if let Some(budget) = &wait.budget {
        out.single(
            DRAIN_WAIT_BUDGET_FITS,
            "1 when the slowest learned checker's interval x threshold, the quiet period, the shutdown margin and (a sidecar's drain wait) the app's time fit the grace period, and the checker timeout waits for it; 0 when not (the log names the checker and what it needs).",
            f64::from(u8::from(budget.fits)),
        );
        out.single(
            DRAIN_WAIT_GRACE_NEEDED,
            "The grace period the slowest learned checker needs (lifeguard_drain_wait_budget_fits).",
            budget.needed_grace_period_seconds,
        );
    }
    if wait.state == WaitState::NotStarted {
        return;
    }
    out.gauge(
        DRAIN_WAIT_CHECKERS,
        "The checkers of the pod's readiness in the drain, by state: checking, failed (took the pod out), vanished (stopped probing), timed_out (let go at the checker timeout), seen_once, gone_before_drain.",
    );
    for state in CheckerState::all() {
        let n = wait.checkers.iter().filter(|c| c.counted && c.state == state).count();
        out.sample(DRAIN_WAIT_CHECKERS, &[("state", state.label())], n as f64);
    }
    let times = [
        (
            DRAIN_WAIT_CHECKERS_DONE_AFTER,
            "Seconds from the drain's start to when the last checker was done (took the pod out, stopped probing, or was let go).",
            wait.last_checker_done_after_seconds,
        ),
        (
            DRAIN_WAIT_TRAFFIC_STOPPED_AFTER,
            "Seconds from the drain's start to the read that last saw a new request on the counted listeners.",
            wait.traffic_stopped_after_seconds,
        ),
        (
            DRAIN_WAIT_OUT_AFTER,
            "Seconds from the drain's start to out of rotation (every checker done, no new request for the quiet period).",
            wait.took_seconds,
        ),
    ];
    for (name, help, value) in times {
        if let Some(v) = value {
            out.single(name, help, v);
        }
    }
}

/// The standard process families, read from /proc now.
pub(super) fn process_families(out: &mut Exposition) {
    let p = metrics_process::collector::collect();
    if let Some(cpu) = p.cpu_seconds_total {
        out.family(
            PROCESS_CPU,
            "counter",
            "Total user and system CPU time spent in seconds.",
        );
        out.sample(PROCESS_CPU, &[], cpu);
    }
    let gauges = [
        (PROCESS_RSS, "Resident memory size in bytes.", p.resident_memory_bytes),
        (PROCESS_VSZ, "Virtual memory size in bytes.", p.virtual_memory_bytes),
        (PROCESS_OPEN_FDS, "Number of open file descriptors.", p.open_fds),
        // 0 is how the collector says "unlimited": no series then.
        (
            PROCESS_MAX_FDS,
            "Maximum number of open file descriptors.",
            p.max_fds.filter(|&n| n > 0),
        ),
        (
            PROCESS_START,
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        ),
        (PROCESS_THREADS, "Number of OS threads in the process.", p.threads),
    ];
    for (name, help, value) in gauges {
        if let Some(v) = value {
            out.single(name, help, v as f64);
        }
    }
}

/// Prometheus text format 0.0.4, written by hand for the state families.
#[derive(Default)]
pub(super) struct Exposition(pub(super) String);

impl Exposition {
    pub(super) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub(super) fn gauge(&mut self, name: &str, help: &str) {
        self.family(name, "gauge", help);
    }

    /// A gauge family with one unlabelled sample.
    pub(super) fn single(&mut self, name: &str, help: &str, value: f64) {
        self.gauge(name, help);
        self.sample(name, &[], value);
    }

    /// Label values here are our own constants: nothing to escape.
    pub(super) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(self.0, "{sep}{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }
}
