//! The side-channel audit's verdicts (`isolation_audits`): one row per worker and channel of
//! each probe run, what `/api/isolation` lists and the isolation chart draws. A p-value is kept
//! as `round(-log10(p) * 1000)`: both backends store it as an integer, and the chart's axis is
//! that very scale.

use serde::Serialize;
use sqlx::Row;

use super::{get_enum, get_flag, Store, StoreError};
use crate::domain::{IsolationChannel, ProbeRunId, UnixMs};

/// One verdict to record.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NewIsolationAudit {
    /// The probe run it ended.
    pub run_id: ProbeRunId,
    /// The prefill worker whose cache was tested (`all`: the deployment signs no receipts).
    pub worker: String,
    /// Which channel.
    pub channel: IsolationChannel,
    /// Rounds that counted.
    pub rounds: i64,
    /// The test's p-value (cross against cold; or the order's rank test).
    pub p: f64,
    /// The timing channel's positive control p-value (warm against cold).
    pub control_p: Option<f64>,
    /// The p-value below which it is a leak.
    pub threshold: f64,
    /// The audit could see what it tests for (the timing control passed; an order audit
    /// with at least one round is always conclusive).
    pub conclusive: bool,
    /// It found a leak.
    pub leak: bool,
    /// When.
    pub at: UnixMs,
}

/// A recorded verdict, as `/api/isolation` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IsolationAudit {
    /// Row id.
    pub id: i64,
    /// What was recorded (p-values to three decimals of their log).
    #[serde(flatten)]
    pub audit: NewIsolationAudit,
}

/// `-log10(p) * 1000`, rounded, for p in (0, 1]; p at or below 0 (or NaN) is clamped to
/// 10^-300, above 1 to 1.
pub fn neg_log10_milli(p: f64) -> i64 {
    let p = if p.is_nan() {
        1e-300
    } else {
        p.clamp(1e-300, 1.0)
    };
    (-p.log10() * 1000.0).round() as i64
}

/// The p-value a stored `-log10(p) * 1000` stands for.
pub fn from_neg_log10_milli(v: i64) -> f64 {
    10f64.powf(-(v as f64) / 1000.0)
}

impl Store {
    /// Records one verdict; its row id.
    pub async fn insert_isolation_audit(&self, a: &NewIsolationAudit) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO isolation_audits (run_id, worker, channel, rounds, p_neg_log10_milli, \
             control_p_neg_log10_milli, threshold_p_neg_log10_milli, conclusive, leak, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        )
        .bind(a.run_id.0)
        .bind(a.worker.clone())
        .bind(a.channel.as_str())
        .bind(a.rounds)
        .bind(neg_log10_milli(a.p))
        .bind(a.control_p.map(neg_log10_milli))
        .bind(neg_log10_milli(a.threshold))
        .bind(i64::from(a.conclusive))
        .bind(i64::from(a.leak))
        .bind(a.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// The newest `limit` verdicts recorded since `since`, oldest first (the chart's order).
    pub async fn isolation_audits(
        &self,
        since: UnixMs,
        limit: i64,
    ) -> Result<Vec<IsolationAudit>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, run_id, worker, channel, rounds, p_neg_log10_milli, \
             control_p_neg_log10_milli, threshold_p_neg_log10_milli, conclusive, leak, at \
             FROM isolation_audits WHERE at >= $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(since.0)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut out = rows
            .iter()
            .map(|r| {
                Ok(IsolationAudit {
                    id: r.try_get("id")?,
                    audit: NewIsolationAudit {
                        run_id: ProbeRunId(r.try_get("run_id")?),
                        worker: r.try_get("worker")?,
                        channel: get_enum(r, "channel")?,
                        rounds: r.try_get("rounds")?,
                        p: from_neg_log10_milli(r.try_get("p_neg_log10_milli")?),
                        control_p: r
                            .try_get::<Option<i64>, _>("control_p_neg_log10_milli")?
                            .map(from_neg_log10_milli),
                        threshold: from_neg_log10_milli(r.try_get("threshold_p_neg_log10_milli")?),
                        conclusive: get_flag(r, "conclusive")?,
                        leak: get_flag(r, "leak")?,
                        at: UnixMs(r.try_get("at")?),
                    },
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_values_keep_three_decimals_of_their_log() {
        assert_eq!(neg_log10_milli(1.0), 0);
        assert_eq!(neg_log10_milli(1e-3), 3000);
        assert_eq!(neg_log10_milli(0.0), 300_000);
        assert_eq!(neg_log10_milli(f64::NAN), 300_000);
        assert_eq!(neg_log10_milli(7.0), 0);
        for p in [0.5, 0.049, 2.1e-5, 1e-12] {
            let back = from_neg_log10_milli(neg_log10_milli(p));
            assert!((back / p - 1.0).abs() < 0.0012, "{p} came back as {back}");
        }
    }
}
