//! A master: serves one slot of the key space from its [`Log`]. Reads are
//! answered from the index alone; every write is appended to the log and
//! sent to all R backups by parallel nested RPCs, and acknowledged (and
//! made visible) once every one of them has it. A backup that does not
//! answer is replaced by another live one, which first receives the whole
//! log. A master that starts recovers its slot from every backup.

use crate::log::Log;
use crate::proto::{
    backup, coord, encode_read_reply, master, slot_of, Append, DropOlder, EnlistMaster, Entry,
    Fetch, Grant, Ready, Table, Versioned, WriteReq, MAX_KEY, MAX_MESSAGE, MAX_VALUE, NOT_OWNER,
    VERSION_MISMATCH, W_CONDITIONAL, W_DELETE,
};
use bytes::Bytes;
use homa_rpc::{Code, Context, Status};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// How a master is run.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    pub coordinator: SocketAddr,
    /// The slot to serve (a restart names its slot); `None`: the first
    /// free one.
    pub slot: Option<u32>,
    /// Backups each write goes to before it is acknowledged.
    pub replicas: usize,
    /// How long a replication call may take before its backup is taken
    /// for dead and replaced.
    pub replication_timeout: Duration,
    /// How long to wait at start for enough backups to enlist.
    pub wait_for_backups: Duration,
    /// The busy-poll time of the endpoint replication calls go through
    /// (None: the server endpoint's).
    pub nested_poll: Option<Duration>,
    /// How often the replicas are pinged between writes.
    pub watch_period: Duration,
}

impl MasterConfig {
    pub fn new(coordinator: SocketAddr) -> MasterConfig {
        MasterConfig {
            coordinator,
            slot: None,
            replicas: 3,
            replication_timeout: Duration::from_millis(200),
            wait_for_backups: Duration::from_secs(10),
            nested_poll: None,
            watch_period: Duration::from_millis(250),
        }
    }
}

/// What a master knows about its start (for logs and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub grant: Grant,
    /// Entries read from backups, and the live objects they made.
    pub entries_found: usize,
    pub objects: usize,
    pub replicas: Vec<SocketAddr>,
    pub took: Duration,
}

/// The replication side, one writer at a time.
#[derive(Debug)]
struct Writer {
    replicas: Vec<SocketAddr>,
    /// Every replica holds the whole log (false after a failed write).
    synced: bool,
    /// Backups this master gave up on.
    dead: Vec<SocketAddr>,
}

