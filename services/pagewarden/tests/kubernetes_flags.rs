//! The Kubernetes manifests (`deploy/kubernetes/`) pass only flags and environment names the
//! binaries have: each is checked against the built binaries' `--help`, which must be built
//! first (`scripts/test.sh` builds them, as for `compose_flags.rs`); a missing one fails the test
//! with the command to run. The rest of the wiring is `kubernetes.rs`'s, the schemas
//! `kubernetes_schemas.rs`'s.

mod deploy;
mod kube;

use std::collections::{BTreeMap, BTreeSet};

use deploy::{clis, flags_and_ports, Cli, BINARIES, COMMON_ENV};
use kube::{command, env, mutate, references};

/// Flags and environment names the binaries do not have; an environment name is also fine
/// when it is a key of the binary's configuration layer (`PAGEWARDEN_<SERVICE>_<KEY>`, KEY a
/// flag), or only feeds `$(NAME)` in the container's own command.
fn flag_problems(texts: &BTreeMap<String, String>, clis: &BTreeMap<&str, Cli>) -> Vec<String> {
    let docs = kube::documents(texts);
    let mut p = Vec::new();
    let mut run = BTreeSet::new();
    for w in kube::workloads(&docs) {
        let Some((c, bin)) = w.service_container() else {
            continue;
        };
        let Some(cli) = clis.get(bin.as_str()) else {
            p.push(format!("{}: unknown binary {bin}", w.name));
            continue;
        };
        run.insert(bin.clone());
        let cmd = command(c);
        for f in flags_and_ports(&cmd[1..]).0 {
            if !cli.flags.contains(&f) {
                p.push(format!("{}: {bin} has no flag {f}", w.name));
            }
        }
        let envs = env(c);
        let referenced: BTreeSet<String> = cmd
            .iter()
            .chain(envs.iter().map(|(_, v)| v))
            .flat_map(|s| references(s))
            .collect();
        let prefix = format!(
            "PAGEWARDEN_{}_",
            bin.trim_start_matches("pagewarden-").to_uppercase()
        );
        for (n, _) in &envs {
            let layered = n.strip_prefix(&prefix).is_some_and(|k| {
                cli.flags
                    .contains(&format!("--{}", k.to_lowercase().replace('_', "-")))
            });
            if !(cli.envs.contains(n)
                || COMMON_ENV.contains(&n.as_str())
                || referenced.contains(n)
                || layered)
            {
                p.push(format!(
                    "{}: {bin} reads no environment variable {n}",
                    w.name
                ));
            }
        }
    }
    for bin in BINARIES {
        if !run.contains(bin) {
            p.push(format!("no workload runs {bin}"));
        }
    }
    p
}

#[test]
fn manifests_match_the_binaries() {
    let problems = flag_problems(&kube::texts(&kube::dir()), &clis());
    assert!(
        problems.is_empty(),
        "deploy/kubernetes/ drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_flag_check_catches_drift() {
    let texts = kube::texts(&kube::dir());
    let bad = mutate(
        &texts,
        &[
            ("decode.yaml", "- --transfer-addr", "- --transfer-address"),
            (
                "auditor.yaml",
                "name: PAGEWARDEN_AUDITOR_DATABASE_URL",
                "name: PAGEWARDEN_DB_URL",
            ),
            (
                "prefill.yaml",
                "name: RUST_LOG",
                "name: PAGEWARDEN_PREFILL_THREADZ",
            ),
        ],
    );
    let problems = flag_problems(&bad, &clis()).join("\n");
    for expected in [
        "pagewarden-decode has no flag --transfer-address",
        "pagewarden-auditor reads no environment variable PAGEWARDEN_DB_URL",
        "pagewarden-prefill reads no environment variable PAGEWARDEN_PREFILL_THREADZ",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not reported in:\n{problems}"
        );
    }
}
