//! `pagewarden-decode`: parses its flags and runs the decode worker ([`pagewarden_decode::run`]).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    pagewarden_decode::run(pagewarden_decode::Cli::parse()).await
}
