//! Every manifest of `deploy/kubernetes/` passes the Kubernetes API's schemas, strictly (an
//! unknown field is an error), for the oldest and the newest Kubernetes release this repository
//! supports. The schemas come offline with the Python package `kubernetes-validate`, which
//! `scripts/test.sh` installs; without it the test fails and says so.
//!
//! `kubernetes-validate` only warns, and exits 0, for a kind or apiVersion it has no schema for
//! (`apps/v2`): here every line it prints must be a pass, and there must be one pass per
//! document and version, so a warning fails the test too.

mod deploy;
mod kube;

use std::path::Path;
use std::process::Command;

/// The validator `scripts/test.sh` installs.
const VALIDATOR_VERSION: &str = "1.37.0";

/// The Kubernetes releases the manifests must be valid for: the oldest supported, the newest.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];

/// Panics, saying what to run, unless `python3 -m kubernetes_validate` is the pinned version.
fn require_validator() {
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .output();
    let version = match &out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => String::new(),
    };
    assert!(
        version == VALIDATOR_VERSION,
        "kubernetes-validate {VALIDATOR_VERSION} is needed to check deploy/kubernetes/ against \
         the Kubernetes schemas (`python3 -m kubernetes_validate --version` gave {version:?}, \
         {out:?}): run scripts/test.sh, which installs it"
    );
}

/// Validates every manifest in `dir`: `Ok(passes)` when every document passed for every version,
/// else `Err` with the validator's output.
fn validate(dir: &Path) -> Result<usize, String> {
    require_validator();
    let texts = kube::texts(dir);
    let documents = kube::documents(&texts).len();
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "kubernetes_validate", "--strict"]);
    for v in KUBERNETES_VERSIONS {
        cmd.args(["--kubernetes-version", v]);
    }
    cmd.args(texts.keys().map(|name| dir.join(name)));
    let out = cmd
        .output()
        .expect("running python3 -m kubernetes_validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let passes = text
        .lines()
        .filter(|l| l.starts_with("INFO ") && l.contains(" passed for resource "))
        .count();
    let others = text.lines().filter(|l| !l.starts_with("INFO ")).count();
    let want = documents * KUBERNETES_VERSIONS.len();
    if out.status.success() && others == 0 && passes == want {
        Ok(passes)
    } else {
        Err(format!(
            "{} (passes {passes} of {want} documents × versions):\n{text}",
            out.status
        ))
    }
}

#[test]
fn manifests_pass_the_kubernetes_schemas() {
    match validate(&kube::dir()) {
        Ok(passes) => assert!(passes >= 20, "only {passes} documents validated"),
        Err(e) => panic!("deploy/kubernetes/ does not validate: {e}"),
    }
}

#[test]
fn the_schema_check_catches_broken_manifests() {
    let texts = kube::texts(&kube::dir());
    for (file, from, to, expected) in [
        // A misspelt field: strict validation knows no `containerPorts`.
        (
            "router.yaml",
            "containerPort: 8080",
            "containerPorts: 8080",
            "'containerPort' is a required property",
        ),
        // An apiVersion with no schema: kubernetes-validate only warns (and exits 0).
        (
            "decode.yaml",
            "apiVersion: apps/v1",
            "apiVersion: apps/v2",
            "Couldn't find schema for kind StatefulSet with api version apps/v2",
        ),
        // A value of the wrong type.
        (
            "prefill.yaml",
            "terminationGracePeriodSeconds: 60",
            "terminationGracePeriodSeconds: a minute",
            "'a minute' is not of type 'integer'",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        for (name, text) in &texts {
            std::fs::write(tmp.path().join(name), text).unwrap();
        }
        let text = &texts[file];
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(tmp.path().join(file), text.replacen(from, to, 1)).unwrap();
        match validate(tmp.path()) {
            Ok(_) => panic!("{file} with {to:?} passed the schema check"),
            Err(e) => assert!(e.contains(expected), "{expected:?} not reported in:\n{e}"),
        }
    }
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let dir = kube::dir();
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let k: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let listed: std::collections::BTreeSet<String> = k["resources"]
        .as_sequence()
        .expect("kustomization.yaml has resources")
        .iter()
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect();
    let files: std::collections::BTreeSet<String> = kube::texts(&dir).into_keys().collect();
    assert_eq!(
        listed, files,
        "kustomization.yaml's resources must be exactly the manifest files beside it"
    );
}
