//! The erasure log: each tenant's prefix-cache erasure (`DELETE /v1/cache` at the router) with
//! the certificate it was given, one row per erasure and one per worker that erased.

use serde::Serialize;
use sqlx::Row;

use super::{get_enum, Store, StoreError};
use crate::domain::{NodeRole, UnixMs};

/// An erasure to record.
#[derive(Clone, Debug)]
pub struct NewErasure {
    /// The tenant that erased its cache.
    pub tenant: String,
    /// Its namespace's tag.
    pub namespace: String,
    /// The certificate's digest (64 hex digits).
    pub digest: String,
    /// Each worker's part.
    pub workers: Vec<ErasedWorker>,
    /// When it was received.
    pub at: UnixMs,
}

/// One worker's part of an erasure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErasedWorker {
    /// The worker's node id.
    pub node: String,
    /// Prefill or decode.
    pub role: NodeRole,
    /// Cached pages taken out of its index.
    pub entries: i64,
    /// Of them, zeroed at once.
    pub pages_zeroed: i64,
    /// Of them, still read by a running request then: zeroed when it let go.
    pub pages_deferred: i64,
    /// The worker's digest of the erased copies (64 hex digits).
    pub digest: String,
}

/// A recorded erasure, as `/api/erasures` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErasureRecord {
    /// Row id.
    pub id: i64,
    /// The tenant that erased its cache.
    pub tenant: String,
    /// Its namespace's tag.
    pub namespace: String,
    /// The certificate's digest.
    pub digest: String,
    /// When it was received.
    pub at: UnixMs,
    /// Each worker's part.
    pub workers: Vec<ErasedWorker>,
}

impl Store {
    /// Records an erasure and its workers' parts, all or nothing.
    pub async fn insert_erasure(&self, e: &NewErasure) -> Result<i64, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(
            "INSERT INTO cache_erasures (tenant, namespace, digest, at) \
             VALUES ($1, $2, $3, $4) RETURNING id",
        )
        .bind(e.tenant.clone())
        .bind(e.namespace.clone())
        .bind(e.digest.clone())
        .bind(e.at.0)
        .fetch_one(&mut *tx)
        .await?;
        let id: i64 = row.try_get("id")?;
        for w in &e.workers {
            sqlx::query(
                "INSERT INTO cache_erasure_workers (erasure_id, node, role, entries, \
                 pages_zeroed, pages_deferred, digest) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(id)
            .bind(w.node.clone())
            .bind(w.role.as_str())
            .bind(w.entries)
            .bind(w.pages_zeroed)
            .bind(w.pages_deferred)
            .bind(w.digest.clone())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// The newest `limit` erasures, newest first, each with its workers' parts.
    pub async fn erasures(&self, limit: i64) -> Result<Vec<ErasureRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, tenant, namespace, digest, at FROM cache_erasures \
             ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let id: i64 = r.try_get("id")?;
            let workers = sqlx::query(
                "SELECT node, role, entries, pages_zeroed, pages_deferred, digest \
                 FROM cache_erasure_workers WHERE erasure_id = $1 ORDER BY role DESC, node",
            )
            .bind(id)
            .fetch_all(self.pool())
            .await?
            .iter()
            .map(|w| {
                Ok(ErasedWorker {
                    node: w.try_get("node")?,
                    role: get_enum(w, "role")?,
                    entries: w.try_get("entries")?,
                    pages_zeroed: w.try_get("pages_zeroed")?,
                    pages_deferred: w.try_get("pages_deferred")?,
                    digest: w.try_get("digest")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
            out.push(ErasureRecord {
                id,
                tenant: r.try_get("tenant")?,
                namespace: r.try_get("namespace")?,
                digest: r.try_get("digest")?,
                at: UnixMs(r.try_get("at")?),
                workers,
            });
        }
        Ok(out)
    }
}
