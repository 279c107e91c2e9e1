//! The Kubernetes manifests (`deploy/kubernetes/`) cannot drift from the design or from the
//! services: every port, probe, URL, NetworkPolicy, disruption budget, grace period, secret path
//! and the model fetch is checked against what the services listen on, the design's links, what
//! `pagewarden init-secrets` writes, the drain deadlines in the services' source and
//! `pagewarden fetch` (`src/fetch.rs`). No service binary is needed. Flags and environment names are
//! `kubernetes_flags.rs`'s, the schemas `kubernetes_schemas.rs`'s.

mod deploy;
mod kube;

use std::collections::{BTreeMap, BTreeSet};

use deploy::{flags_and_ports, urls};
use kube::facts::{facts, Facts};
use kube::network::allowed_links;
use kube::{addr_port, command, container_ports, env, kind, labels, mutate};
use kube::{name, references, selects, Workload};
use serde_yaml::Value;

/// The design's links (ARCHITECTURE.md), as the NetworkPolicies must allow them, no more: from
/// a component (`*`: anyone; `ns:NAME`: the pods of namespace NAME) to a component's port.
const LINKS: [(&str, &str, u16); 11] = [
    ("*", "router", 8080),
    ("router", "prefill", 7101),
    ("router", "decode", 7201),
    ("prefill", "decode", 7203),
    ("router", "auditor", 7400),
    ("prefill", "auditor", 7400),
    ("decode", "auditor", 7400),
    ("auditor", "postgres", 5432),
    ("ns:monitoring", "prefill", 7102),
    ("ns:monitoring", "decode", 7202),
    ("ns:monitoring", "auditor", 7401),
];

/// Secrets that are not a role's TLS and config files, and the components that may read them.
const SHARED_SECRETS: [(&str, &[&str]); 1] = [("pagewarden-postgres", &["auditor", "postgres"])];

