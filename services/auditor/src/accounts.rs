//! Who may use the web UI and the JSON API, from the auditor's config:
//!
//! ```toml
//! [[operators]]                      # web UI logins
//! name = "ana"
//! role = "operator"                  # or "viewer": reads, never acknowledges or resolves
//! password_argon2 = "$argon2id$v=19$m=19456,t=2,p=1$..."   # `pagewarden-auditor hash-password`
//!
//! [[api_tokens]]                     # bearer tokens of the JSON API
//! name = "ci"
//! role = "viewer"
//! token_sha256 = "<64 hex digits>"   # tokens are random, so one SHA-256 suffices
//! ```
//!
//! Only hashes are configured. Passwords are people's, so they get a slow salted hash (argon2id,
//! PHC string); tokens are 128 random bits, so they get the same SHA-256 as tenant API keys.

use std::collections::HashMap;
use std::sync::Arc;

use argon2::password_hash::{Output, PasswordHash, PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use pagewarden_common::secret::SecretHash;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// What a signed-in person or token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page and endpoint.
    Viewer,
    /// Reads, and acknowledges and resolves incidents.
    Operator,
}

impl Role {
    /// Whether this role may acknowledge or resolve incidents.
    pub fn may_sign_off(self) -> bool {
        match self {
            Role::Viewer => false,
            Role::Operator => true,
        }
    }

    /// The role's name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// One `[[operators]]` entry: a web UI login.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorAccount {
    /// Login name; recorded as "by" on every acknowledgement and resolution.
    pub name: String,
    /// What the account may do.
    pub role: Role,
    /// argon2 PHC string of the password.
    pub password_argon2: String,
}

/// One `[[api_tokens]]` entry: a bearer token of the JSON API.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ApiToken {
    /// Name recorded as "by" when the token acknowledges or resolves.
    pub name: String,
    /// What the token may do.
    pub role: Role,
    /// SHA-256 of the token.
    pub token_sha256: SecretHash,
}

/// Who is acting: a signed-in operator or a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// Account or token name.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// The configured accounts are unusable.
#[derive(Debug, thiserror::Error)]
pub enum AccountsError {
    /// A password hash is not an argon2 PHC string.
    #[error("operator `{0}`: password_argon2 is not an argon2 PHC string ({1})")]
    BadHash(String, argon2::password_hash::Error),
    /// A name is empty or used twice.
    #[error("account name {0:?} is empty or used twice")]
    BadName(String),
}

/// The argon2id hash of `password` with a fresh random salt, as a PHC string.
pub fn hash_password(password: &str, rng: &mut impl Rng) -> String {
    let salt_bytes: [u8; 16] = rng.random();
    let salt = SaltString::encode_b64(&salt_bytes)
        .unwrap_or_else(|_| unreachable!("16 bytes always encode as a salt"));
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .unwrap_or_else(|_| unreachable!("default parameters hash any password"))
        .to_string()
}

/// Whether `password` hashes to `hash`, computed in this thread's argon2 memory.
///
/// Argon2 fills `m` KiB (19 MiB by default) per check. Allocated afresh for every check, the
/// allocator kept what a flood of sign-ins freed (hundreds of MB for a few dozen checks); each
/// thread that hashes keeps one block of memory instead, grown to the largest cost it has seen.
fn verify_in_thread_memory(password: &[u8], hash: &PasswordHash<'_>) -> bool {
    thread_local! {
        static MEMORY: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
        return false;
    };
    let Ok(algorithm) = Algorithm::try_from(hash.algorithm) else {
        return false;
    };
    let version = match hash.version.map(Version::try_from).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(_) => return false,
    };
    let Ok(params) = Params::try_from(hash) else {
        return false;
    };
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
        return false;
    };
    let blocks = params.block_count();
    let mut out = vec![0u8; expected.len()];
    let hashed = MEMORY.with_borrow_mut(|memory| {
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        Argon2::new(algorithm, version, params).hash_password_into_with_memory(
            password,
            salt,
            &mut out,
            &mut memory[..blocks],
        )
    });
    // `Output`'s equality is constant-time.
    hashed.is_ok() && Output::new(&out).is_ok_and(|o| o == *expected)
}

/// Accounts and tokens, ready to check credentials against.
#[derive(Clone, Default)]
pub struct Accounts {
    operators: Arc<HashMap<String, (Role, String)>>,
    tokens: Arc<HashMap<SecretHash, Principal>>,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts")
            .field("operators", &self.operators.keys().collect::<Vec<_>>())
            .field("api_tokens", &self.tokens.len())
            .finish()
    }
}

