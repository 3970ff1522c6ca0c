//! The store's processes on their own (the real-process tests run this;
//! `homa kv` is the same command inside the `homa` binary).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "homa-kv",
    about = "homa-kv: a replicated in-memory key-value store on Homa"
)]
struct Cli {
    #[command(subcommand)]
    command: homa_kv::cli::KvCommand,
}

fn main() -> anyhow::Result<()> {
    homa_kv::cli::run(Cli::parse().command)
}