/// The component `http://host:port` reaches from inside the namespace, and the StatefulSet pod
/// ordinal when `host` is `<pod>.<headless service>`; `Err` says why it reaches nothing.
fn resolve(
    host: &str,
    port: u16,
    docs: &[(String, Value)],
    workloads: &[Workload],
) -> Result<(String, Option<(String, u64)>), String> {
    let service = |n: &str| {
        docs.iter()
            .map(|(_, d)| d)
            .find(|d| kind(d) == "Service" && name(d) == n)
    };
    if let Some((pod, svc)) = host.split_once('.') {
        let s = service(svc).ok_or(format!("{host}: no Service {svc}"))?;
        if s["spec"]["clusterIP"].as_str() != Some("None") {
            return Err(format!(
                "{host}: Service {svc} is not headless: its pods have no DNS names"
            ));
        }
        let sts = workloads
            .iter()
            .find(|w| w.kind == "StatefulSet" && w.service_name == Some(svc))
            .ok_or(format!("{host}: no StatefulSet has serviceName {svc}"))?;
        let ordinal = pod
            .strip_prefix(&format!("{}-", sts.name))
            .and_then(|i| i.parse::<u64>().ok())
            .filter(|i| *i < sts.replicas)
            .ok_or(format!(
                "{host}: no pod {pod} among {} replicas of {}",
                sts.replicas, sts.name
            ))?;
        if !sts.container_ports().contains(&port) {
            return Err(format!(
                "{host}:{port}, but {} listens on {:?}",
                sts.name,
                sts.container_ports()
            ));
        }
        return Ok((
            sts.component().to_string(),
            Some((sts.name.to_string(), ordinal)),
        ));
    }
    let s = service(host).ok_or(format!("{host}: no Service {host}"))?;
    let sel = labels(&s["spec"]["selector"]);
    let w = workloads
        .iter()
        .find(|w| selects(&sel, &w.pod_labels))
        .ok_or(format!("Service {host} selects no pods"))?;
    let sp = s["spec"]["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(port.into()))
        .ok_or(format!(
            "{host}:{port}, but Service {host} has no port {port}"
        ))?;
    let target = sp["targetPort"].as_u64().unwrap_or(port.into());
    if !w.container_ports().iter().any(|p| u64::from(*p) == target) {
        return Err(format!(
            "Service {host} sends {port} to {target}, where {} has no port",
            w.name
        ));
    }
    Ok((w.component().to_string(), None))
}

/// Problems of one workload's pod: `$(NAME)` references, the Secrets it reads, its grace
/// period, its disruption budget.
fn pod_problems(w: &Workload, docs: &[(String, Value)], facts: &Facts, p: &mut Vec<String>) {
    let comp = w.component();
    let mut secrets_read = Vec::new();
    for c in w.containers() {
        let envs = env(c);
        let names: BTreeSet<&str> = envs.iter().map(|(n, _)| n.as_str()).collect();
        let texts = command(c)
            .into_iter()
            .chain(envs.iter().map(|(_, v)| v.clone()));
        for r in texts.flat_map(|s| references(&s)) {
            if !names.contains(r.as_str()) {
                p.push(format!(
                    "{}: $({r}) names no environment variable of its container",
                    w.name
                ));
            }
        }
        for e in c["env"].as_sequence().into_iter().flatten() {
            if let Some(s) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                secrets_read.push(s.to_string());
            }
        }
    }
    for v in w.pod["volumes"].as_sequence().into_iter().flatten() {
        if let Some(s) = v["secret"]["secretName"].as_str() {
            secrets_read.push(s.to_string());
        }
    }
    for s in secrets_read {
        let shared = SHARED_SECRETS
            .iter()
            .any(|(n, who)| *n == s && who.contains(&comp));
        if s != format!("pagewarden-{comp}") && !shared {
            p.push(format!(
                "{}: reads Secret {s}, which is not its role's ({comp})",
                w.name
            ));
        }
    }
    if let Some(&need) = facts.drains.get(comp) {
        let grace = w.pod["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30);
        if grace <= need {
            p.push(format!(
                "{}: terminationGracePeriodSeconds {grace}, but its drain may take {need} s",
                w.name
            ));
        }
    }
    if ["router", "prefill", "decode"].contains(&comp) {
        let budget = docs.iter().map(|(_, d)| d).find(|d| {
            kind(d) == "PodDisruptionBudget"
                && selects(
                    &labels(&d["spec"]["selector"]["matchLabels"]),
                    &w.pod_labels,
                )
        });
        match budget.map(|b| &b["spec"]["maxUnavailable"]) {
            Some(m) if m.as_u64() == Some(1) => {}
            Some(m) => p.push(format!(
                "{}: its PodDisruptionBudget allows {m:?} down, not 1",
                w.name
            )),
            None => p.push(format!("{}: no PodDisruptionBudget", w.name)),
        }
        if w.replicas < 2 {
            p.push(format!(
                "{}: {} replica: a drain or a rolling restart takes it away",
                w.name, w.replicas
            ));
        }
    }
}

/// What the wiring checks of one service container look things up in.
struct Context<'a> {
    docs: &'a [(String, Value)],
    workloads: &'a [Workload<'a>],
    allowed: &'a BTreeSet<(String, String, u16)>,
    model_path: &'a str,
}

