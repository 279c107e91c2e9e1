//! The manifests of `deploy/kubernetes/`, read for the tests that check them: every YAML
//! document of every file but `kustomization.yaml`, and the few views of them the checks need
//! (workloads, their containers, Services, the text of a container's command).

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

pub mod facts;
pub mod network;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;

/// The directory of the manifests.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// `name.yaml` → its text, for every manifest file (not `kustomization.yaml`).
pub fn texts(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            out.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// Every non-empty document of every file, with the file it came from.
pub fn documents(texts: &BTreeMap<String, String>) -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    for (name, text) in texts {
        for d in serde_yaml::Deserializer::from_str(text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            if !v.is_null() {
                docs.push((name.clone(), v));
            }
        }
    }
    docs
}

/// `doc.kind`.
pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

/// `doc.metadata.name`.
pub fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// The string pairs of a `matchLabels`-like mapping.
pub fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_mapping()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

/// Whether every pair of `selector` is in `labels`.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The label that names a pod's role in the suite.
pub const COMPONENT: &str = "app.kubernetes.io/component";

/// A Deployment or StatefulSet.
pub struct Workload<'a> {
    pub kind: &'a str,
    pub name: &'a str,
    pub replicas: u64,
    /// `spec.serviceName` (StatefulSets).
    pub service_name: Option<&'a str>,
    pub pod_labels: BTreeMap<String, String>,
    pub pod: &'a Value,
}

impl Workload<'_> {
    /// The pod's `app.kubernetes.io/component`.
    pub fn component(&self) -> &str {
        self.pod_labels.get(COMPONENT).map_or("", String::as_str)
    }

    /// Init containers, then containers.
    pub fn containers(&self) -> Vec<&Value> {
        ["initContainers", "containers"]
            .iter()
            .flat_map(|k| self.pod[k].as_sequence().into_iter().flatten())
            .collect()
    }

    /// The container whose command runs a `pagewarden-*` binary, with that binary's name.
    pub fn service_container(&self) -> Option<(&Value, String)> {
        self.containers().into_iter().find_map(|c| {
            let bin = command(c).into_iter().next()?;
            bin.starts_with("pagewarden-").then_some((c, bin))
        })
    }

    /// Every `containerPort` of its containers.
    pub fn container_ports(&self) -> BTreeSet<u16> {
        self.containers()
            .into_iter()
            .flat_map(container_ports)
            .collect()
    }
}

/// The Deployments and StatefulSets among `docs`.
pub fn workloads(docs: &[(String, Value)]) -> Vec<Workload<'_>> {
    docs.iter()
        .map(|(_, d)| d)
        .filter(|d| matches!(kind(d), "Deployment" | "StatefulSet"))
        .map(|d| Workload {
            kind: kind(d),
            name: name(d),
            replicas: d["spec"]["replicas"].as_u64().unwrap_or(1),
            service_name: d["spec"]["serviceName"].as_str(),
            pod_labels: labels(&d["spec"]["template"]["metadata"]["labels"]),
            pod: &d["spec"]["template"]["spec"],
        })
        .collect()
}

/// A container's `command` and `args`, as one list of strings.
pub fn command(c: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .flat_map(|k| c[k].as_sequence().into_iter().flatten())
        .filter_map(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
        .collect()
}

/// A container's `containerPort`s.
pub fn container_ports(c: &Value) -> BTreeSet<u16> {
    c["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|p| p["containerPort"].as_u64()?.try_into().ok())
        .collect()
}

/// A container's environment: name → literal value (empty for `valueFrom`), in order.
pub fn env(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e["name"].as_str()?.to_string();
            Some((name, e["value"].as_str().unwrap_or_default().to_string()))
        })
        .collect()
}

/// The port of `flag`'s address in `args` (`--flag ADDR` or `--flag=ADDR`).
pub fn addr_port(args: &[String], flag: &str) -> Option<u16> {
    let at = args
        .iter()
        .position(|a| a == flag || a.starts_with(&format!("{flag}=")))?;
    let value = match args[at].split_once('=') {
        Some((_, v)) => v,
        None => args.get(at + 1)?,
    };
    value.rsplit(':').next()?.parse().ok()
}

/// The names `$(NAME)` refers to in `s` (Kubernetes' dependent environment variables).
pub fn references(s: &str) -> Vec<String> {
    s.split("$(")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(n, _)| n.to_string()))
        .collect()
}

/// `texts` with each `(file, from, to)` replaced once; a replacement that does not apply fails.
pub fn mutate(
    texts: &BTreeMap<String, String>,
    edits: &[(&str, &str, &str)],
) -> BTreeMap<String, String> {
    let mut out = texts.clone();
    for (file, from, to) in edits {
        let t = out.get_mut(*file).unwrap();
        assert!(t.contains(from), "{file} has no {from:?}");
        *t = t.replacen(from, to, 1);
    }
    out
}
