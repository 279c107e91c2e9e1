//! Compiles every `.proto` under `pagewarden/v1/` with protox (pure Rust, no system `protoc`)
//! and generates prost messages plus tonic clients and servers.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("pagewarden/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed=pagewarden/v1");
    let fds = protox::compile(&files, ["."])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
