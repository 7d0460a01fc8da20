//! The drain's port to the load balancers' verdict ([`Rotation`]) and its
//! vocabulary: who checks the pod ([`CheckerKey`]), what the wait for them
//! still waits for ([`WaitingOn`]), and how it ended ([`RotationVerdict`],
//! [`Conclusion`]). Values, put in words only where they are shown (`GET
//! /drain`, the log, the progress line). `lifeguard_drain_wait` implements
//! the port and fills these in; the drain reads them.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use lifeguard_base::duration::GoDuration;

use super::kubelet::Audience;

/// What the `out-of-rotation` policy (and another policy while the kubelet
/// follows Envoy) waits for: the verdict of the drain wait
/// (`lifeguard_drain_wait::DrainWait` is the real one), which applies its
/// rule from the moment readiness turns 503.
pub trait Rotation {
    /// Resolves once the pod is out of rotation, or once the wait gave up
    /// at its bound.
    fn verdict(&self) -> impl Future<Output = RotationVerdict> + Send;
    /// Resolves once the load balancers have let the pod go, whether or
    /// not their traffic has stopped: every checker the wait follows is
    /// done, and each load balancer declared to check the node has had
    /// its time since the drain began (`--load-balancer-checks`); at once
    /// when the wait gave up. What clients still send then comes on
    /// connections they keep: a gateway closes them (at a request
    /// boundary) from here, and they reconnect where the load balancers
    /// now send.
    fn let_go(&self) -> impl Future<Output = ()> + Send;
    /// What the wait still waits for (for the progress line).
    fn waiting_on(&self) -> WaitingOn;
}

/// For drains without a drain wait (tests of other policies; never in the
/// binary, so a drain the agent runs cannot lack its drain wait): no
/// verdict ever comes.
#[cfg(any(test, feature = "testing"))]
impl Rotation for () {
    async fn verdict(&self) -> RotationVerdict {
        std::future::pending().await
    }
    async fn let_go(&self) {
        std::future::pending().await
    }
    fn waiting_on(&self) -> WaitingOn {
        WaitingOn::FirstRead
    }
}

/// How the wait for the load balancers ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RotationVerdict {
    /// Every checker has taken the pod out and no new request came for the
    /// quiet period.
    Out(Conclusion),
    /// The wait's bound came first: what it was still waiting for.
    NotOut(WaitingOn),
}

/// Bytes of a `User-Agent` kept to tell checkers apart.
const AGENT_BYTES: usize = 40;

/// Who sent a probe: an address and the start of its `User-Agent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckerKey {
    /// The prober's address (for probes through Envoy's status listener,
    /// the one Envoy appended to `x-forwarded-for`).
    pub ip: IpAddr,
    /// The address came from `x-forwarded-for` (a probe through Envoy).
    pub forwarded: bool,
    agent: [u8; AGENT_BYTES],
    agent_len: u8,
}

impl CheckerKey {
    /// The checker at `ip` that sent `agent` (its first bytes are kept);
    /// None for the kubelet, which is not a load balancer.
    pub fn new(ip: IpAddr, forwarded: bool, agent: &[u8]) -> Option<CheckerKey> {
        if Audience::of_agent(Some(agent)) == Audience::Kubelet {
            return None;
        }
        let mut key = CheckerKey {
            ip,
            forwarded,
            agent: [0; AGENT_BYTES],
            agent_len: 0,
        };
        let n = agent.len().min(AGENT_BYTES);
        key.agent[..n].copy_from_slice(&agent[..n]);
        key.agent_len = n as u8;
        Some(key)
    }

    /// Whether `other` sent the same `User-Agent` (its first bytes).
    pub fn same_agent(&self, other: &CheckerKey) -> bool {
        self.agent[..self.agent_len as usize] == other.agent[..other.agent_len as usize]
    }

    /// The `User-Agent` as sent (its first bytes), if any.
    pub fn agent(&self) -> Option<String> {
        let agent = &self.agent[..self.agent_len as usize];
        (!agent.is_empty()).then(|| String::from_utf8_lossy(agent).into_owned())
    }

