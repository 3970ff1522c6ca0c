//! The `homa` command. Each subcommand lives in its own module.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "homa", version, about = "Homa transport: benchmarks, simulator and tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Placeholder until the first real subcommand lands.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Version => {
            println!("homa {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    }
}
