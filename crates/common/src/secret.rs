//! Bearer secrets (tenant API keys, auditor API tokens): high-entropy random strings that
//! servers store only as their SHA-256. A secret carries 128 random bits, so one SHA-256 is as
//! strong as a slow password hash, and looking the hash up in a map leaks nothing a guesser
//! could use (no byte-by-byte comparison of the secret itself ever happens).

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// The SHA-256 of a bearer secret: the only form in which a server keeps one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretHash([u8; 32]);

impl SecretHash {
    /// The hash of `secret` as presented (no trimming: callers pass what they were given).
    pub fn of(secret: &str) -> Self {
        Self(Sha256::digest(secret.as_bytes()).into())
    }
}

impl fmt::Display for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretHash({self})")
    }
}

/// A string that is not 64 hex digits.
#[derive(Debug, thiserror::Error)]
#[error("expected a SHA-256 as 64 hex digits, got {0:?}")]
pub struct BadSecretHash(String);

impl FromStr for SecretHash {
    type Err = BadSecretHash;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadSecretHash(s.chars().take(80).collect());
        let bytes = crate::hex::decode(s.trim()).ok_or_else(bad)?;
        bytes.try_into().map(Self).map_err(|_| bad())
    }
}

impl Serialize for SecretHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SecretHash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A fresh secret: `prefix` then 32 hex digits (128 random bits).
pub fn new_secret(prefix: &str, rng: &mut impl Rng) -> String {
    let v: u128 = rng.random();
    format!("{prefix}{v:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_matches_sha256sum() {
        // printf %s abc | sha256sum
        let h = SecretHash::of("abc");
        let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(h.to_string(), hex);
        assert_eq!(hex.parse::<SecretHash>().unwrap(), h);
        assert!("abc".parse::<SecretHash>().is_err());
        assert!(hex.replace('b', "g").parse::<SecretHash>().is_err());
    }
}