    /// The failed checks in a row after which this checker's software takes
    /// a host out, when the software fixes it: Envoy's active health
    /// checker (`Envoy/HC`) takes a host out at its first unexpected
    /// status (its `unhealthy_threshold` counts only network failures).
    pub fn fixed_threshold(&self) -> Option<u32> {
        self.agent[..self.agent_len as usize]
            .starts_with(b"Envoy/HC")
            .then_some(1)
    }
}

/// `10.0.0.5`, `10.0.0.5 (ELB-HealthChecker/2.0)`.
impl fmt::Display for CheckerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ip)?;
        match self.agent() {
            Some(agent) => write!(f, " ({agent})"),
            None => Ok(()),
        }
    }
}

/// What the wait for the load balancers still waits for, as of its last
/// read.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitingOn {
    /// Its first read.
    FirstRead,
    /// Before the drain: its start.
    DrainToBegin,
    /// The readiness-fail delay: readiness to turn 503.
    ReadinessToFail,
    /// Checkers still checking, and whether probers too many to follow
    /// hold the wait too.
    Checkers { pending: Vec<Pending>, unfollowed: bool },
    /// Probers too many to follow only, held until the checker timeout,
    /// `left` from the read.
    Unfollowed { left: Duration },
    /// No new request for `quiet`; none for `so_far` at the read.
    Quiet { quiet: Duration, so_far: Duration },
    /// Every checker is done; the load balancers of
    /// `--load-balancer-checks` may still send new connections for `left`
    /// (a gateway keeps its kept-alive connections open until then).
    DeclaredLetGo { left: Duration },
    /// The drain's deadline came before the verdict.
    Deadline,
    /// The wait ended (with Envoy) before its verdict.
    Ended,
}

/// A checker still checking, as the read found it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub key: CheckerKey,
    /// Counted among the checkers (false: the table had no room).
    pub counted: bool,
    pub failures_in_row: u32,
    /// Its threshold: the configured one, or its software's own.
    pub threshold: u32,
    pub interval: Duration,
}

impl WaitingOn {
    /// Whether load balancers that check the pod hold the wait (and what
    /// they still send is lost once Envoy stops), rather than the traffic
    /// or the time.
    pub fn is_checkers(&self) -> bool {
        matches!(
            self,
            WaitingOn::Checkers { .. } | WaitingOn::Unfollowed { .. } | WaitingOn::DeclaredLetGo { .. }
        )
    }

    /// What comes of stopping Envoy while the wait still waits for this,
    /// in words.
    pub fn consequence(&self) -> &'static str {
        match self.is_checkers() {
            true => "requests those load balancers still send are lost",
            false => "requests that still arrive once Envoy stops are refused",
        }
    }
}

/// A duration to the millisecond: words are for people.
fn ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

impl fmt::Display for WaitingOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitingOn::FirstRead => f.write_str("the drain wait's first read"),
            WaitingOn::DrainToBegin => f.write_str("the drain to begin (the proxy's SIGTERM or POST /drain)"),
            WaitingOn::ReadinessToFail => f.write_str("readiness to turn 503 (--readiness-fail-delay)"),
            WaitingOn::Checkers { pending, unfollowed } => {
                let noun = if pending.len() == 1 { "checker" } else { "checkers" };
                write!(f, "{} {noun}: ", pending.len())?;
                for (i, c) in pending.iter().enumerate() {
                    write!(
                        f,
                        "{}{}{} ({} of {} failures in a row, every {})",
                        if i > 0 { ", " } else { "" },
                        c.key,
                        if c.counted { "" } else { " [not counted: no room]" },
                        c.failures_in_row,
                        c.threshold,
                        GoDuration(ms(c.interval))
                    )?;
                }
                if *unfollowed {
                    f.write_str("; and probers too many to follow")?;
                }
                Ok(())
            }
            WaitingOn::Unfollowed { left } => write!(
                f,
                "probers whose probes were not counted and too many to follow (a flood of agents?): held until the checker timeout, {} from now",
                GoDuration(ms(*left))
            ),
            WaitingOn::Quiet { quiet, so_far } => write!(
                f,
                "no new request for {} (none for {} so far)",
                GoDuration(ms(*quiet)),
                GoDuration(ms(*so_far))
            ),
            WaitingOn::DeclaredLetGo { left } => write!(
                f,
                "the load balancers of --load-balancer-checks to let the pod go ({} left)",
                GoDuration(ms(*left))
            ),
            WaitingOn::Deadline => f.write_str("the drain wait's verdict, by the deadline"),
            WaitingOn::Ended => f.write_str("the drain wait, which has ended"),
        }
    }
}

