//! Running the store's servers: a coordinator, a backup or a master on
//! its own Homa endpoint with its serving threads, in this process. The
//! processes (`homa kv coordinator|backup|master`), the local cluster
//! (`homa kv up`), the tests and the benchmark all start them this way.

use crate::backup::BackupService;
use crate::coordinator::Coordinator;
use crate::master::{Master, MasterConfig, Recovered};
use crate::proto::{backup, coord, master};
use homa::{Endpoint, EndpointConfig};
use homa_rpc::{Dispatch, Server};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A server running on its own threads. Stopping it (or dropping it)
/// shuts its endpoint down: to its peers it is as gone as a killed
/// process.
pub struct Running {
    pub addr: SocketAddr,
    server: Server,
    threads: Vec<JoinHandle<homa::Result<()>>>,
    /// A master's replica watcher: told to stop, then joined.
    watcher: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Running {
    fn start(
        ep: Endpoint,
        svc: impl Dispatch,
        threads: usize,
        name: &str,
        nested: Option<Endpoint>,
    ) -> Running {
        let addr = ep.local_addr();
        let mut b = Server::builder(ep).workers(1).service(svc);
        if let Some(n) = nested {
            b = b.nested_endpoint(n);
        }
        let server = b.build();
        let threads = threads.max(1);
        let threads = (0..threads)
            .map(|i| {
                let s = server.clone();
                std::thread::Builder::new()
                    .name(if threads == 1 {
                        name.to_string()
                    } else {
                        format!("{name}-{i}")
                    })
                    .spawn(move || s.serve())
                    .expect("a serving thread")
            })
            .collect();
        Running {
            addr,
            server,
            threads,
            watcher: None,
        }
    }

    /// Shuts the server down and waits for its threads.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if let Some((stop, t)) = self.watcher.take() {
            stop.store(true, Ordering::Relaxed);
            t.thread().unpark();
            let _ = t.join();
        }
        self.server.shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A client endpoint on the same side as `peer` (loopback or not).
pub fn client_endpoint(peer: SocketAddr) -> homa::Result<Endpoint> {
    if peer.ip().is_loopback() {
        Endpoint::bind("127.0.0.1:0")
    } else if peer.is_ipv4() {
        Endpoint::bind("0.0.0.0:0")
    } else {
        Endpoint::bind("[::]:0")
    }
}

/// Starts a coordinator of `slots` slots on `addr`.
pub fn start_coordinator(
    addr: SocketAddr,
    slots: u32,
    cfg: &EndpointConfig,
) -> anyhow::Result<Running> {
    let ep = Endpoint::bind_with(addr, cfg.clone())?;
    Ok(Running::start(
        ep,
        coord::server(Coordinator::new(slots)),
        1,
        "kv-coord",
        None,
    ))
}

/// Starts a backup on `addr` and enlists it with the coordinator. Its
/// serving thread is called `name`.
pub fn start_backup(
    addr: SocketAddr,
    coordinator: SocketAddr,
    cfg: &EndpointConfig,
    name: &str,
) -> anyhow::Result<Running> {
    let ep = Endpoint::bind_with(addr, cfg.clone())?;
    let r = Running::start(ep, backup::server(BackupService::default()), 1, name, None);
    let rpc = homa_rpc::Client::new(client_endpoint(coordinator)?);
    let co = coord::Client::new(rpc.with_timeout(Duration::from_secs(1)), coordinator);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match co.enlist_backup(&r.addr) {
            Ok(()) => return Ok(r),
            Err(e) if Instant::now() > end => {
                anyhow::bail!("the coordinator at {coordinator} did not answer: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Starts a master on `addr`: recovers its slot, serves it on `threads`
/// threads (called `name`, or `name-i` when there are several), and tells
/// the coordinator.
pub fn start_master(
    addr: SocketAddr,
    cfg: &MasterConfig,
    threads: usize,
    homa: &EndpointConfig,
    name: &str,
) -> anyhow::Result<(Running, Recovered)> {
    let ep = Endpoint::bind_with(addr, homa.clone())?;
    let rpc = homa_rpc::Client::new(client_endpoint(cfg.coordinator)?);
    let (m, rec) = Master::recover(cfg, &rpc)?;
    let m = Arc::new(m);
    // The replication calls' endpoint: the server's settings, with its
    // own busy-poll time if one is set.
    let nested = match cfg.nested_poll {
        Some(p) => {
            let mut c = homa.clone();
            c.poll = p;
            Some(Endpoint::bind_with(SocketAddr::new(addr.ip(), 0), c)?)
        }
        None => None,
    };
    let mut r = Running::start(ep, master::Server(m.clone()), threads, name, nested);
    m.announce(&rpc, r.addr)?;
    // Checks the replicas while no write does: a backup lost while the
    // master is idle is replaced within about a period, not at the next
    // write.
    let stop = Arc::new(AtomicBool::new(false));
    let (m2, stop2) = (m.clone(), stop.clone());
    let every = cfg.watch_period;
    let watcher = std::thread::Builder::new()
        .name(format!("{name}-watch"))
        .spawn(move || {
            let rpc = rpc.with_timeout(m2.replication_timeout());
            let mut next = Instant::now() + every;
            while !stop2.load(Ordering::Relaxed) {
                // Woken early (unpark) to stop.
                std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
                if Instant::now() >= next && !stop2.load(Ordering::Relaxed) {
                    m2.check_replicas(&rpc);
                    next = Instant::now() + every;
                }
            }
        })?;
    r.watcher = Some((stop, watcher));
    Ok((r, rec))
}
