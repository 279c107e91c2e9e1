//! `pagewarden init-secrets --dir DIR`: the secrets of a containerised suite, drawn at its
//! first start (compose's one-shot `init` service), so that no key or certificate ships in an
//! image or in the repository. One directory per role, each meant to be its own volume and
//! mounted only by that role:
//!
//! - `admin/`: the suite CA and its private key (`tls/`), the dev tenants' and the probe
//!   tenant's API keys in clear (`keys.toml`), the auditor's dev operator password, the
//!   workers' metrics token: what an operator keeps; no service mounts it.
//! - `router/`: `ca.pem`, `router.pem`, `router.key`, `tenants.toml` (SHA-256 of each key).
//! - `prefill/`, `decode/`: `ca.pem`, the role's certificate and key, and `metrics-token`,
//!   which their `/metrics` (served off loopback) requires of every scrape.
//! - `prometheus/`: the same `metrics-token`, which Prometheus presents.
//! - `auditor/`: `ca.pem`, its certificate and key, and `auditor.toml`: the operator's argon2
//!   hash and the probe tenant's key (the one `router/tenants.toml` holds the hash of).
//!
//! A file already there is kept (a restart changes nothing; tenants added to
//! `router/tenants.toml` with `pagewarden keys` stay); delete the volumes to draw anew.

use std::path::{Path, PathBuf};

use anyhow::Context;
use pagewarden_auditor::probe::ProbeTenant;
use pagewarden_common::tenants::write_private;
use pagewarden_common::tls::{write_dev_suite, SuiteRole};
use rand::Rng;

use crate::devsecrets::{self, PROBE_TENANT};

/// `pagewarden init-secrets` flags.
#[derive(Debug, clap::Args)]
pub struct InitSecretsArgs {
    /// The directory holding one subdirectory per role (`admin`, `router`, `prefill`,
    /// `decode`, `auditor`).
    #[arg(long)]
    pub dir: PathBuf,
}

/// Copies `from` to `to` unless `to` is there; private (0600) when `secret`.
fn place(from: &Path, to: &Path, secret: bool) -> anyhow::Result<bool> {
    if to.exists() {
        return Ok(false);
    }
    let text =
        std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
    if secret {
        write_private(to, &text)?;
    } else {
        std::fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    }
    Ok(true)
}

/// The workers' metrics token in `admin/`, drawn (128 random bits, hex) unless there.
fn ensure_metrics_token(admin: &Path) -> anyhow::Result<PathBuf> {
    let path = admin.join(METRICS_TOKEN);
    if !path.exists() {
        let bits: u128 = rand::rng().random();
        write_private(&path, &format!("{bits:032x}\n"))?;
    }
    Ok(path)
}

/// The file holding the workers' metrics token, in `admin/`, `prefill/`, `decode/` and
/// `prometheus/`.
pub const METRICS_TOKEN: &str = "metrics-token";

/// The auditor's config: the dev operator `devsecrets` wrote, plus the probe tenant's key.
fn auditor_config(admin: &Path, probe_key: &str) -> anyhow::Result<String> {
    let path = devsecrets::auditor_config(admin);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let probe = ProbeTenant {
        tenant: PROBE_TENANT.into(),
        api_key: probe_key.into(),
    };
    table.insert(
        "probe_tenants".into(),
        toml::Value::try_from(vec![probe]).context("encoding the probe tenant")?,
    );
    Ok(format!(
        "# Written by `pagewarden init-secrets`: the probe tenant's key and the operators' \
         hashes.\n{}",
        toml::to_string(&table).context("encoding the auditor config")?
    ))
}

