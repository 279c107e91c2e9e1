//! API keys → tenants, from a toml file (`[[tenants]] name = "..", keys = [..]`), and the auth
//! middleware that runs before any body is read: no key or an unknown key is a 401.

use std::collections::HashMap;
use std::path::Path;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pagewarden_common::TenantId;
use serde::Deserialize;

use crate::error::RouterError;
use crate::server::AppState;

/// One `[[tenants]]` entry.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant's name.
    pub name: String,
    /// Its API keys (bearer tokens).
    pub keys: Vec<String>,
}

/// The tenants file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantsFile {
    /// Every tenant.
    #[serde(default)]
    pub tenants: Vec<TenantEntry>,
}

/// Why a tenants table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// The file could not be read.
    #[error("cannot read tenants file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid toml of the expected shape.
    #[error("cannot parse tenants file {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// The toml error.
        source: toml::de::Error,
    },
    /// Two tenants share a key, or a key is empty.
    #[error("API key problem in tenant `{tenant}`: {what}")]
    BadKey {
        /// The tenant whose key is bad.
        tenant: String,
        /// What is wrong.
        what: &'static str,
    },
}

/// Key → tenant lookup.
#[derive(Clone, Debug, Default)]
pub struct Tenants {
    by_key: HashMap<String, TenantId>,
}

impl Tenants {
    /// Builds the table; a key shared by two tenants or an empty key is an error.
    pub fn new(entries: &[TenantEntry]) -> Result<Self, TenantsError> {
        let mut by_key = HashMap::new();
        for t in entries {
            for k in &t.keys {
                if k.is_empty() {
                    return Err(TenantsError::BadKey {
                        tenant: t.name.clone(),
                        what: "empty key",
                    });
                }
                if by_key.insert(k.clone(), TenantId::new(&t.name)).is_some() {
                    return Err(TenantsError::BadKey {
                        tenant: t.name.clone(),
                        what: "key already belongs to another tenant",
                    });
                }
            }
        }
        Ok(Self { by_key })
    }

    /// Reads a tenants toml file.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let file: TenantsFile = toml::from_str(&text).map_err(|source| TenantsError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(&file.tenants)
    }

    /// The tenant owning `key`.
    pub fn tenant(&self, key: &str) -> Option<&TenantId> {
        self.by_key.get(key)
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when no key is configured (every request will be a 401).
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
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
                .cloned()
                .ok_or(RouterError::Unauthorized("invalid API key"))
        });
    match tenant {
        Ok(t) => {
            req.extensions_mut().insert(t);
            next.run(req).await
        }
        Err(e) => {
            state.metrics.reject(e.reason());
            e.into_response()
        }
    }
}
