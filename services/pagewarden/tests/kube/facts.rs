//! What the manifests are checked against, read from the rest of the repository: the files
//! `pagewarden init-secrets` writes, the default model of `pagewarden fetch`, and the
//! drain deadlines in the services' source.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the manifests are checked against, read from the rest of the repository.
pub struct Facts {
    /// Role → the files `pagewarden init-secrets` writes into its directory.
    pub secrets: BTreeMap<String, BTreeSet<String>>,
    /// The default model of `pagewarden fetch`: its package pin, sha256 and file name.
    pub model: (String, String, String),
    /// Least grace period (s) each component's drain needs after SIGTERM.
    pub drains: BTreeMap<&'static str, u64>,
}

/// The quoted value of `field: "…"` (or `field: &["…"]`) in `DEFAULT_MODEL` of the launcher's
/// `src/fetch.rs`, the one table of fetchable models.
fn default_model_value(field: &str) -> String {
    let text = std::fs::read_to_string(repo().join("services/pagewarden/src/fetch.rs")).unwrap();
    let block = text
        .split("pub const DEFAULT_MODEL: KnownModel = KnownModel {")
        .nth(1)
        .expect("fetch.rs: DEFAULT_MODEL");
    let block = block.split("};").next().unwrap();
    let line = block
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&format!("{field}: ")))
        .unwrap_or_else(|| panic!("fetch.rs: no {field} in DEFAULT_MODEL"));
    line.trim_start_matches(['&', '['])
        .trim_end_matches([',', ']'])
        .trim_matches('"')
        .to_string()
}

/// Reads them (runs `pagewarden init-secrets` in a temporary directory).
pub fn facts() -> Facts {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args(["init-secrets", "--dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "init-secrets: {out:?}");
    let mut secrets = BTreeMap::new();
    for e in std::fs::read_dir(tmp.path()).unwrap() {
        let e = e.unwrap();
        let files = std::fs::read_dir(e.path())
            .unwrap()
            .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        secrets.insert(e.file_name().to_string_lossy().into_owned(), files);
    }
    let file = default_model_value("file");
    let package = default_model_value("packages");
    let sha = default_model_value("sha256");
    Facts {
        secrets,
        model: (package, sha, file),
        drains: crate::deploy::drain_seconds(),
    }
}
