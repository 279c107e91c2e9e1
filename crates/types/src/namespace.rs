//! Prefix-cache namespaces (I10): the only key under which cached KV may be shared. A
//! namespace is derived by the server, never taken from a client: HMAC-SHA256 under the
//! suite's [`NamespaceSecret`] of either the tenant's name (its private namespace) or, when the
//! tenants file places the tenant in one explicitly (`shared_namespace = "..."`), the name of
//! a shared namespace. Nothing else shares: two tenants hit each other's cache only when the
//! operator wrote the same `shared_namespace` for both.
//!
//! The two inputs are domain-separated (`tenant\0` / `shared\0` prefixes), so a tenant named
//! `x` and a shared namespace named `x` are different namespaces. Without the secret nobody
//! can compute a namespace, so the prefix hashes derived from it (kvcache) reveal nothing
//! about the tokens when they travel (to the router, for KV-aware routing).

use std::fmt;

use rand::Rng;
use ring::hmac;

use crate::TenantId;

/// Where a tenant's cached prefixes live, as the tenants file places it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement<'a> {
    /// Its own namespace: nobody else hits its cache.
    Private(&'a TenantId),
    /// A named namespace shared with every tenant the tenants file places in it.
    Shared(&'a str),
}

/// The suite secret under which namespaces are derived: 32 random bytes, the same on every
/// worker and router of one suite. `Debug` never prints it.
#[derive(Clone)]
pub struct NamespaceSecret(hmac::Key);

impl NamespaceSecret {
    /// The secret from its 32 bytes (as stored by the operator's secret files).
    pub fn from_bytes(bytes: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// A fresh secret from `rng` (one per suite; tests and single-process runs).
    pub fn random(rng: &mut impl Rng) -> Self {
        Self::from_bytes(&rng.random())
    }
}

impl fmt::Debug for NamespaceSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NamespaceSecret(…)")
    }
}

/// One prefix-cache namespace: `HMAC-SHA256(secret, domain || name)`. Cached pages are bound to
/// exactly one; a lookup under another never sees them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace([u8; 32]);

impl Namespace {
    /// The namespace of a tenant placed as `placement`, under `secret`.
    pub fn derive(secret: &NamespaceSecret, placement: Placement<'_>) -> Self {
        let (domain, name): (&[u8], &str) = match placement {
            Placement::Private(t) => (b"tenant\0", t.as_str()),
            Placement::Shared(n) => (b"shared\0", n),
        };
        let mut ctx = hmac::Context::with_key(&secret.0);
        ctx.update(domain);
        ctx.update(name.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        Self(out)
    }

    /// The 32 bytes, for hashing (the prefix hash chain) and the wire.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A namespace as it travels on the internal wire, from the router that derived it; `None`
    /// unless exactly 32 bytes.
    pub fn from_wire(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

impl Namespace {
    /// Eight hex digits that tell namespaces apart in logs and audit records without
    /// revealing the rest; metrics label by tenant name instead.
    pub fn tag(&self) -> String {
        crate::hex::encode(&self.0[..4])
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.tag())
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivation_is_hmac_sha256_of_domain_and_name() {
        // RFC 4231 test case 2 (key "Jefe"), with our 32-byte key zero-padded: HMAC pads a
        // short key with zeros to the block size, so the MAC is the RFC's.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let s = NamespaceSecret::from_bytes(&key);
        let mac = hmac::sign(&s.0, b"what do ya want for nothing?");
        assert_eq!(
            crate::hex::encode(mac.as_ref()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let t = TenantId::new("acme");
        let ns = Namespace::derive(&s, Placement::Private(&t));
        assert_eq!(ns.as_bytes(), hmac::sign(&s.0, b"tenant\0acme").as_ref());
    }

    #[test]
    fn namespaces_differ_by_tenant_secret_and_domain() {
        let mut rng = rand::rng();
        let s = NamespaceSecret::random(&mut rng);
        let (a, b) = (TenantId::new("a"), TenantId::new("b"));
        let ns = |p| Namespace::derive(&s, p);
        assert_eq!(ns(Placement::Private(&a)), ns(Placement::Private(&a)));
        assert_ne!(ns(Placement::Private(&a)), ns(Placement::Private(&b)));
        assert_ne!(ns(Placement::Private(&a)), ns(Placement::Shared("a")));
        assert_eq!(ns(Placement::Shared("org")), ns(Placement::Shared("org")));
        let other = NamespaceSecret::random(&mut rng);
        assert_ne!(
            ns(Placement::Private(&a)),
            Namespace::derive(&other, Placement::Private(&a))
        );
        assert!(
            !format!("{s:?}").contains(&crate::hex::encode(ns(Placement::Private(&a)).as_bytes()))
        );
    }
}