/// Runs `pagewarden init-secrets`.
pub fn run(a: InitSecretsArgs) -> anyhow::Result<()> {
    let admin = a.dir.join("admin");
    let suite = write_dev_suite(&admin.join("tls")).context("writing the suite CA")?;
    let (tenants, keys) = devsecrets::ensure_tenants(&admin)?;
    devsecrets::ensure_operator(&admin)?;
    let probe_key = keys
        .key_of(PROBE_TENANT)
        .context("no probe tenant key was drawn")?;
    let mut written = Vec::new();
    for role in SuiteRole::ALL {
        let dir = a.dir.join(role.as_str());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let files = [
            (suite.ca(), dir.join("ca.pem"), false),
            (suite.cert(role), dir.join(format!("{role}.pem")), false),
            (suite.key(role), dir.join(format!("{role}.key")), true),
        ];
        for (from, to, secret) in files {
            if place(&from, &to, secret)? {
                written.push(to);
            }
        }
    }
    let token = ensure_metrics_token(&admin)?;
    // Prometheus runs as a user of its own, which a private file of ours would shut out; its
    // volume is mounted by it alone.
    for (dir, private) in [("prefill", true), ("decode", true), ("prometheus", false)] {
        let dir = a.dir.join(dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let to = dir.join(METRICS_TOKEN);
        if place(&token, &to, private)? {
            written.push(to);
        }
    }
    let router_tenants = a.dir.join("router/tenants.toml");
    if place(&tenants, &router_tenants, true)? {
        written.push(router_tenants);
    }
    let auditor = a.dir.join("auditor/auditor.toml");
    if !auditor.exists() {
        write_private(&auditor, &auditor_config(&admin, probe_key)?)?;
        written.push(auditor);
    }
    if written.is_empty() {
        eprintln!("secrets in {} already there: kept", a.dir.display());
    }
    for w in written {
        eprintln!("wrote {}", w.display());
    }
    eprintln!(
        "API keys in clear: {}; the auditor's dev operator password: {}",
        admin.join("keys.toml").display(),
        admin.join("dev-operator.password").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewarden_common::tenants::{ClientKeys, KeyTable, TenantsFile};

    #[test]
    fn each_role_gets_its_own_files_and_the_probe_key_opens_the_probe_tenant() {
        let dir = tempfile::tempdir().unwrap();
        run(InitSecretsArgs {
            dir: dir.path().to_path_buf(),
        })
        .unwrap();
        let p = |s: &str| dir.path().join(s);
        for role in SuiteRole::ALL {
            assert!(p(&format!("{role}/{role}.pem")).is_file());
            assert!(p(&format!("{role}/ca.pem")).is_file());
            for other in SuiteRole::ALL.into_iter().filter(|o| *o != role) {
                assert!(!p(&format!("{role}/{other}.key")).exists());
            }
            assert!(
                !p(&format!("{role}/ca.key")).exists(),
                "the CA key stays in admin"
            );
        }
        let config: toml::Table =
            toml::from_str(&std::fs::read_to_string(p("auditor/auditor.toml")).unwrap()).unwrap();
        let probe: Vec<ProbeTenant> = config["probe_tenants"].clone().try_into().unwrap();
        let table = KeyTable::new(
            &TenantsFile::load(&p("router/tenants.toml"))
                .unwrap()
                .tenants,
        )
        .unwrap();
        assert_eq!(
            table.tenant(&probe[0].api_key).unwrap().as_str(),
            PROBE_TENANT
        );
        assert!(config["operators"].as_array().is_some_and(|o| o.len() == 1));
        let token = std::fs::read_to_string(p("admin/metrics-token")).unwrap();
        assert_eq!(token.trim().len(), 32, "{token}");
        for holder in ["prefill", "decode", "prometheus"] {
            let there = std::fs::read_to_string(p(&format!("{holder}/metrics-token"))).unwrap();
            assert_eq!(there, token, "{holder}");
        }
        for other in ["router", "auditor"] {
            assert!(!p(&format!("{other}/metrics-token")).exists(), "{other}");
        }
        // A second start keeps everything, a tenant added to the router's file included.
        let keys = ClientKeys::load(&p("admin/keys.toml")).unwrap();
        let before = std::fs::read(p("router/tenants.toml")).unwrap();
        run(InitSecretsArgs {
            dir: dir.path().to_path_buf(),
        })
        .unwrap();
        assert_eq!(std::fs::read(p("router/tenants.toml")).unwrap(), before);
        assert_eq!(ClientKeys::load(&p("admin/keys.toml")).unwrap(), keys);
    }
}
