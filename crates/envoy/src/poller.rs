//! The background task that keeps the readiness snapshot fresh.
//!
//! Two reads, chosen so that lifeguard's cost to Envoy does not grow with
//! Envoy's config once the pod is ready:
//!
//! - **Until the first ready, and whenever `/ready` stops saying LIVE**: the
//!   full check. `GET /ready` and the readiness stats
//!   ([`READINESS_STATS`]: `server.state`, `workers_started`, the
//!   first CDS/LDS updates). Ready needs both. The stats give the reason
//!   when not ready; `/ready` wins when the stats say ready and it does not
//!   (after `/healthcheck/fail`, `server.state` stays 0 while `/ready` says
//!   DRAINING). A stats read is matched against every stat Envoy has: its
//!   cost grows with the config (docs/drain.md gives Envoy's figures).
//! - **Once ready (steady state)**: `GET /ready` alone — a constant cost
//!   at any size, and it does not lag the stats flush. LIVE keeps the pod ready.
//!   Any other state name flips at once (and the full check runs again).
//!
//! No flap from slowness: a read that times out says nothing new about
//! Envoy (its admin thread may be busy with a long `/stats/prometheus`), so
//! a ready answer is kept, until it is older than the staleness bound
//! ([`Readiness::answer`] then says 503, naming the timeout). A hung or
//! dead Envoy is therefore detected within that bound, never before. One
//! exception, lifeguard's own doing: while lifeguard's merged-scrape read
//! waits on Envoy or Envoy streams it ([`Heartbeat`]), Envoy's admin thread
//! is busy with that read (admin requests are served one at a time), and the
//! kept answer is dated from the last beat; a read vouches for Envoy for its
//! first client's scrape timeout at most (30 s at most), so a hung Envoy is
//! then seen within that plus the staleness bound, and an answer gone stale
//! is never revived by a beat. A definite answer — connection refused, an error
//! status, a state other than LIVE — flips at once. Kept answers and flips
//! are counted (`lifeguard_readiness_kept_total`,
//! `lifeguard_envoy_readiness_changes_total`) and logged, once per change or
//! per run of timeouts.
//!
//! If `/ready` answers something that is not one of Envoy's state names
//! (an old or a fake admin), the stats decide, every poll.
//!
//! It reads every poll interval while ready, every startup poll interval
//! while not, and never stops asking: unlike an agent that trusts Envoy
//! forever after the first success, a hung or dead Envoy turns readiness to
//! 503 here. Envoy is reached through [`EnvoyReadiness`], so the
//! transitions are unit-tested in virtual time against a scripted Envoy.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminClient, AdminError, Endpoint, STATS_LIMIT};
use crate::readiness::{Readiness, Verdict};
use crate::state::{evaluate, ReadyAnswer, ServerState, XdsCheck, READINESS_STATS, SERVER_STATE};
use crate::stats::{self, StatValue};
use lifeguard_drain::Patience;

/// The two reads the poller makes. [`AdminClient`] is the real one.
pub trait EnvoyReadiness {
    /// `GET /ready`.
    fn ready(&self) -> impl Future<Output = Result<ReadyAnswer, AdminError>> + Send;
    /// `GET` [`READINESS_STATS`]: the body of a 200, waited for as
    /// `patience` says.
    fn readiness_stats(&self, patience: Patience) -> impl Future<Output = Result<String, AdminError>> + Send;
}

/// Largest `/ready` answer read (Envoy's is a state name).
const READY_LIMIT: usize = 4096;

impl EnvoyReadiness for AdminClient {
    async fn ready(&self) -> Result<ReadyAnswer, AdminError> {
        let (status, body) = self.get_any(Endpoint::Ready, "/ready", READY_LIMIT).await?;
        Ok(ReadyAnswer::parse(status, &body))
    }

