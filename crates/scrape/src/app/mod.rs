//! The app's own metrics in the merged scrape: how their text is fitted
//! into the answer ([`lines`]), and how each endpoint is read (`fetch`).
//! Which endpoints, from `ISTIO_PROMETHEUS_ANNOTATIONS`, is
//! `lifeguard_istio::annotations`'.

pub(crate) mod fetch;
pub mod lines;
