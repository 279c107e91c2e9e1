//! The six defense layers of the incident, as switches. Four map to the kvcache pool's
//! test-only `Defenses`; router rejection and worker admission are harness flags (the harness
//! plays router and workers, so it decides whether to run their admission checks).

use pagewarden_kvcache::Defenses;

/// One defense layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Router admission against the cluster's effective context (HTTP 400).
    RouterRejection,
    /// Worker admission re-check (decode before reserving, prefill before allocating).
    WorkerAdmission,
    /// Commit verification: tokens written == tokens reserved (kvcache `commit_token_count`).
    CommitTokenCount,
    /// Generation check on every page read (kvcache `read_generation_check`).
    ReadGeneration,
    /// Writes land only under a live grant at the granted generation (`grant_fencing`).
    GrantFencing,
    /// Write and commit checksums (kvcache `checksum_check`).
    Checksums,
}

impl Layer {
    /// Every layer.
    pub const ALL: [Layer; 6] = [
        Layer::RouterRejection,
        Layer::WorkerAdmission,
        Layer::CommitTokenCount,
        Layer::ReadGeneration,
        Layer::GrantFencing,
        Layer::Checksums,
    ];
}

/// Which layers are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layers {
    /// Router rejection.
    pub router_rejection: bool,
    /// Worker admission re-check.
    pub worker_admission: bool,
    /// The pool checks.
    pub pool: Defenses,
}

impl Layers {
    /// Everything on (production behaviour).
    pub fn all_on() -> Self {
        Self {
            router_rejection: true,
            worker_admission: true,
            pool: Defenses::default(),
        }
    }

    /// Everything off (the positive control).
    pub fn all_off() -> Self {
        Self {
            router_rejection: false,
            worker_admission: false,
            pool: Defenses {
                read_generation_check: false,
                commit_token_count: false,
                checksum_check: false,
                grant_fencing: false,
            },
        }
    }

    /// Whether `l` is on.
    pub fn is_on(&self, l: Layer) -> bool {
        match l {
            Layer::RouterRejection => self.router_rejection,
            Layer::WorkerAdmission => self.worker_admission,
            Layer::CommitTokenCount => self.pool.commit_token_count,
            Layer::ReadGeneration => self.pool.read_generation_check,
            Layer::GrantFencing => self.pool.grant_fencing,
            Layer::Checksums => self.pool.checksum_check,
        }
    }

    /// `self` with `l` set to `on`.
    pub fn with(mut self, l: Layer, on: bool) -> Self {
        match l {
            Layer::RouterRejection => self.router_rejection = on,
            Layer::WorkerAdmission => self.worker_admission = on,
            Layer::CommitTokenCount => self.pool.commit_token_count = on,
            Layer::ReadGeneration => self.pool.read_generation_check = on,
            Layer::GrantFencing => self.pool.grant_fencing = on,
            Layer::Checksums => self.pool.checksum_check = on,
        }
        self
    }

    /// Every layer on except `l`.
    pub fn without(l: Layer) -> Self {
        Self::all_on().with(l, false)
    }

    /// Only `l` on.
    pub fn only(l: Layer) -> Self {
        Self::all_off().with(l, true)
    }
}
