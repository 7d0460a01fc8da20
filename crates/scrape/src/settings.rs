//! The merged scrape's settings: the app's metrics, whether Envoy's are
//! merged, and the linger after Envoy stops; the [`Plan`] they make.

use std::time::Duration;

use clap::Args;
use lifeguard_base::settings::{GoBool, SettingError, Span};
use lifeguard_istio::annotations::{AnnotationsError, AppMetrics};
use serde::Serialize;

/// The merged scrape's settings. In the file: the section `[metrics]`, a key a field.
#[derive(Debug, Clone, Args, Serialize)]
#[group(skip)]
pub struct Settings {
    /// The app's own metrics, served last in `/stats/prometheus`, as the
    /// JSON Istio's injector writes: `{"scrape":"true","port":"8080",
    /// "path":"/metrics"}` or `{"targets":[{"port":..,"path":..},...]}`;
    /// `"scrape":"false"` or empty: none. Read on 127.0.0.1; a target on a
    /// port of the proxy stops start-up, named.
    #[arg(long, env = "ISTIO_PROMETHEUS_ANNOTATIONS", value_name = "JSON", default_value = "")]
    pub app_metrics: AppMetrics,

    /// Append Envoy's own metrics to `/stats/prometheus` (true or false).
    #[arg(long, env = "LIFEGUARD_MERGE_ENVOY_METRICS", value_name = "BOOL", default_value = "true")]
    pub merge_envoy_metrics: GoBool,

    /// After Envoy stops, keep the status port answering until one scrape of
    /// /stats/prometheus has seen the final state, or this long at most;
    /// never past the grace period.
    #[arg(long, env = "LIFEGUARD_LINGER", value_name = "DURATION", default_value = "0s")]
    pub linger: Span,
}

/// An app metrics target on one of the proxy's own ports.
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct PlanError {
    json: String,
    why: AnnotationsError,
}

impl SettingError for PlanError {
    fn key(&self) -> &'static str {
        "app_metrics"
    }

    fn value(&self) -> String {
        self.json.clone()
    }
}

/// What the merged scrape serves, and how long the port lingers.
#[derive(Debug, Clone)]
pub struct Plan {
    pub app_metrics: AppMetrics,
    pub merge_envoy_metrics: bool,
    pub linger: Duration,
}

impl Settings {
    /// The merged scrape's plan, for a proxy whose status port and admin
    /// port (None: a Unix socket) the app's targets may not be.
    pub fn plan(&self, status_port: u16, admin_port: Option<u16>) -> Result<Plan, PlanError> {
        if let Err(why) = self.app_metrics.check_ports(status_port, admin_port) {
            let json = self.app_metrics.to_json();
            return Err(PlanError { json, why });
        }
        Ok(Plan {
            app_metrics: self.app_metrics.clone(),
            merge_envoy_metrics: self.merge_envoy_metrics.get(),
            linger: self.linger.get(),
        })
    }
}
