//! The engine: turns validated reports into stored records and incidents. Every detector
//! (sample scan, integrity event, preflight, probe step) opens incidents through
//! [`Engine::open_incident`], so metrics and logs see all of them. Routine integrity events
//! ([`IntegrityKind::is_routine`](crate::domain::IntegrityKind::is_routine)) are stored and
//! counted but open none.

use pagewarden_common::TenantId;
use serde_json::json;

use crate::domain::{CacheEventKind, IncidentId, IncidentKind, IntegrityKind, UnixMs};
use crate::ingest::{
    SampleBody, ValidCacheEvent, ValidErasure, ValidIntegrity, ValidPreflight, ValidSample,
};
use crate::markers::{new_marker, ForeignMarker, MarkerRegistry};
use crate::metrics::Metrics;
use crate::store::{
    CacheHeld, ErasedWorker, MarkerRecord, NewCacheEvent, NewErasure, NewIncident,
    NewIntegrityEvent, NewPreflight, NewSample, Store, StoreError,
};

/// Shared state of a running auditor: the store, the marker index, the counters.
pub struct Engine {
    store: Store,
    markers: MarkerRegistry,
    metrics: Metrics,
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Engine {
    /// An engine over `store`, with every previously issued marker loaded.
    pub async fn new(store: Store) -> Result<Self, StoreError> {
        let markers = MarkerRegistry::default();
        for m in store.markers(None).await? {
            markers.insert(m.marker, TenantId::new(m.tenant));
        }
        Ok(Engine {
            store,
            markers,
            metrics: Metrics::default(),
        })
    }

    /// The database.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Markers in `text` issued to tenants other than `reader`.
    pub fn foreign_markers(&self, reader: &TenantId, text: &str) -> Vec<ForeignMarker> {
        self.markers.foreign_in(reader, text)
    }

    /// Draws, stores and indexes a fresh marker for `tenant`.
    pub async fn issue_marker(&self, tenant: &TenantId) -> Result<MarkerRecord, StoreError> {
        let rec = MarkerRecord {
            marker: new_marker(&mut rand::rng()),
            tenant: tenant.as_str().to_string(),
            issued_at: UnixMs::now(),
        };
        self.store.insert_marker(&rec).await?;
        self.markers.insert(rec.marker.clone(), tenant.clone());
        Ok(rec)
    }

    /// Stores an incident, counts it and logs it.
    pub async fn open_incident(&self, n: NewIncident) -> Result<IncidentId, StoreError> {
        let id = self.store.insert_incident(&n).await?;
        self.metrics.incident(n.kind);
        tracing::warn!(
            incident = id.0,
            kind = %n.kind,
            severity = %n.severity,
            tenant = n.tenant.as_deref().unwrap_or(""),
            node = n.node.as_deref().unwrap_or(""),
            "incident opened"
        );
        Ok(id)
    }

    /// Stores a sampled response and opens one incident per foreign marker in it.
    pub async fn ingest_sample(&self, s: ValidSample) -> Result<Vec<IncidentId>, StoreError> {
        let at = UnixMs::now();
        let (digest, foreign, scanned) = match &s.body {
            SampleBody::Text(t) => (
                format!("{:032x}", xxhash_rust::xxh3::xxh3_128(t.as_bytes())),
                self.markers.foreign_in(&s.tenant, t),
                true,
            ),
            SampleBody::Digest(d) => (d.clone(), Vec::new(), false),
        };
        self.metrics.sample(scanned);
        let request_id = s.request.map(|r| r.to_string());
        let sample_id = self
            .store
            .insert_sample(&NewSample {
                tenant: s.tenant.as_str().to_string(),
                request_id: request_id.clone(),
                node: s.node.clone(),
                prompt_tokens: i64::from(s.prompt_tokens),
                completion_tokens: i64::from(s.completion_tokens),
                response_digest: digest.clone(),
                scanned,
                foreign_markers: foreign.len() as i64,
                ttft_ms: s.ttft_ms.map(i64::from),
                status: s.status,
                at,
            })
            .await?;
        let mut opened = Vec::new();
        for f in foreign {
            let kind = IncidentKind::CrossTenantMarker;
            opened.push(
                self.open_incident(NewIncident {
                    kind,
                    severity: kind.severity(),
                    node: s.node.clone(),
                    request_id: request_id.clone(),
                    tenant: Some(s.tenant.as_str().to_string()),
                    other_tenant: Some(f.owner.as_str().to_string()),
                    page: None,
                    generation: None,
                    details: json!({
                        "source": "sample",
                        "sample_id": sample_id,
                        "marker": f.marker,
                        "response_digest": digest,
                        "status": s.status,
                    })
                    .to_string(),
                    at,
                })
                .await?,
            );
        }
        Ok(opened)
    }

    /// Stores a prefix-cache event and counts it per role, kind and tenant; a `held` report
    /// replaces what its worker last said of its namespace. Isolation itself is checked by the
    /// probes' prefix step; these say how each tenant's cache is used.
    pub async fn ingest_cache(&self, e: ValidCacheEvent) -> Result<(), StoreError> {
        let tenant = e.tenant.as_ref().map(|t| t.as_str().to_string());
        if e.kind == CacheEventKind::Held {
            let held = CacheHeld {
                node: e.node,
                role: e.role,
                namespace: e.namespace,
                tenant,
                pages: i64::from(e.pages),
                at: UnixMs::now(),
            };
            return self.store.set_cache_held(&held).await;
        }
        self.metrics.cache_event(
            e.role,
            e.kind,
            tenant.as_deref().unwrap_or(""),
            u64::from(e.cached_tokens),
        );
        let rec = NewCacheEvent {
            kind: e.kind,
            node: e.node,
            role: e.role,
            tenant,
            namespace: e.namespace,
            request_id: e.request.map(|r| r.to_string()),
            prompt_tokens: i64::from(e.prompt_tokens),
            cached_tokens: i64::from(e.cached_tokens),
            pages: i64::from(e.pages),
            at: UnixMs::now(),
        };
        self.store.insert_cache_event(&rec).await?;
        Ok(())
    }

    /// Logs a tenant's prefix-cache erasure with its certificate (counts and digests only).
    pub async fn ingest_erasure(&self, e: ValidErasure) -> Result<(), StoreError> {
        let rec = NewErasure {
            tenant: e.tenant.as_str().to_string(),
            namespace: e.namespace,
            digest: e.digest,
            workers: e
                .workers
                .into_iter()
                .map(|w| ErasedWorker {
                    node: w.node,
                    role: w.role,
                    entries: i64::from(w.entries),
                    pages_zeroed: i64::from(w.pages_zeroed),
                    pages_deferred: i64::from(w.pages_deferred),
                    digest: w.digest,
                })
                .collect(),
            at: UnixMs::now(),
        };
        self.store.insert_erasure(&rec).await?;
        tracing::info!(tenant = %rec.tenant, namespace = %rec.namespace, digest = %rec.digest, "prefix cache erasure logged");
        Ok(())
    }

    /// Stores an integrity event; one that is not routine opens an incident, a routine one is
    /// only counted (`None`).
    pub async fn ingest_integrity(
        &self,
        e: ValidIntegrity,
    ) -> Result<Option<IncidentId>, StoreError> {
        let at = UnixMs::now();
        self.metrics.integrity(e.kind);
        let routine = e.kind.is_routine(e.request.is_some());
        let rec = NewIntegrityEvent {
            kind: e.kind,
            node: e.node,
            request_id: e.request.map(|r| r.to_string()),
            tenant: e.tenant.map(|t| t.as_str().to_string()),
            page: e.page.map(i64::from),
            generation: e.generation.map(clamp_i64),
            details: e.details,
            routine,
            at,
        };
        let event_id = self.store.insert_integrity(&rec).await?;
        if routine {
            self.metrics.routine(rec.kind);
            tracing::debug!(kind = %rec.kind, node = %rec.node, "routine integrity event counted");
            return Ok(None);
        }
        let kind = IncidentKind::from(rec.kind);
        let id = self
            .open_incident(NewIncident {
                kind,
                severity: kind.severity(),
                node: Some(rec.node.clone()),
                request_id: rec.request_id.clone(),
                tenant: rec.tenant.clone(),
                other_tenant: None,
                page: rec.page,
                generation: rec.generation,
                details: json!({
                    "source": "integrity_event",
                    "event_id": event_id,
                    "page": rec.page,
                    "generation": rec.generation,
                    "details": rec.details,
                })
                .to_string(),
                at,
            })
            .await?;
        Ok(Some(id))
    }

    /// Stores a preflight report; a failed one, or one whose pool cannot hold the advertised
    /// context (I7) whatever the worker concluded, opens an incident.
    pub async fn ingest_preflight(
        &self,
        p: ValidPreflight,
    ) -> Result<Option<IncidentId>, StoreError> {
        let at = UnixMs::now();
        self.metrics.preflight();
        let rec = NewPreflight {
            node: p.node,
            role: p.role,
            pool_tokens: clamp_i64(p.pool_tokens),
            context_length: i64::from(p.context_length),
            ok: p.ok,
            message: p.message,
            at,
        };
        self.store.insert_preflight(&rec).await?;
        let undersized = p.pool_tokens < u64::from(p.context_length);
        if rec.ok && !undersized {
            return Ok(None);
        }
        let kind = IncidentKind::Integrity(IntegrityKind::PreflightFailed);
        let why = if rec.ok {
            "worker reported ok but its pool cannot hold its advertised context"
        } else {
            "worker reported a failed preflight"
        };
        let id = self
            .open_incident(NewIncident {
                kind,
                severity: kind.severity(),
                node: Some(rec.node.clone()),
                request_id: None,
                tenant: None,
                other_tenant: None,
                page: None,
                generation: None,
                details: json!({
                    "source": "preflight",
                    "why": why,
                    "role": rec.role,
                    "pool_tokens": rec.pool_tokens,
                    "context_length": rec.context_length,
                    "ok": rec.ok,
                    "message": rec.message,
                })
                .to_string(),
                at,
            })
            .await?;
        Ok(Some(id))
    }
}
