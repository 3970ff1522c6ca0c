//! A whole store in one process on loopback: a coordinator, B backups and
//! M masters, each on its own endpoint and threads. `homa kv up`, the
//! benchmark and the in-process tests use it; stopping a node shuts its
//! endpoint, which its peers see as a dead process.

use crate::master::{MasterConfig, Recovered};
use crate::node::{start_backup, start_coordinator, start_master, Running};
use crate::KvClient;
use std::net::SocketAddr;
use std::time::Duration;

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub masters: u32,
    pub backups: usize,
    /// Backups per write (R).
    pub replicas: usize,
    /// Serving threads per master.
    pub master_threads: usize,
    pub replication_timeout: Duration,
    /// Every node's endpoint settings.
    pub homa: homa::EndpointConfig,
    /// The backups' busy-poll time, if not `homa.poll` (kv-bench).
    pub backup_poll: Option<Duration>,
    /// The busy-poll time of the masters' replication endpoint, if not
    /// `homa.poll`.
    pub nested_poll: Option<Duration>,
    /// The serving threads' names: masters', backups'.
    pub thread_names: (&'static str, &'static str),
}

impl Default for ClusterSpec {
    fn default() -> ClusterSpec {
        ClusterSpec {
            masters: 1,
            backups: 3,
            replicas: 3,
            master_threads: 1,
            replication_timeout: Duration::from_millis(200),
            homa: homa::EndpointConfig::default(),
            backup_poll: None,
            nested_poll: None,
            thread_names: ("kv-master", "kv-backup"),
        }
    }
}

/// The running store.
pub struct LocalCluster {
    // Dropped in this order: the masters stop before their backups (a
    // master that outlives a backup replaces it, and says so) and the
    // coordinator last.
    masters: Vec<Option<Running>>,
    backups: Vec<Option<Running>>,
    coordinator: Running,
    spec: ClusterSpec,
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl LocalCluster {
    pub fn start(spec: ClusterSpec) -> anyhow::Result<LocalCluster> {
        anyhow::ensure!(
            spec.backups >= spec.replicas,
            "{} backups cannot hold {} replicas",
            spec.backups,
            spec.replicas
        );
        let coordinator = start_coordinator(loopback(), spec.masters, &spec.homa)?;
        let mut c = LocalCluster {
            spec,
            coordinator,
            backups: Vec::new(),
            masters: Vec::new(),
        };
        for _ in 0..c.spec.backups {
            c.add_backup()?;
        }
        for slot in 0..c.spec.masters {
            c.masters.push(None);
            c.restart_master(slot)?;
        }
        Ok(c)
    }

    pub fn coordinator(&self) -> SocketAddr {
        self.coordinator.addr
    }

    /// A new client of the store.
    pub fn client(&self) -> Result<KvClient, crate::KvError> {
        KvClient::connect(self.coordinator())
    }

    /// The live backups' addresses (index: the order they started in).
    pub fn backups(&self) -> Vec<Option<SocketAddr>> {
        self.backups
            .iter()
            .map(|b| b.as_ref().map(|r| r.addr))
            .collect()
    }

    pub fn masters(&self) -> Vec<Option<SocketAddr>> {
        self.masters
            .iter()
            .map(|b| b.as_ref().map(|r| r.addr))
            .collect()
    }

    /// Starts one more backup; returns its index.
    pub fn add_backup(&mut self) -> anyhow::Result<usize> {
        let mut cfg = self.spec.homa.clone();
        if let Some(p) = self.spec.backup_poll {
            cfg.poll = p;
        }
        let b = start_backup(
            loopback(),
            self.coordinator(),
            &cfg,
            self.spec.thread_names.1,
        )?;
        self.backups.push(Some(b));
        Ok(self.backups.len() - 1)
    }

    /// Stops backup `i` (its replicas are gone with it).
    pub fn kill_backup(&mut self, i: usize) {
        if let Some(b) = self.backups.get_mut(i).and_then(|b| b.take()) {
            b.stop();
        }
    }

    /// Stops the master of `slot`.
    pub fn kill_master(&mut self, slot: u32) {
        if let Some(m) = self.masters.get_mut(slot as usize).and_then(|m| m.take()) {
            m.stop();
        }
    }

    /// Starts a master for `slot` (stopping the running one first): it
    /// recovers the slot from the backups.
    pub fn restart_master(&mut self, slot: u32) -> anyhow::Result<Recovered> {
        self.kill_master(slot);
        let mut cfg = MasterConfig::new(self.coordinator());
        cfg.slot = Some(slot);
        cfg.replicas = self.spec.replicas;
        cfg.replication_timeout = self.spec.replication_timeout;
        cfg.nested_poll = self.spec.nested_poll;
        let (r, rec) = start_master(
            loopback(),
            &cfg,
            self.spec.master_threads,
            &self.spec.homa,
            self.spec.thread_names.0,
        )?;
        self.masters[slot as usize] = Some(r);
        Ok(rec)
    }

    /// Stops everything.
    pub fn stop(self) {}
}
