//! The store's command line: `homa kv coordinator|backup|master` (one
//! process each), `homa kv up` (a whole local cluster in one process) and
//! `homa kv cli` (one client operation). Each server prints `ROLE ADDR`
//! on its first line of stdout once it serves, then runs until killed.

use crate::cluster::{ClusterSpec, LocalCluster};
use crate::master::MasterConfig;
use crate::node::{start_backup, start_coordinator, start_master};
use crate::KvClient;
use clap::{Args, Subcommand};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    /// The coordinator: the slot table, master incarnations, live backups.
    Coordinator {
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// Slots (masters) the key space is cut into.
        #[arg(long, default_value_t = 1)]
        masters: u32,
    },
    /// A backup: holds replicas of masters' logs in memory.
    Backup {
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        #[arg(long)]
        coordinator: SocketAddr,
        /// Busy-poll time in µs before the serving thread sleeps (default:
        /// the runtime's; kv-bench uses 0, see docs/kv.md).
        #[arg(long)]
        poll_us: Option<u64>,
    },
    /// A master: recovers its slot from the backups, then serves it.
    Master(MasterArgs),
    /// A local cluster in this process on loopback (or, with `--testbed`,
    /// one process per node on the namespace testbed): prints the
    /// addresses, runs until Ctrl-C (or `--for-secs`).
    Up {
        #[arg(long, default_value_t = 1)]
        masters: u32,
        #[arg(long, default_value_t = 3)]
        backups: usize,
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// The backups' busy-poll time in µs (default: the runtime's).
        #[arg(long)]
        backup_poll_us: Option<u64>,
        /// The masters' replication endpoints' busy-poll time in µs.
        #[arg(long)]
        nested_poll_us: Option<u64>,
        /// Run every node as its own `homa kv ROLE` process on the namespace
        /// testbed instead (root): the coordinator on host 0, the backups
        /// and then the masters on hosts of their own (prefix `homakv`).
        #[arg(long)]
        testbed: bool,
        /// With `--testbed`: the link rate of every host link, Gbit/s.
        #[arg(long, default_value_t = 1.0)]
        gbps: f64,
        /// Stop after this many seconds (default: run until Ctrl-C).
        #[arg(long)]
        for_secs: Option<u64>,
    },
    /// One client operation.
    Cli(CliArgs),
}

#[derive(Args, Debug)]
pub struct MasterArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    #[arg(long)]
    pub coordinator: SocketAddr,
    /// The slot to serve (to restart or replace a master); default: the
    /// first that never had one.
    #[arg(long)]
    pub slot: Option<u32>,
    /// Backups per write (R).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Serving threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// A replication call slower than this takes its backup for dead (ms).
    #[arg(long, default_value_t = 200)]
    pub replication_timeout_ms: u64,
    /// Busy-poll time in µs of the endpoint replication calls go through
    /// (default: the runtime's; kv-bench uses 0, see docs/kv.md).
    #[arg(long)]
    pub nested_poll_us: Option<u64>,
}

#[derive(Args, Debug)]
pub struct CliArgs {
    #[arg(long)]
    pub coordinator: SocketAddr,
    #[command(subcommand)]
    pub op: CliOp,
}

#[derive(Subcommand, Debug)]
pub enum CliOp {
    /// Prints the value (and version) of KEY.
    Get {
        key: String,
    },
    /// Writes VALUE at KEY; prints the new version.
    Put {
        key: String,
        value: String,
    },
    /// Writes only if KEY's version is VERSION (0: only if absent).
    PutIf {
        key: String,
        value: String,
        version: u64,
    },
    Delete {
        key: String,
    },
    /// Several keys at once.
    Mget {
        keys: Vec<String>,
    },
    /// The coordinator's table.
    Table,
}

