//! The crates' dependencies are what docs/architecture.md says: the router links no compute
//! (kernels, KV pool, transfer, the workers' crate), and the vocabulary crates link no runtime.
//! Asked of `cargo tree` (offline: the lock file answers), one package at a time, so features
//! other packages of the workspace turn on do not hide a dependency.

use std::path::Path;
use std::process::Command;

/// The names of every package `package` depends on for its normal (non-dev) build.
fn normal_dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "-p", package])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn assert_links_none(package: &str, forbidden: &[&str]) {
    let deps = normal_dependencies(package);
    assert!(
        deps.iter().any(|d| d == package),
        "cargo tree listed nothing for {package}: {deps:?}"
    );
    let found: Vec<&String> = deps
        .iter()
        .filter(|d| forbidden.contains(&d.as_str()))
        .collect();
    assert!(found.is_empty(), "{package} depends on {found:?}");
}

#[test]
fn the_router_links_no_compute() {
    assert_links_none(
        "pagewarden-router",
        &[
            "pagewarden-kernels",
            "pagewarden-kvcache",
            "pagewarden-transfer",
            "pagewarden-worker",
            "cudarc",
        ],
    );
}

#[test]
fn the_kv_pool_and_the_vocabulary_link_no_runtime() {
    for package in ["pagewarden-kvcache", "pagewarden-types"] {
        assert_links_none(
            package,
            &["tokio", "tonic", "axum", "hyper", "pagewarden-common"],
        );
    }
}

#[test]
fn the_transfer_protocol_links_no_service_runtime() {
    assert_links_none(
        "pagewarden-transfer",
        &["pagewarden-common", "tonic", "axum", "hyper"],
    );
}

#[test]
fn the_check_sees_a_dependency_that_is_there() {
    // Decode runs the model: if this finds no kernels, the two checks above prove nothing.
    let deps = normal_dependencies("pagewarden-decode");
    assert!(deps.iter().any(|d| d == "pagewarden-kernels"), "{deps:?}");
    assert!(deps.iter().any(|d| d == "tokio"), "{deps:?}");
}
