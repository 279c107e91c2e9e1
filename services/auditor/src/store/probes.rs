//! Probe runs and their per-step results.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::{get_enum, ProbeResult, ProbeRun, ProbeRunEnd, Store, StoreError, Window};
use crate::domain::{ProbeRunId, SweepKind, UnixMs};

impl Store {
    /// Starts a run of `sweep` in status `running`.
    pub async fn start_probe_run(
        &self,
        at: UnixMs,
        sweep: SweepKind,
    ) -> Result<ProbeRunId, StoreError> {
        let row = sqlx::query(
            "INSERT INTO probe_runs (started_at, status, sweep) VALUES ($1, 'running', $2) \
             RETURNING id",
        )
        .bind(at.0)
        .bind(sweep.as_str())
        .fetch_one(self.pool())
        .await?;
        Ok(ProbeRunId(row.try_get("id")?))
    }

    /// Records one step of a run.
    pub async fn insert_probe_result(
        &self,
        run: ProbeRunId,
        r: &ProbeResult,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO probe_results (run_id, tenant, step, prompt_words, expected_tokens, \
             outcome, http_status, prompt_tokens, ttft_ms, detail, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(run.0)
        .bind(r.tenant.clone())
        .bind(r.step)
        .bind(r.prompt_words)
        .bind(r.expected_tokens)
        .bind(r.outcome.as_str())
        .bind(r.http_status)
        .bind(r.prompt_tokens)
        .bind(r.ttft_ms)
        .bind(r.detail.clone())
        .bind(r.at.0)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Closes a run.
    pub async fn finish_probe_run(
        &self,
        run: ProbeRunId,
        end: &ProbeRunEnd,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE probe_runs SET status = $1, context_limit = $2, steps = $3, failures = $4, \
             message = $5, finished_at = $6 WHERE id = $7",
        )
        .bind(end.status.as_str())
        .bind(end.context_limit)
        .bind(end.steps)
        .bind(end.failures)
        .bind(end.message.clone())
        .bind(end.at.0)
        .bind(run.0)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The newest `limit` runs, newest first.
    pub async fn probe_runs(&self, limit: i64) -> Result<Vec<ProbeRun>, StoreError> {
        self.probe_runs_in(Window { limit, offset: 0 }).await
    }

    /// One page of runs, newest first.
    pub async fn probe_runs_in(&self, window: Window) -> Result<Vec<ProbeRun>, StoreError> {
        let sql =
            format!("SELECT {RUN_COLUMNS} FROM probe_runs ORDER BY id DESC LIMIT $1 OFFSET $2");
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(window.limit)
            .bind(window.offset)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// One run, if there is one of that id.
    pub async fn probe_run(&self, run: ProbeRunId) -> Result<Option<ProbeRun>, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM probe_runs WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// How many runs there are.
    pub async fn probe_run_count(&self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT COUNT(*) AS n FROM probe_runs")
            .fetch_one(self.pool())
            .await?;
        Ok(row.try_get("n")?)
    }

    /// Every step of one run, in order.
    pub async fn probe_results(&self, run: ProbeRunId) -> Result<Vec<ProbeResult>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM probe_results WHERE run_id = $1 ORDER BY step, id"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(run.0)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(result_from_row).collect()
    }

    /// The newest `limit` steps observed since `since`, of every run, newest first (the
    /// prompt-length chart).
    pub async fn recent_probe_results(
        &self,
        since: UnixMs,
        limit: i64,
    ) -> Result<Vec<ProbeResult>, StoreError> {
        let sql = format!(
            "SELECT {RESULT_COLUMNS} FROM probe_results WHERE at >= $1 ORDER BY id DESC LIMIT $2"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(since.0)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(result_from_row).collect()
    }
}

const RESULT_COLUMNS: &str = "tenant, step, prompt_words, expected_tokens, outcome, http_status, \
    prompt_tokens, ttft_ms, detail, at";

fn result_from_row(r: &AnyRow) -> Result<ProbeResult, StoreError> {
    Ok(ProbeResult {
        tenant: r.try_get("tenant")?,
        step: r.try_get("step")?,
        prompt_words: r.try_get("prompt_words")?,
        expected_tokens: r.try_get("expected_tokens")?,
        outcome: get_enum(r, "outcome")?,
        http_status: r.try_get("http_status")?,
        prompt_tokens: r.try_get("prompt_tokens")?,
        ttft_ms: r.try_get("ttft_ms")?,
        detail: r.try_get("detail")?,
        at: UnixMs(r.try_get("at")?),
    })
}

/// The columns `run_from_row` reads.
const RUN_COLUMNS: &str =
    "id, started_at, finished_at, status, sweep, context_limit, steps, failures, message";

fn run_from_row(r: &AnyRow) -> Result<ProbeRun, StoreError> {
    Ok(ProbeRun {
        id: ProbeRunId(r.try_get("id")?),
        started_at: UnixMs(r.try_get("started_at")?),
        finished_at: r.try_get::<Option<i64>, _>("finished_at")?.map(UnixMs),
        status: get_enum(r, "status")?,
        sweep: get_enum(r, "sweep")?,
        context_limit: r.try_get("context_limit")?,
        steps: r.try_get("steps")?,
        failures: r.try_get("failures")?,
        message: r.try_get("message")?,
    })
}
