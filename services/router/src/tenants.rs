//! API keys → tenants: the key table of `pagewarden_common::tenants` (hashed keys only),
//! swapped whole when the tenants file is reloaded on SIGHUP, and the auth middleware that runs
//! before any body is read (no key or an unknown key is a 401).
//!
//! A reload never drops a request: a request looks its key up once, at admission, and keeps
//! its tenant; a file that does not load is logged and the previous table stays in force.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pagewarden_common::namespace::{Namespace, NamespaceSecret};
use pagewarden_common::tenants::{KeyTable, TenantEntry, TenantLimits, TenantsFile};
use pagewarden_common::TenantId;

pub use pagewarden_common::tenants::TenantsError;

use crate::error::RouterError;
use crate::server::AppState;
use pagewarden_common::edge::Connection;

/// Where the tenants come from: entries inline in the config file, and the tenants file (read
/// again on every reload).
#[derive(Clone, Debug, Default)]
pub struct TenantSource {
    /// `[[tenants]]` of the config file.
    pub inline: Vec<TenantEntry>,
    /// The tenants file.
    pub file: Option<PathBuf>,
}

impl TenantSource {
    /// Reads the file (if any) and builds the table.
    pub fn load(&self) -> Result<KeyTable, TenantsError> {
        let mut all = self.inline.clone();
        if let Some(p) = &self.file {
            all.extend(TenantsFile::load(p)?.tenants);
        }
        KeyTable::new(&all)
    }
}

/// The live key table, and the secret prefix-cache namespaces are derived under.
#[derive(Debug)]
pub struct Tenants {
    table: RwLock<Arc<KeyTable>>,
    source: TenantSource,
    /// Drawn at start: the namespaces this router derives are its own (a restarted router
    /// starts cold, and two routers never share cached prefixes), and nobody else can compute
    /// one (I10).
    secret: NamespaceSecret,
}

impl Tenants {
    /// Loads the table from `source`.
    pub fn load(source: TenantSource) -> Result<Self, TenantsError> {
        Ok(Self {
            table: RwLock::new(Arc::new(source.load()?)),
            source,
            secret: NamespaceSecret::random(&mut rand::rng()),
        })
    }

    /// A fixed table of `entries` (tests; nothing to reload).
    pub fn new(entries: &[TenantEntry]) -> Result<Self, TenantsError> {
        Self::load(TenantSource {
            inline: entries.to_vec(),
            file: None,
        })
    }

    fn current(&self) -> Arc<KeyTable> {
        // A poisoned lock still holds a whole table: swaps are single assignments.
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The tenant owning `key`.
    pub fn tenant(&self, key: &str) -> Option<TenantId> {
        self.current().tenant(key).cloned()
    }

    /// The tenant's own limit of requests in flight, if its entry sets one.
    pub fn max_concurrent(&self, tenant: &TenantId) -> Option<u32> {
        self.current().max_concurrent(tenant)
    }

    /// The tenant's weight and limits (defaults for a tenant without an entry).
    pub fn limits(&self, tenant: &TenantId) -> TenantLimits {
        self.current().limits(tenant)
    }

    /// The tenant's prefix-cache namespace: the shared one the tenants file places it in,
    /// else its own. Derived here, never taken from a request (I10).
    pub fn namespace(&self, tenant: &TenantId) -> Namespace {
        #[cfg(feature = "unsafe-test-switches")]
        {
            use pagewarden_common::namespace::Placement;
            use pagewarden_common::test_switches::{Switch, TestSwitches};
            if TestSwitches::current().is_off(Switch::NamespaceIsolation) {
                return Namespace::derive(&self.secret, Placement::Shared("unsafe-test-switch"));
            }
        }
        self.current().namespace(tenant, &self.secret)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// True when no key is configured (every request will be a 401).
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// Reads the source again and swaps the table in; on error the old table stays.
    /// Returns the number of keys now in force.
    pub fn reload(&self) -> Result<usize, TenantsError> {
        let fresh = Arc::new(self.source.load()?);
        let n = fresh.len();
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(n)
    }
}

/// Reloads `tenants` on every SIGHUP. The handler is installed before this returns (SIGHUP's
/// default action would end the process), so call it before announcing readiness.
pub fn reload_on_sighup(tenants: Arc<Tenants>) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match tenants.reload() {
                Ok(keys) => tracing::info!(keys, "tenants file reloaded"),
                Err(e) => tracing::error!(
                    error = %e,
                    "tenants file not reloaded: the previous keys stay in force"
                ),
            }
        }
    });
    Ok(())
}

/// Middleware: resolves `Authorization: Bearer KEY` to a [`TenantId`] request extension.
pub async fn require_tenant(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let tenant = req
        .headers()
        .get(AUTHORIZATION)
        .ok_or(RouterError::Unauthorized(
            "missing API key: send `Authorization: Bearer KEY`",
        ))
        .and_then(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, key)| key.trim())
                .and_then(|key| state.tenants.tenant(key))
                .ok_or(RouterError::Unauthorized("invalid API key"))
        });
    match tenant {
        Ok(t) => {
            if let Some(conn) = req.extensions().get::<Connection>() {
                conn.authenticated(t.as_str());
            }
            req.extensions_mut().insert(t);
            next.run(req).await
        }
        Err(e) => {
            state.metrics.reject(e.reason());
            e.into_response()
        }
    }
}
