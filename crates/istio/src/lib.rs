//! Istio's formats, in one place: what Istio's injector writes into a pod
//! and lifeguard reads (or, for `lifeguard inject`, writes), so a pod spec
//! made for pilot-agent moves over unchanged. A leaf: it knows the formats
//! and their checks, not what lifeguard does with them.
//!
//! - [`probers`]: `ISTIO_KUBE_APP_PROBERS`, the app's original probes and
//!   hooks by status-port path (read by the status port's app probes,
//!   written by `lifeguard inject`); `INSTANCE_IP`, the pod's address.
//! - [`annotations`]: `ISTIO_PROMETHEUS_ANNOTATIONS`, the app's metrics
//!   endpoints (read by the merged scrape).
//! - [`proxy_config`]: `PROXY_CONFIG`, the proxy's settings (read by
//!   `config` as a settings layer).

pub mod annotations;
pub mod probers;
pub mod proxy_config;
