//! `pagewarden preflight` as an operator runs it: the real binary on config files, exit status
//! and the printed reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn preflight(config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagewarden"))
        .args(["preflight", "--config"])
        .arg(config)
        .output()
        .expect("running pagewarden preflight")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The default model, which the test script fetches.
fn real_model() -> PathBuf {
    let p = std::env::var_os("PAGEWARDEN_MODEL")
        .map(PathBuf::from)
        .expect(
        "PAGEWARDEN_MODEL is not set: run scripts/test.sh, or `cargo run -p pagewarden -- fetch \
         smollm2` and export PAGEWARDEN_MODEL=<its output>",
    );
    assert!(
        p.is_file(),
        "PAGEWARDEN_MODEL={} does not exist",
        p.display()
    );
    p
}

/// Tenants `a` and `b`, keys `ka` and `kb` (stored as their SHA-256).
const TENANTS: &str = r#"
[[tenants]]
name = "a"
key_sha256 = ["3ebb1c99b12b77463e97c3a0f206e4fd46176cd1b8e183816a67338c04b25e5b"]
[[tenants]]
name = "b"
key_sha256 = ["74fec0c33e96ab90ac88666979207a50a6ea7b9b3eea6ec0e8b916d64c0a0706"]
"#;

fn worker(name: &str, role: &str, model: &Path, extra: &str) -> String {
    format!(
        "[[workers]]\nname = \"{name}\"\nrole = \"{role}\"\nmodel = {:?}\n{extra}\n",
        model.display().to_string()
    )
}

#[test]
fn a_pool_smaller_than_the_context_fails_and_says_why() {
    let model = real_model();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cluster.toml");
    // SmolLM2-135M: 8192 tokens of context; 4096 tokens of pool cannot hold it.
    std::fs::write(
        &cfg,
        format!(
            "{}{}{TENANTS}",
            worker("prefill-0", "prefill", &model, ""),
            worker("decode-0", "decode", &model, "pool_tokens = 4096"),
        ),
    )
    .unwrap();
    let out = preflight(&cfg);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("pool holds 4096 tokens < context 8192"), "{t}");
    assert!(
        t.contains("prefill-0") && t.contains("preflight FAILED"),
        "{t}"
    );
}

#[test]
fn a_sound_cluster_passes_and_lowering_is_reported() {
    let model = real_model();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cluster.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}{}{TENANTS}",
            worker("prefill-0", "prefill", &model, "pool_tokens = 8192"),
            worker(
                "decode-0",
                "decode",
                &model,
                "pool_bytes = 94371840\nlower_context_to_fit = true"
            ),
        ),
    )
    .unwrap();
    let out = preflight(&cfg);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // 30 layers × 2 × 16 × 3 kv heads × 64 × 2 bytes = 368640 bytes a page; 90 MiB = 256 pages.
    assert!(t.contains("368640"), "{t}");
    assert!(t.contains("context lowered from 8192 to 4096"), "{t}");
    assert!(
        t.contains("effective context (min over workers): 4096"),
        "{t}"
    );
}

#[test]
fn bad_keys_unreadable_models_and_versions_fail_each_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = dir.path().join("tiny.gguf");
    std::fs::write(&tiny, pagewarden_model::tiny_llama_gguf(3)).unwrap();
    let cfg = dir.path().join("cluster.toml");
    std::fs::write(
        &cfg,
        format!(
            "{}{}{}\n[[tenants]]\nname = \"a\"\nkey_sha256 = [\"{k}\"]\n[[tenants]]\n\
             name = \"b\"\nkey_sha256 = [\"{k}\"]\n[[tenants]]\nname = \"c\"\nkey_sha256 = []\n",
            worker("prefill-0", "prefill", &tiny, "version = \"0.0.1\""),
            worker("decode-0", "decode", &tiny, ""),
            worker("decode-1", "decode", Path::new("missing.gguf"), ""),
            k = pagewarden_common::secret::SecretHash::of("k"),
        ),
    )
    .unwrap();
    let out = preflight(&cfg);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    for reason in [
        "version 0.0.1 differs",
        "missing.gguf",
        "share a key",
        "\"c\" has no keys",
    ] {
        assert!(t.contains(reason), "{reason:?} missing in:\n{t}");
    }
    // decode-0 itself is sound: its row says ok.
    let row = t.lines().find(|l| l.starts_with("decode-0")).unwrap();
    assert!(row.ends_with("ok"), "{row}");
}
