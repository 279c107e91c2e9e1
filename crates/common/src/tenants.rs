//! The tenants file: API keys → tenants, one definition for the router (which reads it, and
//! reloads it on SIGHUP), `pagewarden keys` (which edits it), `pagewarden up` (which writes the
//! dev one) and `pagewarden preflight` (which checks it).
//!
//! ```toml
//! [[tenants]]
//! name = "acme"
//! key_sha256 = ["<64 hex digits>"]   # SHA-256 of each API key, never the key itself
//! max_concurrent = 4                   # optional: its requests in flight at once (429 above)
//! weight = 2                           # optional (default 1): its share of the workers' queues
//! tokens_per_minute = 100000           # optional: prompt + completion tokens a minute (429 above)
//! shared_namespace = "acme-org"        # optional: share cached prompt prefixes with the tenants
//!                                      # placed in the same named namespace (else: private)
//! receipts = true                      # optional: every response carries a signed isolation
//!                                      # receipt, as with `X-Pagewarden-Receipt: 1`
//! recompute_rate = 0.1                 # optional: the share of its requests the auditor scores
//!                                      # again (the router's default otherwise; 0 opts out)
//! ```
//!
//! Plain `keys = [...]` are refused with a message that says how to hash them: a copy of this
//! file that leaks must not hold a working key.
//!
//! The clear keys a client needs (`pagewarden up`'s dev tenants, `pagewarden chaos`) live in a
//! separate [`ClientKeys`] file that no server reads.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::namespace::{Namespace, NamespaceSecret, Placement};
use crate::secret::SecretHash;
use crate::TenantId;

/// One `[[tenants]]` entry.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(try_from = "RawEntry")]
pub struct TenantEntry {
    /// The tenant's name.
    pub name: String,
    /// SHA-256 of each of its API keys.
    pub key_sha256: Vec<SecretHash>,
    /// Its requests in flight at once, at most (the router answers 429 above); `None`: the
    /// router's default for every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Its share of the workers' waiting queues against other waiting tenants (weighted round
    /// robin: up to `weight` of its requests per turn); `None`: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Prompt and completion tokens it may use a minute (the router answers 429 with
    /// `Retry-After` above); `None`: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// The named prefix-cache namespace it shares with every tenant placed in the same one;
    /// `None`: its own namespace, shared with nobody (I10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_namespace: Option<String>,
    /// Every response to it carries a signed isolation receipt, asked for or not.
    #[serde(default, skip_serializing_if = "crate::config::is_false")]
    pub receipts: bool,
    /// The share of its requests the auditor's recompute audit scores again; `None`: the
    /// router's default (`--recompute-rate`); 0: none (the tenant opted out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_rate: Option<Rate>,
}

/// A share between 0 and 1, kept in millionths (so that it compares exactly); written as a
/// number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(u32);

impl Rate {
    /// None at all.
    pub const ZERO: Rate = Rate(0);
    /// One in twenty.
    pub const PERCENT_5: Rate = Rate(50_000);

    /// `share` (0 to 1) rounded to millionths; `None` outside that range or not a number.
    pub fn new(share: f64) -> Option<Rate> {
        (0.0..=1.0)
            .contains(&share)
            .then(|| Rate((share * 1e6).round() as u32))
    }

    /// The share, 0 to 1.
    pub fn share(self) -> f64 {
        f64::from(self.0) / 1e6
    }

    /// Whether a draw `u` (uniform in [0, 1)) falls in this share.
    pub fn picks(self, u: f64) -> bool {
        u < self.share()
    }
}

impl Serialize for Rate {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.share())
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Rate::new(v).ok_or_else(|| {
            serde::de::Error::custom(format!("a rate must be between 0 and 1, got {v}"))
        })
    }
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v: f64 = s.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
        Rate::new(v).ok_or_else(|| format!("a rate must be between 0 and 1, got {v}"))
    }
}

impl TenantEntry {
    /// Where its cached prefixes live.
    pub fn placement<'a>(&'a self, id: &'a TenantId) -> Placement<'a> {
        match &self.shared_namespace {
            Some(name) => Placement::Shared(name),
            None => Placement::Private(id),
        }
    }
}

