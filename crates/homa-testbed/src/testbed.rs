//! The emulated cluster: N network namespaces ("hosts"), each with one veth
//! link to a Linux bridge (the switch). The bridge port towards each host
//! (its downlink) carries the HTB priority tree of [`crate::tc`]; so does,
//! optionally, the host's own interface (its uplink, i.e. the NIC).
//!
//! Names, for prefix `p`: namespaces `p-h0..`, bridge `p-br`, bridge ports
//! `p-v0..`; inside each namespace the interface is `eth0` with address
//! 10.77.0.(i+1)/24 (a private subnet that exists only on that bridge) and
//! MAC 02:77:00:00:xx:yy. Neighbour entries are static (no ARP), IPv6 is off
//! and GSO is limited to one segment so that the queues see wire-sized
//! packets, as a switch does.

use crate::cmd::{batch, ensure_iproute2, require_root, run, run_quiet};
use crate::netns::{netns_path, write_sysctl};
use crate::tc::{parse_class_stats, shape_commands, PortShape, PortStats};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where `up` records the configuration of each live testbed.
const STATE_DIR: &str = "/run/homa-testbed";

/// What to build.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TestbedConfig {
    /// Name prefix of every object (1..=9 characters, `[a-z0-9]`).
    pub prefix: String,
    pub hosts: usize,
    /// Link rate of every host link, Gbit/s.
    pub gbps: f64,
    /// Priority classes per port (1..=8).
    pub priorities: u8,
    /// Packets each class's queue holds (the switch buffer per port and class).
    pub queue_packets: u32,
    /// Also shape each host's own interface (its NIC) with the same tree.
    pub shape_uplinks: bool,
    /// Put TCP in the lowest class of every port, below all of Homa's
    /// levels ([`crate::tc::PortShape::tcp_below`]).
    #[serde(default)]
    pub tcp_below: bool,
}

impl Default for TestbedConfig {
    fn default() -> Self {
        TestbedConfig {
            prefix: "homa".into(),
            hosts: 4,
            gbps: crate::DEFAULT_GBPS,
            priorities: 8,
            queue_packets: 1000,
            shape_uplinks: true,
            tcp_below: false,
        }
    }
}

impl TestbedConfig {
    pub fn validate(&self) -> Result<()> {
        validate_prefix(&self.prefix)?;
        if !(2..=250).contains(&self.hosts) {
            return Err(Error::config(format!(
                "--hosts {} must be 2..=250",
                self.hosts
            )));
        }
        if !(self.gbps.is_finite() && (0.001..=100.0).contains(&self.gbps)) {
            return Err(Error::config(format!(
                "--gbps {} must be in 0.001..=100",
                self.gbps
            )));
        }
        if !(1..=8).contains(&self.priorities) {
            return Err(Error::config(format!(
                "--priorities {} must be 1..=8",
                self.priorities
            )));
        }
        if self.queue_packets == 0 {
            return Err(Error::config("queue length must be positive"));
        }
        Ok(())
    }

    pub fn rate_bps(&self) -> u64 {
        (self.gbps * 1e9) as u64
    }

    fn shape(&self) -> PortShape {
        PortShape {
            rate_bps: self.rate_bps(),
            classes: self.priorities,
            queue_packets: self.queue_packets,
            tcp_below: self.tcp_below,
        }
    }
}

/// Checks that `prefix` makes valid, short enough interface names.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty()
        || prefix.len() > 9
        || !prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Err(Error::config(format!(
            "prefix {prefix:?} must be 1..=9 characters of [a-z0-9]"
        )));
    }
    Ok(())
}

/// Names and addresses of a testbed with a given prefix.
#[derive(Clone, Debug, PartialEq)]
pub struct Names {
    pub prefix: String,
}

impl Names {
    pub fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.to_string(),
        }
    }
    pub fn bridge(&self) -> String {
        format!("{}-br", self.prefix)
    }
    /// Network namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }
    /// Bridge port towards host `i` (its downlink is this device's egress).
    pub fn port(&self, i: usize) -> String {
        format!("{}-v{i}", self.prefix)
    }
}

/// Address of host `i`.
pub fn host_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, (i + 1) as u8)
}

fn host_mac(i: usize) -> String {
    format!("02:77:00:00:{:02x}:{:02x}", (i >> 8) & 0xff, i & 0xff)
}

/// A testbed that exists (or was just built).
#[derive(Clone, Debug)]
pub struct Testbed {
    pub config: TestbedConfig,
    pub names: Names,
}

