//! The gateway overlays played as their load balancers would play them:
//! the load balancer of `tests/common/lb.rs` and `tests/common/nodes.rs`
//! configured from an overlay's own rendered annotations (`kubectl
//! kustomize`, as the operator renders it), lifeguard from the overlay's
//! own container env, the kubelet's probe from its own readinessProbe.
//! What a user would check: a rolling restart behind the `aws-nlb-instance`
//! overlay's NLB loses no request; the same NLB left to reset an unhealthy
//! target's connections (its default, which the overlay turns off) loses
//! some, so the model catches an overlay that would reset a draining node;
//! a rolling restart behind the `metallb` overlay's announcer loses none;
//! and the shipped gateway keeps its kept-alive connections open from the
//! drain's start until the load balancers have let it go, then closes them
//! at a request boundary. Needs root, HAProxy, kubectl and Envoy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_norway::Value;

use common::lb::{gateway_at, secs, Check, Client, Lan, Sent};
use common::nodes::{node_rolling_restart, NodeRollout, NodeRun, NodeWay, ProbeSpec};
use common::pod::{signal, Gateway, GATEWAY_PORT};
use common::{kustomize, root, wait_for};

/// One busy rolling restart at a time in this process (nextest runs each
/// test in its own, in the `rolling-restart` group).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// An overlay's rendering.
fn render(overlay: &str) -> Vec<Value> {
    kustomize(&overlay_dir(overlay))
}

fn overlay_dir(overlay: &str) -> PathBuf {
    root().join("config/k8s/gateway/overlays").join(overlay)
}

fn doc<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// The Service's annotation `service.beta.kubernetes.io/aws-load-balancer-{key}`.
fn aws_annotation<'a>(docs: &'a [Value], key: &str) -> Option<&'a str> {
    doc(docs, "Service")["metadata"]["annotations"]
        [format!("service.beta.kubernetes.io/aws-load-balancer-{key}").as_str()]
    .as_str()
}

/// The target group attribute `name` the Service's annotation sets.
fn target_group_attribute<'a>(docs: &'a [Value], name: &str) -> Option<&'a str> {
    aws_annotation(docs, "target-group-attributes")?
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim() == name)
        .map(|(_, value)| value.trim())
}

/// The NLB's checks of its targets, as the overlay's annotations set them,
/// and what it does to an unhealthy target's connections: it resets them
/// unless `target_health_state.unhealthy.connection_termination.enabled`
/// is false (true is the NLB's default; the AWS Load Balancer Controller's
/// docs/guide/service/annotations.md, "target-group-attributes").
fn nlb_check(docs: &[Value]) -> Check {
    let number = |key: &str| -> u64 {
        aws_annotation(docs, key)
            .unwrap_or_else(|| panic!("the overlay sets no {key}"))
            .parse()
            .unwrap_or_else(|e| panic!("{key}: {e}"))
    };
    let terminates = target_group_attribute(docs, "target_health_state.unhealthy.connection_termination.enabled")
        .is_none_or(|v| v != "false");
    Check {
        inter: Duration::from_secs(number("healthcheck-interval")),
        fall: number("healthcheck-unhealthy-threshold") as u32,
        rise: number("healthcheck-healthy-threshold") as u32,
        terminates,
    }
}

