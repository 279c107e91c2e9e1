//! Tenant markers and marker-derived KV bytes: every byte a tenant's KV page holds spells that
//! tenant's marker, so any foreign byte in a response is visible as a foreign marker.

/// A tenant with its unique marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Tenant name (`TenantId`).
    pub name: &'static str,
    /// Marker string; unique among tenants, never a substring of another's.
    pub marker: &'static str,
}

/// Tenant A of the incident.
pub const A: Tenant = Tenant {
    name: "tenant-a",
    marker: "<MARK-A-7f3a91>",
};

/// Tenant B of the incident.
pub const B: Tenant = Tenant {
    name: "tenant-b",
    marker: "<MARK-B-c2d4e8>",
};

/// `len` bytes spelling `marker` over and over, starting at the marker's first byte.
pub fn marker_bytes(marker: &str, len: usize) -> Vec<u8> {
    marker
        .as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// Whether `bytes` contain `marker` (a whole copy).
pub fn contains_marker(bytes: &[u8], marker: &str) -> bool {
    let m = marker.as_bytes();
    !m.is_empty() && bytes.windows(m.len()).any(|w| w == m)
}

/// Whether `bytes` contain at least a 6-byte run of `marker`'s distinctive tail (catches a
/// marker cut at a page boundary, too).
pub fn contains_marker_fragment(bytes: &[u8], marker: &str) -> bool {
    let m = marker.as_bytes();
    let tag = &m[m.len().saturating_sub(8)..m.len() - 1];
    bytes.windows(tag.len()).any(|w| w == tag)
}