/// Host indexes with an object of this prefix: namespaces and bridge ports.
fn existing_hosts(names: &Names) -> Vec<usize> {
    let mut v = Vec::new();
    let ns_pre = format!("{}-h", names.prefix);
    let port_pre = format!("{}-v", names.prefix);
    let scan = |dir: &str, pre: &str, v: &mut Vec<usize>| {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if let Some(i) = n.strip_prefix(pre).and_then(|s| s.parse().ok()) {
                    v.push(i);
                }
            }
        }
    };
    scan("/run/netns", &ns_pre, &mut v);
    scan("/sys/class/net", &port_pre, &mut v);
    v.sort_unstable();
    v.dedup();
    v
}

fn link_exists(dev: &str) -> bool {
    std::path::Path::new("/sys/class/net").join(dev).exists()
}

fn state_path(prefix: &str) -> PathBuf {
    PathBuf::from(STATE_DIR).join(format!("{prefix}.json"))
}

/// Prefixes of every testbed present on this machine (found by their bridge,
/// namespaces or ports), for `status` and stale cleanup.
pub fn list_prefixes() -> Vec<String> {
    let mut v = Vec::new();
    let mut take = |name: &str| {
        for suffix in ["-br", "-h", "-v"] {
            if let Some(pos) = name.rfind(suffix) {
                let (pre, rest) = name.split_at(pos);
                let tail = &rest[suffix.len()..];
                let ok_tail = suffix == "-br" && tail.is_empty()
                    || suffix != "-br" && tail.parse::<usize>().is_ok();
                if ok_tail && validate_prefix(pre).is_ok() {
                    v.push(pre.to_string());
                }
            }
        }
    };
    for dir in ["/run/netns", "/sys/class/net"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                take(&e.file_name().to_string_lossy());
            }
        }
    }
    v.sort();
    v.dedup();
    v
}

impl Testbed {
    /// Builds the testbed, or brings an existing one to `config`. When a
    /// testbed with this prefix and exactly this configuration is already up,
    /// nothing is touched (its counters keep running).
    pub fn up(config: &TestbedConfig) -> Result<Testbed> {
        config.validate()?;
        require_root()?;
        ensure_iproute2()?;
        let names = Names::new(&config.prefix);
        let tb = Testbed {
            config: config.clone(),
            names: names.clone(),
        };
        if tb.recorded_config().as_ref() == Some(config) && tb.is_complete() {
            return Ok(tb);
        }
        // Hosts beyond the requested count go away.
        for i in existing_hosts(&names) {
            if i >= config.hosts {
                remove_host(&names, i);
            }
        }
        let br = names.bridge();
        if !link_exists(&br) {
            run("ip", &["link", "add", &br, "type", "bridge"])?;
        }
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{br}/disable_ipv6"), "1");
        // No STP, no learning delay: ports forward at once.
        run(
            "ip",
            &[
                "link",
                "set",
                &br,
                "type",
                "bridge",
                "stp_state",
                "0",
                "forward_delay",
                "0",
            ],
        )?;
        run("ip", &["link", "set", &br, "up"])?;
        for i in 0..config.hosts {
            tb.build_host(i)?;
        }
        tb.shape_all()?;
        std::fs::create_dir_all(STATE_DIR)
            .and_then(|_| {
                std::fs::write(
                    state_path(&config.prefix),
                    serde_json::to_string_pretty(config).expect("config serializes"),
                )
            })
            .map_err(|e| Error::Command(format!("{STATE_DIR}: {e}")))?;
        Ok(tb)
    }

    /// The testbed with this prefix as recorded by `up`, if it exists.
    pub fn open(prefix: &str) -> Result<Testbed> {
        validate_prefix(prefix)?;
        let text = std::fs::read_to_string(state_path(prefix))
            .map_err(|_| Error::config(format!("no testbed {prefix:?} is up")))?;
        let config: TestbedConfig =
            serde_json::from_str(&text).map_err(|e| Error::Parse(e.to_string()))?;
        Ok(Testbed {
            names: Names::new(prefix),
            config,
        })
    }