fn announce(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

/// Sleeps `secs` seconds, or forever.
fn run_for(secs: Option<u64>) {
    match secs {
        Some(s) => std::thread::sleep(Duration::from_secs(s)),
        None => forever(),
    }
}

fn forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

pub fn run(cmd: KvCommand) -> anyhow::Result<()> {
    match cmd {
        KvCommand::Coordinator { addr, masters } => {
            let r = start_coordinator(addr, masters, &Default::default())?;
            announce(format!("coordinator {}", r.addr));
            forever()
        }
        KvCommand::Backup {
            addr,
            coordinator,
            poll_us,
        } => {
            let mut cfg = homa::EndpointConfig::default();
            if let Some(p) = poll_us {
                cfg.poll = Duration::from_micros(p);
            }
            let r = start_backup(addr, coordinator, &cfg, "kv-backup")?;
            announce(format!("backup {}", r.addr));
            forever()
        }
        KvCommand::Master(a) => {
            let mut cfg = MasterConfig::new(a.coordinator);
            cfg.slot = a.slot;
            cfg.replicas = a.replicas;
            cfg.replication_timeout = Duration::from_millis(a.replication_timeout_ms);
            cfg.nested_poll = a.nested_poll_us.map(Duration::from_micros);
            let (r, rec) = start_master(a.addr, &cfg, a.threads, &Default::default(), "kv-master")?;
            announce(format!(
                "master {} slot {} epoch {} recovered {} objects from {} entries in {:.1} ms, replicas {:?}",
                r.addr,
                rec.grant.slot,
                rec.grant.epoch,
                rec.objects,
                rec.entries_found,
                rec.took.as_secs_f64() * 1e3,
                rec.replicas
            ));
            forever()
        }
        KvCommand::Up {
            masters,
            backups,
            replicas,
            gbps,
            for_secs,
            testbed: true,
            ..
        } => {
            let c = crate::testbed::start_cluster(&crate::testbed::TestbedSpec {
                masters,
                backups,
                replicas,
                gbps,
                program: None,
            })?;
            for n in &c.nodes {
                announce(format!(
                    "{} {} (host {}, {})",
                    n.role,
                    n.addr,
                    n.host,
                    c.ns(n.host)
                ));
            }
            announce(format!(
                "try: ip netns exec {} homa kv cli --coordinator {} put hello world (Ctrl-C stops the processes; `homa testbed down --prefix {}` removes the testbed)",
                c.ns(0),
                c.coordinator(),
                crate::testbed::PREFIX
            ));
            run_for(for_secs);
            drop(c);
            Ok(())
        }
        KvCommand::Up {
            masters,
            backups,
            replicas,
            backup_poll_us,
            nested_poll_us,
            for_secs,
            ..
        } => {
            let c = LocalCluster::start(ClusterSpec {
                masters,
                backups,
                replicas,
                backup_poll: backup_poll_us.map(Duration::from_micros),
                nested_poll: nested_poll_us.map(Duration::from_micros),
                ..ClusterSpec::default()
            })?;
            announce(format!("coordinator {}", c.coordinator()));
            for (i, m) in c.masters().iter().enumerate() {
                announce(format!("master {} slot {i}", fmt(m)));
            }
            for b in c.backups() {
                announce(format!("backup {}", fmt(&b)));
            }
            announce(format!(
                "try: homa kv cli --coordinator {} put hello world (Ctrl-C stops the cluster)",
                c.coordinator()
            ));
            run_for(for_secs);
            drop(c);
            Ok(())
        }
        KvCommand::Cli(a) => client(a),
    }
}

fn fmt(a: &Option<SocketAddr>) -> String {
    a.map_or("-".into(), |a| a.to_string())
}

fn client(a: CliArgs) -> anyhow::Result<()> {
    let c = KvClient::connect(a.coordinator)?;
    let show = |v: Option<crate::Versioned>| match v {
        Some(v) => format!(
            "{} (version {})",
            String::from_utf8_lossy(&v.value),
            v.version
        ),
        None => "(none)".into(),
    };
    match a.op {
        CliOp::Get { key } => println!("{}", show(c.get(key.as_bytes())?)),
        CliOp::Put { key, value } => {
            println!("version {}", c.put(key.as_bytes(), value.into_bytes())?)
        }
        CliOp::PutIf {
            key,
            value,
            version,
        } => println!(
            "version {}",
            c.put_if(key.as_bytes(), value.into_bytes(), version)?
        ),
        CliOp::Delete { key } => {
            c.delete(key.as_bytes())?;
            println!("deleted");
        }
        CliOp::Mget { keys } => {
            let ks: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            for (k, v) in keys.iter().zip(c.multi_get(&ks)?) {
                println!("{k}: {}", show(v));
            }
        }
        CliOp::Table => println!("{:#?}", c.table()),
    }
    Ok(())
}
