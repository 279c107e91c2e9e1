//! The dev configuration `pagewarden up` runs with: where its dir lives, and the command line
//! of each child service ([`Plan`]). The secrets it points at are drawn by `devsecrets`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use pagewarden_common::receipt::ReceiptKey;
use pagewarden_common::tenants::create_private_dir;
use pagewarden_common::tls::{write_dev_suite, DevSuite, SuiteRole};

use crate::children::Spec;
use crate::devsecrets::receipt_key_path;

/// The dev config dir when `--dir` names none: `.pw/` in the directory the launcher runs in
/// (in a checkout's root, the checkout's own, which git ignores).
pub fn dev_dir() -> PathBuf {
    std::env::current_dir()
        .unwrap_or_else(|_| PathBuf::from("."))
        .join(".pw")
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
    /// The auditor's config file (its operator accounts).
    pub auditor_config: PathBuf,
    /// Router HTTP address (chosen before start: the auditor needs it first).
    pub router_addr: SocketAddr,
    /// Auditor HTTP address.
    pub auditor_addr: SocketAddr,
    /// Auditor probe interval (zero: on demand only).
    pub probe_interval: Duration,
    /// Decode's write grant lifetime.
    pub grant_ttl: Duration,
    /// Workers' pool size override.
    pub pool_tokens: Option<usize>,
    /// Workers' context override.
    pub context_length: Option<usize>,
    /// Workers attend in llama.cpp's flash-attention arithmetic.
    pub flash_attention: bool,
    /// The auditor's gRPC URL, once it is known: router and workers report to it.
    pub auditor_grpc: Option<String>,
}

