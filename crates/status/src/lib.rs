//! The status port (15020): everything the kubelet, Envoy, Prometheus and
//! the pod's hooks ask lifeguard.
//!
//! Endpoints:
//! - `GET|HEAD /healthz/ready` — 200 `ready`, or 503 with a one-line reason.
//!   Answered from the readiness snapshot: no Envoy call, no allocation.
//! - `GET /drain` — the drain's status as JSON, with the drain wait's
//!   (any caller).
//! - `GET|HEAD /drain/wait[?timeout=D]` — the app container's preStop hook:
//!   answers 200 with one line once the pod is out of its load balancers'
//!   rotation, or at its bound, saying which ([`lifeguard_drain_wait`]); starts
//!   nothing; any caller.
//! - `POST /drain` — loopback only: start the drain (readiness 503 at once)
//!   or join the one under way; answers with the status once drained. Envoy
//!   keeps running until a signal. The native-sidecar preStop hook.
//!   `POST /drain?nowait` starts it the same way and answers 202 at once,
//!   once readiness is 503 (how `wait-app-exit` tells the agent that
//!   termination began, so the deadline counts from then).
//! - `POST /quitquitquit` — loopback only: stop Envoy now and exit cleanly.
//! - `GET /stats/prometheus` (alias `/metrics`) — Envoy's own metrics,
//!   streamed, then lifeguard's (any caller); the query string goes to
//!   Envoy, gzip when accepted. The machinery is [`lifeguard_scrape`]'s.
//! - `GET|HEAD /app-health/<container>/livez|readyz|startupz` and
//!   `/app-lifecycle/<container>/prestopz|poststartz` — the app's own probe
//!   or hook, run now against the app ([`app_probe`]); any caller, through
//!   the drain and the linger.
//!
//! Callers of the POST routes from other hosts get 403 and nothing happens;
//! so do loopback callers with `--loopback-control false` (then only the
//! control socket drains and stops).
//! Every answer to `/healthz/ready` is recorded against its checker (a load
//! balancer), for the drain wait.
//! Unknown paths get 404, known paths with another method 405.
//!
//! Files:
//!
//! - [`server`]: the listener(s) and hyper's connections: header-read and
//!   write timeouts, `TCP_NODELAY`, a loopback accept queue of its own.
//! - [`service`]: the tower service that routes each request.
//! - `routes`: the route table: one match per request, each route naming its handler.
//! - `response`: the body of every answer and the future that yields it.
//! - [`connections`]: connection slots shared fairly between peers, and the
//!   write timeout of a connection.
//! - [`control`]: the same service on a Unix socket (`--control-socket`),
//!   where drain and stop need no loopback check.
//! - [`app_probe`]: the app's probes, run as the kubelet would.
//! - `settings`: the port's address, who may drain and stop, the app's
//!   probes ([`Settings`]), and the [`Plan`] they make.

pub mod app_probe;
pub mod connections;
pub mod control;
mod response;
mod routes;
pub mod server;
pub mod service;
mod settings;

pub use settings::{AddrError, Plan, PlanError, Settings, StatusAddr};
