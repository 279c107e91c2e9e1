//! The recompute log: one row per recompute audit (`recompute`): digests of the tokens, never
//! the tokens, and the verdict.

use serde::Serialize;
use sqlx::Row;

use super::{get_enum, Store, StoreError};
use crate::domain::{RecomputeVerdict, UnixMs};

/// A recompute to record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NewRecompute {
    /// The request.
    pub request_id: Option<String>,
    /// Who asked.
    pub tenant: String,
    /// The decode node that served it.
    pub decode_node: Option<String>,
    /// Prompt tokens.
    pub prompt_tokens: i64,
    /// Output tokens scored.
    pub output_tokens: i64,
    /// SHA-256 of the prompt's token ids.
    pub prompt_sha256: String,
    /// SHA-256 of the output's token ids.
    pub output_sha256: String,
    /// What it found.
    pub verdict: RecomputeVerdict,
    /// The largest |served − clean| logprob, in millionths of a nat.
    pub max_diff_micro: i64,
    /// The tolerance it was held to, in millionths of a nat.
    pub tolerance_micro: i64,
    /// The first output position beyond the tolerance.
    pub first_divergence: Option<i64>,
    /// How long the clean pass took.
    pub recompute_ms: i64,
    /// When it was recorded.
    pub at: UnixMs,
}

/// A recorded recompute, as `/api/recomputes` shows it: its row id and what was recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecomputeRecord {
    /// Row id.
    pub id: i64,
    /// What was recorded.
    #[serde(flatten)]
    pub recompute: NewRecompute,
}

/// One tenant's recompute verdicts, as the tenants page shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RecomputeTotals {
    /// The tenant.
    pub tenant: String,
    /// Verdicts `match`.
    pub matches: i64,
    /// Verdicts `mismatch`.
    pub mismatches: i64,
    /// Verdicts `failed`.
    pub failed: i64,
    /// The newest.
    pub last_at: UnixMs,
}

impl Store {
    /// Verdicts per tenant, by tenant name.
    pub async fn recompute_totals(&self) -> Result<Vec<RecomputeTotals>, StoreError> {
        let rows = sqlx::query(
            "SELECT tenant, \
             COUNT(CASE WHEN verdict = 'match' THEN 1 END) AS matches, \
             COUNT(CASE WHEN verdict = 'mismatch' THEN 1 END) AS mismatches, \
             COUNT(CASE WHEN verdict = 'failed' THEN 1 END) AS failed, \
             MAX(at) AS last_at FROM recomputes GROUP BY tenant ORDER BY tenant",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(RecomputeTotals {
                    tenant: r.try_get("tenant")?,
                    matches: r.try_get("matches")?,
                    mismatches: r.try_get("mismatches")?,
                    failed: r.try_get("failed")?,
                    last_at: UnixMs(r.try_get("last_at")?),
                })
            })
            .collect()
    }

    /// Records one recompute; its row id.
    pub async fn insert_recompute(&self, r: &NewRecompute) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO recomputes (request_id, tenant, decode_node, prompt_tokens, \
             output_tokens, prompt_sha256, output_sha256, verdict, max_diff_micro, \
             tolerance_micro, first_divergence, recompute_ms, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id",
        )
        .bind(r.request_id.clone())
        .bind(r.tenant.clone())
        .bind(r.decode_node.clone())
        .bind(r.prompt_tokens)
        .bind(r.output_tokens)
        .bind(r.prompt_sha256.clone())
        .bind(r.output_sha256.clone())
        .bind(r.verdict.as_str())
        .bind(r.max_diff_micro)
        .bind(r.tolerance_micro)
        .bind(r.first_divergence)
        .bind(r.recompute_ms)
        .bind(r.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// The newest `limit` recomputes, newest first.
    pub async fn recomputes(&self, limit: i64) -> Result<Vec<RecomputeRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, request_id, tenant, decode_node, prompt_tokens, output_tokens, \
             prompt_sha256, output_sha256, verdict, max_diff_micro, tolerance_micro, \
             first_divergence, recompute_ms, at FROM recomputes ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                let recompute = NewRecompute {
                    request_id: r.try_get("request_id")?,
                    tenant: r.try_get("tenant")?,
                    decode_node: r.try_get("decode_node")?,
                    prompt_tokens: r.try_get("prompt_tokens")?,
                    output_tokens: r.try_get("output_tokens")?,
                    prompt_sha256: r.try_get("prompt_sha256")?,
                    output_sha256: r.try_get("output_sha256")?,
                    verdict: get_enum(r, "verdict")?,
                    max_diff_micro: r.try_get("max_diff_micro")?,
                    tolerance_micro: r.try_get("tolerance_micro")?,
                    first_divergence: r.try_get("first_divergence")?,
                    recompute_ms: r.try_get("recompute_ms")?,
                    at: UnixMs(r.try_get("at")?),
                };
                Ok(RecomputeRecord {
                    id: r.try_get("id")?,
                    recompute,
                })
            })
            .collect()
    }
}
