//! `pagewarden keys add|rotate|revoke --tenant NAME [--file PATH]`: edits a tenants file
//! (default: the dev one `pagewarden up` writes), which stores only the SHA-256 of each key.
//!
//! - `add` draws a new key for the tenant (creating the tenant when new) and prints it once;
//! - `rotate` replaces every key of the tenant by one new key, printed once;
//! - `revoke` removes one key (`--key KEY` or `--sha256 HEX`) or, with neither, every key
//!   of the tenant (and the tenant with them).
//!
//! A running router picks the file up on SIGHUP (`kill -HUP <pid>`), without dropping
//! requests in flight.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Subcommand;
use pagewarden_common::secret::{new_secret, SecretHash};
use pagewarden_common::tenants::TenantsFile;

use crate::devsecrets::{KEY_PREFIX, TENANTS_HEADER};

/// `pagewarden keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Draw a new key for a tenant (the tenant is created when new); prints it once.
    Add(KeysArgs),
    /// Replace every key of a tenant by one new key; prints it once.
    Rotate(KeysArgs),
    /// Remove one key of a tenant, or all of them.
    Revoke(RevokeArgs),
}

/// Which tenant, in which file.
#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// The tenant's name.
    #[arg(long)]
    pub tenant: String,
    /// The tenants file (default: the one `pagewarden up` uses).
    #[arg(long)]
    pub file: Option<PathBuf>,
}

/// `pagewarden keys revoke` flags.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// Which tenant, in which file.
    #[command(flatten)]
    pub which: KeysArgs,
    /// The key to revoke, in clear.
    #[arg(long, conflicts_with = "sha256")]
    pub key: Option<String>,
    /// The SHA-256 of the key to revoke, as the file lists it.
    #[arg(long)]
    pub sha256: Option<SecretHash>,
}

fn path(which: &KeysArgs) -> PathBuf {
    which
        .file
        .clone()
        .unwrap_or_else(|| crate::devconfig::dev_dir().join("tenants.toml"))
}

/// Runs one `pagewarden keys` subcommand.
pub fn run(cmd: KeysCommand) -> anyhow::Result<()> {
    match cmd {
        KeysCommand::Add(a) => new_key(&a, false),
        KeysCommand::Rotate(a) => new_key(&a, true),
        KeysCommand::Revoke(r) => revoke(&r),
    }
}

/// The file at `path`; a missing one is empty when `may_create`.
fn load(path: &std::path::Path, may_create: bool) -> anyhow::Result<TenantsFile> {
    if may_create && !path.exists() {
        return Ok(TenantsFile::default());
    }
    Ok(TenantsFile::load(path)?)
}

fn new_key(a: &KeysArgs, replace: bool) -> anyhow::Result<()> {
    if a.tenant.trim().is_empty() {
        bail!("--tenant must name a tenant");
    }
    let path = path(a);
    let mut file = load(&path, true)?;
    let key = new_secret(KEY_PREFIX, &mut rand::rng());
    let entry = file.entry_mut(&a.tenant);
    let replaced = if replace {
        std::mem::take(&mut entry.key_sha256).len()
    } else {
        0
    };
    entry.key_sha256.push(SecretHash::of(&key));
    file.save(&path, TENANTS_HEADER)
        .with_context(|| format!("saving {}", path.display()))?;
    println!("{key}");
    let what = if replace {
        format!(
            "replaced {replaced} key(s) of tenant {} by this new key",
            a.tenant
        )
    } else {
        format!("added this key to tenant {}", a.tenant)
    };
    eprintln!(
        "{what} in {} (stored as its SHA-256 only: this is the one time it is shown).\n\
         A running router loads the file on SIGHUP: kill -HUP <router pid>",
        path.display()
    );
    Ok(())
}

fn revoke(r: &RevokeArgs) -> anyhow::Result<()> {
    let path = path(&r.which);
    let mut file = load(&path, false)?;
    let target = r.sha256.or_else(|| r.key.as_deref().map(SecretHash::of));
    let Some(i) = file.tenants.iter().position(|t| t.name == r.which.tenant) else {
        bail!("no tenant {:?} in {}", r.which.tenant, path.display());
    };
    let entry = &mut file.tenants[i];
    let before = entry.key_sha256.len();
    match target {
        Some(h) => entry.key_sha256.retain(|k| *k != h),
        None => entry.key_sha256.clear(),
    }
    let removed = before - entry.key_sha256.len();
    if removed == 0 {
        bail!(
            "tenant {:?} has no such key in {}",
            r.which.tenant,
            path.display()
        );
    }
    if entry.key_sha256.is_empty() {
        file.tenants.remove(i);
    }
    file.save(&path, TENANTS_HEADER)
        .with_context(|| format!("saving {}", path.display()))?;
    eprintln!(
        "revoked {removed} key(s) of tenant {} in {}.\n\
         A running router loads the file on SIGHUP: kill -HUP <router pid>",
        r.which.tenant,
        path.display()
    );
    Ok(())
}
