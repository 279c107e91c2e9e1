//! The deployment files cannot drift from the binaries: every flag, environment name and port
//! in `deploy/compose/docker-compose.yml` and `deploy/systemd/` is checked against what the built
//! binaries say in `--help`, and the example config files are loaded by the services' own
//! config loaders. The binaries must be built first (`scripts/test.sh` builds them); a missing
//! one fails the test with the command to run.

mod deploy;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use deploy::{clis, drain_seconds, flags_and_ports, parse_help, urls, Cli, COMMON_ENV};

/// The four service binaries and their systemd/compose short names.
const SERVICES: [(&str, &str); 4] = [
    ("router", "pagewarden-router"),
    ("prefill", "pagewarden-prefill"),
    ("decode", "pagewarden-decode"),
    ("auditor", "pagewarden-auditor"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Replaces `${VAR:-default}` with its default and `${VAR}` with nothing.
fn interpolate(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let Some(end) = rest[i..].find('}') else {
            break;
        };
        let inner = &rest[i + 2..i + end];
        if let Some((_, default)) = inner.split_once(":-") {
            out.push_str(default);
        }
        rest = &rest[i + end + 1..];
    }
    out.push_str(rest);
    out
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit(':').next()?.trim_end_matches('/').parse().ok()
}

fn strs(v: &serde_yaml::Value) -> Vec<String> {
    match v {
        serde_yaml::Value::Sequence(s) => s
            .iter()
            .filter_map(|x| match x {
                serde_yaml::Value::String(s) => Some(interpolate(s)),
                serde_yaml::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .collect(),
        serde_yaml::Value::String(s) => s.split_whitespace().map(interpolate).collect(),
        _ => Vec::new(),
    }
}

/// Every drift between a compose file and the binaries.
/// Problems of the compose file `yaml` and the Prometheus config it mounts (`prometheus`, whose
/// scrape targets must be ports the services listen on).
fn compose_problems(
    yaml: &str,
    prometheus: &str,
    clis: &BTreeMap<&'static str, Cli>,
) -> Vec<String> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("compose file is YAML");
    doc.apply_merge().expect("merge keys");
    let services = doc["services"]
        .as_mapping()
        .expect("compose has services")
        .clone();
    let mut problems = Vec::new();
    let mut listen: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    let mut aliases: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    let mut binaries = BTreeSet::new();
    listen.insert("postgres".into(), BTreeSet::from([5432]));
    listen.insert("otel-collector".into(), BTreeSet::from([4317, 4318]));
    listen.insert("prometheus".into(), BTreeSet::from([9090]));
    listen.insert("grafana".into(), BTreeSet::from([3000]));
    for (name, svc) in &services {
        let name = name.as_str().unwrap_or_default().to_string();
        let cmd = strs(&svc["command"]);
        let Some(bin) = cmd.first().filter(|b| b.starts_with("pagewarden-")) else {
            continue;
        };
        let Some(cli) = clis.get(bin.as_str()) else {
            problems.push(format!("{name}: unknown binary {bin}"));
            continue;
        };
        binaries.insert(bin.clone());
        let (flags, ports) = flags_and_ports(&cmd[1..]);
        for f in flags {
            if !cli.flags.contains(&f) {
                problems.push(format!("{name}: {bin} has no flag {f}"));
            }
        }
        // A network alias (what a `dns://` worker source names) reaches every service that
        // carries it: only the ports all of them listen on.
        for net in svc["networks"]
            .as_mapping()
            .into_iter()
            .flat_map(|m| m.values())
        {
            for alias in strs(&net["aliases"]) {
                aliases
                    .entry(alias)
                    .and_modify(|p: &mut BTreeSet<u16>| p.retain(|x| ports.contains(x)))
                    .or_insert_with(|| ports.clone());
            }
        }
        listen.insert(name.clone(), ports);
        if let Some((short, _)) = SERVICES.iter().find(|(_, b)| b == bin) {
            let grace = svc["stop_grace_period"].as_str();
            let what = format!("{name}: stop_grace_period");
            problems.extend(stop_timeout_problem(short, &what, grace, "Docker's 10 s"));
        }
        if let Some(env) = svc["environment"].as_mapping() {
            for (k, _) in env {
                let k = k.as_str().unwrap_or_default();
                if !cli.envs.contains(k) && !COMMON_ENV.contains(&k) {
                    problems.push(format!("{name}: {bin} reads no environment variable {k}"));
                }
            }
        }
    }
    for (alias, ports) in aliases {
        match listen.entry(alias) {
            std::collections::btree_map::Entry::Occupied(o) => problems.push(format!(
                "network alias {} is also a service's name",
                o.key()
            )),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(ports);
            }
        }
    }
    for (_, bin) in SERVICES {
        if !binaries.contains(bin) {
            problems.push(format!("no compose service runs {bin}"));
        }
    }
    let scrape: serde_yaml::Value =
        serde_yaml::from_str(prometheus).expect("prometheus.yml is YAML");
    for job in scrape["scrape_configs"].as_sequence().into_iter().flatten() {
        for target in job["static_configs"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|c| strs(&c["targets"]))
        {
            for (host, port) in urls(&format!("http://{target}")) {
                check_target(&mut problems, &listen, "prometheus scrape", &host, port);
            }
        }
    }
    for needed in ["postgres", "otel-collector", "prometheus", "grafana"] {
        if !services.contains_key(needed) {
            problems.push(format!("compose has no {needed} service"));
        }
    }
    for (name, svc) in &services {
        let name = name.as_str().unwrap_or_default();
        let own = listen.get(name).cloned().unwrap_or_default();
        if !svc["command"].is_null() && name != "otel-collector" {
            for a in strs(&svc["command"]) {
                for (host, port) in urls(&a) {
                    check_target(&mut problems, &listen, name, &host, port);
                }
            }
        }
        if let Some(env) = svc["environment"].as_mapping() {
            for (k, v) in env {
                for (host, port) in urls(&interpolate(v.as_str().unwrap_or_default())) {
                    let k = k.as_str().unwrap_or_default();
                    check_target(&mut problems, &listen, &format!("{name} {k}"), &host, port);
                }
            }
        }
        for p in strs(&svc["ports"]) {
            match port_of(&p) {
                Some(port) if own.contains(&port) => {}
                _ => problems.push(format!("{name}: publishes {p}, but listens on {own:?}")),
            }
        }
        for a in strs(&svc["healthcheck"]["test"]) {
            for (host, port) in urls(&a) {
                if host == "127.0.0.1" && !own.contains(&port) {
                    problems.push(format!(
                        "{name}: health check on port {port}, but listens on {own:?}"
                    ));
                }
            }
        }
    }
    problems
}

fn check_target(
    problems: &mut Vec<String>,
    listen: &BTreeMap<String, BTreeSet<u16>>,
    from: &str,
    host: &str,
    port: u16,
) {
    if host == "127.0.0.1" || host == "localhost" {
        return;
    }
    match listen.get(host) {
        Some(ports) if ports.contains(&port) => {}
        Some(ports) => problems.push(format!(
            "{from}: {host}:{port}, but {host} listens on {ports:?}"
        )),
        None => problems.push(format!("{from}: {host} is not a compose service")),
    }
}

#[test]
fn compose_matches_the_binaries() {
    let clis = clis();
    let yaml = std::fs::read_to_string(repo().join("deploy/compose/docker-compose.yml")).unwrap();
    let prometheus = std::fs::read_to_string(repo().join("deploy/compose/prometheus.yml")).unwrap();
    let problems = compose_problems(&yaml, &prometheus, &clis);
    assert!(
        problems.is_empty(),
        "compose drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_compose_check_catches_drift() {
    let clis = clis();
    let yaml = std::fs::read_to_string(repo().join("deploy/compose/docker-compose.yml")).unwrap();
    let prometheus = std::fs::read_to_string(repo().join("deploy/compose/prometheus.yml")).unwrap();
    let bad_prometheus = prometheus.replace("decode-0:7202", "decode-0:7299");
    assert_ne!(bad_prometheus, prometheus, "the mutation must apply");
    let bad = yaml
        .replace(
            "--grpc-addr\n      - 0.0.0.0:7201",
            "--grpc-address\n      - 0.0.0.0:7201",
        )
        .replace("PAGEWARDEN_AUDITOR_DATABASE_URL", "PAGEWARDEN_DB_URL")
        .replace("dns://prefill:7101", "dns://prefill:7999")
        .replace("dns://decode:7201", "dns://decoder:7201")
        .replace(
            "127.0.0.1:${PAGEWARDEN_ROUTER_PORT:-8080}:8080",
            "127.0.0.1:${PAGEWARDEN_ROUTER_PORT:-8080}:8081",
        )
        .replace("stop_grace_period: 310s", "stop_grace_period: 30s")
        .replace(
            "stop_grace_period: 30s\n    command:\n      - pagewarden-router",
            "command:\n      - pagewarden-router",
        );
    assert_ne!(bad, yaml, "the mutations must apply");
    let problems = compose_problems(&bad, &bad_prometheus, &clis).join("\n");
    for expected in [
        "prometheus scrape: decode-0:7299",
        "has no flag --grpc-address",
        "no environment variable PAGEWARDEN_DB_URL",
        "router: prefill:7999, but prefill listens on",
        "router: decoder is not a compose service",
        "publishes 127.0.0.1:8080:8081",
        "decode-0: stop_grace_period 30s, but its drain may take 302 s",
        "router: stop_grace_period unset (Docker's 10 s default), but its drain may take 25 s",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not reported in:\n{problems}"
        );
    }
}

/// Why a stop timeout (`what`, its value if set, `default` when not) cuts `short`'s drain, if
/// it does: it must outlast the drain deadline read from the source.
fn stop_timeout_problem(
    short: &str,
    what: &str,
    value: Option<&str>,
    default: &str,
) -> Option<String> {
    let need = *drain_seconds().get(short)?;
    match value.map(humantime::parse_duration) {
        Some(Ok(t)) if t.as_secs() > need => None,
        Some(Ok(t)) => Some(format!(
            "{what} {}s, but its drain may take {need} s",
            t.as_secs()
        )),
        Some(Err(_)) | None => Some(format!(
            "{what} unset ({default} default), but its drain may take {need} s"
        )),
    }
}

/// `key=value` lines of a unit or env file (comments and sections skipped).
fn ini(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn systemd_problems(dir: &Path, clis: &BTreeMap<&'static str, Cli>) -> Vec<String> {
    let mut problems = Vec::new();
    for (short, bin) in SERVICES {
        let cli = &clis[bin];
        let unit_path = dir.join(format!("{bin}.service"));
        let Ok(unit) = std::fs::read_to_string(&unit_path) else {
            problems.push(format!("{} is missing", unit_path.display()));
            continue;
        };
        let kv = ini(&unit);
        let get = |k: &str| -> std::vec::IntoIter<&str> {
            kv.iter()
                .filter(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .into_iter()
        };
        let exec: Vec<&str> = get("ExecStart")
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        if exec.first() != Some(&format!("/usr/local/bin/{bin}").as_str()) {
            problems.push(format!(
                "{bin}.service: ExecStart does not run /usr/local/bin/{bin}"
            ));
        }
        let args: Vec<String> = exec.iter().skip(1).map(|s| s.to_string()).collect();
        for f in flags_and_ports(&args).0 {
            if !cli.flags.contains(&f) {
                problems.push(format!("{bin}.service: {bin} has no flag {f}"));
            }
        }
        for (k, want) in [
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("Restart", "on-failure"),
        ] {
            if !get(k).any(|v| v == want) {
                problems.push(format!("{bin}.service: missing {k}={want}"));
            }
        }
        if !get("DynamicUser").any(|v| v == "yes") && get("User").next().is_none() {
            problems.push(format!("{bin}.service: neither DynamicUser=yes nor User="));
        }
        for k in ["LimitNOFILE", "MemoryMax"] {
            if get(k).next().is_none() {
                problems.push(format!("{bin}.service: no {k}"));
            }
        }
        let what = format!("{bin}.service: TimeoutStopSec");
        let timeout = get("TimeoutStopSec").next();
        problems.extend(stop_timeout_problem(
            short,
            &what,
            timeout,
            "systemd's 90 s",
        ));
        if short == "auditor" && get("StateDirectory").next().is_none() {
            problems.push(format!("{bin}.service: no StateDirectory for SQLite"));
        }
        let pulls_in_postgres = ["Wants", "Requires", "BindsTo"]
            .iter()
            .any(|k| get(k).any(|v| v.split_whitespace().any(|u| u == "postgresql.service")));
        let want_env = format!("/etc/pagewarden/{short}.env");
        if !get("EnvironmentFile").any(|v| v.trim_start_matches('-') == want_env) {
            problems.push(format!("{bin}.service: no EnvironmentFile={want_env}"));
        }
        let env_path = dir.join(format!("{short}.env"));
        let Ok(env) = std::fs::read_to_string(&env_path) else {
            problems.push(format!("{} is missing", env_path.display()));
            continue;
        };
        for (k, v) in ini(&env) {
            // A unit started on a host without PostgreSQL must still start: the default is
            // SQLite in its StateDirectory, and a PostgreSQL URL needs the unit to pull it in.
            if k.ends_with("_DATABASE_URL") && v.starts_with("postgres") && !pulls_in_postgres {
                problems.push(format!(
                    "{short}.env: {k} names PostgreSQL, but {bin}.service does not pull \
                     postgresql.service in (Wants=)"
                ));
            }
            if !cli.envs.contains(&k) && !COMMON_ENV.contains(&k.as_str()) {
                problems.push(format!(
                    "{short}.env: {bin} reads no environment variable {k}"
                ));
            }
            if let Some(name) = v.strip_prefix("/etc/pagewarden/") {
                if !dir.join(name).is_file() {
                    problems.push(format!(
                        "{short}.env: {k} names {v}, not shipped in {}",
                        dir.display()
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn systemd_units_and_env_files_match_the_binaries() {
    let clis = clis();
    let problems = systemd_problems(&repo().join("deploy/systemd"), &clis);
    assert!(
        problems.is_empty(),
        "systemd files drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_systemd_check_catches_drift() {
    let clis = clis();
    let src = repo().join("deploy/systemd");
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).unwrap();
    }
    let edit = |file: &str, from: &str, to: &str| {
        let p = tmp.path().join(file);
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains(from), "{file} has no {from:?}");
        std::fs::write(&p, s.replace(from, to)).unwrap();
    };
    edit(
        "decode.env",
        "PAGEWARDEN_CONFIG=",
        "PAGEWARDEN_DECODE_CONFIG=",
    );
    edit("pagewarden-router.service", "--config", "--conf");
    edit(
        "pagewarden-auditor.service",
        "ProtectSystem=strict",
        "ProtectSystem=full",
    );
    edit(
        "pagewarden-decode.service",
        "TimeoutStopSec=310s",
        "TimeoutStopSec=30s",
    );
    edit(
        "auditor.env",
        "# PAGEWARDEN_AUDITOR_DATABASE_URL=",
        "PAGEWARDEN_AUDITOR_DATABASE_URL=",
    );
    let problems = systemd_problems(tmp.path(), &clis).join("\n");
    for expected in [
        "auditor.env: PAGEWARDEN_AUDITOR_DATABASE_URL names PostgreSQL",
        "reads no environment variable PAGEWARDEN_DECODE_CONFIG",
        "has no flag --conf",
        "pagewarden-auditor.service: missing ProtectSystem=strict",
        "pagewarden-decode.service: TimeoutStopSec 30s, but its drain may take 302 s",
    ] {
        assert!(
            problems.contains(expected),
            "{expected:?} not reported in:\n{problems}"
        );
    }
}

/// Keys of a TOML config file must be flags of the binary (`_` for `-`), except `extra`.
fn toml_key_problems(path: &Path, cli: &Cli, extra: &[&str]) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    table
        .keys()
        .filter(|k| !extra.contains(&k.as_str()))
        .filter(|k| !cli.flags.contains(&format!("--{}", k.replace('_', "-"))))
        .map(|k| format!("{}: key {k} is no flag of the binary", path.display()))
        .collect()
}

/// A unit's `LoadCredential=NAME:SOURCE` lines, by name.
fn load_credentials(unit: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(unit).unwrap();
    ini(&text)
        .into_iter()
        .filter(|(k, _)| k == "LoadCredential")
        .filter_map(|(_, v)| v.split_once(':').map(|(n, s)| (n.into(), s.into())))
        .collect()
}

/// `deploy/systemd/<role>.toml` as its unit sees it once installed under `root` instead of `/`:
/// every `/run/credentials/pagewarden-<role>.service/NAME` becomes the file the unit's
/// `LoadCredential=NAME:SOURCE` hands over (`SOURCE` under `root`). A credential path the unit
/// does not hand over, or one whose source the install steps in docs/deploy.md do not write, is
/// a problem.
fn as_installed(role: &str, root: &Path, problems: &mut Vec<String>) -> PathBuf {
    let dir = repo().join("deploy/systemd");
    let creds = load_credentials(&dir.join(format!("pagewarden-{role}.service")));
    let prefix = format!("/run/credentials/pagewarden-{role}.service/");
    let mut text = std::fs::read_to_string(dir.join(format!("{role}.toml"))).unwrap();
    while let Some(at) = text.find(&prefix) {
        let rest = &text[at + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| *c != '"' && !c.is_whitespace())
            .collect();
        let installed = match creds.get(&name) {
            Some(source) => {
                let file = root.join(source.trim_start_matches('/'));
                if !file.is_file() {
                    problems.push(format!(
                        "{role}: credential {name} comes from {source}, which the install \
                         steps do not write"
                    ));
                }
                file
            }
            None => {
                problems.push(format!(
                    "{role}.toml names credential {name}, which pagewarden-{role}.service \
                     does not load"
                ));
                PathBuf::from("/nonexistent").join(&name)
            }
        };
        let installed = installed.display().to_string();
        text.replace_range(at..at + prefix.len() + name.len(), &installed);
    }
    let path = root.join(format!("{role}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The install steps the credentials come from: `pagewarden init-secrets --dir
/// /etc/pagewarden/tls` (the suite CA, a certificate and key per role) and the tenants and
/// auditor files copied to `/etc/pagewarden/`, here under `root`.
fn install_credentials(root: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args(["init-secrets", "--dir"])
        .arg(root.join("etc/pagewarden/tls"))
        .output()
        .unwrap();
    assert!(out.status.success(), "init-secrets: {out:?}");
    let etc = root.join("etc/pagewarden");
    std::fs::copy(
        repo().join("deploy/compose/tenants.example.toml"),
        etc.join("tenants.toml"),
    )
    .unwrap();
    std::fs::copy(
        repo().join("deploy/systemd/auditor.toml"),
        etc.join("auditor.toml"),
    )
    .unwrap();
}

/// The secrets directories compose mounts under `/etc/pagewarden/` that an image does not
/// make as a mount point (`image`: compose-base.sh or the Dockerfile). A volume mounted where
/// the image has no directory is created root-owned, and `init`, which runs as the services'
/// user, cannot write it.
fn mount_point_problems(yaml: &str, image_name: &str, image: &str) -> Vec<String> {
    let doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("compose file is YAML");
    let mut problems = Vec::new();
    let volumes = strs(&doc["services"]["init"]["volumes"]);
    // Names made in a `for d in a b c; do ... /etc/pagewarden/$d` loop, or one by one.
    let looped: Vec<&str> = image
        .lines()
        .filter_map(|l| l.split_once("for d in ").map(|(_, rest)| rest))
        .flat_map(|l| l.split(';').next().unwrap_or_default().split_whitespace())
        .collect();
    for v in &volumes {
        let Some(dir) = v
            .split(':')
            .nth(1)
            .and_then(|t| t.strip_prefix("/etc/pagewarden/"))
        else {
            continue;
        };
        if !looped.contains(&dir) && !image.contains(&format!("/etc/pagewarden/{dir}")) {
            problems.push(format!(
                "{image_name} makes no mount point /etc/pagewarden/{dir} for compose's volume"
            ));
        }
    }
    problems
}

#[test]
fn every_secrets_volume_has_its_mount_point_in_the_images() {
    let yaml = std::fs::read_to_string(repo().join("deploy/compose/docker-compose.yml")).unwrap();
    let mut problems = Vec::new();
    for image in ["scripts/compose-base.sh", "deploy/compose/Dockerfile"] {
        let text = std::fs::read_to_string(repo().join(image)).unwrap();
        problems.extend(mount_point_problems(&yaml, image, &text));
        // The check fails for a volume the image does not prepare.
        let extra = yaml.replacen(
            "      - secrets-admin:/etc/pagewarden/admin\n",
            "      - secrets-admin:/etc/pagewarden/admin\n      - secrets-x:/etc/pagewarden/x\n",
            1,
        );
        assert_ne!(
            extra, yaml,
            "the init service's volumes changed: update this mutation"
        );
        assert!(
            mount_point_problems(&extra, image, &text)
                .iter()
                .any(|p| p.contains("/etc/pagewarden/x")),
            "{image}: the check missed an unprepared volume"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The binaries the install steps in docs/deploy.md put in /usr/local/bin: each service the
/// units start and the `pagewarden` launcher the later steps run, named one by one (a
/// `pagewarden-*` glob also copies cargo's `.d` files and misses the launcher).
fn install_step_problems(deploy_md: &str) -> Vec<String> {
    let Some(line) = deploy_md
        .lines()
        .find(|l| l.starts_with("install -m755 target/release/"))
    else {
        return vec!["docs/deploy.md: no `install -m755 target/release/...` step".into()];
    };
    let mut problems = Vec::new();
    // Each word under target/release/, with the shell's `a{b,c}` expanded.
    let names: Vec<String> = line
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("target/release/"))
        .flat_map(|w| match (w.split_once('{'), w.rsplit_once('}')) {
            (Some((head, rest)), Some((_, tail))) => rest
                .trim_end_matches(tail)
                .trim_end_matches('}')
                .split(',')
                .map(|alt| format!("{head}{alt}{tail}"))
                .collect(),
            _ => vec![w.to_string()],
        })
        .collect();
    for want in std::iter::once("pagewarden").chain(SERVICES.iter().map(|(_, b)| *b)) {
        if !names.iter().any(|n| n == want) {
            problems.push(format!("the install step does not install {want}: {line}"));
        }
    }
    if let Some(glob) = names.iter().find(|n| n.contains('*')) {
        problems.push(format!("the install step copies a glob ({glob}): {line}"));
    }
    problems
}

#[test]
fn the_install_steps_install_the_launcher_and_every_service() {
    let md = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let problems = install_step_problems(&md);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The check fails on the step as it was.
    let old = md.replace(
        "install -m755 target/release/pagewarden target/release/pagewarden-{router,prefill,decode,auditor}",
        "install -m755 target/release/pagewarden-*",
    );
    assert_ne!(
        old, md,
        "the install step changed: update this test's mutation"
    );
    assert!(!install_step_problems(&old).is_empty());
}

#[test]
fn example_config_files_load_with_the_services_own_loaders() {
    use pagewarden_common::worker_config::{WorkerConfig, WorkerDefaults, WorkerFlags};
    let clis = clis();
    let dir = repo().join("deploy/systemd");
    let root = tempfile::tempdir().unwrap();
    install_credentials(root.path());
    let mut problems = Vec::new();
    for (role, defaults) in [
        ("decode", WorkerDefaults::decode()),
        ("prefill", WorkerDefaults::prefill()),
    ] {
        let path = dir.join(format!("{role}.toml"));
        let flags = WorkerFlags {
            config: Some(as_installed(role, root.path(), &mut problems)),
            model: Some(PathBuf::from("/m.gguf")),
            ..WorkerFlags::default()
        };
        if let Err(e) = WorkerConfig::resolve(flags, defaults) {
            problems.push(format!("{}: {e}", path.display()));
        }
        problems.extend(toml_key_problems(
            &path,
            &clis[format!("pagewarden-{role}").as_str()],
            &[],
        ));
    }
    let auditor = dir.join("auditor.toml");
    let args = pagewarden_auditor::config::Args {
        config: Some(as_installed("auditor", root.path(), &mut problems)),
        ..Default::default()
    };
    if let Err(e) = pagewarden_auditor::config::Config::load(args) {
        problems.push(format!("{}: {e}", auditor.display()));
    }
    as_installed("router", root.path(), &mut problems);
    problems.extend(toml_key_problems(
        &dir.join("router.toml"),
        &clis["pagewarden-router"],
        &["tenants_file", "tenants"],
    ));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn pagewarden_up_passes_only_real_flags() {
    let clis = clis();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args([
            "up",
            "--print-commands",
            "--no-build",
            "--pool-tokens",
            "9000",
        ])
        .args(["--context-length", "4096", "--model", "/m.gguf", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for line in text.lines() {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let bin = Path::new(&words[0])
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let cli = &clis[bin.as_str()];
        for f in flags_and_ports(&words[1..]).0 {
            if !cli.flags.contains(&f) {
                problems.push(format!("up starts {bin} with {f}, which it does not have"));
            }
        }
        seen.insert(bin);
    }
    assert_eq!(seen.len(), 4, "{text}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn help_parsing_reads_flags_and_env_names() {
    let cli = parse_help(
        "Options:\n      --grpc-addr <GRPC_ADDR>\n          gRPC\n      --model <MODEL>\n          \
         GGUF [env: PAGEWARDEN_MODEL=/x/y.gguf]\n  -h, --help\n",
    );
    assert!(cli.flags.contains("--grpc-addr") && cli.flags.contains("--help"));
    assert_eq!(cli.envs, BTreeSet::from(["PAGEWARDEN_MODEL".to_string()]));
    assert_eq!(interpolate("a=${X:-b}c${Y}"), "a=bc");
    assert_eq!(
        urls("postgres://u:p@postgres:5432/db"),
        vec![("postgres".into(), 5432)]
    );
}

#[test]
fn compose_ships_no_working_key() {
    use pagewarden_common::tenants::{KeyTable, TenantsFile};
    let path = repo().join("deploy/compose/tenants.example.toml");
    let example = TenantsFile::load(&path).expect("the example tenants file loads");
    let table = KeyTable::new(&example.tenants).expect("a key table");
    assert!(
        table.is_empty(),
        "{} lists key hashes: whoever knows their keys gets in",
        path.display()
    );
}

/// The Dockerfile's stages: name (`FROM … AS name`) and the lines under it.
fn dockerfile_stages(dockerfile: &str) -> BTreeMap<String, String> {
    let mut stages = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in dockerfile.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let ["FROM", _, as_, name] = words.as_slice() {
            if as_.eq_ignore_ascii_case("as") {
                stages.extend(current.take());
                current = Some((name.to_string(), String::new()));
                continue;
            }
        }
        if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    stages.extend(current);
    stages
}

/// Why `gpu_yaml` (over `base_yaml`) does not run every worker of the base file on the
/// Dockerfile's CUDA stage: a worker left on the CPU image, a target that is not the stage,
/// no GPU reserved, a device that is not CUDA, an environment name the worker does not read;
/// or the stage not carrying the workers built with their `cuda` feature.
fn gpu_problems(
    dockerfile: &str,
    base_yaml: &str,
    gpu_yaml: &str,
    clis: &BTreeMap<&'static str, Cli>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let stages = dockerfile_stages(dockerfile);
    match stages.get("runtime-cuda") {
        None => problems.push("Dockerfile: no stage runtime-cuda".to_string()),
        Some(body) => {
            let from = body
                .lines()
                .filter_map(|l| l.trim().strip_prefix("COPY --from="))
                .filter_map(|l| l.split_whitespace().next())
                .collect::<BTreeSet<_>>();
            if from.is_empty() {
                problems.push("Dockerfile: runtime-cuda copies no binaries".into());
            }
            for stage in from {
                let build = stages.get(stage).map(String::as_str).unwrap_or_default();
                let features = build
                    .split_whitespace()
                    .skip_while(|w| *w != "--features")
                    .nth(1)
                    .unwrap_or_default();
                for feature in ["pagewarden-prefill/cuda", "pagewarden-decode/cuda"] {
                    if !features.split(',').any(|f| f == feature) {
                        problems.push(format!(
                            "Dockerfile: {stage} (copied into runtime-cuda) does not build \
                             with {feature}"
                        ));
                    }
                }
            }
        }
    }
    let load = |yaml: &str| -> serde_yaml::Value {
        let mut doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("compose file is YAML");
        doc.apply_merge().expect("merge keys");
        doc
    };
    let (base, gpu) = (load(base_yaml), load(gpu_yaml));
    let workers = base["services"]
        .as_mapping()
        .expect("compose has services")
        .iter()
        .filter_map(|(name, svc)| {
            let bin = strs(&svc["command"]).first().cloned()?;
            ["pagewarden-prefill", "pagewarden-decode"]
                .contains(&bin.as_str())
                .then(|| (name.as_str().unwrap_or_default().to_string(), bin))
        });
    for (name, bin) in workers {
        let svc = &gpu["services"][name.as_str()];
        if svc.is_null() {
            problems.push(format!("gpu.yml: {name} stays on the CPU image"));
            continue;
        }
        if svc["build"]["target"].as_str() != Some("runtime-cuda") {
            problems.push(format!(
                "gpu.yml: {name} does not build the runtime-cuda stage"
            ));
        }
        let device = &svc["deploy"]["resources"]["reservations"]["devices"][0];
        if device["driver"].as_str() != Some("nvidia")
            || !strs(&device["capabilities"]).contains(&"gpu".to_string())
        {
            problems.push(format!("gpu.yml: {name} reserves no NVIDIA GPU"));
        }
        let env = svc["environment"].as_mapping().cloned().unwrap_or_default();
        for (k, v) in &env {
            let k = k.as_str().unwrap_or_default();
            if !clis[bin.as_str()].envs.contains(k) && !COMMON_ENV.contains(&k) {
                problems.push(format!(
                    "gpu.yml: {name}: {bin} reads no environment variable {k}"
                ));
            }
            if k == "PAGEWARDEN_DEVICE" && !v.as_str().unwrap_or_default().starts_with("cuda:") {
                problems.push(format!("gpu.yml: {name} computes on {v:?}, not a GPU"));
            }
        }
        if !env.contains_key("PAGEWARDEN_DEVICE") {
            problems.push(format!("gpu.yml: {name} sets no PAGEWARDEN_DEVICE"));
        }
    }
    problems
}

fn gpu_files() -> (String, String, String) {
    let read = |p: &str| std::fs::read_to_string(repo().join(p)).unwrap();
    (
        read("deploy/compose/Dockerfile"),
        read("deploy/compose/docker-compose.yml"),
        read("deploy/compose/gpu.yml"),
    )
}

#[test]
fn the_gpu_override_runs_every_worker_on_the_cuda_build() {
    let (dockerfile, base, gpu) = gpu_files();
    let problems = gpu_problems(&dockerfile, &base, &gpu, &clis());
    assert!(
        problems.is_empty(),
        "gpu.yml drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_gpu_check_catches_drift() {
    let clis = clis();
    let (dockerfile, base, gpu) = gpu_files();
    let mutate = |s: &str, from: &str, to: &str| {
        let out = s.replacen(from, to, 1);
        assert_ne!(out, s, "the mutation {from:?} must apply");
        out
    };
    for (dockerfile, gpu, expected) in [
        (
            mutate(&dockerfile, "pagewarden-prefill/cuda,", ""),
            gpu.clone(),
            "builder-cuda (copied into runtime-cuda) does not build with pagewarden-prefill/cuda",
        ),
        (
            mutate(&dockerfile, "AS runtime-cuda", "AS runtime-gpu"),
            gpu.clone(),
            "Dockerfile: no stage runtime-cuda",
        ),
        (
            dockerfile.clone(),
            mutate(
                &gpu,
                "  decode-1:\n    <<: *gpu\n",
                "  decode-9:\n    <<: *gpu\n",
            ),
            "gpu.yml: decode-1 stays on the CPU image",
        ),
        (
            dockerfile.clone(),
            mutate(&gpu, "target: runtime-cuda", "target: runtime"),
            "gpu.yml: prefill-0 does not build the runtime-cuda stage",
        ),
        (
            dockerfile.clone(),
            mutate(&gpu, "PAGEWARDEN_DEVICE: cuda:0", "PAGEWARDEN_GPU: cuda:0"),
            "pagewarden-prefill reads no environment variable PAGEWARDEN_GPU",
        ),
        (
            dockerfile.clone(),
            mutate(&gpu, "PAGEWARDEN_DEVICE: cuda:0", "PAGEWARDEN_DEVICE: cpu"),
            "gpu.yml: decode-0 computes on",
        ),
        (
            dockerfile.clone(),
            gpu.replace("driver: nvidia", "driver: amd"),
            "gpu.yml: prefill-1 reserves no NVIDIA GPU",
        ),
    ] {
        let problems = gpu_problems(&dockerfile, &base, &gpu, &clis).join("\n");
        assert!(
            problems.contains(expected),
            "{expected:?} not reported in:\n{problems}"
        );
    }
}
