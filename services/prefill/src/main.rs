//! `pagewarden-prefill`: parses its flags and runs the prefill worker ([`pagewarden_prefill::run`]).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    pagewarden_prefill::run(pagewarden_prefill::Cli::parse()).await
}