impl Accounts {
    /// Checks every entry (hashes parse, names unique) and builds the lookup tables.
    pub fn new(operators: &[OperatorAccount], tokens: &[ApiToken]) -> Result<Self, AccountsError> {
        let mut ops = HashMap::new();
        for o in operators {
            PasswordHash::new(&o.password_argon2)
                .map_err(|e| AccountsError::BadHash(o.name.clone(), e))?;
            let fresh = ops
                .insert(o.name.clone(), (o.role, o.password_argon2.clone()))
                .is_none();
            if o.name.trim().is_empty() || !fresh {
                return Err(AccountsError::BadName(o.name.clone()));
            }
        }
        let mut by_hash = HashMap::new();
        for t in tokens {
            let p = Principal {
                name: t.name.clone(),
                role: t.role,
            };
            if t.name.trim().is_empty() || by_hash.insert(t.token_sha256, p).is_some() {
                return Err(AccountsError::BadName(t.name.clone()));
            }
        }
        Ok(Self {
            operators: Arc::new(ops),
            tokens: Arc::new(by_hash),
        })
    }

    /// The operator `name` when `password` is theirs. Slow on purpose (argon2): call it off
    /// the async threads.
    pub fn login(&self, name: &str, password: &str) -> Option<Principal> {
        // An unknown name costs the same hash as a known one: timing does not tell names.
        static UNKNOWN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let (role, phc) = match self.operators.get(name) {
            Some((role, phc)) => (Some(*role), phc.as_str()),
            None => (
                None,
                UNKNOWN
                    .get_or_init(|| hash_password("", &mut rand::rng()))
                    .as_str(),
            ),
        };
        let hash = PasswordHash::new(phc).ok()?;
        let ok = verify_in_thread_memory(password.as_bytes(), &hash);
        role.filter(|_| ok).map(|role| Principal {
            name: name.to_string(),
            role,
        })
    }

    /// The token's principal.
    pub fn bearer(&self, token: &str) -> Option<Principal> {
        self.tokens.get(&SecretHash::of(token)).cloned()
    }

    /// True when nobody at all can get in (no operators and no tokens).
    pub fn is_empty(&self) -> bool {
        self.operators.is_empty() && self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn passwords_and_tokens_are_checked_against_hashes_only() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let phc = hash_password("correct horse", &mut rng);
        assert!(phc.starts_with("$argon2id$"), "{phc}");
        let a = Accounts::new(
            &[OperatorAccount {
                name: "ana".into(),
                role: Role::Operator,
                password_argon2: phc,
            }],
            &[ApiToken {
                name: "ci".into(),
                role: Role::Viewer,
                token_sha256: SecretHash::of("tok"),
            }],
        )
        .unwrap();
        assert_eq!(
            a.login("ana", "correct horse").unwrap().role,
            Role::Operator
        );
        assert!(a.login("ana", "wrong").is_none());
        assert!(a.login("bob", "correct horse").is_none());
        assert_eq!(a.bearer("tok").unwrap().name, "ci");
        assert!(a.bearer("tok2").is_none());
        let bad = OperatorAccount {
            name: "x".into(),
            role: Role::Viewer,
            password_argon2: "hunter2".into(),
        };
        assert!(Accounts::new(&[bad], &[]).is_err());
    }

    #[test]
    fn checks_in_thread_memory_agree_with_argon2_for_every_algorithm_and_cost() {
        use argon2::password_hash::PasswordVerifier;
        let salt = SaltString::encode_b64(b"sixteen byte slt").unwrap();
        // A larger cost after a smaller one and back: the thread's memory is grown, then reused.
        for (algorithm, m, t, p, len) in [
            (Algorithm::Argon2id, 64, 1, 1, 32),
            (Algorithm::Argon2i, 256, 2, 2, 16),
            (Algorithm::Argon2d, 32, 3, 1, 64),
            (Algorithm::Argon2id, 19 * 1024, 2, 1, 32),
        ] {
            let params = Params::new(m, t, p, Some(len)).unwrap();
            let argon = Argon2::new(algorithm, Version::V0x13, params);
            let phc = argon.hash_password(b"pw", &salt).unwrap().to_string();
            let hash = PasswordHash::new(&phc).unwrap();
            for guess in [&b"pw"[..], b"pW", b""] {
                assert_eq!(
                    verify_in_thread_memory(guess, &hash),
                    argon.verify_password(guess, &hash).is_ok(),
                    "{phc} with {guess:?}"
                );
            }
            assert!(verify_in_thread_memory(b"pw", &hash), "{phc}");
        }
    }
}