/// A tenant's share and limits, as the router applies them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantLimits {
    /// Requests in flight at once, at most (`None`: the router's default).
    pub max_concurrent: Option<u32>,
    /// Weight in the workers' fair queues (at least 1).
    pub weight: u32,
    /// Tokens a minute, at most (`None`: no limit).
    pub tokens_per_minute: Option<u64>,
    /// Every response carries a signed isolation receipt.
    pub receipts: bool,
    /// The share of its requests the recompute audit scores (`None`: the router's default).
    pub recompute_rate: Option<Rate>,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            weight: 1,
            tokens_per_minute: None,
            receipts: false,
            recompute_rate: None,
        }
    }
}

/// An entry as written, before plain keys are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    #[serde(default)]
    key_sha256: Vec<SecretHash>,
    keys: Option<toml::Value>,
    max_concurrent: Option<u32>,
    weight: Option<u32>,
    tokens_per_minute: Option<u64>,
    shared_namespace: Option<String>,
    #[serde(default)]
    receipts: bool,
    recompute_rate: Option<Rate>,
}

/// Whether `name` may name a shared namespace: 1 to 64 of `A-Z a-z 0-9 . _ -`.
fn valid_namespace_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl TryFrom<RawEntry> for TenantEntry {
    type Error = String;

    fn try_from(r: RawEntry) -> Result<Self, String> {
        if r.keys.is_some() {
            return Err(format!(
                "tenant `{0}` lists plain `keys`, which are refused: store only \
                 `key_sha256 = [\"<hex>\"]`, the SHA-256 of each key (`printf %s KEY | sha256sum`), \
                 or draw a new key with `pagewarden keys add --tenant {0} --file FILE`",
                r.name
            ));
        }
        if r.max_concurrent == Some(0) {
            return Err(format!(
                "tenant `{}`: max_concurrent = 0 would refuse every request (leave it out for \
                 the router's default)",
                r.name
            ));
        }
        if r.weight == Some(0) {
            return Err(format!(
                "tenant `{}`: weight = 0 would never serve it while others wait (the least is 1)",
                r.name
            ));
        }
        if r.tokens_per_minute == Some(0) {
            return Err(format!(
                "tenant `{}`: tokens_per_minute = 0 would refuse every request (leave it out \
                 for no limit)",
                r.name
            ));
        }
        if let Some(ns) = &r.shared_namespace {
            if !valid_namespace_name(ns) {
                return Err(format!(
                    "tenant `{}`: shared_namespace {ns:?} must be 1 to 64 letters, digits, `.`, \
                     `_` or `-` (leave it out for a namespace of its own)",
                    r.name
                ));
            }
        }
        Ok(Self {
            name: r.name,
            key_sha256: r.key_sha256,
            max_concurrent: r.max_concurrent,
            weight: r.weight,
            tokens_per_minute: r.tokens_per_minute,
            shared_namespace: r.shared_namespace,
            receipts: r.receipts,
            recompute_rate: r.recompute_rate,
        })
    }
}

/// The tenants file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TenantsFile {
    /// Every tenant.
    #[serde(default)]
    pub tenants: Vec<TenantEntry>,
}

/// Why a tenants file or table could not be read, built or written.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid toml of the expected shape (plain keys included).
    #[error("cannot parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The toml error.
        source: toml::de::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Two tenants share a key.
    #[error("tenants `{0}` and `{1}` share a key: a key must name one tenant")]
    SharedKey(String, String),
}

/// Reads a toml file of type `T`, mapping failures to [`TenantsError`].
fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| TenantsError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates `dir` (and its missing parents) and makes it 0700: it holds secrets, so no other
/// local user may list or read it. An existing directory is tightened too.
pub fn create_private_dir(dir: &Path) -> Result<(), TenantsError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| TenantsError::Write {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)
}

