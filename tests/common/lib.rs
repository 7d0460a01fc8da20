//! The test kit, one crate shared by the integration tests and the
//! benchmarks that reuse them (`bench/reaction.rs`, `bench/rolling.rs`,
//! ...), built once (a dev-dependency of lifeguard, named `common` in
//! Cargo.toml). One concern a file:
//!
//! | file | what it owns |
//! | --- | --- |
//! | `bins.rs` | the Envoy and lifeguard binaries, Envoy's version, running a program to its end (`run_lifeguard`, `run_lifeguard_env`, `promtool`), the repository's root |
//! | `temp.rs` | temporary directories, names unique to a test, a lock every test process shares (`exclusive`) |
//! | `ports.rs` | loopback ports leased to a test (`port`, `Port`), binding one (`bind_leased`) |
//! | `wait.rs` | waiting on a condition with a deadline (`wait_for`, `wait_status`) |
//! | `alloc.rs` | a global allocator that counts allocations (`common::alloc`), for the probe's allocation test and benchmark |
//! | `procs.rs` | child processes (`Proc`), what /proc says about a process |
//! | `envoy.rs` | the ports of one Envoy + agent pair (`Ports`), bootstraps, starting Envoy, its in-flight count |
//! | `agent.rs` | starting `lifeguard run`: `Agent::builder()`, `Agent` |
//! | `clients.rs` | the one HTTP client of the tests (`request`: TCP or a Unix socket, any method and headers, the whole `Answer`) and its short forms; a keep-alive client, an idle connection; a sample of a scrape; answer times (`Latencies`) |
//! | `servers.rs` | fake HTTP servers (`TestServer`, `reply`), the slow test `App` |
//! | `fake_admin.rs` | a fake Envoy admin that misbehaves on demand (`FakeAdmin`) |
//! | `local_pod.rs` | a pod on loopback: the app, lifeguard and its Envoy (`Pod`) |
//! | `netns.rs` | network namespaces, a pod's and a peer's joined by a veth pair |
//! | `pod.rs` | a pod of namespaces and cgroups around the real Envoy (`common::pod`) |
//! | `gateway.rs` | ingress gateways' bootstraps, shaped as users write them (`common::gateway`) |
//! | `lb.rs` | HAProxy in front of such pods, rolling restarts (`common::lb`) |
//! | `nodes.rs` | load balancers that check the node: kube-proxy's rules (KEP-1669) on each node, the kubelet's probes, the EndpointSlice's conditions (`common::nodes`) |
//! | `container.rs` | the image under podman, a pod played from Kubernetes YAML (`common::container`) |
//!
//! Everything above but `netns`, `pod`, `gateway`, `lb`, `nodes` and `container` is
//! re-exported here (`use common::*`); those are used by their path.
//!
//! Every process and server started here is stopped when its handle drops,
//! also when a test panics. A crate of its own, the compiler reports the
//! kit's dead code like any library's: what no test or benchmark uses goes.

// A kit's `new()` starts something (leases ports, makes namespaces): no
// `Default` value stands for it.
#![allow(clippy::new_without_default)]
// The kit makes system calls no safe wrapper it uses offers (signals to
// its own children, pidfds, setns, flock), each with its SAFETY note; and
// a rolling restart's set-up reads as one scenario, longer than a screen.
#![allow(unsafe_code, clippy::too_many_lines)]

pub mod agent;
pub mod alloc;
pub mod bins;
pub mod clients;
pub mod container;
pub mod envoy;
pub mod fake_admin;
pub mod gateway;
pub mod lb;
pub mod local_pod;
pub mod netns;
pub mod nodes;
pub mod pod;
pub mod ports;
pub mod procs;
pub mod servers;
pub mod temp;
pub mod wait;

pub use {
    agent::*, bins::*, clients::*, envoy::*, fake_admin::*, local_pod::*, ports::*, procs::*, servers::*, temp::*,
    wait::*,
};
