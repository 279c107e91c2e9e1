//! Persistence over sqlx's `Any` driver: one `Store` for SQLite (embedded default) and
//! PostgreSQL (production). Queries use `$N` placeholders, which both backends accept, and only
//! types both agree on (BIGINT/INTEGER, TEXT); times are unix milliseconds.
//!
//! - `records`: the row types read and written.
//! - `incidents`: incidents and their open → acknowledged → resolved transitions.
//! - `events`: samples, integrity events (routine counts included), preflight reports, markers,
//!   the integrity series.
//! - `probes`: probe runs and their per-step results.
//! - `erasures`: tenants' prefix-cache erasures and their certificates.
//! - `recomputes`: the recompute audit's verdicts (digests, never tokens).
//! - `isolation`: the side-channel audit's verdicts per worker and channel.

mod erasures;
mod events;
mod incidents;
mod isolation;
mod probes;
mod recomputes;
mod records;

use std::str::FromStr;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{AnyPool, Row};

pub use erasures::{ErasedWorker, ErasureRecord, NewErasure};
pub use isolation::{IsolationAudit, NewIsolationAudit};
pub use recomputes::{NewRecompute, RecomputeRecord, RecomputeTotals};
pub use records::*;

use crate::domain::{IncidentId, IncidentStatus, UnknownValue};

/// The schema of each backend, embedded at build time from `migrations/{sqlite,postgres}/`
/// (`build.rs` rebuilds when a file there changes).
static SQLITE_MIGRATIONS: Migrator = sqlx_macros::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx_macros::migrate!("../../migrations/postgres");

/// How long a query waits for a connection before it fails. While the database is down sqlx
/// keeps trying to connect until then, so this bounds how long a report waits for its
/// `UNAVAILABLE` (the sender retries it) and how long `/ready` waits for its 503; sqlx's default
/// is 30 s.
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// What went wrong talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names neither `sqlite:` nor `postgres:`.
    #[error("unsupported database url {0:?} (expected sqlite:... or postgres://...)")]
    UnsupportedUrl(String),
    /// The driver failed.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] MigrateError),
    /// A stored value is not one the schema allows (the CHECKs and enums disagree).
    #[error("stored value out of range: {0}")]
    Corrupt(#[from] UnknownValue),
    /// No incident has this id.
    #[error("incident {0} not found")]
    NotFound(IncidentId),
    /// The incident's status does not allow this transition.
    #[error("incident {id} is {from}; it cannot become {to}")]
    InvalidTransition {
        /// The incident.
        id: IncidentId,
        /// Its current status.
        from: IncidentStatus,
        /// The requested status.
        to: IncidentStatus,
    },
    /// The incident changed between reading and updating it.
    #[error("incident {0} changed concurrently; retry")]
    Conflict(IncidentId),
}

/// Which database engine a store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// SQLite, a file or `:memory:`.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Backend {
    /// The backend a database URL names.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::UnsupportedUrl(url.to_string()))
        }
    }

    /// The backend's migrations up to `through` (inclusive).
    fn migrator(self, through: i64) -> Migrator {
        let all = match self {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        Migrator::with_migrations(
            all.iter()
                .filter(|m| m.version <= through)
                .cloned()
                .collect(),
        )
    }
}

/// The auditor's database: a pool plus the backend it points at. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

impl Store {
    /// Connects to `url` and applies the backend's migrations.
    ///
    /// `sqlite::memory:` gets a single connection (each SQLite connection would otherwise see
    /// its own empty database); file URLs should carry `?mode=rwc` to be created when missing.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_through(url, i64::MAX).await
    }

    /// [`Store::connect`], applying migrations only up to version `through`: for tests of a
    /// later migration over rows written under an earlier schema.
    pub async fn connect_through(url: &str, through: i64) -> Result<Self, StoreError> {
        let backend = Backend::of_url(url)?;
        sqlx::any::install_default_drivers();
        let memory = backend == Backend::Sqlite && url.contains(":memory:");
        let opts = AnyPoolOptions::new()
            .max_connections(if memory { 1 } else { 4 })
            .min_connections(if memory { 1 } else { 0 })
            .idle_timeout(if memory {
                None
            } else {
                Some(std::time::Duration::from_secs(300))
            })
            .max_lifetime(None)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // A connection the database dropped (it restarted) is found dead and replaced on
            // its next use, never handed to a query.
            .test_before_acquire(true);
        let pool = opts.connect(url).await?;
        backend.migrator(through).run(&pool).await?;
        Ok(Store { pool, backend })
    }

    /// The backend this store talks to.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Answers when the database does: one `SELECT 1` (the `/health` check).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Executes one trusted SQL statement verbatim (maintenance and tests; never user input).
    pub async fn execute_raw(&self, sql: &'static str) -> Result<u64, StoreError> {
        Ok(sqlx::query(sql).execute(&self.pool).await?.rows_affected())
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// Reads a CHECK-constrained text column as its enum.
pub(crate) fn get_enum<T>(row: &AnyRow, col: &str) -> Result<T, StoreError>
where
    T: FromStr<Err = UnknownValue>,
{
    let s: String = row.try_get(col)?;
    Ok(s.parse()?)
}

/// Reads a 0/1 integer column as a bool (the `Any` driver has no portable boolean).
pub(crate) fn get_flag(row: &AnyRow, col: &str) -> Result<bool, StoreError> {
    let v: i64 = row.try_get(col)?;
    Ok(v != 0)
}