/// Problems of the container that runs a service binary: its ports and probes, its secret and
/// model paths, the URLs it calls (each pod ordinal they name goes into `ordinals`).
fn service_problems(
    w: &Workload,
    cx: &Context,
    facts: &Facts,
    ordinals: &mut BTreeMap<String, BTreeSet<u64>>,
    p: &mut Vec<String>,
) {
    let comp = w.component();
    let Some((c, bin)) = w.service_container() else {
        return;
    };
    let cmd = command(c);
    let (_, listen) = flags_and_ports(&cmd[1..]);
    let declared = container_ports(c);
    if listen != declared {
        p.push(format!(
            "{}: {bin} listens on {listen:?}, but declares containerPorts {declared:?}",
            w.name
        ));
    }
    // Probes ask HTTP paths: of the metrics listener (workers) or the HTTP one.
    let http: Vec<u64> = ["--metrics-addr", "--http-addr"]
        .iter()
        .filter_map(|f| addr_port(&cmd[1..], f).map(u64::from))
        .collect();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let pr = &c[probe];
        match pr["httpGet"]["port"].as_u64() {
            _ if pr.is_null() => p.push(format!("{}: no {probe}", w.name)),
            Some(port) if http.contains(&port) => {}
            port => p.push(format!(
                "{}: {probe} on port {port:?}, not {bin}'s HTTP listener {http:?}",
                w.name
            )),
        }
    }
    let mounts: BTreeMap<String, String> = c["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["mountPath"].as_str()?.to_string(),
                m["name"].as_str()?.to_string(),
            ))
        })
        .collect();
    let secret_of = |volume: &str| {
        w.pod["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|v| v["name"].as_str() == Some(volume))
            .and_then(|v| v["secret"]["secretName"].as_str().map(str::to_string))
    };
    let values: Vec<String> = cmd
        .iter()
        .cloned()
        .chain(env(c).into_iter().map(|(_, v)| v))
        .collect();
    let mut uses_model = false;
    for v in &values {
        if let Some(rest) = v.strip_prefix("/etc/pagewarden/") {
            let (role, file) = rest.split_once('/').unwrap_or((rest, ""));
            let dir = format!("/etc/pagewarden/{role}");
            if role != comp {
                p.push(format!("{}: {v} is not its own role's ({comp})", w.name));
            } else if !facts.secrets.get(role).is_some_and(|f| f.contains(file)) {
                p.push(format!(
                    "{}: {v}: `pagewarden init-secrets` writes no {role}/{file}",
                    w.name
                ));
            } else if mounts.get(&dir).and_then(|vol| secret_of(vol))
                != Some(format!("pagewarden-{role}"))
            {
                p.push(format!(
                    "{}: {v}, but Secret pagewarden-{role} is not mounted at {dir}",
                    w.name
                ));
            }
        }
        if v.starts_with("/models/") {
            uses_model = true;
            if v != cx.model_path {
                p.push(format!(
                    "{}: model {v}, but the fetch writes {}",
                    w.name, cx.model_path
                ));
            }
        }
        for (host, port) in urls(v) {
            // A `dns://` worker source must name a headless Service: a ClusterIP would hide
            // the pods behind one virtual address, one "worker" to the router.
            if v.starts_with("dns://") {
                let headless = cx.docs.iter().any(|(_, d)| {
                    kind(d) == "Service"
                        && name(d) == host
                        && d["spec"]["clusterIP"].as_str() == Some("None")
                });
                if !headless {
                    p.push(format!("{}: {v} names no headless Service", w.name));
                }
            }
            match resolve(&host, port, cx.docs, cx.workloads) {
                Ok((to, ordinal)) => {
                    if let Some((sts, i)) = ordinal {
                        ordinals.entry(sts).or_default().insert(i);
                    }
                    let ok = cx
                        .allowed
                        .iter()
                        .any(|(f, t, q)| (f == comp || f == "*") && *t == to && *q == port);
                    if !ok {
                        p.push(format!(
                            "{}: {host}:{port}, but no NetworkPolicy lets {comp} reach {to}:{port}",
                            w.name
                        ));
                    }
                }
                Err(e) => p.push(format!("{}: {e}", w.name)),
            }
        }
    }
    let fetches = w
        .containers()
        .iter()
        .any(|i| command(i).iter().any(|a| a.ends_with("fetch-model.py")));
    if uses_model && (!fetches || mounts.get("/models").map(String::as_str) != Some("models")) {
        p.push(format!(
            "{}: reads {}, but no init container fetches it into its `models` volume",
            w.name, cx.model_path
        ));
    }
}