/// Writes `text` to `path` through a sibling temp file and a rename (a reader never sees half
/// a file), mode 0600 (the clear keys file holds secrets; the hashes are not for everyone).
pub fn write_private(path: &Path, text: &str) -> Result<(), TenantsError> {
    if let Some(dir) = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
    {
        create_private_dir(dir)?;
    }
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| TenantsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

impl TenantsFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        read_toml(path)
    }

    /// Writes the file (atomically, mode 0600) under a one-line `header` comment.
    pub fn save(&self, path: &Path, header: &str) -> Result<(), TenantsError> {
        let body = toml::to_string(self).map_err(|e| TenantsError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        write_private(path, &format!("# {header}\n{body}"))
    }

    /// The entry of tenant `name`, added empty when missing.
    pub fn entry_mut(&mut self, name: &str) -> &mut TenantEntry {
        let i = match self.tenants.iter().position(|t| t.name == name) {
            Some(i) => i,
            None => {
                self.tenants.push(TenantEntry {
                    name: name.to_string(),
                    key_sha256: Vec::new(),
                    max_concurrent: None,
                    weight: None,
                    tokens_per_minute: None,
                    shared_namespace: None,
                    receipts: false,
                    recompute_rate: None,
                });
                self.tenants.len() - 1
            }
        };
        &mut self.tenants[i]
    }
}

/// Every problem of a tenant list, each in a sentence for the operator: no tenants, a name
/// listed twice, a tenant without keys, a key shared by two tenants.
pub fn problems(tenants: &[TenantEntry]) -> Vec<String> {
    let mut out = Vec::new();
    if tenants.is_empty() {
        out.push("no tenants: the router would refuse every request".into());
    }
    let mut names = HashSet::new();
    let mut owners: HashMap<SecretHash, &str> = HashMap::new();
    for t in tenants {
        if !names.insert(t.name.as_str()) {
            out.push(format!("tenant {:?} is listed twice", t.name));
        }
        if t.key_sha256.is_empty() {
            out.push(format!("tenant {:?} has no keys", t.name));
        }
        for h in &t.key_sha256 {
            if let Some(other) = owners.insert(*h, t.name.as_str()) {
                if other != t.name {
                    out.push(TenantsError::SharedKey(other.into(), t.name.clone()).to_string());
                }
            }
        }
    }
    out
}

/// Key → tenant lookup, by the SHA-256 of the presented key, and each tenant's limits.
#[derive(Clone, Debug, Default)]
pub struct KeyTable {
    by_hash: HashMap<SecretHash, TenantId>,
    limits: HashMap<TenantId, TenantLimits>,
    /// Tenants the file places in a named shared namespace.
    shared: HashMap<TenantId, String>,
}

impl KeyTable {
    /// Builds the table; a key shared by two tenants is an error.
    pub fn new(entries: &[TenantEntry]) -> Result<Self, TenantsError> {
        let mut by_hash: HashMap<SecretHash, TenantId> = HashMap::new();
        let mut limits = HashMap::new();
        let mut shared = HashMap::new();
        for t in entries {
            if let Some(ns) = &t.shared_namespace {
                shared.insert(TenantId::new(&t.name), ns.clone());
            }
            limits.insert(
                TenantId::new(&t.name),
                TenantLimits {
                    max_concurrent: t.max_concurrent,
                    weight: t.weight.unwrap_or(1).max(1),
                    tokens_per_minute: t.tokens_per_minute,
                    receipts: t.receipts,
                    recompute_rate: t.recompute_rate,
                },
            );
            for h in &t.key_sha256 {
                if let Some(other) = by_hash.insert(*h, TenantId::new(&t.name)) {
                    if other.as_str() != t.name {
                        return Err(TenantsError::SharedKey(
                            other.as_str().into(),
                            t.name.clone(),
                        ));
                    }
                }
            }
        }
        Ok(Self {
            by_hash,
            limits,
            shared,
        })
    }

    /// The prefix-cache namespace of `tenant` under the suite's `secret`: the shared one the
    /// file places it in, else its own (also for a tenant the table does not list).
    pub fn namespace(&self, tenant: &TenantId, secret: &NamespaceSecret) -> Namespace {
        let placement = match self.shared.get(tenant) {
            Some(name) => Placement::Shared(name),
            None => Placement::Private(tenant),
        };
        Namespace::derive(secret, placement)
    }

    /// The tenant's share and limits (the defaults for a tenant the table does not list).
    pub fn limits(&self, tenant: &TenantId) -> TenantLimits {
        self.limits.get(tenant).copied().unwrap_or_default()
    }

    /// The tenant's own limit of requests in flight, if its entry sets one.
    pub fn max_concurrent(&self, tenant: &TenantId) -> Option<u32> {
        self.limits(tenant).max_concurrent
    }

