//! What the manifests are checked against, read from the rest of the repository: the files
//! `pagewarden init-secrets` writes, the default model of `scripts/fetch-model.sh`, and the
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
    /// The default model of `scripts/fetch-model.sh`: its package pin, sha256 and file name.
    pub model: (String, String, String),
    /// Least grace period (s) each component's drain needs after SIGTERM.
    pub drains: BTreeMap<&'static str, u64>,
}

/// `VAR=value` (quotes and `${…:-…}` kept) of the `smollm2)` case of scripts/fetch-model.sh.
fn fetch_script_value(var: &str) -> String {
    let text = std::fs::read_to_string(repo().join("scripts/fetch-model.sh")).unwrap();
    let case = text
        .split("smollm2)")
        .nth(1)
        .expect("fetch-model.sh: smollm2 case");
    let case = case.split(";;").next().unwrap();
    let line = case
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&format!("{var}=")))
        .unwrap_or_else(|| panic!("fetch-model.sh: no {var}= for smollm2"));
    line.to_string()
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
    let dest = fetch_script_value("dest");
    let file = dest
        .rsplit('/')
        .next()
        .unwrap()
        .trim_end_matches(['}', '"'])
        .to_string();
    let package = fetch_script_value("packages")
        .trim_matches(['(', ')'])
        .to_string();
    let sha = fetch_script_value("want");
    Facts {
        secrets,
        model: (package, sha, file),
        drains: crate::deploy::drain_seconds(),
    }
}
