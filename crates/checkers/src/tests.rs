//! The unit tests of `checkers`.

use super::*;
use http::header::HeaderValue;

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

fn peer(s: &str) -> Option<SocketAddr> {
    Some(s.parse().unwrap())
}

fn key_of(ip: [u8; 4], agent: &str) -> CheckerKey {
    let mut h = HeaderMap::new();
    h.insert(USER_AGENT, HeaderValue::from_str(agent).unwrap());
    checker_key(Some((ip, 1).into()), &h, true).unwrap()
}

#[test]
fn a_checker_is_its_address_and_agent_and_the_kubelet_is_none() {
    let lb = checker_key(peer("10.0.0.5:4000"), &headers(&[]), true).unwrap();
    assert_eq!(lb.to_string(), "10.0.0.5");
    assert!(!lb.forwarded);
    let elb = checker_key(
        peer("10.0.0.5:4001"),
        &headers(&[("user-agent", "ELB-HealthChecker/2.0")]),
        true,
    )
    .unwrap();
    assert_ne!(lb, elb, "another agent at the same address is another checker");
    assert_eq!(elb.to_string(), "10.0.0.5 (ELB-HealthChecker/2.0)");
    let kubelet = headers(&[("user-agent", "kube-probe/1.31")]);
    assert_eq!(checker_key(peer("10.0.0.1:5000"), &kubelet, true), None);
    assert_eq!(checker_key(None, &headers(&[]), true), None);
}

#[test]
fn envoys_checker_takes_a_host_out_at_its_first_failure_others_as_configured() {
    assert_eq!(key_of([10, 0, 0, 5], "Envoy/HC").fixed_threshold(), Some(1));
    assert_eq!(key_of([10, 0, 0, 5], "ELB-HealthChecker/2.0").fixed_threshold(), None);
    assert_eq!(key_of([10, 0, 0, 5], "GoogleHC/1.0").fixed_threshold(), None);
}

#[test]
fn the_forwarded_peer_is_trusted_from_loopback_only() {
    let via_envoy = headers(&[("x-forwarded-for", "203.0.113.9, 10.1.2.3")]);
    let key = checker_key(peer("127.0.0.1:5555"), &via_envoy, true).unwrap();
    assert_eq!(key.ip, "10.1.2.3".parse::<IpAddr>().unwrap());
    assert!(key.forwarded);
    // A remote caller's own header says nothing.
    let key = checker_key(peer("10.9.9.9:5555"), &via_envoy, true).unwrap();
    assert_eq!(key.ip, "10.9.9.9".parse::<IpAddr>().unwrap());
    // Loopback without the header (Istio's bootstrap): loopback.
    let key = checker_key(peer("127.0.0.1:5555"), &headers(&[]), true).unwrap();
    assert_eq!(key.ip, "127.0.0.1".parse::<IpAddr>().unwrap());
    // An Envoy that does not append the prober's address (Istio's
    // bootstrap): whatever the prober wrote there says nothing.
    let key = checker_key(peer("127.0.0.1:5555"), &via_envoy, false).unwrap();
    assert_eq!((key.ip, key.forwarded), ("127.0.0.1".parse::<IpAddr>().unwrap(), false));
    // An IPv4 address mapped into IPv6 is the IPv4 address.
    let key = checker_key(peer("[::ffff:10.1.2.3]:5555"), &headers(&[]), true).unwrap();
    assert_eq!(key.ip, "10.1.2.3".parse::<IpAddr>().unwrap());
    // Garbage in the header: loopback too.
    let junk = headers(&[("x-forwarded-for", "not an address")]);
    assert!(!checker_key(peer("[::1]:5555"), &junk, true).unwrap().forwarded);
    // Two header lines: the last one's last entry.
    let two = headers(&[("x-forwarded-for", "10.0.0.1"), ("x-forwarded-for", "10.0.0.2")]);
    let key = checker_key(peer("127.0.0.1:1"), &two, true).unwrap();
    assert_eq!(key.ip, "10.0.0.2".parse::<IpAddr>().unwrap());
}

#[test]
fn a_long_agent_is_cut_and_never_allocates_in_the_key() {
    let long = headers(&[("user-agent", "a-very-long-user-agent-string-that-goes-on-and-on/1.0")]);
    let key = checker_key(peer("10.0.0.5:1"), &long, true).unwrap();
    assert_eq!(key.agent().unwrap().len(), 40, "the first 40 bytes");
}

