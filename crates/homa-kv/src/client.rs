//! The client library: finds each key's master from the coordinator's
//! table, calls it, and retries through a master change (a restart, a
//! recovery, a stale table) until its retry budget runs out. Errors are
//! typed ([`KvError`]).

use crate::node::client_endpoint;
use crate::proto::{
    coord, decode_read_reply, master, slot_of, Table, Versioned, WriteReq, MAX_KEY, MAX_VALUE,
    NOT_OWNER, VERSION_MISMATCH, W_CONDITIONAL, W_DELETE,
};
use bytes::Bytes;
use homa_rpc::{Code, Raw, Status};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// What a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("key of {0} bytes: at most {MAX_KEY}")]
    KeyTooLong(usize),
    #[error("value of {0} bytes: at most {MAX_VALUE} (the Homa message limit less headers)")]
    ValueTooLarge(usize),
    /// A conditional write found another version.
    #[error("version mismatch: expected {expected}, current {current}")]
    VersionMismatch { expected: u64, current: u64 },
    /// No master answered within the retry budget. A write that ends so
    /// may or may not have been applied.
    #[error("no master answered within {waited:?}: {last}")]
    Unavailable { waited: Duration, last: Status },
    /// Any other refusal from a server.
    #[error("the store refused: {0}")]
    Refused(Status),
    #[error("could not open a client endpoint: {0}")]
    Endpoint(#[from] homa::Error),
}

/// A client of one store (cheap to clone; share it between threads).
#[derive(Debug)]
pub struct KvClient {
    rpc: homa_rpc::Client,
    /// This client's writes' ids: a random 64-bit client id, then a
    /// counter (the same id on every retry of one write).
    id: u64,
    writes: AtomicU64,
    coordinator: SocketAddr,
    table: RwLock<Table>,
    attempt: Duration,
    retry_for: Duration,
}

impl Clone for KvClient {
    fn clone(&self) -> KvClient {
        KvClient {
            rpc: self.rpc.clone(),
            id: new_client_id(),
            writes: AtomicU64::new(0),
            coordinator: self.coordinator,
            table: RwLock::new(self.table()),
            attempt: self.attempt,
            retry_for: self.retry_for,
        }
    }
}

impl KvClient {
    /// A client of the store whose coordinator is at `coordinator`, on a
    /// new endpoint.
    pub fn connect(coordinator: SocketAddr) -> Result<KvClient, KvError> {
        let ep = client_endpoint(coordinator)?;
        Self::with_rpc(homa_rpc::Client::new(ep), coordinator)
    }

    /// A client that calls through `rpc`'s endpoint.
    pub fn with_rpc(rpc: homa_rpc::Client, coordinator: SocketAddr) -> Result<KvClient, KvError> {
        let c = KvClient {
            rpc,
            id: new_client_id(),
            writes: AtomicU64::new(0),
            coordinator,
            table: RwLock::new(Table::default()),
            attempt: Duration::from_secs(2),
            retry_for: Duration::from_secs(10),
        };
        c.refresh().map_err(|last| KvError::Unavailable {
            waited: c.attempt,
            last,
        })?;
        Ok(c)
    }

    /// Each call's own timeout (default 2 s; a write waits for its
    /// replicas, and for a failed backup's replacement).
    pub fn with_attempt_timeout(mut self, t: Duration) -> KvClient {
        self.attempt = t;
        self
    }

    /// How long an operation retries through failures (default 10 s).
    pub fn with_retry_for(mut self, t: Duration) -> KvClient {
        self.retry_for = t;
        self
    }

    /// The coordinator's table, as last fetched.
    pub fn table(&self) -> Table {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Fetches the table again.
    pub fn refresh(&self) -> Result<(), Status> {
        let co = coord::Client::new(self.rpc.with_timeout(self.attempt), self.coordinator);
        let t = co.table(&())?;
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = t;
        Ok(())
    }

    fn master_of(&self, key: &[u8]) -> Option<SocketAddr> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        let slot = slot_of(key, t.masters.len() as u32) as usize;
        t.masters.get(slot).copied().flatten()
    }