    /// The tenant owning `key`.
    pub fn tenant(&self, key: &str) -> Option<&TenantId> {
        self.by_hash.get(&SecretHash::of(key))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// True when no key is configured (every request will be a 401).
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// One clear key as a client holds it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientKey {
    /// The tenant.
    pub tenant: String,
    /// The bearer key, in clear.
    pub key: String,
}

/// A client's clear keys (`[[keys]] tenant = "..", key = ".."`): `pagewarden up` keeps its dev
/// tenants' keys in one (mode 0600), `pagewarden chaos` reads one. No server reads it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientKeys {
    /// Every key.
    #[serde(default)]
    pub keys: Vec<ClientKey>,
}

impl ClientKeys {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        read_toml(path)
    }

    /// The first key of `tenant`.
    pub fn key_of(&self, tenant: &str) -> Option<&str> {
        self.keys
            .iter()
            .find(|k| k.tenant == tenant && !k.key.is_empty())
            .map(|k| k.key.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, keys: &[&str]) -> TenantEntry {
        TenantEntry {
            name: name.into(),
            key_sha256: keys.iter().map(|k| SecretHash::of(k)).collect(),
            max_concurrent: None,
            weight: None,
            tokens_per_minute: None,
            shared_namespace: None,
            receipts: false,
            recompute_rate: None,
        }
    }

    #[test]
    fn only_tenants_placed_in_the_same_named_namespace_share_one() {
        let f: TenantsFile = toml::from_str(
            "[[tenants]]\nname = \"a\"\nkey_sha256 = []\nshared_namespace = \"org\"\n\
             [[tenants]]\nname = \"b\"\nkey_sha256 = []\nshared_namespace = \"org\"\n\
             [[tenants]]\nname = \"c\"\nkey_sha256 = []\n\
             [[tenants]]\nname = \"d\"\nkey_sha256 = []\nshared_namespace = \"c\"\n",
        )
        .unwrap();
        assert_eq!(
            toml::from_str::<TenantsFile>(&toml::to_string(&f).unwrap()).unwrap(),
            f
        );
        let secret = NamespaceSecret::random(&mut rand::rng());
        let t = KeyTable::new(&f.tenants).unwrap();
        let ns = |n: &str| t.namespace(&TenantId::new(n), &secret);
        assert_eq!(ns("a"), ns("b"));
        assert_eq!(
            ns("a"),
            Namespace::derive(&secret, f.tenants[0].placement(&TenantId::new("a")))
        );
        // Private namespaces: c's own, an unlisted tenant's own, and neither equals the
        // shared namespace named after c that d is placed in.
        let distinct = [ns("a"), ns("c"), ns("d"), ns("unlisted")];
        for (i, x) in distinct.iter().enumerate() {
            for y in &distinct[i + 1..] {
                assert_ne!(x, y);
            }
        }
        for bad in ["", "a b", "ü"] {
            let text =
                format!("[[tenants]]\nname = \"a\"\nkey_sha256 = []\nshared_namespace = {bad:?}\n");
            let e = toml::from_str::<TenantsFile>(&text)
                .unwrap_err()
                .to_string();
            assert!(e.contains("shared_namespace"), "{e}");
        }
    }

    #[test]
    fn a_tenant_may_set_its_recompute_rate_between_0_and_1() {
        let f: TenantsFile = toml::from_str(
            "[[tenants]]\nname = \"a\"\nkey_sha256 = []\nrecompute_rate = 0.2\n\
             [[tenants]]\nname = \"b\"\nkey_sha256 = []\nrecompute_rate = 0\n\
             [[tenants]]\nname = \"c\"\nkey_sha256 = []\n",
        )
        .unwrap();
        assert_eq!(
            toml::from_str::<TenantsFile>(&toml::to_string(&f).unwrap()).unwrap(),
            f
        );
        let rates: Vec<Option<Rate>> = f.tenants.iter().map(|t| t.recompute_rate).collect();
        assert_eq!(rates, [Rate::new(0.2), Some(Rate::ZERO), None]);
        assert!(Rate::new(0.2).unwrap().picks(0.19) && !Rate::new(0.2).unwrap().picks(0.2));
        assert!(!Rate::ZERO.picks(0.0));
        for bad in ["1.5", "-0.1", "nan"] {
            let text =
                format!("[[tenants]]\nname = \"a\"\nkey_sha256 = []\nrecompute_rate = {bad}\n");
            let e = toml::from_str::<TenantsFile>(&text)
                .unwrap_err()
                .to_string();
            assert!(e.contains("between 0 and 1"), "{bad}: {e}");
        }
        assert!("0.05".parse::<Rate>().is_ok() && "2".parse::<Rate>().is_err());
    }

    #[test]
    fn plain_keys_are_refused_with_the_way_to_hash_them() {
        let e = toml::from_str::<TenantsFile>("[[tenants]]\nname = \"a\"\nkeys = [\"k\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sha256sum") && e.contains("pagewarden keys add"),
            "{e}"
        );
    }

    #[test]
    fn keys_are_found_by_hash_and_the_file_round_trips() {
        let f = TenantsFile {
            tenants: vec![entry("a", &["ka"]), entry("b", &["kb1", "kb2"])],
        };
        let text = toml::to_string(&f).unwrap();
        assert!(!text.contains("kb1"), "{text}");
        assert_eq!(toml::from_str::<TenantsFile>(&text).unwrap(), f);
        let t = KeyTable::new(&f.tenants).unwrap();
        assert_eq!(t.tenant("kb2").map(|t| t.as_str()), Some("b"));
        assert!(t.tenant("kb").is_none());
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn a_tenant_may_carry_its_own_concurrency_limit() {
        let f: TenantsFile = toml::from_str(
            "[[tenants]]\nname = \"a\"\nkey_sha256 = []\nmax_concurrent = 2\n\
             [[tenants]]\nname = \"b\"\nkey_sha256 = []\n",
        )
        .unwrap();
        let t = KeyTable::new(&f.tenants).unwrap();
        assert_eq!(t.max_concurrent(&TenantId::new("a")), Some(2));
        assert_eq!(t.max_concurrent(&TenantId::new("b")), None);
        let zero = toml::from_str::<TenantsFile>(
            "[[tenants]]\nname = \"a\"\nkey_sha256 = []\nmax_concurrent = 0\n",
        );
        assert!(zero.unwrap_err().to_string().contains("max_concurrent = 0"));
    }

    #[test]
    fn a_tenant_may_carry_a_weight_and_a_token_rate() {
        let f: TenantsFile = toml::from_str(
            "[[tenants]]\nname = \"a\"\nkey_sha256 = []\nweight = 3\ntokens_per_minute = 600\n\
             [[tenants]]\nname = \"b\"\nkey_sha256 = []\n",
        )
        .unwrap();
        assert_eq!(
            toml::from_str::<TenantsFile>(&toml::to_string(&f).unwrap()).unwrap(),
            f
        );
        let t = KeyTable::new(&f.tenants).unwrap();
        let a = t.limits(&TenantId::new("a"));
        assert_eq!((a.weight, a.tokens_per_minute), (3, Some(600)));
        assert_eq!(t.limits(&TenantId::new("b")), TenantLimits::default());
        assert_eq!(t.limits(&TenantId::new("unlisted")).weight, 1);
        for (field, said) in [
            ("weight = 0", "weight = 0"),
            ("tokens_per_minute = 0", "tokens_per_minute = 0"),
        ] {
            let text = format!("[[tenants]]\nname = \"a\"\nkey_sha256 = []\n{field}\n");
            let e = toml::from_str::<TenantsFile>(&text)
                .unwrap_err()
                .to_string();
            assert!(e.contains(said), "{e}");
        }
    }

    #[test]
    fn key_problems_are_each_named() {
        assert!(problems(&[entry("a", &["k1"]), entry("b", &["k2"])]).is_empty());
        let p = problems(&[entry("a", &["k1"]), entry("b", &["k1"]), entry("c", &[])]);
        assert!(p[0].contains("share a key"), "{p:?}");
        assert!(p[1].contains("\"c\" has no keys"), "{p:?}");
        assert_eq!(problems(&[]).len(), 1);
        assert_eq!(problems(&[entry("a", &["x"]), entry("a", &["y"])]).len(), 1);
        assert!(KeyTable::new(&[entry("a", &["k"]), entry("b", &["k"])]).is_err());
    }
}
