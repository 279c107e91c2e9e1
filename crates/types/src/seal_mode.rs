//! How decode's KV transfer listener checks frames when it does not rely on TLS for the
//! stream: the seal mode, chosen by `--transfer-seal` (the mechanism is
//! `pagewarden-transfer`'s `seal.rs`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::UnknownValue;

/// What a seal protects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SealMode {
    /// Integrity only: frame fields and page bytes authenticated, page bytes in clear.
    Mac,
    /// Integrity and confidentiality: page bytes encrypted, frame fields authenticated.
    Aead,
}

impl SealMode {
    /// The header flags of a frame sealed this way.
    pub fn flag(self) -> u16 {
        match self {
            SealMode::Mac => 1,
            SealMode::Aead => 2,
        }
    }

    /// The mode whose flags these are.
    pub fn from_flag(f: u16) -> Option<Self> {
        match f {
            1 => Some(SealMode::Mac),
            2 => Some(SealMode::Aead),
            _ => None,
        }
    }

    /// Its name in configuration ("mac", "aead").
    pub fn name(self) -> &'static str {
        match self {
            SealMode::Mac => "mac",
            SealMode::Aead => "aead",
        }
    }
}

impl FromStr for SealMode {
    type Err = UnknownValue;

    /// `mac` or `aead` (a flag's or a config file's value).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [SealMode::Mac, SealMode::Aead]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownValue {
                what: "seal mode (mac or aead)",
                value: s.to_string(),
            })
    }
}

impl fmt::Display for SealMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