/// The master service.
pub struct Master {
    grant: Grant,
    coordinator: SocketAddr,
    replicas: usize,
    timeout: Duration,
    log: RwLock<Log>,
    writer: Mutex<Writer>,
    /// A newer incarnation fenced this one off: it serves nothing more.
    fenced: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Master {
    /// Enlists with the coordinator, recovers the slot from the backups
    /// and replicates the recovered log to `replicas` of them. The caller
    /// then serves it and calls [`Master::announce`].
    pub fn recover(
        cfg: &MasterConfig,
        rpc: &homa_rpc::Client,
    ) -> Result<(Master, Recovered), Status> {
        let t0 = Instant::now();
        let co = coord::Client::new(rpc.with_timeout(Duration::from_secs(2)), cfg.coordinator);
        let grant = co.enlist_master(&EnlistMaster { slot: cfg.slot })?;
        let table = wait_for_backups(&co, cfg.replicas, cfg.wait_for_backups)?;
        let found = fetch_all(rpc, &table.backups, grant.slot, grant.epoch);
        let entries_found = found.len();
        let log = Log::recovered(grant.epoch, found);
        let n = table.backups.len();
        let first = (grant.slot as usize * cfg.replicas) % n.max(1);
        let replicas = (0..cfg.replicas.min(n))
            .map(|i| table.backups[(first + i) % n])
            .collect();
        let m = Master {
            grant: grant.clone(),
            coordinator: cfg.coordinator,
            replicas: cfg.replicas,
            timeout: cfg.replication_timeout,
            log: RwLock::new(log),
            writer: Mutex::new(Writer {
                replicas,
                synced: false,
                dead: Vec::new(),
            }),
            fenced: AtomicBool::new(false),
        };
        {
            let mut w = lock(&m.writer);
            m.resync(&rpc.with_timeout(cfg.replication_timeout * 5), &mut w)?;
        }
        // Older incarnations' entries are now superseded everywhere.
        let drop = DropOlder {
            slot: grant.slot,
            epoch: grant.epoch,
        };
        let calls: Vec<_> = table
            .backups
            .iter()
            .filter_map(|a| {
                backup::Client::new(rpc.with_timeout(cfg.replication_timeout), *a)
                    .start()
                    .drop_older(&drop)
                    .ok()
            })
            .collect();
        for c in calls {
            let _ = c.wait();
        }
        let r = Recovered {
            grant,
            entries_found,
            objects: m.read_log().live_keys(),
            replicas: lock(&m.writer).replicas.clone(),
            took: t0.elapsed(),
        };
        Ok((m, r))
    }

    /// Tells the coordinator that this master serves its slot at `addr`.
    pub fn announce(&self, rpc: &homa_rpc::Client, addr: SocketAddr) -> Result<(), Status> {
        coord::Client::new(rpc.with_timeout(Duration::from_secs(2)), self.coordinator).master_ready(
            &Ready {
                slot: self.grant.slot,
                epoch: self.grant.epoch,
                addr,
            },
        )
    }

    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The backups that hold this master's log now.
    pub fn replica_set(&self) -> Vec<SocketAddr> {
        lock(&self.writer).replicas.clone()
    }

    pub fn replication_timeout(&self) -> Duration {
        self.timeout
    }

    /// Pings every replica (in parallel, without holding up writes) and
    /// replaces those that do not answer, as a failed write would.
    pub fn check_replicas(&self, rpc: &homa_rpc::Client) {
        if self.fenced.load(Ordering::Relaxed) {
            return;
        }
        let replicas = self.replica_set();
        let calls: Vec<_> = replicas
            .iter()
            .map(|r| backup::Client::new(rpc.clone(), *r).start().ping(&()))
            .collect();
        let failed: Vec<_> = replicas
            .iter()
            .zip(calls)
            .filter_map(|(r, c)| c.and_then(|c| c.wait()).err().map(|s| (*r, s)))
            .collect();
        if failed.is_empty() {
            return;
        }
        let mut w = lock(&self.writer);
        for (dead, s) in failed {
            // A write may have replaced it meanwhile.
            if w.replicas.contains(&dead) && self.replace(rpc, &mut w, dead, &s).is_err() {
                w.synced = false;
            }
        }
    }

    fn read_log(&self) -> std::sync::RwLockReadGuard<'_, Log> {
        self.log.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_log(&self) -> std::sync::RwLockWriteGuard<'_, Log> {
        self.log.write().unwrap_or_else(|p| p.into_inner())
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Status> {
        if self.fenced.load(Ordering::Relaxed) {
            return Err(Status::unavailable("this master was superseded"));
        }
        if key.len() > MAX_KEY {
            return Err(Status::invalid_argument(format!(
                "key of {} bytes (at most {MAX_KEY})",
                key.len()
            )));
        }
        if slot_of(key, self.grant.slots) != self.grant.slot {
            return Err(Status::new(Code::FailedPrecondition, NOT_OWNER));
        }
        Ok(())
    }

    /// Sends `entries` to every replica at once and waits for all; a
    /// replica that fails is replaced (the replacement gets the whole
    /// log, which includes `entries`).
    fn replicate(
        &self,
        rpc: &homa_rpc::Client,
        w: &mut Writer,
        entries: Vec<Entry>,
    ) -> Result<(), Status> {
        let a = Append {
            slot: self.grant.slot,
            epoch: self.grant.epoch,
            entries,
        };
        homa::tt!("kv replicate start");
        // Fan-out: every call leaves before the first is waited for.
        let calls: Vec<_> = w
            .replicas
            .iter()
            .map(|r| rpc.start::<Append, ()>(*r, backup::ids::append, &a))
            .collect();
        let mut failed = Vec::new();
        for (i, c) in calls.into_iter().enumerate() {
            if let Err(s) = c.and_then(|c| c.wait()) {
                failed.push((w.replicas[i], s));
            }
        }
        homa::tt!("kv replicate done");
        for (dead, s) in failed {
            self.replace(rpc, w, dead, &s)?;
        }
        if w.replicas.len() < self.replicas {
            return Err(Status::unavailable(format!(
                "{} of {} backups",
                w.replicas.len(),
                self.replicas
            )));
        }
        Ok(())
    }

    /// Replaces replica `dead` (which failed with `why`) by a live backup
    /// that does not hold this log yet, and copies the whole log to it.
    fn replace(
        &self,
        rpc: &homa_rpc::Client,
        w: &mut Writer,
        dead: SocketAddr,
        why: &Status,
    ) -> Result<(), Status> {
        if why.code() == Code::Aborted {
            self.fenced.store(true, Ordering::Relaxed);
            return Err(Status::unavailable("this master was superseded"));
        }
        eprintln!(
            "kv master {}: backup {dead} failed ({why}); replacing it",
            self.grant.slot
        );
        w.replicas.retain(|r| *r != dead);
        w.dead.push(dead);
        let co = coord::Client::new(rpc.with_timeout(Duration::from_secs(1)), self.coordinator);
        // Ask the coordinator to check it, without waiting.
        let _ = co.start().suspect(&dead);
        self.fill(rpc, w, &co)
    }

    /// Adds live backups until there are `replicas`, each first given the
    /// whole log.
    fn fill(
        &self,
        rpc: &homa_rpc::Client,
        w: &mut Writer,
        co: &coord::Client,
    ) -> Result<(), Status> {
        if w.replicas.len() >= self.replicas {
            return Ok(());
        }
        let table = co.table(&())?;
        let n = table.backups.len().max(1);
        let start = (self.grant.slot as usize * self.replicas) % n;
        for i in 0..table.backups.len() {
            if w.replicas.len() >= self.replicas {
                break;
            }
            let cand = table.backups[(start + i) % n];
            if w.replicas.contains(&cand) || w.dead.contains(&cand) {
                continue;
            }
            let entries = self.read_log().entries().to_vec();
            match send_log(rpc, cand, self.grant.slot, self.grant.epoch, entries) {
                Ok(()) => {
                    eprintln!(
                        "kv master {}: backup {cand} now holds the log",
                        self.grant.slot
                    );
                    w.replicas.push(cand);
                }
                Err(s) if s.code() == Code::Aborted => {
                    self.fenced.store(true, Ordering::Relaxed);
                    return Err(Status::unavailable("this master was superseded"));
                }
                Err(_) => w.dead.push(cand),
            }
        }
        if w.replicas.len() < self.replicas {
            return Err(Status::unavailable(format!(
                "only {} live backups for {} replicas",
                w.replicas.len(),
                self.replicas
            )));
        }
        Ok(())
    }

    /// Makes every replica hold the whole log (after a failed write or at
    /// start), then makes every entry visible.
    fn resync(&self, rpc: &homa_rpc::Client, w: &mut Writer) -> Result<(), Status> {
        let co = coord::Client::new(rpc.with_timeout(Duration::from_secs(1)), self.coordinator);
        self.fill(rpc, w, &co)?;
        let entries = self.read_log().entries().to_vec();
        for r in w.replicas.clone() {
            if let Err(s) = send_log(rpc, r, self.grant.slot, self.grant.epoch, entries.clone()) {
                // Its replacement gets the whole log.
                self.replace(rpc, w, r, &s)?;
            }
        }
        w.synced = true;
        self.write_log().apply_all();
        Ok(())
    }
}

impl master::Service for Master {
    fn read(&self, _cx: &Context, m: homa::Message) -> Result<Bytes, Status> {
        let key = m.contiguous();
        self.check_key(&key)?;
        match self.read_log().get(&key) {
            Some(v) => Ok(encode_read_reply(v.version, &v.value)),
            None => Err(Status::not_found("")),
        }
    }