    fn recorded_config(&self) -> Option<TestbedConfig> {
        let text = std::fs::read_to_string(state_path(&self.config.prefix)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Whether every object of the configured testbed exists.
    fn is_complete(&self) -> bool {
        link_exists(&self.names.bridge())
            && (0..self.config.hosts)
                .all(|i| netns_path(&self.names.ns(i)).exists() && link_exists(&self.names.port(i)))
            && existing_hosts(&self.names)
                .iter()
                .all(|&i| i < self.config.hosts)
    }

    fn build_host(&self, i: usize) -> Result<()> {
        let n = &self.names;
        let (ns, port) = (n.ns(i), n.port(i));
        if !netns_path(&ns).exists() {
            run("ip", &["netns", "add", &ns])?;
        }
        // Before any interface comes up: no IPv6 (no DAD, no router
        // solicitations; the only traffic is ours). Kernels without IPv6
        // lack the files, which is fine.
        let _ = write_sysctl(&ns, "net.ipv6.conf.all.disable_ipv6", "1");
        let _ = write_sysctl(&ns, "net.ipv6.conf.default.disable_ipv6", "1");
        if !link_exists(&port) {
            // A leftover eth0 without its peer cannot exist (veths die in
            // pairs), but a half-made namespace may hold one from a crash.
            run_quiet("ip", &["-n", &ns, "link", "del", "eth0"]);
            run(
                "ip",
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
        }
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{port}/disable_ipv6"), "1");
        run(
            "ip",
            &[
                "link",
                "set",
                &port,
                "master",
                &n.bridge(),
                "gso_max_segs",
                "1",
                "up",
            ],
        )?;
        let mut lines = vec![
            format!(
                "link set eth0 address {} gso_max_segs 1 mtu 1500 up",
                host_mac(i)
            ),
            "link set lo up".to_string(),
            format!("addr replace {}/24 dev eth0", host_addr(i)),
        ];
        for j in 0..self.config.hosts {
            if j != i {
                lines.push(format!(
                    "neigh replace {} lladdr {} dev eth0 nud permanent",
                    host_addr(j),
                    host_mac(j)
                ));
            }
        }
        batch("ip", &["-n", &ns], &lines, false)
    }

    /// (Re)builds the HTB tree on every downlink and, if configured, uplink.
    fn shape_all(&self) -> Result<()> {
        let shape = self.config.shape();
        let mut root = Vec::new();
        for i in 0..self.config.hosts {
            root.extend(shape_commands(&self.names.port(i), &shape));
        }
        batch("tc", &[], &root, true)?;
        for i in 0..self.config.hosts {
            let ns = self.names.ns(i);
            if self.config.shape_uplinks {
                batch("tc", &["-n", &ns], &shape_commands("eth0", &shape), true)?;
            } else {
                run_quiet("tc", &["-n", &ns, "qdisc", "del", "dev", "eth0", "root"]);
            }
        }
        // -force hides individual failures; check the result instead.
        for i in 0..self.config.hosts {
            let d = self.downlink_stats(i)?;
            if d.classes.len() != self.config.priorities as usize {
                return Err(Error::Command(format!(
                    "shaping {} failed: {} of {} classes present",
                    self.names.port(i),
                    d.classes.len(),
                    self.config.priorities
                )));
            }
            if self.config.shape_uplinks
                && self.uplink_stats(i)?.classes.len() != self.config.priorities as usize
            {
                return Err(Error::Command(format!(
                    "shaping eth0 in {} failed",
                    self.names.ns(i)
                )));
            }
        }
        Ok(())
    }

    pub fn hosts(&self) -> usize {
        self.config.hosts
    }

    /// Namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        self.names.ns(i)
    }

    pub fn addr(&self, i: usize) -> Ipv4Addr {
        host_addr(i)
    }

    /// Counters of host `i`'s downlink (bridge port egress).
    pub fn downlink_stats(&self, i: usize) -> Result<PortStats> {
        parse_class_stats(&run(
            "tc",
            &["-s", "class", "show", "dev", &self.names.port(i)],
        )?)
    }

    /// Counters of host `i`'s uplink (its eth0 egress); empty when uplinks
    /// are not shaped.
    pub fn uplink_stats(&self, i: usize) -> Result<PortStats> {
        parse_class_stats(&run(
            "tc",
            &[
                "-n",
                &self.names.ns(i),
                "-s",
                "class",
                "show",
                "dev",
                "eth0",
            ],
        )?)
    }

    /// Counters of every port: (downlinks, uplinks), by host.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let mut s = Snapshot::default();
        for i in 0..self.config.hosts {
            s.downlinks.push(self.downlink_stats(i)?);
            s.uplinks.push(if self.config.shape_uplinks {
                self.uplink_stats(i)?
            } else {
                PortStats::default()
            });
        }
        Ok(s)
    }

    /// Removes this testbed.
    pub fn down(&self) -> Result<()> {
        down(&self.config.prefix)
    }

    /// A guard that removes the testbed when dropped (also on panic).
    pub fn guard(self) -> TestbedGuard {
        TestbedGuard { tb: Some(self) }
    }
}

fn remove_host(names: &Names, i: usize) {
    // Deleting the bridge-side veth deletes both ends at once; deleting the
    // namespace alone would leave the peer to a lazy kernel cleanup.
    run_quiet("ip", &["link", "del", &names.port(i)]);
    run_quiet("ip", &["netns", "del", &names.ns(i)]);
}

/// Removes every object with this prefix (also of a half-built testbed) and
/// waits, up to a few seconds, until the kernel has let go of them.
pub fn down(prefix: &str) -> Result<()> {
    validate_prefix(prefix)?;
    require_root()?;
    let names = Names::new(prefix);
    for i in existing_hosts(&names) {
        remove_host(&names, i);
    }
    run_quiet("ip", &["link", "del", &names.bridge()]);
    let _ = std::fs::remove_file(state_path(prefix));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = existing_hosts(&names);
        if left.is_empty() && !link_exists(&names.bridge()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Command(format!(
                "testbed {prefix:?} still has hosts {left:?} after removal"
            )));
        }
        for i in left {
            remove_host(&names, i);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Counters of all ports at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub downlinks: Vec<PortStats>,
    pub uplinks: Vec<PortStats>,
}

impl Snapshot {
    pub fn delta(&self, earlier: &Snapshot) -> Snapshot {
        let d = |a: &[PortStats], b: &[PortStats]| -> Vec<PortStats> {
            a.iter()
                .enumerate()
                .map(|(i, p)| p.delta(b.get(i).unwrap_or(&PortStats::default())))
                .collect()
        };
        Snapshot {
            downlinks: d(&self.downlinks, &earlier.downlinks),
            uplinks: d(&self.uplinks, &earlier.uplinks),
        }
    }
    /// Packets dropped by any queue.
    pub fn drops(&self) -> u64 {
        self.downlinks
            .iter()
            .chain(&self.uplinks)
            .map(PortStats::drops)
            .sum()
    }
    /// Packets per priority class summed over all downlinks (index = class).
    pub fn downlink_packets_by_class(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for p in &self.downlinks {
            for c in &p.classes {
                let k = c.class.unwrap_or(0) as usize;
                if v.len() <= k {
                    v.resize(k + 1, 0);
                }
                v[k] += c.packets;
            }
        }
        v
    }
    /// Bytes through all downlinks.
    pub fn downlink_bytes(&self) -> u64 {
        self.downlinks.iter().map(|p| p.link.bytes).sum()
    }
}

/// Removes its testbed on drop, so that a failing test leaves nothing behind.
pub struct TestbedGuard {
    tb: Option<Testbed>,
}

impl std::ops::Deref for TestbedGuard {
    type Target = Testbed;
    fn deref(&self) -> &Testbed {
        self.tb.as_ref().expect("testbed present until drop")
    }
}

impl Drop for TestbedGuard {
    fn drop(&mut self) {
        if let Some(tb) = self.tb.take() {
            if let Err(e) = tb.down() {
                eprintln!("homa-testbed: removing {}: {e}", tb.config.prefix);
            }
        }
    }
}

/// What `status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub prefix: String,
    /// As recorded by `up` (absent for a half-built or foreign testbed).
    pub config: Option<TestbedConfig>,
    pub bridge: bool,
    pub hosts: Vec<HostStatus>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    pub index: usize,
    pub namespace: String,
    pub addr: Ipv4Addr,
    pub namespace_present: bool,
    pub port_present: bool,
    pub downlink: Option<PortStats>,
    pub uplink: Option<PortStats>,
}