/// Requests one tenant may have in flight at the router under `up`: a quarter of the router's
/// default `--max-concurrency` (256), so the two dev tenants, the probe tenant and one more each keep a
/// place however hard another pushes. The workers' fair queues and decode's pool share are on
/// by default (weight 1 each).
pub const TENANT_SHARE: usize = 64;

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

    /// The auditor on SQLite in `dir/auditor`, probing the router as the probe tenant and the
    /// dev tenants (a light sweep every `probe_interval`).
    pub fn auditor(&self) -> Spec {
        let data = self.dir.join("auditor");
        let mut a = strings(["--config", &self.auditor_config.display().to_string()]);
        a.extend(strings(["--http-addr", &self.auditor_addr.to_string()]));
        a.extend(strings(["--grpc-addr", "127.0.0.1:0"]));
        a.extend(strings([
            "--database-url",
            &format!("sqlite://{}/auditor.sqlite?mode=rwc", data.display()),
            "--data-dir",
            &data.display().to_string(),
            "--router-url",
            &format!("http://{}", self.router_addr),
            "--probe-interval",
            &humantime::format_duration(self.probe_interval).to_string(),
            // A light sweep (short prompts and the just-over-context step) as every dev tenant
            // of `keys.toml`, the two people's and the probe tenant. Keys reach the
            // auditor only through that file (0600), never its command line.
            "--probe-sweep",
            "light",
            "--probe-keys-file",
            &self.dir.join("keys.toml").display().to_string(),
            "--model-path",
            &self.model.display().to_string(),
            // The recompute audit scores the router's sample of served requests again on the
            // same model, on a thread of its own at the lowest priority.
            "--recompute-model",
            &self.model.display().to_string(),
        ]));
        // The public half of the router's receipt key, when `up` drew one.
        if let Ok(key) = ReceiptKey::load(&receipt_key_path(&self.dir)) {
            a.extend(strings(["--receipt-public-key", &key.public().to_string()]));
        }
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
            a.extend(strings([
                "--grant-ttl",
                &humantime::format_duration(self.grant_ttl).to_string(),
            ]));
        }
        if let Some(t) = self.pool_tokens {
            a.extend(strings(["--pool-tokens", &t.to_string()]));
        }
        if let Some(c) = self.context_length {
            a.extend(strings(["--context-length", &c.to_string()]));
        }
        if self.flash_attention {
            a.push("--flash-attention".into());
        }
        self.spec(role, a)
    }

    /// The router, pointed at the workers' gRPC addresses. Each tenant gets a share of its
    /// concurrency ([`TENANT_SHARE`]), so one tenant at any load leaves the others served.
    pub fn router(&self, decode_grpc: &str, prefill_grpc: &str) -> Spec {
        let mut a = strings([
            "--tenant-max-concurrency",
            &TENANT_SHARE.to_string(),
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
        // It signs isolation receipts with the key `up` drew.
        let key = receipt_key_path(&self.dir);
        if key.exists() {
            a.extend(strings(["--receipt-key", &key.display().to_string()]));
        }
        self.spec("router", a)
    }
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_dir_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = lock_dir(dir.path()).unwrap();
        let e = lock_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("pid {}", std::process::id())) && e.contains("--dir"),
            "{e}"
        );
        drop(first);
        lock_dir(dir.path()).expect("free again once the first is gone");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_carry_their_role_certificate_once_the_suite_exists() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan {
            bin_dir: PathBuf::from("/bin"),
            dir: dir.path().to_path_buf(),
            model: PathBuf::from("m.gguf"),
            tenants: PathBuf::from("t.toml"),
            auditor_config: PathBuf::from("a.toml"),
            router_addr: "127.0.0.1:1".parse().unwrap(),
            auditor_addr: "127.0.0.1:2".parse().unwrap(),
            probe_interval: Duration::ZERO,
            grant_ttl: Duration::from_millis(1),
            pool_tokens: None,
            context_length: None,
            flash_attention: false,
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
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--tenant-max-concurrency" && w[1] == TENANT_SHARE.to_string()),
            "every tenant gets a share of the router: {args:?}"
        );
        let cert = suite.cert(SuiteRole::Router).display().to_string();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--tls-cert" && w[1] == cert),
            "{args:?}"
        );
    }

    #[test]
    fn no_secret_is_on_a_command_line_and_the_dev_dir_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(".pw");
        let (tenants, keys) = crate::devsecrets::ensure_tenants(&dir).unwrap();
        let operator = crate::devsecrets::ensure_operator(&dir).unwrap();
        let suite = ensure_tls(&dir).unwrap();
        let plan = Plan {
            bin_dir: PathBuf::from("/bin"),
            dir: dir.clone(),
            model: PathBuf::from("m.gguf"),
            tenants,
            auditor_config: crate::devsecrets::auditor_config(&dir),
            router_addr: "127.0.0.1:1".parse().unwrap(),
            auditor_addr: "127.0.0.1:2".parse().unwrap(),
            probe_interval: Duration::ZERO,
            grant_ttl: Duration::from_millis(1),
            pool_tokens: None,
            context_length: None,
            flash_attention: false,
            auditor_grpc: Some("http://127.0.0.1:3".into()),
        };
        let mut secrets: Vec<String> = keys.keys.iter().map(|k| k.key.clone()).collect();
        secrets.push(operator.password.clone());
        let specs = [
            plan.auditor(),
            plan.worker("decode"),
            plan.worker("prefill"),
            plan.router("127.0.0.1:4", "127.0.0.1:5"),
        ];
        for spec in &specs {
            let seen = spec.args.iter().chain(spec.env.iter().map(|(_, v)| v));
            for value in seen {
                for s in &secrets {
                    assert!(
                        !value.contains(s.as_str()),
                        "{}'s command line or environment carries a secret: {value}",
                        spec.name
                    );
                }
            }
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "the dev dir");
        for f in [
            "keys.toml",
            "tenants.toml",
            "dev-operator.password",
            "auditor.toml",
        ] {
            assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        }
        for role in SuiteRole::ALL {
            assert_eq!(mode(&suite.key(role)), 0o600, "{role:?}'s TLS key");
        }
    }

    #[test]
    fn the_dev_dir_is_in_the_directory_up_runs_in() {
        assert_eq!(dev_dir(), std::env::current_dir().unwrap().join(".pw"));
    }
}

/// The lock one `pagewarden up` holds on its dev dir while it runs (released when dropped,
/// or by the OS when the process dies).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Locks `dir/up.lock`, or says which process holds it.
pub fn lock_dir(dir: &Path) -> anyhow::Result<DirLock> {
    use std::io::{Read, Seek, Write};
    create_private_dir(dir)?;
    let path = dir.join("up.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            anyhow::bail!(
                "another `pagewarden up` (pid {}) is running over {}: stop it first, or pass \
                 --dir for a second suite",
                holder.trim(),
                dir.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(DirLock { _file: file })
}
