//! Incidents: open, list (filtered, a window at a time), count, chart, read, and the
//! acknowledge/resolve transitions.

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::{
    get_enum, Incident, IncidentFilter, IncidentPoint, NewIncident, Signoff, Store, StoreError,
    Window,
};
use crate::domain::{IncidentId, IncidentStatus, UnixMs};

const COLUMNS: &str = "id, kind, severity, status, node, request_id, tenant, other_tenant, \
    page, generation, details, created_at, acknowledged_by, acknowledged_at, ack_note, \
    resolved_by, resolved_at, resolve_note";

/// A bound value of a filter clause.
enum Arg {
    Text(String),
    Int(i64),
}

/// `WHERE ...` for `f` (empty when it does not filter) and its arguments, numbered from `$1`.
/// Only `$N` placeholders are interpolated into the SQL; every value is bound.
fn where_clause(f: &IncidentFilter) -> (String, Vec<Arg>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut args: Vec<Arg> = Vec::new();
    if let Some(s) = f.status {
        args.push(Arg::Text(s.as_str().into()));
        clauses.push(format!("status = ${}", args.len()));
    }
    if let Some(k) = f.kind {
        args.push(Arg::Text(k.as_str().into()));
        clauses.push(format!("kind = ${}", args.len()));
    }
    if let Some(t) = &f.tenant {
        args.push(Arg::Text(t.clone()));
        let n = args.len();
        clauses.push(format!("(tenant = ${n} OR other_tenant = ${n})"));
    }
    if let Some(node) = &f.node {
        args.push(Arg::Text(node.clone()));
        clauses.push(format!("node = ${}", args.len()));
    }
    if let Some(p) = f.page {
        args.push(Arg::Int(p));
        clauses.push(format!("page = ${}", args.len()));
    }
    if let Some(g) = f.generation {
        args.push(Arg::Int(g));
        clauses.push(format!("generation = ${}", args.len()));
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    (sql, args)
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, <sqlx::Any as sqlx::Database>::Arguments>;

fn bind_all(mut q: AnyQuery<'_>, args: Vec<Arg>) -> AnyQuery<'_> {
    for a in args {
        q = match a {
            Arg::Text(t) => q.bind(t),
            Arg::Int(i) => q.bind(i),
        };
    }
    q
}

impl Store {
    /// Opens an incident; returns its id.
    pub async fn insert_incident(&self, n: &NewIncident) -> Result<IncidentId, StoreError> {
        let row = sqlx::query(
            "INSERT INTO incidents (kind, severity, status, node, request_id, tenant, \
             other_tenant, page, generation, details, created_at) \
             VALUES ($1, $2, 'open', $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        )
        .bind(n.kind.as_str())
        .bind(n.severity.as_str())
        .bind(n.node.clone())
        .bind(n.request_id.clone())
        .bind(n.tenant.clone())
        .bind(n.other_tenant.clone())
        .bind(n.page)
        .bind(n.generation)
        .bind(n.details.clone())
        .bind(n.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(IncidentId(row.try_get("id")?))
    }

    /// One incident, or `None`.
    pub async fn incident(&self, id: IncidentId) -> Result<Option<Incident>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM incidents WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(incident_from_row).transpose()
    }

    /// The incidents matching `f`, newest first, in window `w`.
    pub async fn incidents(
        &self,
        f: &IncidentFilter,
        w: Window,
    ) -> Result<Vec<Incident>, StoreError> {
        let (filter, args) = where_clause(f);
        let (limit, offset) = (args.len() + 1, args.len() + 2);
        let sql = format!(
            "SELECT {COLUMNS} FROM incidents {filter} ORDER BY id DESC \
             LIMIT ${limit} OFFSET ${offset}"
        );
        let rows = bind_all(sqlx::query(AssertSqlSafe(sql)), args)
            .bind(w.limit)
            .bind(w.offset)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(incident_from_row).collect()
    }

    /// How many incidents match `f` (what the list pages through).
    pub async fn incident_total(&self, f: &IncidentFilter) -> Result<i64, StoreError> {
        let (filter, args) = where_clause(f);
        let sql = format!("SELECT COUNT(*) AS n FROM incidents {filter}");
        let row = bind_all(sqlx::query(AssertSqlSafe(sql)), args)
            .fetch_one(self.pool())
            .await?;
        Ok(row.try_get("n")?)
    }

    /// Incidents opened since `since`, counted per severity in buckets of `bucket_ms`.
    pub async fn incident_series(
        &self,
        since: UnixMs,
        bucket_ms: i64,
    ) -> Result<Vec<IncidentPoint>, StoreError> {
        let bucket_ms = bucket_ms.max(1);
        let rows = sqlx::query(
            "SELECT (created_at / $1) * $1 AS bucket, severity, COUNT(*) AS n FROM incidents \
             WHERE created_at >= $2 GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(bucket_ms)
        .bind(since.0)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(IncidentPoint {
                    bucket: UnixMs(r.try_get("bucket")?),
                    severity: get_enum(r, "severity")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }

    /// Incidents per status, in `IncidentStatus::ALL` order.
    pub async fn incident_counts(&self) -> Result<Vec<(IncidentStatus, i64)>, StoreError> {
        let mut out = Vec::new();
        for s in IncidentStatus::ALL {
            let row = sqlx::query("SELECT COUNT(*) AS n FROM incidents WHERE status = $1")
                .bind(s.as_str())
                .fetch_one(self.pool())
                .await?;
            out.push((*s, row.try_get::<i64, _>("n")?));
        }
        Ok(out)
    }

    /// open → acknowledged.
    pub async fn acknowledge(
        &self,
        id: IncidentId,
        by: &str,
        note: &str,
        at: UnixMs,
    ) -> Result<Incident, StoreError> {
        self.transition(id, Step::Acknowledge, by, note, at).await
    }

    /// open | acknowledged → resolved.
    pub async fn resolve(
        &self,
        id: IncidentId,
        by: &str,
        note: &str,
        at: UnixMs,
    ) -> Result<Incident, StoreError> {
        self.transition(id, Step::Resolve, by, note, at).await
    }

    async fn transition(
        &self,
        id: IncidentId,
        step: Step,
        by: &str,
        note: &str,
        at: UnixMs,
    ) -> Result<Incident, StoreError> {
        let to = step.target();
        let current = self.incident(id).await?.ok_or(StoreError::NotFound(id))?;
        if !current.status.can_become(to) {
            return Err(StoreError::InvalidTransition {
                id,
                from: current.status,
                to,
            });
        }
        let sql = match step {
            Step::Acknowledge => {
                "UPDATE incidents SET status = $1, acknowledged_by = $2, acknowledged_at = $3, \
                 ack_note = $4 WHERE id = $5 AND status = $6"
            }
            Step::Resolve => {
                "UPDATE incidents SET status = $1, resolved_by = $2, resolved_at = $3, \
                 resolve_note = $4 WHERE id = $5 AND status = $6"
            }
        };
        // The status guard makes the read-check-write atomic against a concurrent operator.
        let done = sqlx::query(sql)
            .bind(to.as_str())
            .bind(by.to_string())
            .bind(at.0)
            .bind(note.to_string())
            .bind(id.0)
            .bind(current.status.as_str())
            .execute(self.pool())
            .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Conflict(id));
        }
        self.incident(id).await?.ok_or(StoreError::NotFound(id))
    }
}

/// The operator actions; each leads to exactly one status.
#[derive(Clone, Copy)]
enum Step {
    Acknowledge,
    Resolve,
}

impl Step {
    fn target(self) -> IncidentStatus {
        match self {
            Step::Acknowledge => IncidentStatus::Acknowledged,
            Step::Resolve => IncidentStatus::Resolved,
        }
    }
}

fn signoff(row: &AnyRow, by: &str, at: &str, note: &str) -> Result<Option<Signoff>, StoreError> {
    let at: Option<i64> = row.try_get(at)?;
    Ok(match at {
        Some(at) => Some(Signoff {
            by: row.try_get::<Option<String>, _>(by)?.unwrap_or_default(),
            at: UnixMs(at),
            note: row.try_get::<Option<String>, _>(note)?.unwrap_or_default(),
        }),
        None => None,
    })
}

fn incident_from_row(row: &AnyRow) -> Result<Incident, StoreError> {
    Ok(Incident {
        id: IncidentId(row.try_get("id")?),
        kind: get_enum(row, "kind")?,
        severity: get_enum(row, "severity")?,
        status: get_enum(row, "status")?,
        node: row.try_get("node")?,
        request_id: row.try_get("request_id")?,
        tenant: row.try_get("tenant")?,
        other_tenant: row.try_get("other_tenant")?,
        page: row.try_get("page")?,
        generation: row.try_get("generation")?,
        details: row.try_get("details")?,
        created_at: UnixMs(row.try_get("created_at")?),
        acknowledged: signoff(row, "acknowledged_by", "acknowledged_at", "ack_note")?,
        resolved: signoff(row, "resolved_by", "resolved_at", "resolve_note")?,
    })
}
