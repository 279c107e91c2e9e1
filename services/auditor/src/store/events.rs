//! Ingested records: samples, integrity events, preflight reports, markers, prefix-cache
//! events and the pages each namespace holds, and the integrity-event series the dashboard
//! charts.

use sqlx::Row;

use super::{
    get_enum, get_flag, CacheHeld, CacheTotals, MarkerRecord, NewCacheEvent, NewIntegrityEvent,
    NewPreflight, NewSample, NodeStatus, RoutineCount, SamplePoint, SampleTotals, SeriesPoint,
    Store, StoreError,
};
use crate::domain::{NodeRole, UnixMs};

impl Store {
    /// Records a sampled response.
    pub async fn insert_sample(&self, s: &NewSample) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO samples (tenant, request_id, node, prompt_tokens, completion_tokens, \
             response_digest, scanned, foreign_markers, ttft_ms, status, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
        )
        .bind(s.tenant.clone())
        .bind(s.request_id.clone())
        .bind(s.node.clone())
        .bind(s.prompt_tokens)
        .bind(s.completion_tokens)
        .bind(s.response_digest.clone())
        .bind(i64::from(s.scanned))
        .bind(s.foreign_markers)
        .bind(s.ttft_ms)
        .bind(s.status.as_str())
        .bind(s.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// Totals over every recorded sample.
    pub async fn sample_totals(&self) -> Result<SampleTotals, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, \
             COUNT(CASE WHEN scanned = 1 THEN 1 END) AS scanned, \
             COUNT(CASE WHEN foreign_markers > 0 THEN 1 END) AS leaked FROM samples",
        )
        .fetch_one(self.pool())
        .await?;
        Ok(SampleTotals {
            samples: row.try_get("n")?,
            scanned: row.try_get("scanned")?,
            with_foreign_markers: row.try_get("leaked")?,
        })
    }

    /// The newest `limit` samples received since `since`, newest first (the latency chart).
    pub async fn recent_samples(
        &self,
        since: UnixMs,
        limit: i64,
    ) -> Result<Vec<SamplePoint>, StoreError> {
        let rows = sqlx::query(
            "SELECT tenant, prompt_tokens, ttft_ms, status, at FROM samples WHERE at >= $1 \
             ORDER BY id DESC LIMIT $2",
        )
        .bind(since.0)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SamplePoint {
                    tenant: r.try_get("tenant")?,
                    prompt_tokens: r.try_get("prompt_tokens")?,
                    ttft_ms: r.try_get("ttft_ms")?,
                    status: get_enum(r, "status")?,
                    at: UnixMs(r.try_get("at")?),
                })
            })
            .collect()
    }

    /// Records a prefix-cache event.
    pub async fn insert_cache_event(&self, e: &NewCacheEvent) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO cache_events (kind, node, role, tenant, namespace, request_id, \
             prompt_tokens, cached_tokens, pages, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
        )
        .bind(e.kind.as_str())
        .bind(e.node.clone())
        .bind(e.role.as_str())
        .bind(e.tenant.clone())
        .bind(e.namespace.clone())
        .bind(e.request_id.clone())
        .bind(e.prompt_tokens)
        .bind(e.cached_tokens)
        .bind(e.pages)
        .bind(e.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// Per role and tenant: lookups, evictions and the pages its namespaces hold now (the
    /// workers' last `held` reports).
    pub async fn cache_totals(&self) -> Result<Vec<CacheTotals>, StoreError> {
        let rows = sqlx::query(
            "SELECT role, COALESCE(tenant, '') AS tenant, \
             COUNT(CASE WHEN kind = 'hit' THEN 1 END) AS hits, \
             COUNT(CASE WHEN kind = 'miss' THEN 1 END) AS misses, \
             COUNT(CASE WHEN kind = 'eviction' THEN 1 END) AS evictions, \
             CAST(COALESCE(SUM(prompt_tokens), 0) AS BIGINT) AS prompt_tokens, \
             CAST(COALESCE(SUM(cached_tokens), 0) AS BIGINT) AS cached_tokens, \
             CAST(COALESCE(SUM(pages), 0) AS BIGINT) AS evicted_pages, \
             COUNT(DISTINCT namespace) AS namespaces \
             FROM cache_events GROUP BY role, COALESCE(tenant, '') \
             ORDER BY role, tenant",
        )
        .fetch_all(self.pool())
        .await?;
        let mut totals = rows
            .iter()
            .map(|r| {
                Ok(CacheTotals {
                    role: get_enum(r, "role")?,
                    tenant: r.try_get("tenant")?,
                    hits: r.try_get("hits")?,
                    misses: r.try_get("misses")?,
                    evictions: r.try_get("evictions")?,
                    prompt_tokens: r.try_get("prompt_tokens")?,
                    cached_tokens: r.try_get("cached_tokens")?,
                    evicted_pages: r.try_get("evicted_pages")?,
                    namespaces: r.try_get("namespaces")?,
                    pages_held: 0,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let held = sqlx::query(
            "SELECT role, COALESCE(tenant, '') AS tenant, \
             CAST(COALESCE(SUM(pages), 0) AS BIGINT) AS pages \
             FROM cache_held GROUP BY role, COALESCE(tenant, '')",
        )
        .fetch_all(self.pool())
        .await?;
        for r in &held {
            let (role, tenant): (NodeRole, String) = (get_enum(r, "role")?, r.try_get("tenant")?);
            let pages: i64 = r.try_get("pages")?;
            match totals
                .iter_mut()
                .find(|t| t.role == role && t.tenant == tenant)
            {
                Some(t) => t.pages_held = pages,
                None => totals.push(CacheTotals {
                    role,
                    tenant,
                    hits: 0,
                    misses: 0,
                    evictions: 0,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    evicted_pages: 0,
                    namespaces: 0,
                    pages_held: pages,
                }),
            }
        }
        totals.sort_by(|a, b| (a.role.as_str(), &a.tenant).cmp(&(b.role.as_str(), &b.tenant)));
        Ok(totals)
    }

    /// Replaces what `h.node` last said of `h.namespace`'s cached pages (a tenant it no longer
    /// names keeps the one it named before).
    pub async fn set_cache_held(&self, h: &CacheHeld) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO cache_held (node, namespace, role, tenant, pages, at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (node, namespace) DO UPDATE SET \
             role = excluded.role, tenant = COALESCE(excluded.tenant, cache_held.tenant), \
             pages = excluded.pages, at = excluded.at",
        )
        .bind(h.node.clone())
        .bind(h.namespace.clone())
        .bind(h.role.as_str())
        .bind(h.tenant.clone())
        .bind(h.pages)
        .bind(h.at.0)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records an integrity event.
    pub async fn insert_integrity(&self, e: &NewIntegrityEvent) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO integrity_events (kind, node, request_id, tenant, page, generation, \
             details, routine, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
        )
        .bind(e.kind.as_str())
        .bind(e.node.clone())
        .bind(e.request_id.clone())
        .bind(e.tenant.clone())
        .bind(e.page)
        .bind(e.generation)
        .bind(e.details.clone())
        .bind(i64::from(e.routine))
        .bind(e.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// Routine integrity events (counted, no incident) per kind, with the latest of each.
    pub async fn routine_counts(&self) -> Result<Vec<RoutineCount>, StoreError> {
        let rows = sqlx::query(
            "SELECT kind, COUNT(*) AS n, MAX(at) AS last_at FROM integrity_events \
             WHERE routine = 1 GROUP BY kind ORDER BY kind",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(RoutineCount {
                    kind: get_enum(r, "kind")?,
                    count: r.try_get("n")?,
                    last_at: UnixMs(r.try_get("last_at")?),
                })
            })
            .collect()
    }

    /// Integrity events since `since`, counted per kind in buckets of `bucket_ms`.
    pub async fn integrity_series(
        &self,
        since: UnixMs,
        bucket_ms: i64,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        let bucket_ms = bucket_ms.max(1);
        let rows = sqlx::query(
            "SELECT (at / $1) * $1 AS bucket, kind, COUNT(*) AS n FROM integrity_events \
             WHERE at >= $2 GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .bind(bucket_ms)
        .bind(since.0)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SeriesPoint {
                    bucket: UnixMs(r.try_get("bucket")?),
                    kind: get_enum(r, "kind")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }

    /// Records a preflight report.
    pub async fn insert_preflight(&self, p: &NewPreflight) -> Result<i64, StoreError> {
        let row = sqlx::query(
            "INSERT INTO preflight_reports (node, role, pool_tokens, context_length, ok, \
             message, at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        )
        .bind(p.node.clone())
        .bind(p.role.as_str())
        .bind(p.pool_tokens)
        .bind(p.context_length)
        .bind(i64::from(p.ok))
        .bind(p.message.clone())
        .bind(p.at.0)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get("id")?)
    }

    /// Every node's latest preflight, by node name.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>, StoreError> {
        let rows = sqlx::query(
            "SELECT p.node, p.role, p.pool_tokens, p.context_length, p.ok, p.message, p.at, \
             (SELECT COUNT(*) FROM preflight_reports c WHERE c.node = p.node) AS reports \
             FROM preflight_reports p \
             WHERE p.id = (SELECT MAX(q.id) FROM preflight_reports q WHERE q.node = p.node) \
             ORDER BY p.node",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(NodeStatus {
                    last: NewPreflight {
                        node: r.try_get("node")?,
                        role: get_enum(r, "role")?,
                        pool_tokens: r.try_get("pool_tokens")?,
                        context_length: r.try_get("context_length")?,
                        ok: get_flag(r, "ok")?,
                        message: r.try_get("message")?,
                        at: UnixMs(r.try_get("at")?),
                    },
                    reports: r.try_get("reports")?,
                })
            })
            .collect()
    }

    /// Records an issued marker.
    pub async fn insert_marker(&self, m: &MarkerRecord) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO markers (marker, tenant, issued_at) VALUES ($1, $2, $3)")
            .bind(m.marker.clone())
            .bind(m.tenant.clone())
            .bind(m.issued_at.0)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Issued markers, of one tenant or of all, oldest first.
    pub async fn markers(&self, tenant: Option<&str>) -> Result<Vec<MarkerRecord>, StoreError> {
        let q = match tenant {
            Some(t) => sqlx::query(
                "SELECT marker, tenant, issued_at FROM markers WHERE tenant = $1 \
                 ORDER BY issued_at, marker",
            )
            .bind(t.to_string()),
            None => sqlx::query(
                "SELECT marker, tenant, issued_at FROM markers ORDER BY issued_at, marker",
            ),
        };
        let rows = q.fetch_all(self.pool()).await?;
        rows.iter()
            .map(|r| {
                Ok(MarkerRecord {
                    marker: r.try_get("marker")?,
                    tenant: r.try_get("tenant")?,
                    issued_at: UnixMs(r.try_get("issued_at")?),
                })
            })
            .collect()
    }
}