#[tokio::test(start_paused = true)]
async fn intervals_and_failures_in_a_row_are_learned() {
    let checkers = Checkers::default();
    let key = checker_key(peer("10.0.0.5:1"), &headers(&[]), true).unwrap();
    let t0 = Instant::now();
    checkers.record(key, t0, true);
    assert_eq!(checkers.snapshot()[0].interval, None);
    checkers.record(key, t0 + Duration::from_secs(1), true);
    checkers.record(key, t0 + Duration::from_millis(2200), false);
    checkers.record(key, t0 + Duration::from_millis(3100), false);
    let c = &checkers.snapshot()[0];
    assert_eq!((c.probes, c.failures_in_row), (4, 2));
    assert_eq!(c.interval, Some(Duration::from_millis(1200)), "the longest recent gap");
    checkers.record(key, t0 + Duration::from_secs(4), true);
    assert_eq!(checkers.snapshot()[0].failures_in_row, 0, "a 200 ends the run");
    // A gap longer than any checking interval starts the checker over.
    checkers.record(key, t0 + Duration::from_secs(1000), true);
    assert_eq!(checkers.snapshot()[0].interval, None);
}

/// The attack: a real checker every 3 s, and a peer sending
/// probes with 64 agents at 100 a second.
#[tokio::test(start_paused = true)]
async fn a_flood_of_agents_from_one_address_cannot_replace_an_established_checker() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let real = key_of([10, 0, 0, 5], "HAProxy");
    checkers.record(real, t0, true);
    checkers.record(real, t0 + Duration::from_secs(3), true);
    let agents: Vec<String> = (0..64).map(|i| format!("agent-{i}")).collect();
    let mut t = t0 + Duration::from_secs(3);
    for round in 0..1000 {
        t += Duration::from_millis(10);
        checkers.record(key_of([10, 9, 9, 9], &agents[round % 64]), t, true);
        if round % 300 == 299 {
            checkers.record(real, t, true);
        }
    }
    let seen = counted(&checkers);
    let kept = seen.iter().find(|c| c.key == real).expect("the real checker is kept");
    assert_eq!(kept.interval, Some(Duration::from_secs(3)));
    let peers = seen.iter().filter(|c| c.key.ip == IpAddr::from([10, 9, 9, 9])).count();
    assert_eq!(peers, MAX_PER_ADDRESS, "the flooding address holds at most its share");
    // The rest of its agents are followed apart, not counted.
    let apart = checkers.snapshot().iter().filter(|c| !c.counted).count();
    assert_eq!(apart, 64 - MAX_PER_ADDRESS);
    assert!(*checkers.not_counted().get(NotCounted::TooManyAgents) > 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_table_of_established_checkers_refuses_newcomers_and_says_so() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let key = |i: usize| key_of([10, 0, 1, i as u8], "lb");
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // Every checker probes each second; the first stops after 1 s.
    let round = |second: u64| {
        for i in 0..MAX_CHECKERS {
            if i > 0 || second <= 1 {
                checkers.record(key(i), at(second * 1000), true);
            }
        }
    };
    round(0);
    round(1);
    // Established and probing: a newcomer is not counted...
    let late = key_of([10, 0, 2, 1], "lb");
    round(2);
    checkers.record(late, at(2000), true);
    assert!(counted(&checkers).iter().all(|c| c.key != late));
    assert_eq!(*checkers.not_counted().get(NotCounted::TableFull), 1);
    // (followed apart meanwhile: it may hold the wait)
    let apart: Vec<Checker> = checkers.snapshot().into_iter().filter(|c| !c.counted).collect();
    assert_eq!((apart.len(), apart[0].key), (1, late));
    // ...until one stops probing (twice its 1 s interval and a second):
    // the newcomer takes its entry, with what it sent meanwhile.
    round(3);
    round(4);
    checkers.record(late, at(4100), true);
    let seen = counted(&checkers);
    let took = seen.iter().find(|c| c.key == late).expect("the newcomer is counted");
    assert_eq!((took.probes, took.interval), (2, Some(Duration::from_millis(2100))));
    assert!(!seen.iter().any(|c| c.key == key(0)));
    assert_eq!(seen.len(), MAX_CHECKERS);
    assert_eq!(checkers.snapshot().len(), MAX_CHECKERS, "no longer followed apart");
    assert_eq!(*checkers.not_counted().get(NotCounted::TableFull), 1);
}

/// The checkers counted (in the table), not those followed apart.
fn counted(checkers: &Checkers) -> Vec<Checker> {
    checkers.snapshot().into_iter().filter(|c| c.counted).collect()
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_with_one_probe_is_replaced_by_the_next() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    for s in 0..2 {
        for agent in ["a", "b", "c"] {
            checkers.record(key_of([10, 0, 0, 5], agent), at(s), true);
        }
    }
    checkers.record(key_of([10, 0, 0, 5], "once"), at(1), true);
    checkers.record(key_of([10, 0, 0, 5], "next"), at(2), true);
    let agents: Vec<String> = counted(&checkers).iter().filter_map(|c| c.key.agent()).collect();
    assert_eq!(agents, ["a", "b", "c", "next"]);
    assert_eq!(checkers.not_counted(), NotCountedReport::default());
}

