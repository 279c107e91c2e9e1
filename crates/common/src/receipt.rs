//! Signed isolation receipts: what a tenant's answer was computed over, signed by the
//! deployment's Ed25519 key, so the tenant can prove it afterwards.
//!
//! A signed receipt is one JSON object:
//!
//! ```text
//! { "receipt":   { "version": "pagewarden-receipt-v1", ... },
//!   "signature": { "alg": "ed25519", "key_id": "<16 hex>", "value": "<128 hex>" } }
//! ```
//!
//! The signature is over `"pagewarden-receipt-v1\0"` followed by the receipt's canonical JSON:
//! object keys sorted bytewise, no whitespace, strings as serde_json writes them, and integers
//! only (a float has no one canonical text, so a receipt holding one is refused, not signed).
//! Canonical form makes verification independent of how the JSON was re-serialized on the way
//! (key order, spacing), while any change of a value, a key or an array breaks it.
//!
//! The router holds the private key (a PKCS#8 PEM file, as `openssl genpkey -algorithm ed25519`
//! writes it, or [`ReceiptKey::generate_pem`]); the auditor serves the public key (hex) that
//! `pagewarden verify-receipt` checks against. What a receipt says is built in the router
//! (`receipt` there); this module only signs and verifies.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::PrivatePkcs8KeyDer;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::hex;

/// SHA-256 over token ids, each u32 little-endian (hex): how receipts and the auditor's
/// recompute log name a prompt or an output without holding it.
pub fn ids_sha256(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_le_bytes());
    }
    hex::encode(&h.finalize())
}

/// The receipt format this build writes and verifies.
pub const RECEIPT_VERSION: &str = "pagewarden-receipt-v1";

/// Domain separation: a receipt signature can never pass for a signature over anything else.
const SIGNED_PREFIX: &[u8] = b"pagewarden-receipt-v1\0";

/// The signature algorithm named in a signed receipt.
const ALG: &str = "ed25519";

/// Why a key could not be loaded or a receipt not signed.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptKeyError {
    /// The key file could not be read.
    #[error("cannot read the receipt key {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no PKCS#8 private key in PEM.
    #[error("the receipt key is not a PKCS#8 PEM private key: {0}")]
    Pem(String),
    /// The PKCS#8 key is not an Ed25519 key.
    #[error("the receipt key is not an Ed25519 key: {0}")]
    NotEd25519(String),
    /// A receipt held a value with no canonical form (a float).
    #[error("a receipt cannot hold {0}: it has no canonical form")]
    NotCanonical(String),
}

/// Why a signed receipt does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The document is not `{ "receipt": {...}, "signature": {...} }` as this module writes.
    #[error("not a signed receipt: {0}")]
    Malformed(String),
    /// The signature names another algorithm.
    #[error("the signature's algorithm is {0:?}, not \"ed25519\"")]
    Algorithm(String),
    /// The signature names another key than the one checked against.
    #[error("signed by key {signed}, not by the key given ({given})")]
    OtherKey {
        /// The key id in the receipt.
        signed: String,
        /// The key id of the key checked against.
        given: String,
    },
    /// The signature does not match the receipt: something was changed after signing.
    #[error("the signature does not match the receipt: it was changed after it was signed")]
    BadSignature,
}

/// The deployment's receipt signing key (Ed25519). `Debug` never prints it.
pub struct ReceiptKey {
    pair: Ed25519KeyPair,
}

impl ReceiptKey {
    /// A fresh key as PKCS#8 PEM ("PRIVATE KEY"), to be kept in a 0600 file.
    pub fn generate_pem() -> Result<String, ReceiptKeyError> {
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .map(|k| k.serialize_pem())
            .map_err(|e| ReceiptKeyError::NotEd25519(e.to_string()))
    }

    /// The key in `pem` (PKCS#8, v1 or v2).
    pub fn from_pem(pem: &str) -> Result<Self, ReceiptKeyError> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| ReceiptKeyError::Pem(e.to_string()))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| ReceiptKeyError::NotEd25519(e.to_string()))?;
        Ok(Self { pair })
    }

    /// The key in the PEM file at `path`.
    pub fn load(path: &Path) -> Result<Self, ReceiptKeyError> {
        let pem = std::fs::read_to_string(path).map_err(|source| ReceiptKeyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_pem(&pem)
    }

    /// Its public half: what verifiers check against.
    pub fn public(&self) -> PublicKey {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        PublicKey(out)
    }

    /// `receipt` signed: `{ "receipt": receipt, "signature": {...} }`.
    pub fn sign(&self, receipt: Value) -> Result<Value, ReceiptKeyError> {
        let mut message = SIGNED_PREFIX.to_vec();
        canonical(&receipt, &mut message)?;
        let sig = self.pair.sign(&message);
        Ok(serde_json::json!({
            "receipt": receipt,
            "signature": {
                "alg": ALG,
                "key_id": self.public().key_id(),
                "value": hex::encode(sig.as_ref()),
            },
        }))
    }
}

impl fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReceiptKey(public {})", self.public())
    }
}

