//! Where the functions' metrics go on AWS: CloudWatch embedded metric format on stdout, which
//! CloudWatch Logs turns into metrics (issue #9), without a log filter that depends on a log
//! line's layout and without a CloudWatch API call per invocation.
//!
//! The functions record through the `metrics` facade; [`recorder_from_env`] installs the
//! recorder (`metrics_cloudwatch_embedded`) and [`flush`] writes what was recorded, which
//! each function does at the end of each invocation. Every metric carries the dimension `Stack`, so two stacks in one account
//! keep their metrics apart; the names are the functions' own (`gridrelay_deliver::metrics`).

/// The namespace the metrics are published in.
pub const NAMESPACE: &str = "Gridrelay";
/// Where a function reads the name of its stack (SAM and CDK set it).
pub const STACK_NAME_ENV: &str = "GRIDRELAY_STACK_NAME";
/// The `Stack` dimension when [`STACK_NAME_ENV`] is not set.
pub const DEFAULT_STACK_NAME: &str = "gridrelay";

pub use metrics_cloudwatch_embedded::Collector;

/// Installs the embedded metric format recorder for this process: namespace [`NAMESPACE`],
/// dimension `Stack` from [`STACK_NAME_ENV`].
pub fn recorder_from_env() -> Result<&'static Collector, metrics_cloudwatch_embedded::Error> {
    let stack = std::env::var(STACK_NAME_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_STACK_NAME.to_string());
    metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(NAMESPACE)
        .with_dimension("Stack", stack)
        .init()
}

/// Writes what was recorded since the last flush to stdout (one line per set of dimensions),
/// where Lambda sends it to CloudWatch Logs. A failed write loses those metrics, not the
/// invocation.
pub fn flush(collector: &Collector) {
    if let Err(e) = collector.flush(std::io::stdout().lock()) {
        tracing::warn!(error = %e, "metrics could not be written");
    }
}
