//! Newtypes for pages, generations and write-grant keys.

use std::fmt;

/// Index of one page in a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

impl PageId {
    /// The page's index as a `usize`, for slicing.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for PageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "page {}", self.0)
    }
}

/// Allocation epoch of a page: bumped every time the page is handed out, so a table entry
/// `(page, generation)` names one allocation and goes stale when the page is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gen {}", self.0)
    }
}

/// Random, single-use key of one write grant. A write carrying a key that is unknown,
/// revoked or already committed is dropped (I5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrantKey(pub [u8; 16]);

impl GrantKey {
    /// A fresh key from the thread-local CSPRNG.
    pub fn random() -> Self {
        Self(rand::random())
    }
}

impl fmt::Debug for GrantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrantKey({self})")
    }
}

impl fmt::Display for GrantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Eight hex digits are enough to tell keys apart in logs without printing the secret.
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}
