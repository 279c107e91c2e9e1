//! TEST-ONLY (feature `unsafe-test-switches`): switches that turn single defenses off in the
//! real binaries, so the system tests can replay the incident through the real router, prefill
//! and decode and show that each defense alone stops it. This module only names and parses
//! them; a binary reads them only when its own crate's `unsafe-test-switches` feature is on
//! (`pagewarden-router`, and `pagewarden-worker` under the prefill and decode features), and
//! those crates refuse to compile that feature without `debug_assertions` (a release build).
//!
//! The switches to turn OFF are named, comma-separated, in [`ENV`]
//! (`PAGEWARDEN_UNSAFE_TEST_SWITCHES=router_rejection,checksums`); unset or empty turns nothing
//! off. An unknown name is an error at start-up, never ignored.

use std::sync::OnceLock;

/// The environment variable naming the switches to turn off.
pub const ENV: &str = "PAGEWARDEN_UNSAFE_TEST_SWITCHES";

/// One thing a switch turns off: the incident's six defenses, plus the pool preflight (I7)
/// whose absence is the incident's set-up (a prefill pool smaller than the advertised context).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Switch {
    /// Workers start with a pool smaller than their advertised context (I7), as in the incident.
    PoolPreflight,
    /// Router admission against the effective context (HTTP 400, I3).
    RouterRejection,
    /// Worker admission re-check: decode before reserving, prefill before allocating (I3). Off,
    /// prefill computes and sends only the prompt tokens its pool holds, and commits that many:
    /// fewer than decode reserved, as the incident's prefill did.
    WorkerAdmission,
    /// Commit verification that tokens (and pages) written == reserved (I2).
    CommitTokenCount,
    /// The generation check on every KV read (I1).
    ReadGeneration,
    /// Writes land only under a live grant at the granted generation (I4, I5).
    GrantFencing,
    /// Write and commit checksums, one per granted page.
    Checksums,
    /// Prefix-cache namespaces per tenant (I10): off, the router derives one namespace for
    /// every tenant, so any tenant's cached prefix serves any other (the leaky build the
    /// auditor's side-channel audit must catch). Not one of the incident's defenses.
    NamespaceIsolation,
}

impl Switch {
    /// Every switch, in a fixed order.
    pub const ALL: [Switch; 8] = [
        Switch::PoolPreflight,
        Switch::RouterRejection,
        Switch::WorkerAdmission,
        Switch::CommitTokenCount,
        Switch::ReadGeneration,
        Switch::GrantFencing,
        Switch::Checksums,
        Switch::NamespaceIsolation,
    ];

    /// The six defenses of the incident: every switch but the set-up's `PoolPreflight` and
    /// the prefix cache's `NamespaceIsolation`.
    pub fn defenses() -> impl Iterator<Item = Switch> {
        Switch::ALL
            .into_iter()
            .filter(|s| !matches!(s, Switch::PoolPreflight | Switch::NamespaceIsolation))
    }

    /// The name used in [`ENV`].
    pub fn name(self) -> &'static str {
        match self {
            Switch::PoolPreflight => "pool_preflight",
            Switch::RouterRejection => "router_rejection",
            Switch::WorkerAdmission => "worker_admission",
            Switch::CommitTokenCount => "commit_token_count",
            Switch::ReadGeneration => "read_generation",
            Switch::GrantFencing => "grant_fencing",
            Switch::Checksums => "checksums",
            Switch::NamespaceIsolation => "namespace_isolation",
        }
    }

    fn bit(self) -> u8 {
        1 << Switch::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

/// A name in [`ENV`] that is no switch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PAGEWARDEN_UNSAFE_TEST_SWITCHES: unknown switch {name:?} (known: pool_preflight, router_rejection, worker_admission, commit_token_count, read_generation, grant_fencing, checksums, namespace_isolation)")]
pub struct UnknownSwitch {
    /// The name given.
    pub name: String,
}

/// Which switches are off. The default turns nothing off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TestSwitches {
    off: u8,
}

impl TestSwitches {
    /// Parses a comma-separated list of switch names (spaces around names ignored).
    pub fn parse(list: &str) -> Result<Self, UnknownSwitch> {
        let mut off = 0;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let s = Switch::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or_else(|| UnknownSwitch { name: name.into() })?;
            off |= s.bit();
        }
        Ok(Self { off })
    }

    /// The switches [`ENV`] names; nothing off when it is unset.
    pub fn from_env() -> Result<Self, UnknownSwitch> {
        match std::env::var(ENV) {
            Ok(list) => Self::parse(&list),
            Err(_) => Ok(Self::default()),
        }
    }

    /// The process's switches, read from [`ENV`] once. Services call [`TestSwitches::init`] at
    /// start, which rejects an unknown name; a process that never did reads the variable here
    /// and, on an unknown name, turns nothing off.
    pub fn current() -> Self {
        *CURRENT.get_or_init(|| Self::from_env().unwrap_or_default())
    }

    /// Reads [`ENV`] for this process (an unknown name is an error) and says loudly, at error
    /// level, which defenses `service` runs without.
    pub fn init(service: &str) -> Result<Self, UnknownSwitch> {
        let s = Self::from_env()?;
        let s = *CURRENT.get_or_init(|| s);
        let off: Vec<&str> = s.off().map(Switch::name).collect();
        tracing::error!(
            service,
            off = %off.join(","),
            "UNSAFE TEST BUILD: defenses can be switched off ({ENV}); never serve real traffic"
        );
        eprintln!(
            "{service}: UNSAFE TEST BUILD, switched off: [{}]",
            off.join(",")
        );
        Ok(s)
    }

    /// Whether `s` is off.
    pub fn is_off(self, s: Switch) -> bool {
        self.off & s.bit() != 0
    }

    /// Whether `s` is on.
    pub fn is_on(self, s: Switch) -> bool {
        !self.is_off(s)
    }

    /// The switches that are off.
    pub fn off(self) -> impl Iterator<Item = Switch> {
        Switch::ALL.into_iter().filter(move |s| self.is_off(*s))
    }

    /// `self` with `s` turned off.
    pub fn with_off(self, s: Switch) -> Self {
        Self {
            off: self.off | s.bit(),
        }
    }

    /// The value of [`ENV`] that turns off exactly these switches.
    pub fn env_value(self) -> String {
        self.off().map(Switch::name).collect::<Vec<_>>().join(",")
    }
}

static CURRENT: OnceLock<TestSwitches> = OnceLock::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_unknown_names() {
        for s in Switch::ALL {
            let t = TestSwitches::parse(s.name()).unwrap();
            assert!(t.is_off(s));
            assert_eq!(t.off().count(), 1);
            assert_eq!(TestSwitches::parse(&t.env_value()).unwrap(), t);
        }
        let all = TestSwitches::parse(" checksums , grant_fencing,").unwrap();
        assert!(all.is_off(Switch::Checksums) && all.is_off(Switch::GrantFencing));
        assert!(all.is_on(Switch::RouterRejection));
        assert_eq!(TestSwitches::parse("").unwrap(), TestSwitches::default());
        let e = TestSwitches::parse("checksums,router").unwrap_err();
        assert_eq!(e.name, "router");
    }
}