    fn write(&self, cx: &Context, m: homa::Message) -> Result<u64, Status> {
        let req = WriteReq::decode(m)?;
        self.check_key(&req.key)?;
        if req.value.len() > MAX_VALUE {
            return Err(Status::resource_exhausted(format!(
                "value of {} bytes (at most {MAX_VALUE})",
                req.value.len()
            )));
        }
        let rpc = cx.client()?.with_timeout(self.timeout);
        let mut w = lock(&self.writer);
        if !w.synced {
            self.resync(&rpc, &mut w)?;
        }
        // A retry of a write that was applied: its version, once.
        if let Some(v) = self.read_log().done(req.id) {
            return Ok(v);
        }
        let current = self.read_log().current_version(&req.key);
        if req.flags & W_CONDITIONAL != 0 && current != req.expected {
            return Err(Status::new(
                Code::Aborted,
                format!("{VERSION_MISMATCH}{current}"),
            ));
        }
        let delete = req.flags & W_DELETE != 0;
        if delete && current == 0 {
            return Ok(0);
        }
        let value = (!delete).then_some(req.value);
        let e = self.write_log().append(req.key, value, req.id);
        let version = e.version;
        match self.replicate(&rpc, &mut w, vec![e]) {
            Ok(()) => {
                self.write_log().apply_all();
                Ok(version)
            }
            Err(s) => {
                // The entry stays in the log, unapplied; the next write
                // first makes it durable (or this master is fenced).
                w.synced = false;
                Err(s)
            }
        }
    }