lifeguard_base::serialize_as_display!(WaitingOn);

/// Why the pod is out of rotation: how each checker ended, and the quiet
/// period the traffic kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Conclusion {
    /// Counted checkers that failed their threshold of probes in a row.
    pub failed: usize,
    /// Counted checkers that stopped probing.
    pub vanished: usize,
    /// Counted checkers let go at the checker timeout.
    pub timed_out: usize,
    /// Probers not counted (no room) that failed, stopped or timed out.
    pub uncounted: usize,
    /// Probers too many to follow held the wait for the checker timeout.
    pub unfollowed: bool,
    /// No new request came for this long.
    pub quiet: Duration,
}

impl fmt::Display for Conclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (n, words) in [
            (self.failed, "failed its threshold of probes in a row"),
            (self.vanished, "stopped probing"),
            (self.timed_out, "held the wait for the checker timeout"),
        ] {
            match n {
                0 => {}
                1 => parts.push(format!("1 checker {words}")),
                n => parts.push(format!("{n} checkers {}", words.replace(" its ", " their "))),
            }
        }
        if self.uncounted > 0 || self.unfollowed {
            parts.push(format!(
                "{} prober{} whose probes were not counted (no room) failed, stopped or timed out{}",
                self.uncounted,
                if self.uncounted == 1 { "" } else { "s" },
                if self.unfollowed {
                    ", and probers too many to follow held the wait for the checker timeout"
                } else {
                    ""
                }
            ));
        }
        match parts.len() {
            0 => f.write_str("no load balancer was seen checking the pod")?,
            _ => f.write_str(&parts.join(", "))?,
        }
        write!(f, ", and no new request came for {}", GoDuration(ms(self.quiet)))
    }
}

lifeguard_base::serialize_as_display!(Conclusion);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checker_is_named_by_its_address_and_agent_and_the_kubelet_is_none() {
        let ip = IpAddr::from([10, 0, 0, 5]);
        let elb = CheckerKey::new(ip, true, b"ELB-HealthChecker/2.0").unwrap();
        assert_eq!(elb.to_string(), "10.0.0.5 (ELB-HealthChecker/2.0)");
        assert_eq!(CheckerKey::new(ip, false, b"").unwrap().to_string(), "10.0.0.5");
        assert_eq!(CheckerKey::new(ip, false, b"kube-probe/1.34"), None);
        assert_eq!(
            CheckerKey::new(ip, false, b"Envoy/HC").unwrap().fixed_threshold(),
            Some(1)
        );
        assert_eq!(elb.fixed_threshold(), None);
        let long = [b'a'; 100];
        assert_eq!(
            CheckerKey::new(ip, false, &long).unwrap().agent().unwrap().len(),
            AGENT_BYTES
        );
    }

    #[test]
    fn a_conclusion_says_how_each_checker_ended() {
        let quiet = Duration::from_millis(500);
        assert_eq!(
            Conclusion {
                quiet,
                ..Conclusion::default()
            }
            .to_string(),
            "no load balancer was seen checking the pod, and no new request came for 500ms"
        );
        let c = Conclusion {
            failed: 2,
            vanished: 1,
            quiet,
            ..Conclusion::default()
        };
        assert_eq!(
            c.to_string(),
            "2 checkers failed their threshold of probes in a row, 1 checker stopped probing, and no new request came for 500ms"
        );
    }
}