    async fn readiness_stats(&self, patience: Patience) -> Result<String, AdminError> {
        self.patient(patience)
            .get_text(Endpoint::Stats, READINESS_STATS, STATS_LIMIT)
            .await
    }
}

/// What the poller tells of its reads, for the metrics (which implement
/// it): the poller knows nothing of them.
pub trait ReadinessEvents: Send + 'static {
    /// One read: whether Envoy answered at all, and whether it said ready.
    fn envoy_read(&self, answered: bool, ready: bool);
    /// The readiness answer changed (a read's verdict, or the kept answer
    /// going stale).
    fn readiness_changed(&self, ready: bool);
    /// A read timed out and the last answer was kept.
    fn readiness_kept(&self);
}

/// For tests and benchmarks that count nothing.
impl ReadinessEvents for () {
    fn envoy_read(&self, _: bool, _: bool) {}
    fn readiness_changed(&self, _: bool) {}
    fn readiness_kept(&self) {}
}

/// Evidence that Envoy's admin thread is alive while it is busy: the
/// instant it last sent lifeguard a chunk of `/stats/prometheus`. Written
/// by the merged scrape, read by the poller when `/ready` times out.
#[derive(Clone, Default)]
pub struct Heartbeat(Arc<Mutex<Option<Instant>>>);

