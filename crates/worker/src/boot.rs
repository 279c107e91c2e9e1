//! The blocking start-up whose failure reaches the auditor (I7, I8), and the auditor client
//! that carries a started worker's preflight report.

use pagewarden_common::auditor_client::{
    preflight_report, report_startup_failure, AuditorClient, ClientError,
};
use pagewarden_common::preflight::PreflightReport;

use crate::Role;

/// Reports waiting for the auditor before new ones are dropped.
pub const AUDITOR_BUFFER: usize = 1024;

/// Runs the blocking start-up `f` (model load, preflight, device) off the async runtime. If it
/// fails, the worker says so to the auditor (when one is configured) and waits for the report
/// to be taken before the error is returned, so a refused start is on record (I7, I8).
pub async fn start_up<T, E, F>(
    role: &Role,
    auditor: Option<&str>,
    node_id: &str,
    f: F,
) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: std::fmt::Display + From<tokio::task::JoinError> + Send + 'static,
{
    let started = tokio::task::spawn_blocking(f).await?;
    if let Err(e) = &started {
        // `{:#}` keeps the whole cause chain of an `anyhow::Error`.
        let why = format!("{e:#}");
        report_startup_failure(auditor, node_id, role.name, &why).await;
    }
    started
}

/// The auditor client when `url` is set, with this worker's preflight report already queued.
pub fn auditor_client(
    url: Option<&str>,
    node_id: &str,
    role: &Role,
    preflight: &PreflightReport,
) -> Result<Option<AuditorClient>, ClientError> {
    let Some(url) = url else { return Ok(None) };
    let client = AuditorClient::spawn(url, AUDITOR_BUFFER)?;
    client.report_preflight(preflight_report(node_id, role.name, preflight));
    Ok(Some(client))
}
