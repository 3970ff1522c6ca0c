//! `homa kv up --testbed`: the store as real processes on the namespace
//! testbed (root): the coordinator on host 0, backup `i` on host `1 + i`,
//! master `j` on host `1 + B + j`, each its own `homa kv ROLE` process in
//! its host's network namespace, on shaped links with priority queues. A
//! client runs in any host's namespace (`ip netns exec PREFIX-h0 homa kv
//! cli --coordinator ADDR ...`).

use homa_testbed::{Testbed, TestbedConfig};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The testbed's name prefix (its namespaces are `homakv-h0`, ...).
pub const PREFIX: &str = "homakv";
/// The port every node listens on (each host has its own address).
const PORT: u16 = 7000;

/// What to start.
#[derive(Clone, Debug)]
pub struct TestbedSpec {
    pub masters: u32,
    pub backups: usize,
    pub replicas: usize,
    /// Link rate of every host link, Gbit/s.
    pub gbps: f64,
    /// The executable that runs the roles (`homa` or `homa-kv`; default:
    /// this one).
    pub program: Option<PathBuf>,
}

/// One node: its process and address.
pub struct Node {
    pub role: &'static str,
    pub host: usize,
    pub addr: SocketAddr,
    child: Child,
}

/// The running store; its processes are killed when it is dropped (the
/// testbed stays up for inspection: `homa testbed down --prefix homakv`).
pub struct TestbedCluster {
    pub testbed: Testbed,
    pub nodes: Vec<Node>,
}

impl TestbedCluster {
    pub fn coordinator(&self) -> SocketAddr {
        self.nodes[0].addr
    }

    /// The namespace of host `i`, for clients (`netns::run_in`, `ip netns
    /// exec`).
    pub fn ns(&self, i: usize) -> String {
        self.testbed.ns(i)
    }
}

impl Drop for TestbedCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            let _ = n.child.kill();
            let _ = n.child.wait();
        }
    }
}

/// The program that runs a role: this executable, with `kv` in front of
/// the role unless it is the `homa-kv` binary itself.
fn program(given: &Option<PathBuf>) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let exe = match given {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let own = exe.file_stem().is_some_and(|s| s == "homa-kv");
    Ok((exe, if own { vec![] } else { vec!["kv".into()] }))
}

/// Starts `ROLE ARGS` in host `host`'s namespace and waits for its
/// `ROLE ADDR` line.
fn start(
    spec: &TestbedSpec,
    tb: &Testbed,
    host: usize,
    role: &'static str,
    args: &[String],
) -> anyhow::Result<Node> {
    let (exe, prefix) = program(&spec.program)?;
    let addr = SocketAddr::from((tb.addr(host), PORT));
    let mut child = Command::new("ip")
        .args(["netns", "exec", &tb.ns(host)])
        .arg(&exe)
        .args(&prefix)
        .arg(role)
        .args(["--addr", &addr.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    let out = child.stdout.take().expect("piped");
    BufReader::new(out).read_line(&mut line)?;
    if !line.starts_with(role) {
        let _ = child.kill();
        let _ = child.wait();
        anyhow::bail!("{role} on host {host} did not start (printed {line:?})");
    }
    Ok(Node {
        role,
        host,
        addr,
        child,
    })
}

/// Brings the testbed up (1 + B + M hosts) and starts every node, one at
/// a time (backups enlist in order; a master recovers, then serves).
pub fn start_cluster(spec: &TestbedSpec) -> anyhow::Result<TestbedCluster> {
    homa_testbed::cmd::require_root()?;
    anyhow::ensure!(
        spec.backups >= spec.replicas,
        "{} backups cannot hold {} replicas",
        spec.backups,
        spec.replicas
    );
    let testbed = Testbed::up(&TestbedConfig {
        prefix: PREFIX.into(),
        hosts: 1 + spec.backups + spec.masters as usize,
        gbps: spec.gbps,
        ..TestbedConfig::default()
    })?;
    let mut c = TestbedCluster {
        testbed,
        nodes: Vec::new(),
    };
    let node = start(
        spec,
        &c.testbed,
        0,
        "coordinator",
        &["--masters".into(), spec.masters.to_string()],
    )?;
    c.nodes.push(node);
    let coord = c.coordinator().to_string();
    for i in 0..spec.backups {
        let node = start(
            spec,
            &c.testbed,
            1 + i,
            "backup",
            &["--coordinator".into(), coord.clone()],
        )?;
        c.nodes.push(node);
    }
    for j in 0..spec.masters as usize {
        let args = [
            "--coordinator".into(),
            coord.clone(),
            "--replicas".into(),
            spec.replicas.to_string(),
        ];
        let node = start(spec, &c.testbed, 1 + spec.backups + j, "master", &args)?;
        c.nodes.push(node);
    }
    Ok(c)
}
