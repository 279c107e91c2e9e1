//! The dev configuration `pagewarden up` runs with: where its dir lives, the tenants file with
//! two dev tenants and one auditor probe tenant (each with a random API key), and the command
//! line of each child service ([`Plan`]).
//!
//! The file is kept across runs (keys stay the same, so a curl line copied yesterday still
//! works); delete the dir to draw new keys.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use pagewarden_common::tls::{write_dev_suite, DevSuite, SuiteRole};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::children::Spec;

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

/// Everything the children's command lines are made of.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Where the service binaries are.
    pub bin_dir: PathBuf,
    /// The dev config dir.
    pub dir: PathBuf,
    /// The GGUF model.
    pub model: PathBuf,
    /// The router's tenants file.
    pub tenants: PathBuf,
    /// The auditor's probe tenant key.
    pub probe_key: String,
    /// Router HTTP address (chosen before start: the auditor needs it first).
    pub router_addr: SocketAddr,
    /// Auditor HTTP address.
    pub auditor_addr: SocketAddr,
    /// Auditor probe interval.
    pub probe_interval: String,
    /// Decode's write grant lifetime.
    pub grant_ttl_ms: u64,
    /// Workers' pool size override.
    pub pool_tokens: Option<usize>,
    /// Workers' context override.
    pub context_length: Option<usize>,
    /// The auditor's gRPC URL, once it is known: router and workers report to it.
    pub auditor_grpc: Option<String>,
}

/// Where the dev CA and the services' certificates live: `<dev dir>/tls`.
pub fn tls_dir(dir: &Path) -> PathBuf {
    dir.join("tls")
}

/// Creates the dev CA and one certificate per service under `<dev dir>/tls` (kept across
/// runs; delete the directory to draw new ones).
pub fn ensure_tls(dir: &Path) -> anyhow::Result<DevSuite> {
    Ok(write_dev_suite(&tls_dir(dir))?)
}

fn strings<const N: usize>(a: [&str; N]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

impl Plan {
    fn spec(&self, name: &str, mut args: Vec<String>) -> Spec {
        if let (Some(url), false) = (&self.auditor_grpc, name == "auditor") {
            // Samples (router), integrity events and preflight reports (workers).
            args.extend(strings(["--auditor", url]));
        }
        // The dev suite's certificates, when `up` wrote them (`ensure_tls`): mutual TLS on
        // every internal link, each service under its own role.
        let role = SuiteRole::ALL.into_iter().find(|r| r.as_str() == name);
        if let (Some(suite), Some(role)) = (DevSuite::existing(&tls_dir(&self.dir)), role) {
            args.extend(suite.args(role));
        }
        Spec {
            name: name.to_string(),
            program: self.bin_dir.join(format!("pagewarden-{name}")),
            args,
            env: vec![],
        }
    }

    /// The auditor on SQLite in `dir/auditor`, probing the router as the probe tenant.
    pub fn auditor(&self) -> Spec {
        let data = self.dir.join("auditor");
        let mut a = strings(["--http-addr", &self.auditor_addr.to_string()]);
        a.extend(strings(["--grpc-addr", "127.0.0.1:0"]));
        a.extend(strings([
            "--database-url",
            &format!("sqlite://{}/auditor.sqlite?mode=rwc", data.display()),
            "--data-dir",
            &data.display().to_string(),
            "--router-url",
            &format!("http://{}", self.router_addr),
            "--probe-key",
            &format!("{PROBE_TENANT}={}", self.probe_key),
            "--probe-interval",
            &self.probe_interval,
            "--model-path",
            &self.model.display().to_string(),
        ]));
        self.spec("auditor", a)
    }

    /// A worker on free loopback ports.
    pub fn worker(&self, role: &str) -> Spec {
        let mut a = strings([
            "--model",
            &self.model.display().to_string(),
            "--grpc-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--node-id",
            &format!("{role}-0"),
        ]);
        if role == "decode" {
            a.extend(strings(["--transfer-addr", "127.0.0.1:0"]));
            a.extend(strings(["--grant-ttl-ms", &self.grant_ttl_ms.to_string()]));
        }
        if let Some(t) = self.pool_tokens {
            a.extend(strings(["--pool-tokens", &t.to_string()]));
        }
        if let Some(c) = self.context_length {
            a.extend(strings(["--context-length", &c.to_string()]));
        }
        self.spec(role, a)
    }

    /// The router, pointed at the workers' gRPC addresses.
    pub fn router(&self, decode_grpc: &str, prefill_grpc: &str) -> Spec {
        let a = strings([
            "--http-addr",
            &self.router_addr.to_string(),
            "--model",
            &self.model.display().to_string(),
            "--tenants",
            &self.tenants.display().to_string(),
            "--decode",
            &format!("http://{decode_grpc}"),
            "--prefill",
            &format!("http://{prefill_grpc}"),
        ]);
        self.spec("router", a)
    }
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
    fn specs_carry_their_role_certificate_once_the_suite_exists() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan {
            bin_dir: PathBuf::from("/bin"),
            dir: dir.path().to_path_buf(),
            model: PathBuf::from("m.gguf"),
            tenants: PathBuf::from("t.toml"),
            probe_key: "k".into(),
            router_addr: "127.0.0.1:1".parse().unwrap(),
            auditor_addr: "127.0.0.1:2".parse().unwrap(),
            probe_interval: "0".into(),
            grant_ttl_ms: 1,
            pool_tokens: None,
            context_length: None,
            auditor_grpc: None,
        };
        assert!(!plan.worker("decode").args.contains(&"--tls-ca".to_string()));
        let suite = ensure_tls(dir.path()).unwrap();
        let args = plan.worker("decode").args;
        let cert = suite.cert(SuiteRole::Decode).display().to_string();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--tls-cert" && w[1] == cert),
            "{args:?}"
        );
        let args = plan.router("127.0.0.1:3", "127.0.0.1:4").args;
        let cert = suite.cert(SuiteRole::Router).display().to_string();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--tls-cert" && w[1] == cert),
            "{args:?}"
        );
    }

    #[test]
    fn dev_dir_prefers_the_checkout() {
        assert_eq!(dev_dir(Some(Path::new("/r"))), PathBuf::from("/r/.pw"));
    }
}