    fn multi_read(
        &self,
        _cx: &Context,
        keys: Vec<Bytes>,
    ) -> Result<Vec<Option<Versioned>>, Status> {
        for k in &keys {
            self.check_key(k)?;
        }
        let log = self.read_log();
        Ok(keys.iter().map(|k| log.get(k)).collect())
    }
}

/// Waits until at least `n` backups have enlisted.
fn wait_for_backups(co: &coord::Client, n: usize, wait: Duration) -> Result<Table, Status> {
    let end = Instant::now() + wait;
    loop {
        let t = co.table(&())?;
        if t.backups.len() >= n {
            return Ok(t);
        }
        if Instant::now() > end {
            return Err(Status::unavailable(format!(
                "{} backups enlisted, {n} needed",
                t.backups.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything every backup holds for `slot`, fetched in pages, from all
/// backups at once (one thread each). A backup that does not answer is
/// skipped: it lost its copy (backups keep theirs in memory).
fn fetch_all(rpc: &homa_rpc::Client, backups: &[SocketAddr], slot: u32, epoch: u64) -> Vec<Entry> {
    let rpc = rpc.with_timeout(Duration::from_secs(2));
    std::thread::scope(|s| {
        let jobs: Vec<_> = backups
            .iter()
            .map(|a| {
                let stub = backup::Client::new(rpc.clone(), *a);
                s.spawn(move || {
                    let mut got = Vec::new();
                    let mut after = None;
                    loop {
                        let page = stub.fetch(&Fetch {
                            slot,
                            epoch,
                            after,
                            max_bytes: (MAX_MESSAGE / 2) as u32,
                        });
                        match page {
                            Ok(p) => {
                                after = p.entries.last().map(|e| (e.epoch, e.seq));
                                got.extend(p.entries);
                                if !p.more {
                                    return got;
                                }
                            }
                            Err(e) => {
                                eprintln!("kv master {slot}: backup {a} skipped in recovery: {e}");
                                return got;
                            }
                        }
                    }
                })
            })
            .collect();
        jobs.into_iter()
            .flat_map(|j| j.join().unwrap_or_default())
            .collect()
    })
}

/// Sends `entries` to one backup in messages under the Homa limit, a few
/// in flight at once.
fn send_log(
    rpc: &homa_rpc::Client,
    to: SocketAddr,
    slot: u32,
    epoch: u64,
    entries: Vec<Entry>,
) -> Result<(), Status> {
    let budget = MAX_MESSAGE - 4096;
    let mut chunks: Vec<Vec<Entry>> = vec![Vec::new()];
    let mut size = 0;
    for e in entries {
        let n = e.wire_len();
        if size + n > budget && !chunks.last().is_some_and(|c| c.is_empty()) {
            chunks.push(Vec::new());
            size = 0;
        }
        size += n;
        chunks.last_mut().expect("one chunk").push(e);
    }
    let stub = backup::Client::new(rpc.clone(), to);
    for group in chunks.chunks(4) {
        let calls: Vec<_> = group
            .iter()
            .map(|c| {
                stub.start().append(&Append {
                    slot,
                    epoch,
                    entries: c.clone(),
                })
            })
            .collect();
        for c in calls {
            c?.wait()?;
        }
    }
    Ok(())
}
