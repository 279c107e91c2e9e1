//! `pagewarden hash-password`: reads a password on stdin (one line) and prints its argon2id
//! PHC string, for an `[[operators]]` entry of the auditor's config (which stores only that).

use std::io::BufRead;

use anyhow::{bail, Context};

/// Hashes the first line of stdin.
pub fn run() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from stdin")?;
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        bail!("no password on stdin (try: printf %s 'the password' | pagewarden hash-password)");
    }
    let phc = pagewarden_auditor::accounts::hash_password(password, &mut rand::rng());
    println!("{phc}");
    Ok(())
}