/// The gateway pod's proxy container.
fn proxy(docs: &[Value]) -> &Value {
    &doc(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
}

/// lifeguard's flags for the proxy container's env: each setting the
/// overlay gives lifeguard, as the flag of the same setting. The log
/// format (JSON, for a log pipeline) and the linger (for a scrape no test
/// makes) are the kit's own: neither changes what the load balancers see.
fn lifeguard_args(docs: &[Value]) -> Vec<String> {
    let mut args = Vec::new();
    for e in proxy(docs)["env"].as_sequence().unwrap() {
        let (name, value) = (e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
        let flag = match name {
            "LIFEGUARD_LOG_FORMAT" | "LIFEGUARD_LINGER" => continue,
            "TERMINATION_GRACE_PERIOD" => "--termination-grace-period",
            "LIFEGUARD_DRAIN_SCOPE" => "--drain-scope",
            "LIFEGUARD_LOAD_BALANCER_CHECKS" => "--load-balancer-checks",
            "LIFEGUARD_DRAIN_WAIT_UNHEALTHY_THRESHOLD" => "--drain-wait-unhealthy-threshold",
            "LIFEGUARD_DRAIN_WAIT_CHECKER_TIMEOUT" => "--drain-wait-checker-timeout",
            "LIFEGUARD_TERMINATING_READINESS" => "--terminating-readiness",
            "LIFEGUARD_KUBELET_PROBE" => "--kubelet-probe",
            other => panic!("the overlay sets {other}: give it its flag here"),
        };
        args.extend([flag.to_owned(), value.to_owned()]);
    }
    args
}

/// The pod's grace period.
fn grace(docs: &[Value]) -> Duration {
    let seconds = doc(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    Duration::from_secs(seconds)
}

/// The kubelet's readiness probe of the proxy, as the Deployment sets it.
fn kubelet_probe(docs: &[Value]) -> ProbeSpec {
    let probe = &proxy(docs)["readinessProbe"];
    let seconds =
        |key: &str| Duration::from_secs(probe[key].as_u64().unwrap_or_else(|| panic!("readinessProbe.{key}")));
    ProbeSpec {
        period: seconds("periodSeconds"),
        failure_threshold: probe["failureThreshold"].as_u64().expect("failureThreshold") as u32,
        timeout: seconds("timeoutSeconds"),
    }
}

/// Clients as an NLB's: connections kept alive (each stays with the node it
/// reached), and every 20th request a slow one on a connection of its own:
/// requests in flight whenever the NLB acts.
const NLB_CLIENTS: Client = Client {
    kept_alive: true,
    slow_every: Some(20),
};

/// A gateway replaced behind the `aws-nlb-instance` overlay's NLB (its
/// checks of the nodes as the overlay's annotations set them, and reset on
/// an unhealthy target as `terminates` says), lifeguard and the kubelet as
/// the overlay sets them, at `rate` requests a second.
fn behind_the_instance_overlays_nlb(terminates: Option<bool>, rate: u32) -> NodeRun {
    let docs = render("aws-nlb-instance");
    let mut check = nlb_check(&docs);
    if let Some(terminates) = terminates {
        check.terminates = terminates;
    }
    eprintln!(
        "the overlay's NLB: every {:?}, out after {}, in after {}, resetting an unhealthy node's connections: {}",
        check.inter, check.fall, check.rise, check.terminates,
    );
    roll_the_overlays_gateway(&docs, NodeWay::Checked(check), rate)
}

/// A gateway of the shipped bootstrap replaced behind `way` at `rate`
/// requests a second, its clients keeping their connections alive (and
/// slow requests in flight); lifeguard's arguments, the grace period and
/// the kubelet's probe as the overlay's `docs` set them.
fn roll_the_overlays_gateway(docs: &[Value], way: NodeWay, rate: u32) -> NodeRun {
    let args = lifeguard_args(docs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    eprintln!("lifeguard {}", args.join(" "));
    node_rolling_restart(&NodeRollout {
        way,
        rate,
        steady: Duration::from_secs(5),
        gateway: Some(Gateway::Shipped),
        agent_args: &args,
        grace: grace(docs),
        kubelet: kubelet_probe(docs),
        client: NLB_CLIENTS,
    })
}

/// The requests that failed, each in words.
fn failures(run: &NodeRun) -> Vec<&Sent> {
    run.run.sent.iter().filter(|s| s.answer != Ok(200)).collect()
}

/// Every request answered 200; else how many were lost, the first, and
/// the old pod's lifeguard log.
fn assert_none_lost(run: &NodeRun) {
    let failed = failures(run);
    assert!(
        failed.is_empty(),
        "{} lost, the first: {:?}\n{}",
        failed.len(),
        failed.first(),
        run.run.left[0].log
    );
}

/// What the rollout looked like, in one line.
fn said(run: &NodeRun) -> String {
    let l = &run.run.left[0];
    let d = &l.deletion;
    let summary = l.summary.as_ref();
    format!(
        "{} sent, {} failed; deletion -> the NLB let the node go {:.1} s, Envoy stopped {:.1} s; {}; load balancers: {}",
        run.run.sent.len(),
        failures(run).len(),
        secs(d.started, l.down[0]),
        d.envoy_stopped.map_or(f64::NAN, |t| secs(d.started, t)),
        run.nodes.join("; "),
        summary.map_or("-".into(), |s| s["load_balancers"].to_string()),
    )
}

/// The `aws-nlb-instance` overlay, played: its NLB checks the nodes as its
/// annotations say (every 10 s, out after 2, in after 2) and keeps an
/// unhealthy node's connections (connection termination off); lifeguard
/// runs with the overlay's settings (its grace period, its load balancer's
/// checks). A gateway replaced while clients keep their connections alive
/// through the NLB and slow requests are in flight: no request lost, and
/// Envoy stopped after the NLB let the node go, within the grace period.
#[test]
fn a_gateway_rolled_behind_the_aws_nlb_instance_overlays_nlb_loses_no_request() {
    let docs = render("aws-nlb-instance");
    assert!(
        !nlb_check(&docs).terminates,
        "the overlay leaves the NLB resetting an unhealthy node's connections"
    );
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = behind_the_instance_overlays_nlb(None, 200);
    eprintln!("{}", said(&run));
    assert_none_lost(&run);
    assert!(
        run.run.sent.iter().filter(|s| s.path == "/slow").count() > 100,
        "the slow requests were sent"
    );
    let l = &run.run.left[0];
    let d = &l.deletion;
    let stopped = d.envoy_stopped.expect("Envoy stopped within the grace period");
    assert!(
        stopped >= l.down[0],
        "Envoy stopped {:.2} s before the NLB let the node go\n{}",
        secs(stopped, l.down[0]),
        l.log
    );
    assert!(secs(d.started, stopped) < grace(&docs).as_secs_f64());
    let summary = l.summary.as_ref().expect("an exit summary");
    assert_eq!(summary["outcome"], "drained", "{summary}");
    assert_eq!(d.exit_code, 0, "{}", l.log);
}

/// The control: the same rollout behind an NLB that resets an unhealthy
/// target's connections (its default, `connection_termination.enabled`
/// true) loses the requests on the node's connections when the NLB marks
/// the node unhealthy, while its gateway still serves them: the model
/// catches an overlay that leaves the default. At 20 requests a second (a
/// slow one in flight at any time): the reset needs requests in flight on
/// the node's connections, not load, and so runs beside the busy ones.
#[test]
fn the_same_nlb_resetting_an_unhealthy_nodes_connections_loses_requests() {
    let run = behind_the_instance_overlays_nlb(Some(true), 20);
    let lost = failures(&run).len();
    eprintln!(
        "with connection termination on: {lost} of {} requests lost; {}",
        run.run.sent.len(),
        said(&run)
    );
    assert!(lost > 0, "nothing lost: the model does not reset\n{}", said(&run));
}

/// The `metallb` overlay, played: no load balancer checks the nodes;
/// MetalLB's speaker announces a node while an endpoint on it can serve
/// (ready or serving in the EndpointSlice, the kubelet's readiness probe as
/// the overlay's Deployment sets it) and withdraws it 0.5 s after none can;
/// lifeguard runs with the overlay's settings (the kubelet told 503 from
/// the drain's start, its grace period). A gateway replaced while clients
/// keep their connections alive and slow requests (3 s) are in flight: no
/// request lost, Envoy stopped (lifeguard's log line) after the node was
/// withdrawn, within the quiet period, a slow request's 3 s and 1.5 s of it.
#[test]
fn a_gateway_rolled_behind_the_metallb_overlays_announcer_loses_no_request() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let docs = render("metallb");
    let run = roll_the_overlays_gateway(&docs, NodeWay::METALLB, 200);
    eprintln!("{}", said(&run));
    assert_none_lost(&run);
    let l = &run.run.left[0];
    let d = &l.deletion;
    let exited = d.envoy_stopped.expect("Envoy stopped within the grace period");
    let stopped = common::lb::envoy_stop_sent(&l.log).unwrap_or_else(|| panic!("Envoy was not stopped\n{}", l.log));
    let after = secs(l.down[0], stopped);
    eprintln!(
        "withdrawn {:.2} s after SIGTERM, Envoy stopped by lifeguard {after:.2} s after that, gone {:.2} s after it",
        secs(d.started, l.down[0]),
        secs(l.down[0], exited)
    );
    let summary = l.summary.as_ref().expect("an exit summary");
    let quiet = summary["load_balancers"]["quiet_period_seconds"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        (0.0..=quiet + 4.5).contains(&after),
        "lifeguard stopped Envoy {after:.2} s after the withdrawal\n{}",
        l.log
    );
    assert_eq!(
        summary["kubelet"]["not_serving_because"],
        "terminating_readiness_failing"
    );
    assert_eq!(d.exit_code, 0, "{}", l.log);
}

/// A raw kept-alive HTTP/1.1 connection to the gateway: each answer's
/// status and whether it closes the connection.
struct KeptAlive(BufReader<TcpStream>);

impl KeptAlive {
    fn open(to: SocketAddr) -> KeptAlive {
        let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        KeptAlive(BufReader::new(stream))
    }

    /// `GET /` with `user_agent`: the status, and `Connection: close`.
    fn get(&mut self, user_agent: &str) -> std::io::Result<(u16, bool)> {
        write!(
            self.0.get_mut(),
            "GET / HTTP/1.1\r\nHost: gateway\r\nUser-Agent: {user_agent}\r\n\r\n"
        )?;
        let mut line = String::new();
        self.0.read_line(&mut line)?;
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let (mut length, mut close) = (0, false);
        loop {
            let mut header = String::new();
            self.0.read_line(&mut header)?;
            let header = header.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(v) = header.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            if header.starts_with("connection:") && header.contains("close") {
                close = true;
            }
        }
        let mut body = vec![0u8; length];
        self.0.read_exact(&mut body)?;
        Ok((status, close))
    }
}

/// The shipped gateway (`config/envoy-gateway.yaml`: the `health_check`
/// filter on its traffic listener, `drain_type: MODIFY_ONLY`), its load
/// balancer declared to check every 3 s, out after 2: from the drain's
/// start Envoy fails the load balancer's checks of the traffic port (503
/// to `ELB-HealthChecker/2.0`) while a kept-alive client's connection stays
/// open (no `Connection: close`); once the load balancer has let the pod
/// go (3 s x 2 + 1 s), the next answer on it closes it, and the client's
/// new connection is served. On the real Envoy (1.40; scripts/test runs
/// it against 1.36.4 too).
#[test]
fn the_shipped_gateway_keeps_kept_alive_connections_until_the_load_balancers_let_it_go() {
    let lan = Lan::new();
    let args = ["--drain-scope", "all", "--load-balancer-checks", "3sx2"];
    let (pod, ip) = gateway_at(&lan, 0, Gateway::Shipped, &args);
    let traffic = SocketAddr::from((ip, GATEWAY_PORT));
    let lifeguard = pod.agent_pid;
    let outcome = lan.host.run(move || {
        let mut kept = KeptAlive::open(traffic);
        assert_eq!(kept.get("client").unwrap(), (200, false), "before the drain");
        let sigterm = Instant::now();
        signal(lifeguard, libc::SIGTERM);
        // The load balancer's check of the traffic port fails from the
        // drain's start (Envoy's health_check filter, /healthcheck/fail).
        wait_for(
            "the traffic port's check to fail",
            Duration::from_secs(5),
            || match KeptAlive::open(traffic).get("ELB-HealthChecker/2.0") {
                Ok((503, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            },
        );
        // Meanwhile the client's connection stays open, request after
        // request, until the load balancer has let the pod go.
        let mut served_open = 0;
        let closed_at = loop {
            let (status, close) = kept.get("client").expect("the kept-alive connection");
            assert_eq!(status, 200);
            if close {
                break sigterm.elapsed();
            }
            served_open += 1;
            assert!(sigterm.elapsed() < Duration::from_secs(15), "never closed");
            std::thread::sleep(Duration::from_millis(200));
        };
        let reconnected = KeptAlive::open(traffic).get("client").map(|(status, _)| status);
        (served_open, closed_at, reconnected)
    });
    let (served_open, closed_at, reconnected) = outcome;
    eprintln!(
        "{served_open} requests served on the kept-alive connection after SIGTERM, closed with the answer at {:.2} s; a new connection then: {reconnected:?}",
        closed_at.as_secs_f64()
    );
    assert!(
        closed_at >= Duration::from_secs(7),
        "closed {:.2} s after SIGTERM, before the load balancer let the pod go (7 s)\n{}",
        closed_at.as_secs_f64(),
        pod.agent.output()
    );
    assert!(served_open >= 20, "{served_open} served open");
    assert_eq!(reconnected.unwrap(), 200, "served on a new connection");
}
