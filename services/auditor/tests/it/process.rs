//! The binary: starts on port 0, prints one parseable line, serves, and stops on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::ingest::get_text;

#[tokio::test]
async fn binary_prints_its_addresses_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pagewarden-auditor"))
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--probe-interval",
            "0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let fields: Vec<&str> = line.trim().split(' ').collect();
    assert_eq!(&fields[..2], &["pagewarden-auditor", "listening"], "{line}");
    let http = fields[2].strip_prefix("http=").unwrap();
    let grpc = fields[3].strip_prefix("grpc=").unwrap();
    assert!(grpc.starts_with("127.0.0.1:") && !grpc.ends_with(":0"));
    assert_eq!(get_text(format!("http://{http}/health")).await, "ok");
    assert!(get_text(format!("http://{http}/metrics"))
        .await
        .contains("pagewarden_auditor_samples_total 0"));
    assert!(
        dir.path().join("auditor.sqlite").exists(),
        "default SQLite file in the data dir"
    );
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}
