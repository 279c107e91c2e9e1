//! What the deployment-file tests (`compose_flags.rs`, `kubernetes*.rs`) read the same way:
//! the built binaries' `--help` (their flags and the environment names clap reads), the
//! addresses in a file's values, the flags a command line passes, and how long each service's
//! drain may take (read from the services' source).

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The four service binaries.
pub const BINARIES: [&str; 4] = [
    "pagewarden-router",
    "pagewarden-prefill",
    "pagewarden-decode",
    "pagewarden-auditor",
];

/// Environment names every service honours without a clap flag (logging, tracing).
pub const COMMON_ENV: [&str; 2] = ["RUST_LOG", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// What one binary's `--help` says: its flags and the environment names clap reads.
#[derive(Debug, Default)]
pub struct Cli {
    /// `--flag` names.
    pub flags: BTreeSet<String>,
    /// `[env: NAME=…]` names.
    pub envs: BTreeSet<String>,
}

/// `<target>/<profile>`: a test runs from `<target>/<profile>/deps/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Reads `bin --help`; a missing binary fails with the command that builds it.
pub fn help(bin: &str) -> Cli {
    let path = bin_dir().join(bin);
    assert!(
        path.is_file(),
        "{} is missing: build the service binaries first (`cargo build --workspace --bins`, \
         as scripts/test.sh does) so their real flags can be read",
        path.display()
    );
    let out = Command::new(&path)
        .arg("--help")
        .env_remove("PAGEWARDEN_MODEL")
        .output()
        .unwrap_or_else(|e| panic!("running {} --help: {e}", path.display()));
    assert!(out.status.success(), "{bin} --help failed: {out:?}");
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// The flags and `[env: …]` names in a `--help` text.
pub fn parse_help(text: &str) -> Cli {
    let mut cli = Cli::default();
    for word in text.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']') {
        if let Some(f) = word.strip_prefix("--") {
            let f: String = f
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !f.is_empty() {
                cli.flags.insert(format!("--{f}"));
            }
        }
    }
    for part in text.split("[env: ").skip(1) {
        if let Some(name) = part.split(['=', ']']).next() {
            cli.envs.insert(name.to_string());
        }
    }
    cli
}

/// Every service binary's `--help`.
pub fn clis() -> BTreeMap<&'static str, Cli> {
    BINARIES.iter().map(|b| (*b, help(b))).collect()
}

/// `(host, port)` of every `scheme://host:port` in `s`.
pub fn urls(s: &str) -> Vec<(String, u16)> {
    s.split("://")
        .skip(1)
        .filter_map(|rest| {
            let hostport = rest.split(['/', '?']).next()?;
            let hostport = hostport.rsplit('@').next()?;
            let (host, port) = hostport.rsplit_once(':')?;
            Some((host.to_string(), port.parse().ok()?))
        })
        .collect()
}

/// The flags given in `args` (`--flag VALUE` or `--flag=VALUE`) and the ports their
/// `--*-addr` values name.
pub fn flags_and_ports(args: &[String]) -> (Vec<String>, BTreeSet<u16>) {
    let mut flags = Vec::new();
    let mut ports = BTreeSet::new();
    for (i, a) in args.iter().enumerate() {
        if !a.starts_with("--") {
            continue;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        flags.push(flag.to_string());
        let value = inline.or_else(|| args.get(i + 1).cloned());
        if flag.ends_with("-addr") {
            if let Some(p) = value.and_then(|v| v.rsplit(':').next()?.parse().ok()) {
                ports.insert(p);
            }
        }
    }
    (flags, ports)
}

/// `Duration::from_secs(N)` or `from_millis(N)` of `const NAME` in a source file, in ms.
fn const_duration_ms(path: &str, name: &str) -> u64 {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join(path)).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("const {name}: Duration")))
        .unwrap_or_else(|| panic!("{path} has no `const {name}: Duration`"));
    let number = |prefix: &str| -> Option<u64> {
        let rest = &line[line.find(prefix)? + prefix.len()..];
        rest.split(')').next()?.trim().parse().ok()
    };
    number("from_secs(")
        .map(|s| s * 1000)
        .or_else(|| number("from_millis("))
        .unwrap_or_else(|| panic!("cannot read {name} in {path}: {line}"))
}

/// Seconds each service's drain may take after SIGTERM, by short name (`decode`: its grace and
/// linger; `router`: its drain deadline): a stop timeout must be longer, or the drain is cut.
pub fn drain_seconds() -> BTreeMap<&'static str, u64> {
    let decode = const_duration_ms("services/decode/src/scheduler/mod.rs", "DRAIN_GRACE")
        + const_duration_ms("services/decode/src/scheduler/mod.rs", "DRAIN_LINGER");
    let router = const_duration_ms("services/router/src/main.rs", "DRAIN_DEADLINE");
    BTreeMap::from([("decode", decode.div_ceil(1000)), ("router", router / 1000)])
}