/// The attack, the other way round: 64 agents from the real
/// checker's own address fill its share before it is established. Its
/// probes are not counted, but followed apart: the rule waits for it.
#[tokio::test(start_paused = true)]
async fn a_checker_crowded_out_of_its_address_is_followed_apart() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let real = key_of([10, 0, 0, 5], "HAProxy");
    let agents: Vec<String> = (0..64).map(|i| format!("agent-{i}")).collect();
    let mut t = t0;
    for round in 0..1000u32 {
        t += Duration::from_millis(10);
        checkers.record(key_of([10, 0, 0, 5], &agents[round as usize % 64]), t, false);
        if round % 300 == 0 {
            checkers.record(real, t, false);
        }
    }
    let seen = checkers.snapshot();
    assert_eq!(seen.iter().filter(|c| c.counted).count(), MAX_PER_ADDRESS);
    // Counted or followed apart, its probes are all there: it holds
    // the wait as a checker.
    let real_seen = seen
        .iter()
        .find(|c| c.key == real)
        .expect("the real checker is followed");
    assert_eq!(
        (real_seen.probes, real_seen.interval),
        (4, Some(Duration::from_secs(3))),
        "{real_seen:?}"
    );
    assert_eq!(real_seen.failures_in_row, 4);
    assert_eq!(checkers.overflow(), None, "61 probers fit the second table");
    // Past the second table too: the last such probe is remembered.
    for i in 0..MAX_UNPLACED as u8 {
        let newcomer = key_of([10, 0, 0, 5], &format!("more-{i}"));
        checkers.record(newcomer, t, false);
        checkers.record(newcomer, t + Duration::from_secs(1), false);
    }
    assert_eq!(checkers.overflow(), Some(t + Duration::from_secs(1)));
    assert!(checkers.snapshot().iter().any(|c| c.key == real), "still followed");
}

#[tokio::test(start_paused = true)]
async fn only_the_ranges_count_when_given() {
    let ranges = vec!["35.191.0.0/16".parse().unwrap(), "130.211.0.0/22".parse().unwrap()];
    let checkers = Checkers::new(ranges, ByReason::new(|_| Counter::noop()));
    let t0 = Instant::now();
    checkers.record(key_of([35, 191, 7, 1], "GoogleHC/1.0"), t0, true);
    checkers.record(key_of([10, 0, 0, 5], "GoogleHC/1.0"), t0, true);
    assert_eq!(checkers.snapshot().len(), 1);
    assert_eq!(*checkers.not_counted().get(NotCounted::OutsideRanges), 1);
}

/// One host holds a whole IPv6 /64: its addresses share the 4 checkers
/// an address may have.
#[tokio::test(start_paused = true)]
async fn an_ipv6_64_is_one_address() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let key = |i: u16| {
        let ip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, i);
        checker_key(Some((ip, 1).into()), &HeaderMap::new(), true).unwrap()
    };
    // Four addresses of the /64 establish a checker each...
    for round in 0..2 {
        for i in 0..4 {
            checkers.record(key(i), t0 + Duration::from_secs(round), true);
        }
    }
    // ...and the others of the same /64 are its fifth and more.
    for i in 4..8 {
        checkers.record(key(i), t0 + Duration::from_secs(2), true);
    }
    assert_eq!(counted(&checkers).len(), MAX_PER_ADDRESS);
    assert_eq!(*checkers.not_counted().get(NotCounted::TooManyAgents), 4);
}

/// A probe through Envoy's status listener from `lb` (`x-forwarded-for`
/// appended by Envoy) with `agent` (none when empty), keyed as the drain
/// wait trusts the header or not.
fn through_envoy(lb: &'static str, agent: &'static str, forwarded: bool) -> CheckerKey {
    let mut pairs = vec![("x-forwarded-for", lb)];
    if !agent.is_empty() {
        pairs.push(("user-agent", agent));
    }
    checker_key(peer("127.0.0.1:40000"), &headers(&pairs), forwarded).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_checker_keyed_127_0_0_1_before_the_trust_was_learned_gives_way_to_its_own_address() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // A busy node: Envoy's status listener config not read yet, so the
    // load balancer's probes through Envoy are 127.0.0.1's.
    let before = through_envoy("10.217.0.1", "", false);
    assert_eq!(before.to_string(), "127.0.0.1");
    for s in 0..4 {
        checkers.record(before, at(s * 1000), true);
    }
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(checkers.trust_forwarded(true), "learned: news");
    // Until the load balancer is heard under its own address, the old
    // entry holds the wait as any checker does (an empty table would not).
    let seen: Vec<String> = counted(&checkers).iter().map(|c| c.key.to_string()).collect();
    assert_eq!(seen, ["127.0.0.1"]);
    // Then it is that checker's past: only the checker counts.
    let own = through_envoy("10.217.0.1", "", true);
    checkers.record(own, Instant::now(), false);
    let seen: Vec<String> = counted(&checkers).iter().map(|c| c.key.to_string()).collect();
    assert_eq!(seen, ["10.217.0.1"]);
}

