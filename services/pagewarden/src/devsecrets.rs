//! The secrets `pagewarden up` draws at first start and keeps across runs (so a curl line
//! copied yesterday still works; delete a file to draw anew):
//!
//! - API keys of two dev tenants and the auditor's probe tenant: clear in `keys.toml` (for
//!   the banner, the probe and you; mode 0600), only their SHA-256 in `tenants.toml` (what the
//!   router reads). Tenants added with `pagewarden keys` are kept when dev keys are redrawn.
//! - The auditor's dev operator: its password clear in `dev-operator.password` (0600), only
//!   its argon2 hash in `auditor.toml` (what the auditor reads); and a read-only token of the
//!   auditor's JSON API (`/api/...`, e.g. the prefix cache's per-tenant view), clear in
//!   `dev-viewer.token` (0600), only its SHA-256 in `auditor.toml`.
//! - The router's receipt signing key (Ed25519, PKCS#8 PEM) in `receipt-key.pem` (0600); the
//!   auditor gets only its public half, on its command line.

use std::path::{Path, PathBuf};

use anyhow::Context;
use pagewarden_auditor::accounts::{hash_password, ApiToken, OperatorAccount, Role};
use pagewarden_common::receipt::ReceiptKey;
use pagewarden_common::secret::{new_secret, SecretHash};
use pagewarden_common::tenants::{
    create_private_dir, write_private, ClientKey, ClientKeys, KeyTable, TenantsFile,
};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Names of the generated tenants: two for people.
pub const DEV_TENANTS: [&str; 2] = ["dev-alice", "dev-bob"];
/// The auditor's probe tenant.
pub const PROBE_TENANT: &str = "auditor-probe";
/// The auditor's dev operator account.
pub const DEV_OPERATOR: &str = "dev-operator";
/// The name of the auditor API's read-only dev token.
pub const DEV_VIEWER: &str = "dev-viewer";
/// The prefix of API keys drawn here and by `pagewarden keys`.
pub const KEY_PREFIX: &str = "pw-";

/// The comment heading every tenants file written here or by `pagewarden keys`.
pub const TENANTS_HEADER: &str =
    "Router tenants: SHA-256 of each API key (`pagewarden keys add|rotate|revoke` edits this).";

fn dev_names() -> impl Iterator<Item = &'static str> {
    DEV_TENANTS.into_iter().chain(std::iter::once(PROBE_TENANT))
}

/// Fresh keys for the dev tenants and the probe tenant, one each.
pub fn generate(rng: &mut impl Rng) -> ClientKeys {
    let keys = dev_names()
        .map(|name| ClientKey {
            tenant: name.to_string(),
            key: new_secret(KEY_PREFIX, rng),
        })
        .collect();
    ClientKeys { keys }
}

/// Whether `keys` holds a key for every dev tenant and each opens its tenant in `tenants`.
fn still_valid(keys: &ClientKeys, tenants: &TenantsFile) -> bool {
    let Ok(table) = KeyTable::new(&tenants.tenants) else {
        return false;
    };
    dev_names().all(|name| {
        keys.key_of(name)
            .and_then(|k| table.tenant(k))
            .is_some_and(|t| t.as_str() == name)
    })
}

/// Reads `dir/keys.toml` and `dir/tenants.toml` when they still match; otherwise draws new dev
/// keys, writes them clear to `keys.toml` and hashed into `tenants.toml` (other tenants kept).
/// Returns the tenants file's path and the dev keys.
pub fn ensure_tenants(dir: &Path) -> anyhow::Result<(PathBuf, ClientKeys)> {
    create_private_dir(dir)?;
    let (keys_path, tenants_path) = (dir.join("keys.toml"), dir.join("tenants.toml"));
    // A missing file is drawn anew; one that is there but does not load is the operator's to
    // fix (it may hold tenants added with `pagewarden keys`): never replaced silently.
    let mut tenants = if tenants_path.exists() {
        TenantsFile::load(&tenants_path).context(
            "the dev tenants file does not load; fix it, or delete it to draw new dev keys \
             (tenants added with `pagewarden keys` are lost then)",
        )?
    } else {
        TenantsFile::default()
    };
    if let Ok(keys) = ClientKeys::load(&keys_path) {
        if still_valid(&keys, &tenants) {
            return Ok((tenants_path, keys));
        }
    }
    let keys = generate(&mut rand::rng());
    for k in &keys.keys {
        tenants.entry_mut(&k.tenant).key_sha256 = vec![SecretHash::of(&k.key)];
    }
    let text = format!(
        "# Dev API keys in clear, written by `pagewarden up`; delete this file to draw new ones.\n{}",
        toml::to_string(&keys).context("encoding the keys file")?
    );
    write_private(&keys_path, &text)?;
    tenants.save(&tenants_path, TENANTS_HEADER)?;
    Ok((tenants_path, keys))
}

/// The auditor config `up` writes: the dev operator account and the read-only API token.
#[derive(Debug, Default, Deserialize, Serialize)]
struct DevAuditorConfig {
    operators: Vec<OperatorAccount>,
    api_tokens: Vec<ApiToken>,
}

/// The auditor config `up` writes and starts the auditor with.
pub fn auditor_config(dir: &Path) -> PathBuf {
    dir.join("auditor.toml")
}

/// Where the router's receipt signing key lives under `up`'s `dir`.
pub fn receipt_key_path(dir: &Path) -> PathBuf {
    dir.join("receipt-key.pem")
}

/// The receipt signing key under `dir`, drawn (0600) when missing or unreadable as a key.
pub fn ensure_receipt_key(dir: &Path) -> anyhow::Result<ReceiptKey> {
    let path = receipt_key_path(dir);
    if let Ok(key) = ReceiptKey::load(&path) {
        return Ok(key);
    }
    write_private(&path, &ReceiptKey::generate_pem()?)?;
    Ok(ReceiptKey::load(&path)?)
}