    /// Runs `call` against `key`'s master until it succeeds, fails for
    /// good, or the retry budget is spent.
    fn retrying<T>(
        &self,
        key: &[u8],
        call: impl Fn(&homa_rpc::Client, SocketAddr) -> Result<T, Status>,
    ) -> Result<T, KvError> {
        let t0 = Instant::now();
        let rpc = self.rpc.with_timeout(self.attempt);
        let mut backoff = Duration::from_millis(1);
        let mut last = Status::unavailable("no master for the key");
        loop {
            if let Some(addr) = self.master_of(key) {
                match call(&rpc, addr) {
                    Ok(t) => return Ok(t),
                    Err(s) if retryable(&s) => last = s,
                    Err(s) => return Err(typed(s)),
                }
            }
            if t0.elapsed() > self.retry_for {
                return Err(KvError::Unavailable {
                    waited: t0.elapsed(),
                    last,
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(50));
            let _ = self.refresh();
        }
    }

    /// The object at `key` (None: there is none).
    pub fn get(&self, key: &[u8]) -> Result<Option<Versioned>, KvError> {
        check_key(key)?;
        let k = Bytes::copy_from_slice(key);
        self.retrying(key, |rpc, addr| {
            match rpc.call::<Raw, Raw>(addr, master::ids::read, &k) {
                Ok(m) => decode_read_reply(m).map(Some),
                Err(s) if s.code() == Code::NotFound => Ok(None),
                Err(s) => Err(s),
            }
        })
    }

    fn write(&self, mut req: WriteReq) -> Result<u64, KvError> {
        check_key(&req.key)?;
        let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        req.id = ((self.id as u128) << 64) | n as u128;
        if req.value.len() > MAX_VALUE {
            return Err(KvError::ValueTooLarge(req.value.len()));
        }
        let body = req.encode();
        self.retrying(&req.key, |rpc, addr| {
            rpc.call::<Raw, u64>(addr, master::ids::write, &body)
        })
        .map_err(|e| match e {
            KvError::VersionMismatch { current, .. } => KvError::VersionMismatch {
                expected: req.expected,
                current,
            },
            e => e,
        })
    }

    /// Writes `value` at `key`; returns the new version. Acknowledged
    /// only once every replica has it.
    pub fn put(&self, key: &[u8], value: impl Into<Bytes>) -> Result<u64, KvError> {
        self.write(WriteReq {
            flags: 0,
            id: 0,
            expected: 0,
            key: Bytes::copy_from_slice(key),
            value: value.into(),
        })
    }

    /// Writes only if the object's version is `expected` (0: only if there
    /// is no object); otherwise [`KvError::VersionMismatch`].
    pub fn put_if(
        &self,
        key: &[u8],
        value: impl Into<Bytes>,
        expected: u64,
    ) -> Result<u64, KvError> {
        self.write(WriteReq {
            flags: W_CONDITIONAL,
            id: 0,
            expected,
            key: Bytes::copy_from_slice(key),
            value: value.into(),
        })
    }

    /// Deletes `key` (nothing happens if there is no object).
    pub fn delete(&self, key: &[u8]) -> Result<(), KvError> {
        self.write(WriteReq {
            flags: W_DELETE,
            id: 0,
            expected: 0,
            key: Bytes::copy_from_slice(key),
            value: Bytes::new(),
        })
        .map(|_| ())
    }

    /// Several objects: one call per master, all in flight at once.
    pub fn multi_get(&self, keys: &[&[u8]]) -> Result<Vec<Option<Versioned>>, KvError> {
        for k in keys {
            check_key(k)?;
        }
        let t0 = Instant::now();
        let mut out: Vec<Option<Option<Versioned>>> = vec![None; keys.len()];
        let mut backoff = Duration::from_millis(1);
        let rpc = self.rpc.with_timeout(self.attempt);
        loop {
            // Group what is still missing by master.
            let mut groups: Vec<(SocketAddr, Vec<usize>)> = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                if let Some(a) = self.master_of(k) {
                    match groups.iter_mut().find(|g| g.0 == a) {
                        Some(g) => g.1.push(i),
                        None => groups.push((a, vec![i])),
                    }
                }
            }
            let calls: Vec<_> = groups
                .iter()
                .map(|(a, idx)| {
                    let ks: Vec<Bytes> = idx
                        .iter()
                        .map(|&i| Bytes::copy_from_slice(keys[i]))
                        .collect();
                    master::Client::new(rpc.clone(), *a).start().multi_read(&ks)
                })
                .collect();
            let mut last = None;
            for ((_, idx), c) in groups.iter().zip(calls) {
                match c.and_then(|c| c.wait()) {
                    Ok(vs) if vs.len() == idx.len() => {
                        for (&i, v) in idx.iter().zip(vs) {
                            out[i] = Some(v);
                        }
                    }
                    Ok(_) => return Err(KvError::Refused(Status::internal("short multi-read"))),
                    Err(s) if retryable(&s) => last = Some(s),
                    Err(s) => return Err(typed(s)),
                }
            }
            if out.iter().all(|o| o.is_some()) {
                return Ok(out.into_iter().map(|o| o.unwrap_or_default()).collect());
            }
            if t0.elapsed() > self.retry_for {
                return Err(KvError::Unavailable {
                    waited: t0.elapsed(),
                    last: last.unwrap_or_else(|| Status::unavailable("no master for a key")),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(50));
            let _ = self.refresh();
        }
    }
}

/// A random nonzero client id.
fn new_client_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

fn check_key(key: &[u8]) -> Result<(), KvError> {
    if key.len() > MAX_KEY {
        return Err(KvError::KeyTooLong(key.len()));
    }
    Ok(())
}

/// Failures another attempt (after a fresh table) may get past.
fn retryable(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => true,
        Code::FailedPrecondition => s.message() == NOT_OWNER,
        _ => false,
    }
}

fn typed(s: Status) -> KvError {
    match s.code() {
        Code::Aborted if s.message().starts_with(VERSION_MISMATCH) => KvError::VersionMismatch {
            expected: 0,
            current: s.message()[VERSION_MISMATCH.len()..].parse().unwrap_or(0),
        },
        Code::ResourceExhausted if s.message().starts_with("value of") => {
            KvError::ValueTooLarge(MAX_VALUE + 1)
        }
        _ => KvError::Refused(s),
    }
}