/// The state of the testbed with this prefix, read from the system.
pub fn status(prefix: &str) -> Result<Status> {
    validate_prefix(prefix)?;
    let names = Names::new(prefix);
    let config = std::fs::read_to_string(state_path(prefix))
        .ok()
        .and_then(|t| serde_json::from_str::<TestbedConfig>(&t).ok());
    let mut idx = existing_hosts(&names);
    if let Some(c) = &config {
        idx.extend(0..c.hosts);
        idx.sort_unstable();
        idx.dedup();
    }
    let can_read = crate::cmd::is_root();
    let hosts = idx
        .into_iter()
        .map(|i| {
            let port_present = link_exists(&names.port(i));
            let namespace_present = netns_path(&names.ns(i)).exists();
            let tb = Testbed {
                config: config.clone().unwrap_or_default(),
                names: names.clone(),
            };
            HostStatus {
                index: i,
                namespace: names.ns(i),
                addr: host_addr(i),
                namespace_present,
                port_present,
                downlink: (can_read && port_present)
                    .then(|| tb.downlink_stats(i).ok())
                    .flatten(),
                uplink: (can_read && namespace_present)
                    .then(|| tb.uplink_stats(i).ok())
                    .flatten()
                    .filter(|s| !s.classes.is_empty()),
            }
        })
        .collect();
    Ok(Status {
        prefix: prefix.to_string(),
        config,
        bridge: link_exists(&names.bridge()),
        hosts,
    })
}