/// A receipt verification key: the 32 bytes of an Ed25519 public key, written as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// Sixteen hex digits naming the key: the start of the SHA-256 of its bytes.
    pub fn key_id(&self) -> String {
        hex::encode(&Sha256::digest(self.0)[..8])
    }

    /// Checks `signed` (as [`ReceiptKey::sign`] writes it) against this key; the receipt
    /// itself when it verifies.
    pub fn verify<'a>(&self, signed: &'a Value) -> Result<&'a Value, VerifyError> {
        let malformed = |what: &str| VerifyError::Malformed(what.to_string());
        let receipt = signed
            .get("receipt")
            .filter(|r| r.is_object())
            .ok_or_else(|| malformed("no \"receipt\" object"))?;
        let sig = signed
            .get("signature")
            .ok_or_else(|| malformed("no \"signature\" object"))?;
        let field = |name: &str| {
            sig.get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| malformed(&format!("the signature has no \"{name}\" string")))
        };
        let alg = field("alg")?;
        if alg != ALG {
            return Err(VerifyError::Algorithm(alg.to_string()));
        }
        let key_id = field("key_id")?;
        if key_id != self.key_id() {
            return Err(VerifyError::OtherKey {
                signed: key_id.to_string(),
                given: self.key_id(),
            });
        }
        let value = hex::decode(field("value")?)
            .filter(|v| v.len() == 64)
            .ok_or_else(|| malformed("the signature's value is not 64 bytes of hex"))?;
        let mut message = SIGNED_PREFIX.to_vec();
        canonical(receipt, &mut message).map_err(|e| VerifyError::Malformed(e.to_string()))?;
        UnparsedPublicKey::new(&ED25519, self.0)
            .verify(&message, &value)
            .map_err(|_| VerifyError::BadSignature)?;
        Ok(receipt)
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.key_id())
    }
}

/// A text that is not an Ed25519 public key in hex.
#[derive(Debug, thiserror::Error)]
#[error("expected an Ed25519 public key as 64 hex digits")]
pub struct BadPublicKey;

impl FromStr for PublicKey {
    type Err = BadPublicKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = hex::decode(s.trim()).ok_or(BadPublicKey)?;
        bytes.try_into().map(Self).map_err(|_| BadPublicKey)
    }
}

/// Appends `v`'s canonical JSON to `out` (see the module docs).
pub fn canonical(v: &Value, out: &mut Vec<u8>) -> Result<(), ReceiptKeyError> {
    match v {
        Value::Null | Value::Bool(_) | Value::String(_) => {
            out.extend_from_slice(v.to_string().as_bytes());
        }
        Value::Number(n) if n.is_u64() || n.is_i64() => {
            out.extend_from_slice(n.to_string().as_bytes());
        }
        Value::Number(n) => return Err(ReceiptKeyError::NotCanonical(format!("the number {n}"))),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(map) => canonical_object(map, out)?,
    }
    Ok(())
}

fn canonical_object(map: &Map<String, Value>, out: &mut Vec<u8>) -> Result<(), ReceiptKeyError> {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    out.push(b'{');
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
        out.push(b':');
        canonical(&map[k], out)?;
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key() -> ReceiptKey {
        ReceiptKey::from_pem(&ReceiptKey::generate_pem().unwrap()).unwrap()
    }

    fn receipt() -> Value {
        json!({
            "version": RECEIPT_VERSION,
            "tenant": "acme",
            "cached_tokens": 32,
            "pages": [[3, 7], [9, 1]],
            "nested": { "b": "é\"\n", "a": null, "c": true },
        })
    }

    #[test]
    fn a_signed_receipt_verifies_and_survives_reserialization() {
        let k = key();
        let signed = k.sign(receipt()).unwrap();
        assert_eq!(k.public().verify(&signed), Ok(&receipt()));
        // Another serializer's key order and spacing change nothing.
        let pretty = serde_json::to_string_pretty(&signed).unwrap();
        let back: Value = serde_json::from_str(&pretty).unwrap();
        assert!(k.public().verify(&back).is_ok());
    }

    #[test]
    fn any_change_after_signing_fails() {
        let k = key();
        let signed = k.sign(receipt()).unwrap();
        let tamper = |f: &dyn Fn(&mut Value)| {
            let mut t = signed.clone();
            f(&mut t);
            k.public().verify(&t).map(|_| ())
        };
        let bad = Err(VerifyError::BadSignature);
        assert_eq!(tamper(&|t| t["receipt"]["cached_tokens"] = json!(0)), bad);
        assert_eq!(tamper(&|t| t["receipt"]["tenant"] = json!("other")), bad);
        assert_eq!(tamper(&|t| t["receipt"]["pages"][1][1] = json!(2)), bad);
        assert_eq!(tamper(&|t| t["receipt"]["nested"]["extra"] = json!(1)), bad);
        let other = key();
        assert!(matches!(
            other.public().verify(&signed),
            Err(VerifyError::OtherKey { .. })
        ));
        // A forged key id does not help: the signature is still checked.
        let mut forged = signed.clone();
        forged["signature"]["key_id"] = json!(other.public().key_id());
        assert_eq!(other.public().verify(&forged).map(|_| ()), bad);
    }

    #[test]
    fn canonical_json_sorts_keys_and_refuses_floats() {
        let mut out = Vec::new();
        canonical(&json!({"b": 1, "a": [true, "x"], "A": -2}), &mut out).unwrap();
        assert_eq!(out, br#"{"A":-2,"a":[true,"x"],"b":1}"#);
        assert!(key().sign(json!({"p": 0.5})).is_err());
    }

    #[test]
    fn keys_load_from_pem_and_public_keys_parse_from_hex() {
        assert!(ReceiptKey::from_pem("not a key").is_err());
        let k = key();
        let text = k.public().to_string();
        assert_eq!(text.len(), 64);
        assert_eq!(text.parse::<PublicKey>().unwrap(), k.public());
        assert!("12ab".parse::<PublicKey>().is_err());
        assert!(format!("{k:?}").starts_with("ReceiptKey(public "));
    }
}
