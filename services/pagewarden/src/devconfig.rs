//! The dev config dir `pagewarden up` writes: where it lives, and the tenants file with two dev
//! tenants and one auditor probe tenant, each with a random API key.
//!
//! The file is kept across runs (keys stay the same, so a curl line copied yesterday still
//! works); delete the dir to draw new keys.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// One `[[tenants]]` entry, in the router's tenants-file shape.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Tenant {
    /// Tenant name.
    pub name: String,
    /// Bearer API keys.
    pub keys: Vec<String>,
}

/// The router's tenants file (`[[tenants]] name = "..", keys = [..]`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct TenantsFile {
    /// Every tenant.
    #[serde(default)]
    pub tenants: Vec<Tenant>,
}

/// Names of the generated tenants: two for people, one the auditor probes as.
pub const DEV_TENANTS: [&str; 2] = ["dev-alice", "dev-bob"];
/// The auditor's probe tenant.
pub const PROBE_TENANT: &str = "auditor-probe";

/// The dev config dir: `.pw/` at the checkout root when run from a checkout, otherwise
/// `$XDG_STATE_HOME/pagewarden` (or `~/.local/state/pagewarden`).
pub fn dev_dir(checkout: Option<&Path>) -> PathBuf {
    if let Some(root) = checkout {
        return root.join(".pw");
    }
    if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        return PathBuf::from(state).join("pagewarden");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".local/state/pagewarden")
}

/// A fresh API key: `pw-` and 32 hex digits (128 random bits).
pub fn new_key(rng: &mut impl Rng) -> String {
    let v: u128 = rng.random();
    format!("pw-{v:032x}")
}

/// The dev tenants: the two people and the probe tenant, one key each.
pub fn generate(rng: &mut impl Rng) -> TenantsFile {
    let tenants = DEV_TENANTS
        .iter()
        .chain(std::iter::once(&PROBE_TENANT))
        .map(|name| Tenant {
            name: name.to_string(),
            keys: vec![new_key(rng)],
        })
        .collect();
    TenantsFile { tenants }
}

impl TenantsFile {
    /// Whether every dev tenant and the probe tenant is present with a non-empty key.
    pub fn is_complete(&self) -> bool {
        DEV_TENANTS
            .iter()
            .chain(std::iter::once(&PROBE_TENANT))
            .all(|n| self.key_of(n).is_some())
    }

    /// The first key of tenant `name`.
    pub fn key_of(&self, name: &str) -> Option<&str> {
        self.tenants
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.keys.first())
            .map(String::as_str)
            .filter(|k| !k.is_empty())
    }
}

/// Reads `dir/tenants.toml` when it holds every dev tenant; otherwise writes a new one
/// (mode 0600: it holds secrets). Returns the file's path and contents.
pub fn ensure_tenants(dir: &Path) -> anyhow::Result<(PathBuf, TenantsFile)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("tenants.toml");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Ok(file) = toml::from_str::<TenantsFile>(&text) {
            if file.is_complete() {
                return Ok((path, file));
            }
        }
    }
    let file = generate(&mut rand::rng());
    let text = format!(
        "# Dev tenants written by `pagewarden up`; delete this file to draw new keys.\n{}",
        toml::to_string(&file).context("encoding the tenants file")?
    );
    write_private(&path, &text)?;
    Ok((path, file))
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn generated_keys_are_distinct_and_complete() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let f = generate(&mut rng);
        assert!(f.is_complete());
        let keys: std::collections::HashSet<_> =
            f.tenants.iter().flat_map(|t| t.keys.clone()).collect();
        assert_eq!(keys.len(), 3);
        assert!(keys.iter().all(|k| k.len() == 35 && k.starts_with("pw-")));
    }

    #[test]
    fn tenants_file_is_kept_across_runs_and_rewritten_when_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let (path, first) = ensure_tenants(dir.path()).unwrap();
        let (_, again) = ensure_tenants(dir.path()).unwrap();
        assert_eq!(first.tenants, again.tenants);
        std::fs::write(&path, "[[tenants]]\nname = \"dev-alice\"\nkeys = []\n").unwrap();
        let (_, fresh) = ensure_tenants(dir.path()).unwrap();
        assert!(fresh.is_complete());
        assert_ne!(fresh.tenants, first.tenants);
        let parsed: TenantsFile = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(parsed.tenants, fresh.tenants);
    }

    #[test]
    fn dev_dir_prefers_the_checkout() {
        assert_eq!(dev_dir(Some(Path::new("/r"))), PathBuf::from("/r/.pw"));
    }
}
