//! `homa testbed up|down|status`: the emulated cluster (network namespaces on
//! a bridge, HTB priority queues on every link). Needs root.

use clap::{Args, Subcommand};
use homa_testbed::testbed::{self, TestbedConfig};
use homa_testbed::Testbed;

#[derive(Args, Debug)]
pub struct TestbedArgs {
    #[command(subcommand)]
    pub command: TestbedCommand,
}

#[derive(Subcommand, Debug)]
pub enum TestbedCommand {
    /// Create (or bring to this configuration) the testbed. Idempotent.
    Up(UpArgs),
    /// Remove every namespace, link and qdisc of the testbed.
    Down(PrefixArg),
    /// Show the testbed and its per-class packet counters.
    Status(StatusArgs),
}

#[derive(Args, Debug, Clone)]
pub struct PrefixArg {
    /// Name prefix of the testbed's objects (namespaces PREFIX-h0.., bridge PREFIX-br).
    #[arg(long, default_value = "homa")]
    pub prefix: String,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub prefix: PrefixArg,
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// Number of hosts (network namespaces).
    #[arg(long, default_value_t = 4)]
    pub hosts: usize,
    /// Link rate of every host link, Gbit/s (default 0.1; `bench cluster`
    /// lowers it for workloads of small messages, see docs/evaluation.md).
    #[arg(long)]
    pub gbps: Option<f64>,
    /// Priority classes per switch port (1 = a single FIFO).
    #[arg(long, default_value_t = 8)]
    pub priorities: u8,
    /// Packets each priority class's queue holds before dropping.
    #[arg(long, default_value_t = 1000)]
    pub queue_packets: u32,
    /// Leave the hosts' own interfaces (their NICs) unshaped.
    #[arg(long)]
    pub no_uplink_shaping: bool,
    /// Reserve each port's lowest class for TCP, below all of Homa's levels.
    #[arg(long)]
    pub tcp_below: bool,
    #[command(flatten)]
    pub prefix: PrefixArg,
}

impl UpArgs {
    pub fn config(&self) -> TestbedConfig {
        TestbedConfig {
            prefix: self.prefix.prefix.clone(),
            hosts: self.hosts,
            gbps: self.gbps.unwrap_or(homa_testbed::DEFAULT_GBPS),
            priorities: self.priorities,
            queue_packets: self.queue_packets,
            shape_uplinks: !self.no_uplink_shaping,
            tcp_below: self.tcp_below,
        }
    }
}

pub fn run(args: TestbedArgs) -> anyhow::Result<()> {
    match args.command {
        TestbedCommand::Up(a) => {
            let tb = Testbed::up(&a.config())?;
            println!(
                "testbed {:?} up: {} hosts {}..{} on bridge {}, {} Gbit/s links, {} priority classes",
                tb.config.prefix,
                tb.hosts(),
                tb.addr(0),
                tb.addr(tb.hosts() - 1),
                tb.names.bridge(),
                tb.config.gbps,
                tb.config.priorities
            );
            println!(
                "run a command on host 0 with: ip netns exec {} <command>",
                tb.ns(0)
            );
        }
        TestbedCommand::Down(p) => {
            testbed::down(&p.prefix)?;
            println!("testbed {:?} removed", p.prefix);
        }
        TestbedCommand::Status(s) => {
            let st = testbed::status(&s.prefix.prefix)?;
            if s.json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{st}");
                let others: Vec<String> = testbed::list_prefixes()
                    .into_iter()
                    .filter(|p| *p != s.prefix.prefix)
                    .collect();
                if !others.is_empty() {
                    println!("other testbeds present: {}", others.join(", "));
                }
            }
        }
    }
    Ok(())
}
