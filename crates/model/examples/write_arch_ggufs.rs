//! Writes the tiny random model of every architecture (`gguf::tiny_arch`) into a directory,
//! as `<name>.gguf`, for `tests/data/arch/make_reference.sh` to query llama.cpp with.
//!
//! `cargo run -p pagewarden-model --example write_arch_ggufs -- DIR`

use std::path::PathBuf;

use pagewarden_model::gguf::{tiny_arch_gguf, ArchSpec, TinyArch};

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "arch-ggufs".to_string()),
    );
    std::fs::create_dir_all(&dir)?;
    for arch in TinyArch::ALL {
        let path = dir.join(format!("{}.gguf", arch.name()));
        std::fs::write(&path, tiny_arch_gguf(&ArchSpec::parity(arch)))?;
        println!("{}", path.display());
    }
    Ok(())
}
