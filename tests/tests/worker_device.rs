//! `--device` on both workers (prefill and decode): garbage is refused by the flag parser;
//! `cuda:0` in a build without the `cuda` feature, or on a machine without an NVIDIA driver,
//! fails at start-up with a clear error and never a panic (on a GPU machine with the feature,
//! the worker starts).
//!
//! Whether the binaries carry CUDA is read from this test's own build
//! (`Device::cuda_compiled()`): the workers' `cuda` features turn on `pagewarden-kernels/cuda`,
//! so a workspace built with one set of features agrees with itself.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use pagewarden_kernels::Device;
use pagewarden_system_tests::bin;
use pagewarden_testkit::poll_until_blocking;

/// The two workers, by binary name.
const WORKERS: [&str; 2] = ["pagewarden-prefill", "pagewarden-decode"];

/// Starts worker `binary` on the tiny model with `args`/`env`; `Ok(stderr)` if it exited
/// (failing), `Err(())` if it came up listening (then it is killed).
fn start(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Result<String, ()> {
    let mut cmd = Command::new(bin(binary));
    cmd.args(["--tiny-test-model", "3", "--grpc-addr", "127.0.0.1:0"])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--transfer-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .env_remove("PAGEWARDEN_DEVICE")
        .env_remove("PAGEWARDEN_MODEL")
        .env_remove("PAGEWARDEN_CONFIG")
        .env_remove("PAGEWARDEN_AUDITOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn the worker");
    let stdout = child.stdout.take().expect("stdout");
    let listening = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("listening"))
    });
    // `Some(status)` once it exits, `None` once its stdout has said (or not) that it listens.
    let outcome = poll_until_blocking(Duration::from_secs(60), || {
        match child.try_wait().expect("wait") {
            Some(status) => Some(Some(status)),
            None => listening.is_finished().then_some(None),
        }
    });
    let (exited, listened) = match outcome {
        Some(Some(status)) => (Some(status), false),
        Some(None) => match listening.join().unwrap_or(false) {
            true => (None, true),
            // Its stdout closed without a word of listening: it is exiting (a process's output
            // closes just before it can be reaped), so wait for its status.
            false => (
                poll_until_blocking(Duration::from_secs(10), || child.try_wait().expect("wait")),
                false,
            ),
        },
        None => (None, false),
    };
    if let Some(status) = exited {
        assert!(!status.success(), "{binary} exited 0 without serving");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
            .expect("read stderr");
        return Ok(err);
    }
    child.kill().ok();
    child.wait().ok();
    assert!(listened, "{binary} neither exited nor listened");
    Err(())
}

/// `cuda:0` either fails clearly or, only in a CUDA build on a GPU machine, starts.
fn check_cuda_start(binary: &str, args: &[&str], env: &[(&str, &str)]) {
    let cuda_built = Device::cuda_compiled();
    match start(binary, args, env) {
        Ok(stderr) => {
            assert!(
                !stderr.contains("panicked"),
                "{binary}: a panic, not an error:\n{stderr}"
            );
            if cuda_built {
                assert!(
                    stderr.contains("cuda:0"),
                    "{binary}: the error names no device:\n{stderr}"
                );
            } else {
                assert!(
                    stderr.contains("built without CUDA support"),
                    "{binary}: unclear refusal (or the binaries were built with other \
                     features than this test):\n{stderr}"
                );
            }
        }
        Err(()) => assert!(
            cuda_built,
            "{binary} started on cuda:0 without CUDA support"
        ),
    }
}

#[test]
fn cuda_device_without_support_or_driver_fails_clearly() {
    for binary in WORKERS {
        check_cuda_start(binary, &["--device", "cuda:0"], &[]);
        // The environment variable selects the device too.
        check_cuda_start(binary, &[], &[("PAGEWARDEN_DEVICE", "cuda:0")]);
    }
}

#[test]
fn unknown_device_is_refused_and_cpu_serves() {
    for binary in WORKERS {
        let stderr = start(binary, &["--device", "tpu"], &[]).expect("tpu is refused");
        assert!(stderr.contains("expected `cpu`"), "{binary}: {stderr}");
        assert!(
            start(binary, &["--device", "cpu"], &[]).is_err(),
            "{binary} must start on cpu"
        );
    }
}