/// Every drift between the manifests (`texts`: file → YAML) and the design, the services'
/// ports and drain deadlines, the secrets' layout and the model fetch (`facts`).
fn wiring_problems(texts: &BTreeMap<String, String>, facts: &Facts) -> Vec<String> {
    let docs = kube::documents(texts);
    let workloads = kube::workloads(&docs);
    let mut p = Vec::new();
    for (file, d) in &docs {
        if kind(d) == "Secret" {
            p.push(format!("{file}: Secret {} ships key material", name(d)));
        }
    }
    let (model_package, model_sha, model_file) = &facts.model;
    let model_path = format!("/models/{model_file}");
    let fetch = docs
        .iter()
        .find(|(_, d)| kind(d) == "ConfigMap" && name(d) == "pagewarden-model-fetch")
        .map(|(_, d)| {
            d["data"]["fetch-model.py"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default();
    for want in [
        format!("PACKAGE = \"{model_package}\""),
        format!("SHA256 = \"{model_sha}\""),
        format!("DEST = \"{model_path}\""),
    ] {
        if !fetch.contains(&want) {
            p.push(format!(
                "the model fetch script lacks {want} (src/fetch.rs)"
            ));
        }
    }

    let (allowed, default_deny) = allowed_links(&docs, &mut p);
    if !default_deny {
        p.push("no NetworkPolicy denies ingress to every pod by default".into());
    }
    let design: BTreeSet<(String, String, u16)> = LINKS
        .iter()
        .map(|(f, t, port)| (f.to_string(), t.to_string(), *port))
        .collect();
    for (f, t, port) in allowed.difference(&design) {
        p.push(format!(
            "NetworkPolicies allow {f} → {t}:{port}, a link the design does not have"
        ));
    }
    for (f, t, port) in design.difference(&allowed) {
        p.push(format!(
            "no NetworkPolicy allows the design's link {f} → {t}:{port}"
        ));
    }
    for (f, t, port) in &allowed {
        let listens = workloads
            .iter()
            .filter(|w| w.component() == t)
            .any(|w| w.container_ports().contains(port));
        if !listens {
            p.push(format!(
                "NetworkPolicies allow {f} → {t}:{port}, where no {t} pod listens"
            ));
        }
    }

    let mut ordinals: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    let cx = Context {
        docs: &docs,
        workloads: &workloads,
        allowed: &allowed,
        model_path: &model_path,
    };
    for w in &workloads {
        pod_problems(w, &docs, facts, &mut p);
        service_problems(w, &cx, facts, &mut ordinals, &mut p);
    }
    for (sts, seen) in &ordinals {
        let w = workloads.iter().find(|w| w.name == sts).unwrap();
        let all: BTreeSet<u64> = (0..w.replicas).collect();
        if *seen != all {
            p.push(format!(
                "{sts} has {} replicas, but only pods {seen:?} are listed by name",
                w.replicas
            ));
        }
    }
    p
}

#[test]
fn manifests_are_wired_as_the_design_says() {
    let problems = wiring_problems(&kube::texts(&kube::dir()), &facts());
    assert!(
        problems.is_empty(),
        "deploy/kubernetes/ drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_wiring_check_catches_drift() {
    let texts = kube::texts(&kube::dir());
    let (ready, ready_bad) = (
        "/ready\n              port: 7102",
        "/ready\n              port: 7101",
    );
    let bad = mutate(
        &texts,
        &[
            (
                "router.yaml",
                "dns://prefill:7101",
                "http://prefill-0.prefill:7101\n            - --prefill\n            - \
                 http://prefill-2.prefill:7101",
            ),
            ("router.yaml", "http://auditor:7400", "http://auditor:7499"),
            ("router.yaml", "router/tenants.toml", "router/tenant.toml"),
            ("decode.yaml", "$(POD_IP):7203", "$(POD_ADDR):7203"),
            ("decode.yaml", "clusterIP: None", "clusterIP: 10.0.0.9"),
            ("decode.yaml", "PeriodSeconds: 310", "PeriodSeconds: 30"),
            ("decode.yaml", "containerPort: 7203", "containerPort: 7204"),
            ("network-policies.yaml", "port: 7203", "port: 7204"),
            (
                "disruption-budgets.yaml",
                "component: prefill",
                "component: prefil",
            ),
            (
                "auditor.yaml",
                "Name: pagewarden-auditor",
                "Name: pagewarden-admin",
            ),
            ("prefill.yaml", ready, ready_bad),
            ("model-fetch.yaml", "SHA256 = \"b", "SHA256 = \"0"),
        ],
    );
    let problems = wiring_problems(&bad, &facts()).join("\n");
    for expected in [
        "no pod prefill-2 among 2 replicas of prefill",
        "router: dns://decode:7201 names no headless Service",
        "prefill has 2 replicas, but only pods {0} are listed by name",
        "Service auditor has no port 7499",
        "writes no router/tenant.toml",
        "$(POD_ADDR) names no environment variable",
        "decode: terminationGracePeriodSeconds 30, but its drain may take 302 s",
        "pagewarden-decode listens on {7201, 7202, 7203}",
        "but declares containerPorts {7201, 7202, 7204}",
        "NetworkPolicies allow prefill → decode:7204, a link the design does not have",
        "no NetworkPolicy allows the design's link prefill → decode:7203",
        "prefill: no PodDisruptionBudget",
        "reads Secret pagewarden-admin, which is not its role's (auditor)",
        "Secret pagewarden-auditor is not mounted at /etc/pagewarden/auditor",
        "prefill: readinessProbe on port Some(7101)",
        "the model fetch script lacks SHA256",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not reported in:\n{problems}"
        );
    }
}