/// A flood of agents at a load balancer's address, through Envoy, before
/// the trust was learned: it fills the table under 127.0.0.1. Once the
/// agents are heard under their own address (the address's share full,
/// most followed apart), their old entries hold nothing and make room.
#[tokio::test(start_paused = true)]
async fn a_flood_keyed_127_0_0_1_before_the_trust_was_learned_gives_way_once_heard_under_its_address() {
    let checkers = Checkers::default();
    let agents: Vec<String> = (0..40).map(|i| format!("flood-{i}")).collect();
    let key = |agent: &str, forwarded: bool| {
        let mut h = HeaderMap::new();
        h.insert(USER_AGENT, HeaderValue::from_str(agent).unwrap());
        h.insert("x-forwarded-for", HeaderValue::from_static("10.217.0.1"));
        checker_key(peer("127.0.0.1:40000"), &h, forwarded).unwrap()
    };
    // Three rounds a second apart: 32 established entries under 127.0.0.1.
    for _ in 0..3 {
        for agent in &agents {
            checkers.record(key(agent, false), Instant::now(), true);
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(counted(&checkers).len(), MAX_CHECKERS);
    let newcomer = key_of([10, 0, 0, 7], "GoogleHC/1.0");
    checkers.record(newcomer, Instant::now(), true);
    assert!(counted(&checkers).iter().all(|c| c.key != newcomer), "no room yet");
    checkers.trust_forwarded(true);
    // One round under their own address: four fit the address's share, the
    // rest are followed apart.
    for agent in &agents {
        checkers.record(key(agent, true), Instant::now(), true);
    }
    let seen = checkers.snapshot();
    let loopback: Vec<String> = seen
        .iter()
        .filter(|c| c.key.ip.is_loopback())
        .map(|c| c.key.to_string())
        .collect();
    assert_eq!(loopback, Vec::<String>::new(), "the entries from before hold nothing");
    let own = seen.iter().filter(|c| c.key.forwarded).count();
    assert_eq!(own, agents.len(), "each agent, counted or followed apart");
    assert_eq!(
        seen.iter().filter(|c| c.counted && c.key.forwarded).count(),
        MAX_PER_ADDRESS
    );
    // Their old entries make room at once (each probed every second: they
    // would hold their entries 3 s more).
    checkers.record(newcomer, Instant::now(), true);
    assert!(counted(&checkers).iter().any(|c| c.key == newcomer), "room made");
    assert!(checkers.snapshot().iter().all(|c| !c.key.ip.is_loopback()));
    assert_eq!(checkers.overflow(), None, "no prober lost for want of room");
}

#[tokio::test(start_paused = true)]
async fn a_prober_of_127_0_0_1_that_goes_on_probing_as_it_did_stays_a_checker() {
    let checkers = Checkers::default();
    let t0 = Instant::now();
    let loopback = checker_key(peer("127.0.0.1:40000"), &headers(&[("user-agent", "in-pod")]), false).unwrap();
    checkers.record(loopback, t0, true);
    tokio::time::advance(Duration::from_secs(1)).await;
    checkers.trust_forwarded(true);
    // One with another agent under its own address does not stand for it.
    checkers.record(through_envoy("10.0.0.9", "lb", true), Instant::now(), true);
    assert_eq!(counted(&checkers).len(), 2, "another agent: both count");
    // The same agent under an appended address, but the loopback prober
    // probes again as before (no x-forwarded-for): it is a prober of its
    // own, and counts.
    checkers.record(through_envoy("10.0.0.10", "in-pod", true), Instant::now(), true);
    assert_eq!(counted(&checkers).len(), 2, "given way to 10.0.0.10 (in-pod)");
    tokio::time::advance(Duration::from_secs(1)).await;
    checkers.record(loopback, Instant::now(), true);
    let mut seen: Vec<String> = counted(&checkers).iter().map(|c| c.key.to_string()).collect();
    seen.sort();
    assert_eq!(seen, ["10.0.0.10 (in-pod)", "10.0.0.9 (lb)", "127.0.0.1 (in-pod)"]);
}
