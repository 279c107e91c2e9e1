//! The six defense layers of the incident (named by the real binaries' test-only
//! [`Switch`]es), on or off in the harness. Four map to the kvcache pool's test-only
//! `Defenses`; router rejection and worker admission are harness flags (the harness plays router
//! and workers, so it decides whether to run their admission checks).

use pagewarden_common::test_switches::Switch;
use pagewarden_kvcache::Defenses;

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

    /// `self` with the defense `s` set to `on` (the harness has no pool preflight and no
    /// prefix cache to switch).
    pub fn with(mut self, s: Switch, on: bool) -> Self {
        match s {
            Switch::PoolPreflight | Switch::NamespaceIsolation => {}
            Switch::RouterRejection => self.router_rejection = on,
            Switch::WorkerAdmission => self.worker_admission = on,
            Switch::CommitTokenCount => self.pool.commit_token_count = on,
            Switch::ReadGeneration => self.pool.read_generation_check = on,
            Switch::GrantFencing => self.pool.grant_fencing = on,
            Switch::Checksums => self.pool.checksum_check = on,
        }
        self
    }

    /// Every layer on except `s`.
    pub fn without(s: Switch) -> Self {
        Self::all_on().with(s, false)
    }
}
