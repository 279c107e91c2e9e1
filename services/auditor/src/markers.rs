//! Canary markers: unique strings issued to one tenant, whose appearance in another tenant's
//! response proves that tenant's data conditioned it.
//!
//! A marker is `PWCANARY-` followed by 16 lowercase hex digits. The registry is the in-memory
//! index of every marker ever issued (loaded from the store at start), so scanning a sample
//! costs one pass over its text and one hash lookup per marker found.

use std::collections::HashMap;

use pagewarden_common::TenantId;
use parking_lot::RwLock;

/// The fixed prefix every marker starts with.
pub const MARKER_PREFIX: &str = "PWCANARY-";
const HEX_LEN: usize = 16;

/// A freshly drawn marker string for `rng`.
pub fn new_marker(rng: &mut impl rand::Rng) -> String {
    let v: u64 = rng.random();
    format!("{MARKER_PREFIX}{v:016x}")
}

/// Every well-formed marker in `text`, in order of appearance, duplicates removed.
pub fn scan(text: &str) -> Vec<&str> {
    let mut found: Vec<&str> = Vec::new();
    let mut rest = 0;
    while let Some(pos) = text[rest..].find(MARKER_PREFIX) {
        let start = rest + pos;
        let hex_start = start + MARKER_PREFIX.len();
        let hex = text.as_bytes().get(hex_start..hex_start + HEX_LEN);
        if let Some(hex) = hex {
            if hex
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            {
                let m = &text[start..hex_start + HEX_LEN];
                if !found.contains(&m) {
                    found.push(m);
                }
            }
        }
        rest = hex_start;
    }
    found
}

/// A marker found in one tenant's response that was issued to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignMarker {
    /// The marker text.
    pub marker: String,
    /// The tenant it was issued to.
    pub owner: TenantId,
}

/// Marker → owning tenant, for every marker issued.
#[derive(Default)]
pub struct MarkerRegistry {
    owners: RwLock<HashMap<String, TenantId>>,
}

impl MarkerRegistry {
    /// Records that `marker` belongs to `tenant`.
    pub fn insert(&self, marker: String, tenant: TenantId) {
        self.owners.write().insert(marker, tenant);
    }

    /// How many markers are known.
    pub fn len(&self) -> usize {
        self.owners.read().len()
    }

    /// Whether no marker is known.
    pub fn is_empty(&self) -> bool {
        self.owners.read().is_empty()
    }

    /// Markers in `text` that were issued to a tenant other than `reader`. Unknown markers are
    /// ignored: only a marker we issued proves where text came from.
    pub fn foreign_in(&self, reader: &TenantId, text: &str) -> Vec<ForeignMarker> {
        let owners = self.owners.read();
        scan(text)
            .into_iter()
            .filter_map(|m| match owners.get(m) {
                Some(owner) if owner != reader => Some(ForeignMarker {
                    marker: m.to_string(),
                    owner: owner.clone(),
                }),
                Some(_) | None => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_finds_well_formed_markers_only() {
        let text = "a PWCANARY-0123456789abcdef b PWCANARY-xyz PWCANARY-0123456789abcdef \
                    PWCANARY-fedcba9876543210";
        assert_eq!(
            scan(text),
            vec!["PWCANARY-0123456789abcdef", "PWCANARY-fedcba9876543210"]
        );
        assert!(scan("PWCANARY-0123").is_empty());
    }

    #[test]
    fn only_other_tenants_markers_are_foreign() {
        let reg = MarkerRegistry::default();
        let mut rng = rand::rng();
        let (a, b) = (new_marker(&mut rng), new_marker(&mut rng));
        reg.insert(a.clone(), TenantId::new("alice"));
        reg.insert(b.clone(), TenantId::new("bob"));
        let text = format!("{a} hello {b} PWCANARY-00000000deadbeef");
        let found = reg.foreign_in(&TenantId::new("alice"), &text);
        assert_eq!(
            found,
            vec![ForeignMarker {
                marker: b,
                owner: TenantId::new("bob")
            }]
        );
        assert!(reg.foreign_in(&TenantId::new("alice"), &a).is_empty());
    }
}