impl Status {
    /// Whether nothing of this testbed exists.
    pub fn is_empty(&self) -> bool {
        !self.bridge
            && self
                .hosts
                .iter()
                .all(|h| !h.namespace_present && !h.port_present)
    }
}

fn fmt_port(f: &mut fmt::Formatter<'_>, what: &str, p: &PortStats) -> fmt::Result {
    write!(
        f,
        "    {what}: {} pkts {} bytes, drops {}; by class (highest first):",
        p.link.packets,
        p.link.bytes,
        p.drops()
    )?;
    for c in p.classes.iter().rev() {
        write!(f, " {}:{}", c.class.unwrap_or(0), c.packets)?;
        if c.drops > 0 {
            write!(f, "(-{})", c.drops)?;
        }
    }
    writeln!(f)
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "testbed {:?}: down", self.prefix);
        }
        match &self.config {
            Some(c) => writeln!(
                f,
                "testbed {:?}: {} hosts, {} Gbit/s links, {} priority classes, {} packets per class queue, uplinks {}",
                self.prefix,
                c.hosts,
                c.gbps,
                c.priorities,
                c.queue_packets,
                if c.shape_uplinks { "shaped" } else { "unshaped" }
            )?,
            None => writeln!(f, "testbed {:?}: partial (no recorded configuration)", self.prefix)?,
        }
        writeln!(
            f,
            "  switch: bridge {}-br {}",
            self.prefix,
            if self.bridge { "up" } else { "MISSING" }
        )?;
        for h in &self.hosts {
            writeln!(
                f,
                "  host {} {} ({}){}{}",
                h.index,
                h.addr,
                h.namespace,
                if h.namespace_present {
                    ""
                } else {
                    " namespace MISSING"
                },
                if h.port_present { "" } else { " port MISSING" }
            )?;
            if let Some(d) = &h.downlink {
                fmt_port(f, "downlink", d)?;
            }
            if let Some(u) = &h.uplink {
                fmt_port(f, "uplink  ", u)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_interface_limits() {
        let n = Names::new("abcdefghi");
        assert!(n.port(249).len() <= 15);
        assert!(n.bridge().len() <= 15);
        assert_eq!(n.ns(3), "abcdefghi-h3");
        assert!(validate_prefix("homa").is_ok());
        assert!(validate_prefix("").is_err());
        assert!(validate_prefix("toolongprefix").is_err());
        assert!(validate_prefix("a-b").is_err());
        assert!(validate_prefix("Ab").is_err());
    }

    #[test]
    fn addresses_and_macs() {
        assert_eq!(host_addr(0), Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(host_addr(9), Ipv4Addr::new(10, 77, 0, 10));
        assert_eq!(host_mac(0), "02:77:00:00:00:00");
        assert_eq!(host_mac(300), "02:77:00:00:01:2c");
    }

    #[test]
    fn config_validation() {
        assert!(TestbedConfig::default().validate().is_ok());
        let bad = |f: fn(&mut TestbedConfig)| {
            let mut c = TestbedConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.hosts = 1));
        assert!(bad(|c| c.gbps = 0.0));
        assert!(bad(|c| c.gbps = f64::NAN));
        assert!(bad(|c| c.priorities = 9));
        assert!(bad(|c| c.priorities = 0));
        assert!(bad(|c| c.queue_packets = 0));
    }

    #[test]
    fn snapshot_sums() {
        use crate::tc::ClassStats;
        let port = |a: u64, b: u64| PortStats {
            link: ClassStats {
                class: None,
                bytes: 100,
                packets: a + b,
                drops: 0,
            },
            classes: vec![
                ClassStats {
                    class: Some(0),
                    bytes: 0,
                    packets: a,
                    drops: 1,
                },
                ClassStats {
                    class: Some(7),
                    bytes: 0,
                    packets: b,
                    drops: 0,
                },
            ],
        };
        let s = Snapshot {
            downlinks: vec![port(1, 2), port(3, 4)],
            uplinks: vec![port(0, 0)],
        };
        assert_eq!(s.drops(), 3);
        let by = s.downlink_packets_by_class();
        assert_eq!((by[0], by[7], by.len()), (4, 6, 8));
        assert_eq!(s.downlink_bytes(), 200);
        let d = s.delta(&s);
        assert_eq!(d.drops(), 0);
        assert_eq!(d.downlink_packets_by_class()[7], 0);
    }
}