impl Heartbeat {
    pub fn beat(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    pub(crate) fn last(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// When the poller reads, and what ready requires.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub poll_interval: Duration,
    pub startup_poll_interval: Duration,
    pub xds_check: XdsCheck,
}

/// Runs until `shutdown` is cancelled.
pub async fn run<E: EnvoyReadiness, M: ReadinessEvents>(
    schedule: Schedule,
    envoy: E,
    readiness: Readiness,
    events: M,
    heartbeat: Heartbeat,
    shutdown: CancellationToken,
) {
    let mut poller = Poller {
        schedule,
        envoy,
        readiness,
        events,
        heartbeat,
        timeouts: 0,
        stats_patience: Patience::default(),
        stale_logged: false,
    };
    loop {
        let pause = tokio::select! {
            _ = shutdown.cancelled() => return,
            pause = poller.poll() => pause,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// What one poll found.
enum Found {
    /// A definite answer, and the server state it showed (if any).
    Verdict(Verdict, Option<u64>),
    /// No answer in time: nothing new is known.
    TimedOut(AdminError),
}

struct Poller<E, M> {
    schedule: Schedule,
    envoy: E,
    readiness: Readiness,
    events: M,
    heartbeat: Heartbeat,
    /// Reads that timed out in a row.
    timeouts: u32,
    /// How long the next readiness stats read is waited for: longer after
    /// reads that timed out, the admin timeout after any other answer.
    stats_patience: Patience,
    /// Whether the kept answer's going stale has been logged.
    stale_logged: bool,
}

impl<E: EnvoyReadiness, M: ReadinessEvents> Poller<E, M> {
    /// One poll; returns the pause before the next.
    async fn poll(&mut self) -> Duration {
        let previous = self.readiness.verdict();
        let was_ready = previous.is_ready();
        let found = match self.envoy.ready().await {
            Ok(ReadyAnswer::State(state)) if was_ready && self.live(state) => {
                Found::Verdict(Verdict::ready(Instant::now()), Some(ServerState::Live as u64))
            }
            Err(e) if was_ready && e.is_timeout() => Found::TimedOut(e),
            answer => self.full_check(answer).await,
        };
        match found {
            Found::Verdict(verdict, server_state) => {
                if self.timeouts > 0 {
                    tracing::info!(timeouts = self.timeouts, "Envoy's admin answers again");
                }
                self.timeouts = 0;
                let was_stale = std::mem::take(&mut self.stale_logged);
                self.events.envoy_read(server_state.is_some(), verdict.is_ready());
                self.store(verdict, was_stale);
            }
            Found::TimedOut(error) if was_ready => {
                self.timeouts += 1;
                self.events.readiness_kept();
                // Envoy busy with our own scrape read since is proof of
                // life; once the kept answer has gone stale, only an answer
                // from Envoy makes it fresh again.
                let at = match self.heartbeat.last() {
                    Some(beat) if beat > previous.at() && !self.stale_logged => beat,
                    _ => previous.at(),
                };
                let stale_after = self.readiness.stale_after();
                let stale = at.elapsed() > stale_after;
                if self.timeouts == 1 {
                    tracing::warn!(
                        error = %error,
                        "Envoy's admin did not answer; keeping the last answer until it is older than {}",
                        lifeguard_base::duration::GoDuration(stale_after)
                    );
                }
                if stale && !self.stale_logged {
                    self.stale_logged = true;
                    self.events.readiness_changed(false);
                    tracing::warn!(
                        reason = %error,
                        "Envoy is NOT ready: no successful admin read in the last {}",
                        lifeguard_base::duration::GoDuration(stale_after)
                    );
                }
                self.readiness
                    .store(Verdict::kept(&previous, &error.to_string(), stale_after, at));
            }
            Found::TimedOut(error) => {
                self.timeouts += 1;
                self.events.envoy_read(false, false);
                self.store(Verdict::not_ready(&error.to_string(), Instant::now()), false);
            }
        }
        if self.readiness.verdict().is_ready() {
            self.schedule.poll_interval
        } else {
            self.schedule.startup_poll_interval
        }
    }

    /// Whether `/ready`'s state says Envoy is live. Once a drain has
    /// begun, DRAINING is the drain wait's own doing (`/healthcheck/fail`
    /// fails the load balancers' checks; `server.state` stays LIVE): Envoy
    /// still serves, which the kubelet's answer follows while the pod
    /// terminates. A state the drain cannot cause (initializing) is not.
    fn live(&self, state: ServerState) -> bool {
        match state {
            ServerState::Live => true,
            ServerState::Draining => self.readiness.drain_begun(),
            ServerState::PreInitializing | ServerState::Initializing => false,
        }
    }

    /// The full check: the readiness stats, with `/ready`'s answer.
    async fn full_check(&mut self, ready: Result<ReadyAnswer, AdminError>) -> Found {
        let xds = self.schedule.xds_check;
        let not_live = match &ready {
            Ok(ReadyAnswer::State(s)) if !self.live(*s) => Some(*s),
            _ => None,
        };
        let from_ready = |s: ServerState| {
            Found::Verdict(
                Verdict::not_ready(&format!("Envoy's /ready says {}", s.name()), Instant::now()),
                Some(s as u64),
            )
        };
        let stats = self.envoy.readiness_stats(self.stats_patience).await;
        match &stats {
            Err(e) if e.is_timeout() => self.stats_patience.timed_out(),
            _ => self.stats_patience.reset(),
        }
        match stats {
            Ok(body) => {
                let state = match stats::find(&body, SERVER_STATE) {
                    Some(StatValue::Number(n)) => Some(n),
                    _ => None,
                };
                let verdict = evaluate(&body, xds, Instant::now());
                match (verdict.is_ready(), not_live, ready) {
                    (false, _, _) => Found::Verdict(verdict, state),
                    (true, Some(s), _) => from_ready(s),
                    (true, None, Err(e)) if e.is_timeout() => Found::TimedOut(e),
                    (true, None, _) => Found::Verdict(verdict, state),
                }
            }
            Err(e) => match not_live {
                Some(s) => from_ready(s),
                None if e.is_timeout() => Found::TimedOut(e),
                None => Found::Verdict(Verdict::not_ready(&e.to_string(), Instant::now()), None),
            },
        }
    }

    /// Stores a definite verdict; logs and counts a change. `was_stale`:
    /// the kept answer before it had gone stale (the probe said 503).
    fn store(&mut self, verdict: Verdict, was_stale: bool) {
        let ready = verdict.is_ready();
        let previous = self.readiness.store(verdict);
        let current = self.readiness.verdict();
        let served_ready = previous.is_ready() && !was_stale;
        if served_ready != ready {
            self.events.readiness_changed(ready);
        }
        if previous.text() != current.text() || (was_stale && ready) {
            if ready {
                tracing::info!("Envoy is ready");
            } else if self.readiness.is_draining() {
                // Envoy not ready while it drains: news, not a fault.
                tracing::info!(reason = current.text(), "Envoy is not ready (the drain has begun)");
            } else {
                tracing::warn!(reason = current.text(), "Envoy is NOT ready");
            }
        }
    }
}

#[cfg(test)]
mod schedule_tests {
    //! The poller in virtual time (`start_paused`) against a scripted
    //! Envoy whose answers are functions of the time since the test began.

    use std::sync::{Arc, Mutex};

    use super::*;
    use hyper::StatusCode;

    const LIVE_STATS: &str = "listener_manager.workers_started: 1\nserver.state: 0\n";
    /// Poll every 1 s, 100 ms while not ready, admin timeout 1 s: stale after 4 s.
    const STALE: Duration = Duration::from_secs(4);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    type Answer<T> = (Duration, Result<T, AdminError>);

    struct Script {
        t0: Instant,
        ready: Box<dyn Fn(Duration) -> Answer<ReadyAnswer> + Send + Sync>,
        stats: Box<dyn Fn(Duration) -> Answer<String> + Send + Sync>,
        calls: Mutex<Vec<(Duration, &'static str)>>,
    }

    #[derive(Clone)]
    struct Envoy(Arc<Script>);

    impl EnvoyReadiness for Envoy {
        async fn ready(&self) -> Result<ReadyAnswer, AdminError> {
            let t = self.0.t0.elapsed();
            self.0.calls.lock().unwrap().push((t, "ready"));
            let (delay, answer) = (self.0.ready)(t);
            tokio::time::sleep(delay).await;
            answer
        }

        /// The script's answer, or a timeout at the admin timeout (1 s)
        /// as `patience` stretches it, when it comes later.
        async fn readiness_stats(&self, patience: Patience) -> Result<String, AdminError> {
            let t = self.0.t0.elapsed();
            self.0.calls.lock().unwrap().push((t, "stats"));
            let (delay, answer) = (self.0.stats)(t);
            let waited = patience.timeout(secs(1.0));
            if delay > waited {
                tokio::time::sleep(waited).await;
                return Err(AdminError::Timeout {
                    url: "http://127.0.0.1:15000".into(),
                    timeout: waited,
                });
            }
            tokio::time::sleep(delay).await;
            answer
        }
    }

    impl Envoy {
        fn new(
            ready: impl Fn(Duration) -> Answer<ReadyAnswer> + Send + Sync + 'static,
            stats: impl Fn(Duration) -> Answer<String> + Send + Sync + 'static,
        ) -> Self {
            Envoy(Arc::new(Script {
                t0: Instant::now(),
                ready: Box::new(ready),
                stats: Box::new(stats),
                calls: Mutex::new(Vec::new()),
            }))
        }

        fn last_call_before(&self, what: &str, t: f64) -> Duration {
            let calls = self.0.calls.lock().unwrap();
            calls
                .iter()
                .filter(|(at, w)| *w == what && *at < secs(t))
                .map(|(at, _)| *at)
                .max()
                .unwrap()
        }

        fn stats_calls_between(&self, from: f64, to: f64) -> usize {
            let calls = self.0.calls.lock().unwrap();
            calls
                .iter()
                .filter(|(t, what)| *what == "stats" && *t >= secs(from) && *t < secs(to))
                .count()
        }
    }

    fn state(s: ServerState) -> Answer<ReadyAnswer> {
        (secs(0.0005), Ok(ReadyAnswer::State(s)))
    }

    fn live_stats() -> Answer<String> {
        (secs(0.05), Ok(LIVE_STATS.to_owned()))
    }

    /// `/ready` says `before` until `at` seconds, `after` from then.
    fn state_until(
        at: f64,
        before: ServerState,
        after: ServerState,
    ) -> impl Fn(Duration) -> Answer<ReadyAnswer> + Send + Sync + 'static {
        move |t| state(if t < secs(at) { before } else { after })
    }

    /// An Envoy LIVE, its stats too, whose `/ready` says DRAINING from
    /// `at` seconds (`/healthcheck/fail`: `server.state` stays 0).
    fn draining_from(at: f64) -> Envoy {
        Envoy::new(state_until(at, ServerState::Live, ServerState::Draining), |_| {
            live_stats()
        })
    }

    fn timeout<T>() -> Answer<T> {
        (
            secs(1.0),
            Err(AdminError::Timeout {
                url: "http://127.0.0.1:15000".into(),
                timeout: secs(1.0),
            }),
        )
    }

    fn refused<T>() -> Answer<T> {
        (
            Duration::ZERO,
            Err(AdminError::Connect {
                url: "http://127.0.0.1:15000".into(),
                source: std::io::ErrorKind::ConnectionRefused.into(),
            }),
        )
    }

    struct Running {
        readiness: Readiness,
        heartbeat: Heartbeat,
        t0: Instant,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    impl Running {
        /// Whether the probe says ready at `t` seconds since the start.
        async fn ready_at(&self, t: f64) -> bool {
            tokio::time::sleep_until(self.t0 + secs(t)).await;
            self.readiness.answer(crate::readiness::Audience::LoadBalancer).ready
        }

        async fn body_at(&self, t: f64) -> String {
            tokio::time::sleep_until(self.t0 + secs(t)).await;
            String::from_utf8(
                self.readiness
                    .answer(crate::readiness::Audience::LoadBalancer)
                    .body
                    .to_vec(),
            )
            .unwrap()
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.task.await.unwrap();
        }
    }

    fn start(envoy: &Envoy) -> Running {
        start_with(envoy, lifeguard_drain::PhaseCell::serving())
    }

    fn start_with(envoy: &Envoy, phase: lifeguard_drain::PhaseCell) -> Running {
        let readiness = Readiness::new(STALE, phase);
        let heartbeat = Heartbeat::default();
        let shutdown = CancellationToken::new();
        let schedule = Schedule {
            poll_interval: secs(1.0),
            startup_poll_interval: secs(0.1),
            xds_check: XdsCheck::Auto,
        };
        let task = tokio::spawn(run(
            schedule,
            envoy.clone(),
            readiness.clone(),
            (),
            heartbeat.clone(),
            shutdown.clone(),
        ));
        Running {
            readiness,
            heartbeat,
            t0: envoy.0.t0,
            shutdown,
            task,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn stats_until_the_first_ready_then_only_ready() {
        // Envoy initializes for 2 s, then is live.
        let envoy = Envoy::new(state_until(2.0, ServerState::PreInitializing, ServerState::Live), |t| {
            if t < secs(2.0) {
                (secs(0.05), Ok("server.state: 2\n".into()))
            } else {
                live_stats()
            }
        });
        let p = start(&envoy);
        assert!(p.body_at(1.0).await.contains("PRE_INITIALIZING"));
        assert!(p.ready_at(2.2).await, "ready within a startup poll of Envoy");
        let at_ready = envoy.stats_calls_between(0.0, 2.2);
        assert!(at_ready >= 15, "the full check ran every 100 ms: {at_ready}");
        // Steady state: 60 s of polls, not one stats read.
        assert!(p.ready_at(62.0).await);
        assert_eq!(envoy.stats_calls_between(2.2, 62.0), 0);
        p.stop().await;
    }

    /// An Envoy so large, on a node so busy, that its readiness stats take
    /// 2.5 s to answer (more than the 1 s admin timeout): each read that
    /// timed out is followed by one waiting twice as long, so the pod gets
    /// ready; then `/ready` alone, as ever.
    #[tokio::test(start_paused = true)]
    async fn a_readiness_stats_read_that_times_out_is_waited_for_longer_until_it_answers() {
        let envoy = Envoy::new(|_| state(ServerState::Live), |_| (secs(2.5), Ok(LIVE_STATS.to_owned())));
        let p = start(&envoy);
        assert!(!p.ready_at(2.9).await, "two reads cut at 1 s and 2 s");
        assert!(p.body_at(2.9).await.contains("did not answer within 1s"));
        assert!(p.ready_at(6.0).await, "the third read waits 4 s and gets its answer");
        assert_eq!(envoy.stats_calls_between(0.0, 6.0), 3);
        assert!(p.ready_at(30.0).await);
        assert_eq!(envoy.stats_calls_between(6.0, 30.0), 0);
        p.stop().await;
    }

    /// Once a drain has begun, Envoy's DRAINING is the drain wait's own
    /// `/healthcheck/fail`: Envoy still serves, and the kubelet's answer
    /// (while the pod terminates) says so, with no stats read.
    #[tokio::test(start_paused = true)]
    async fn draining_after_the_drain_began_is_the_drains_own_doing_and_keeps_envoy_ready() {
        use lifeguard_drain::{KubeletAnswer, Phase};
        let envoy = draining_from(10.0);
        let cell = lifeguard_drain::PhaseCell::serving();
        let p = start_with(&envoy, cell.clone());
        assert!(p.ready_at(9.0).await);
        cell.set(Phase::Draining, Some(KubeletAnswer::FollowsEnvoy));
        let kubelet = crate::readiness::Audience::Kubelet;
        for t in 10..20 {
            tokio::time::sleep_until(p.t0 + secs(f64::from(t) + 0.5)).await;
            assert!(p.readiness.answer(kubelet).ready, "{t}");
            assert!(p.readiness.verdict().is_ready(), "{t}");
        }
        assert_eq!(envoy.stats_calls_between(9.0, 20.0), 0, "no stats read for it");
        p.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_other_than_live_flips_at_once_and_the_full_check_resumes() {
        // LIVE until 10 s, then DRAINING (/healthcheck/fail): server.state stays 0.
        let envoy = draining_from(10.0);
        let p = start(&envoy);
        assert!(p.ready_at(9.9).await);
        let body = p.body_at(11.1).await;
        assert_eq!(body, "not ready: Envoy's /ready says DRAINING\n");
        assert!(envoy.stats_calls_between(10.0, 11.1) >= 1, "the full check runs again");
        // It stays not ready though the stats say LIVE: no flap.
        for t in 12..20 {
            assert!(!p.ready_at(f64::from(t)).await, "{t}");
        }
        p.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_keep_the_answer_until_it_is_stale_and_no_longer() {
        // Envoy's admin is busy from 10 s to 12.5 s (a 2.5 s scrape: a read
        // waits until then, or times out after 1 s), then answers; from
        // 20 s it hangs for good.
        let envoy = Envoy::new(
            |t| {
                if t >= secs(20.0) {
                    timeout()
                } else if t >= secs(10.0) && t < secs(12.5) {
                    let wait = secs(12.5) - t;
                    if wait > secs(1.0) {
                        timeout()
                    } else {
                        (wait, Ok(ReadyAnswer::State(ServerState::Live)))
                    }
                } else {
                    state(ServerState::Live)
                }
            },
            |_| live_stats(),
        );
        let p = start(&envoy);
        // Every 100 ms from 9 s to 14 s: ready all along (no flap).
        for i in 0..50 {
            let t = 9.0 + f64::from(i) * 0.1;
            assert!(p.ready_at(t).await, "flapped at {t}s");
        }
        // Hung from 20 s: the last answer (the last read started before
        // 20 s, 0.5 ms later) is trusted up to the bound...
        tokio::time::sleep_until(p.t0 + secs(20.0)).await;
        let last_ok = envoy.last_call_before("ready", 20.0).as_secs_f64() + 0.0005;
        eprintln!("last answer at {last_ok:.4}s");
        assert!(
            p.ready_at(last_ok + STALE.as_secs_f64() - 0.1).await,
            "503 before the bound"
        );
        // ...and not after it, naming the timeout.
        let body = p.body_at(last_ok + STALE.as_secs_f64() + 0.1).await;
        assert!(
            body.starts_with("not ready: no successful Envoy admin read in the last 4s")
                && body.contains("did not answer within 1s"),
            "{body}"
        );
        p.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_connection_flips_at_once() {
        let envoy = Envoy::new(
            |t| {
                if t < secs(5.0) {
                    state(ServerState::Live)
                } else {
                    refused()
                }
            },
            |t| if t < secs(5.0) { live_stats() } else { refused() },
        );
        let p = start(&envoy);
        assert!(p.ready_at(4.9).await);
        let body = p.body_at(6.01).await;
        assert!(body.contains("cannot connect to Envoy admin"), "{body}");
        p.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn envoy_streaming_a_scrape_is_proof_of_life_while_ready_times_out() {
        // /ready times out from 5 s to 15 s, while Envoy streams a scrape.
        let envoy = Envoy::new(
            |t| {
                if t >= secs(5.0) && t < secs(15.0) {
                    timeout()
                } else {
                    state(ServerState::Live)
                }
            },
            |_| live_stats(),
        );
        let p = start(&envoy);
        let beats = {
            let heartbeat = p.heartbeat.clone();
            let t0 = p.t0;
            tokio::spawn(async move {
                tokio::time::sleep_until(t0 + secs(5.0)).await;
                while t0.elapsed() < secs(15.0) {
                    heartbeat.beat();
                    tokio::time::sleep(secs(0.2)).await;
                }
            })
        };
        for t in 5..17 {
            assert!(p.ready_at(f64::from(t)).await, "{t}");
        }
        beats.await.unwrap();
        p.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrecognized_ready_answer_leaves_the_decision_to_the_stats() {
        let envoy = Envoy::new(
            |_| {
                (
                    secs(0.001),
                    Ok(ReadyAnswer::parse(StatusCode::OK, b"server.state: 0\n")),
                )
            },
            |t| {
                if t < secs(5.0) {
                    live_stats()
                } else {
                    (secs(0.01), Ok("server.state: 18446744073709551615\n".into()))
                }
            },
        );
        let p = start(&envoy);
        assert!(p.ready_at(4.0).await);
        assert!(p.body_at(6.1).await.contains("impossible value"));
        p.stop().await;
    }

    #[test]
    fn ready_answers() {
        let parse = |code: u16, body: &str| ReadyAnswer::parse(StatusCode::from_u16(code).unwrap(), body.as_bytes());
        assert_eq!(parse(200, "LIVE\n"), ReadyAnswer::State(ServerState::Live));
        assert_eq!(parse(503, "DRAINING\n"), ReadyAnswer::State(ServerState::Draining));
        assert_eq!(
            parse(503, "PRE_INITIALIZING\n"),
            ReadyAnswer::State(ServerState::PreInitializing)
        );
        assert_eq!(
            parse(503, "INITIALIZING\n"),
            ReadyAnswer::State(ServerState::Initializing)
        );
        assert!(matches!(parse(200, "DRAINING"), ReadyAnswer::Unrecognized(_)));
        assert!(matches!(parse(503, "LIVE"), ReadyAnswer::Unrecognized(_)));
        assert!(matches!(parse(404, "not found"), ReadyAnswer::Unrecognized(_)));
    }
}