/// The dev operator's sign-in and the read-only API token, as the banner prints them.
#[derive(Clone, Debug)]
pub struct DevOperator {
    /// Where the clear password is kept (mode 0600).
    pub password_file: PathBuf,
    /// The password.
    pub password: String,
    /// Where the clear read-only API token is kept (mode 0600).
    pub viewer_token_file: PathBuf,
    /// The read-only API token.
    pub viewer_token: String,
}

/// Reads the dev operator's password, the read-only API token and `dir/auditor.toml` when all
/// are there; otherwise draws a new random password and token and writes them (0600) and their
/// hashes.
pub fn ensure_operator(dir: &Path) -> anyhow::Result<DevOperator> {
    create_private_dir(dir)?;
    let config = auditor_config(dir);
    let password_file = dir.join("dev-operator.password");
    let viewer_token_file = dir.join("dev-viewer.token");
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let (Some(password), Some(viewer_token), true) = (
        read(&password_file),
        read(&viewer_token_file),
        config.is_file(),
    ) {
        return Ok(DevOperator {
            password_file,
            password,
            viewer_token_file,
            viewer_token,
        });
    }
    let mut rng = rand::rng();
    let password = new_secret("", &mut rng);
    let viewer_token = new_secret(KEY_PREFIX, &mut rng);
    let file = DevAuditorConfig {
        operators: vec![OperatorAccount {
            name: DEV_OPERATOR.into(),
            role: Role::Operator,
            password_argon2: hash_password(&password, &mut rng),
        }],
        api_tokens: vec![ApiToken {
            name: DEV_VIEWER.into(),
            role: Role::Viewer,
            token_sha256: SecretHash::of(&viewer_token),
        }],
    };
    let text = format!(
        "# The auditor's dev operator and read-only API token, written by `pagewarden up` (in \
         clear in {} and {}).\n{}",
        password_file.display(),
        viewer_token_file.display(),
        toml::to_string(&file).context("encoding the auditor config")?
    );
    write_private(&password_file, &format!("{password}\n"))?;
    write_private(&viewer_token_file, &format!("{viewer_token}\n"))?;
    write_private(&config, &text)?;
    Ok(DevOperator {
        password_file,
        password,
        viewer_token_file,
        viewer_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn generated_keys_are_distinct_and_complete() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let f = generate(&mut rng);
        let keys: std::collections::HashSet<_> = f.keys.iter().map(|k| k.key.clone()).collect();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| k.len() == 35 && k.starts_with("pw-")));
    }

    #[test]
    fn keys_are_kept_across_runs_and_only_hashes_reach_the_tenants_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, first) = ensure_tenants(dir.path()).unwrap();
        let (_, again) = ensure_tenants(dir.path()).unwrap();
        assert_eq!(first, again);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(first.keys.iter().all(|k| !text.contains(&k.key)), "{text}");
        let table = KeyTable::new(&TenantsFile::load(&path).unwrap().tenants).unwrap();
        assert_eq!(
            table
                .tenant(first.key_of("dev-bob").unwrap())
                .unwrap()
                .as_str(),
            "dev-bob"
        );
        // A tenant added by hand survives new dev keys.
        let mut t = TenantsFile::load(&path).unwrap();
        t.entry_mut("acme").key_sha256 = vec![SecretHash::of("pw-acme")];
        t.save(&path, "x").unwrap();
        std::fs::remove_file(dir.path().join("keys.toml")).unwrap();
        let (_, fresh) = ensure_tenants(dir.path()).unwrap();
        assert_ne!(fresh, first);
        let table = KeyTable::new(&TenantsFile::load(&path).unwrap().tenants).unwrap();
        assert!(table.tenant("pw-acme").is_some());
        assert!(table.tenant(first.key_of("dev-bob").unwrap()).is_none());
    }

    #[test]
    fn a_tenants_file_that_does_not_load_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, "[[tenants]\nname = broken").unwrap();
        let e = format!("{:#}", ensure_tenants(dir.path()).unwrap_err());
        assert!(
            e.contains("does not load") && e.contains("tenants.toml"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "[[tenants]\nname = broken"
        );
    }

    #[test]
    fn the_dev_operator_password_is_kept_clear_only_in_a_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let op = ensure_operator(dir.path()).unwrap();
        let mode = std::fs::metadata(&op.password_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let config = std::fs::read_to_string(auditor_config(dir.path())).unwrap();
        assert!(!config.contains(&op.password) && config.contains("$argon2id$"));
        assert_eq!(ensure_operator(dir.path()).unwrap().password, op.password);
        // The read-only API token: clear only in its private file, its hash a viewer's.
        let mode = std::fs::metadata(&op.viewer_token_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!config.contains(&op.viewer_token));
        let parsed: DevAuditorConfig = toml::from_str(&config).unwrap();
        assert_eq!(parsed.api_tokens.len(), 1);
        assert_eq!(parsed.api_tokens[0].role, Role::Viewer);
        assert_eq!(
            parsed.api_tokens[0].token_sha256,
            SecretHash::of(&op.viewer_token)
        );
        assert_eq!(
            ensure_operator(dir.path()).unwrap().viewer_token,
            op.viewer_token
        );
        // A dev directory from before the token is drawn anew, token and all.
        std::fs::remove_file(&op.viewer_token_file).unwrap();
        let again = ensure_operator(dir.path()).unwrap();
        assert_ne!(again.viewer_token, op.viewer_token);
        assert!(std::fs::read_to_string(auditor_config(dir.path()))
            .unwrap()
            .contains(SecretHash::of(&again.viewer_token).to_string().as_str()));
    }
}
