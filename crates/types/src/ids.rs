//! Identifier newtypes. No `-1` sentinels and no bare integers on the wire: a request id
//! can never be confused with a tenant id or an attempt number.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One client request, unique across the cluster: 16 random bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub [u8; 16]);

impl RequestId {
    /// A fresh random id.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// Parses the 16-byte wire form; `None` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The 16-byte wire form.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({self})")
    }
}

/// Which try of a request this is; a reply carrying an older attempt is stale (I5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttemptId(pub u32);

/// A tenant: the owner of API keys and of every request made with them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TenantId(pub String);

impl TenantId {
    /// Wraps a tenant name.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The tenant's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
