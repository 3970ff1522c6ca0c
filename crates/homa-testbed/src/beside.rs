//! Issue #21's "short RPCs beside a saturating stream" where the network,
//! not the CPU, is the bottleneck (`homa bench beside`; `docs/streams.md`
//! §4.1 has the design and the results).
//!
//! On loopback (`homa stream-bench`) a stream saturates the CPUs, and the
//! kernel's scheduler decides when an RPC's threads run; there are no
//! switch priorities either. Here three testbed hosts share a bridge whose
//! ports are shaped to the link rate with strict-priority classes by DSCP
//! (`crate::tc`): host 1 writes one Homa stream to host 0 as fast as the
//! stream's credit lets it (64 KB messages), and host 2 times 100-byte
//! RPCs to host 0, alone and beside the stream. The stream's packets go at
//! the priority of a message as long as what the stream can send now
//! (`docs/streams.md` §2.4), the RPCs' at the highest: at host 0's
//! downlink they pass the stream's queue.
//!
//! The same for TCP: 100-byte echoes on one connection from host 2, alone
//! and beside one bulk TCP flow from host 1 (both TCP, so both in the
//! class DSCP 0 maps to: a FIFO they share).

use crate::bulk::{self, FlowSpec};
use crate::cluster::{self, ClusterConfig};
use crate::netns::{run_in, spawn_in};
use crate::testbed::{host_addr, Testbed, TestbedConfig};
use crate::{Error, Result};
use bytes::Bytes;
use homa::Endpoint;
use homa_workload::stats::percentile;
use homa_workload::workload::Workload;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Homa server's port on host 0 (RPCs and the stream).
const HOMA_PORT: u16 = 7100;
/// The TCP echo server's port on host 0.
const TCP_PORT: u16 = 7200;
/// Bytes of each RPC request and response.
const RPC_BYTES: usize = 100;
/// Bytes per stream write.
const CHUNK: usize = 64 * 1024;

/// What to run.
#[derive(Clone)]
pub struct BesideConfig {
    pub testbed: TestbedConfig,
    /// Timed RPCs per phase (after a tenth as many untimed).
    pub rpcs: usize,
    /// How long the stream (or bulk flow) runs before the timed RPCs start.
    pub warmup: Duration,
    /// The engine's RTT estimate, µs (the testbed's one-packet echo).
    pub rtt_us: u64,
    /// Homa busy-poll time, µs (0: sleep at once, as the cluster bench).
    pub poll_us: u64,
    /// Last word on the engine's parameters (the CLI's `--set`).
    pub adjust_engine: Option<cluster::EngineHook>,
    pub progress: bool,
}

impl BesideConfig {
    pub fn new() -> BesideConfig {
        BesideConfig {
            testbed: TestbedConfig {
                prefix: "hbes".into(),
                hosts: 3,
                ..TestbedConfig::default()
            },
            rpcs: 2000,
            warmup: Duration::from_millis(500),
            rtt_us: 300,
            poll_us: 0,
            adjust_engine: None,
            progress: true,
        }
    }
}

impl Default for BesideConfig {
    fn default() -> Self {
        BesideConfig::new()
    }
}

/// Round-trip times of one phase, µs.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub rpcs: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// One transport: alone, beside its bulk transfer, and that transfer's rate.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub transport: String,
    pub alone: Latency,
    pub beside: Latency,
    /// The stream's (or bulk flow's) goodput while the RPCs ran, Mbit/s.
    pub bulk_mbps: f64,
    /// `beside.p99_us / alone.p99_us`.
    pub p99_ratio: f64,
    /// Packets through every downlink per priority class while the RPCs
    /// ran beside the bulk transfer (index = class; TCP uses class 0).
    pub packets_by_class: Vec<u64>,
    /// Packets any queue dropped meanwhile.
    pub drops: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BesideReport {
    pub gbps: f64,
    pub priorities: u8,
    pub homa: Side,
    pub tcp: Side,
}

impl BesideReport {
    pub fn text(&self) -> String {
        let mut s = format!(
            "testbed: {} Gbit/s links, {} priority classes\n",
            self.gbps, self.priorities
        );
        for side in [&self.homa, &self.tcp] {
            s += &format!(
                "{:<5} 100 B RPCs alone p50 {:.0} p99 {:.0} us; beside {:.1} Mbit/s of bulk: p50 {:.0} p99 {:.0} us (p99 {:.2}x)\n",
                side.transport,
                side.alone.p50_us,
                side.alone.p99_us,
                side.bulk_mbps,
                side.beside.p50_us,
                side.beside.p99_us,
                side.p99_ratio
            );
            s += &format!(
                "      downlink packets by class meanwhile {:?}, drops {}\n",
                side.packets_by_class, side.drops
            );
        }
        s
    }
}

fn say(on: bool, what: &str) {
    if on {
        eprintln!("beside: {what}");
    }
}

fn latency(mut ns: Vec<u64>) -> Latency {
    ns.sort_unstable();
    let us: Vec<f64> = ns.iter().map(|&n| n as f64 / 1e3).collect();
    Latency {
        rpcs: us.len(),
        p50_us: percentile(&us, 50.0),
        p99_us: percentile(&us, 99.0),
        max_us: us.last().copied().unwrap_or(0.0),
    }
}

fn side(
    transport: &str,
    alone: Vec<u64>,
    beside: Vec<u64>,
    bulk_mbps: f64,
    queues: crate::testbed::Snapshot,
) -> Side {
    let (alone, beside) = (latency(alone), latency(beside));
    Side {
        transport: transport.into(),
        p99_ratio: beside.p99_us / alone.p99_us.max(1e-9),
        alone,
        beside,
        bulk_mbps,
        packets_by_class: queues.downlink_packets_by_class(),
        drops: queues.drops(),
    }
}

/// Runs `op` `n / 10` times untimed, then `n` times timed: the times, ns.
fn timed(n: usize, mut op: impl FnMut() -> Result<()>) -> Result<Vec<u64>> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t0 = Instant::now();
        op()?;
        if i >= n / 10 {
            v.push(t0.elapsed().as_nanos() as u64);
        }
    }
    Ok(v)
}

/// Brings the testbed up, runs both transports, takes it down.
pub fn run(cfg: &BesideConfig) -> Result<BesideReport> {
    cfg.testbed.validate()?;
    if cfg.testbed.hosts < 3 {
        return Err(Error::config("the beside experiment needs 3 hosts"));
    }
    let tb = Testbed::up(&cfg.testbed)?.guard();
    run_on(&tb, cfg)
}

/// Runs both transports on a testbed that is up.
pub fn run_on(tb: &Testbed, cfg: &BesideConfig) -> Result<BesideReport> {
    let homa = homa_side(tb, cfg)?;
    let tcp = tcp_side(tb, cfg)?;
    Ok(BesideReport {
        gbps: cfg.testbed.gbps,
        priorities: cfg.testbed.priorities,
        homa,
        tcp,
    })
}

/// The engine configuration: the cluster bench's derivation for this link
/// and RTT (W4's sizes for the priority plan), then `--set`.
fn homa_endpoint_config(cfg: &BesideConfig) -> Result<homa::EndpointConfig> {
    let w = Workload::builtin("w4").map_err(|e| Error::config(e.to_string()))?;
    let mut c = ClusterConfig::new(w, 0.5);
    c.testbed = cfg.testbed.clone();
    c.poll_us = cfg.poll_us;
    c.adjust_engine = cfg.adjust_engine.clone();
    c.engine_levels = Some(cfg.testbed.priorities);
    let (hc, _) = cluster::homa_config(&c, cfg.rtt_us * 1000);
    Ok(hc)
}

fn homa_side(tb: &Testbed, cfg: &BesideConfig) -> Result<Side> {
    let hc = homa_endpoint_config(cfg)?;
    let server_addr = SocketAddr::new(host_addr(0).into(), HOMA_PORT);
    let c = hc.clone();
    let server = run_in(&tb.ns(0), move || {
        homa_bench::node::homa_node::bind_server(server_addr, &c)
            .map_err(|e| Error::bench(e.to_string()))
    })?;
    let srv = server.clone();
    let serve = std::thread::Builder::new()
        .name("beside-serve".into())
        .spawn(move || {
            let _ = srv.serve(|req| {
                let m = req.message().to_vec();
                let _ = req.reply(m);
            });
        })
        .map_err(|e| Error::bench(format!("spawn: {e}")))?;
    let received = Arc::new(AtomicU64::new(0));
    let srv = server.clone();
    let got = received.clone();
    let reader = std::thread::Builder::new()
        .name("beside-reader".into())
        .spawn(move || -> Result<()> {
            let Ok(mut s) = srv.accept_stream() else {
                return Ok(());
            };
            while let Ok(Some(c)) = s.recv_chunk() {
                got.fetch_add(c.bytes.len() as u64, Ordering::Relaxed);
            }
            Ok(())
        })
        .map_err(|e| Error::bench(format!("spawn: {e}")))?;
    let c = hc.clone();
    let client = run_in(&tb.ns(2), move || {
        Endpoint::bind_with(SocketAddr::new(host_addr(2).into(), 0), c)
            .map_err(|e| Error::bench(e.to_string()))
    })?;
    let call = |n: usize| -> Result<Vec<u64>> {
        let msg = Bytes::from(vec![7u8; RPC_BYTES]);
        timed(n, || {
            let r = client
                .call(server_addr, msg.clone())
                .map_err(|e| Error::bench(format!("Homa RPC: {e}")))?;
            if r.len() != RPC_BYTES {
                return Err(Error::bench("Homa RPC: short response"));
            }
            Ok(())
        })
    };
    say(cfg.progress, "Homa: 100 B RPCs alone");
    let alone = call(cfg.rpcs)?;
    say(cfg.progress, "Homa: 100 B RPCs beside a stream");
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let c = hc.clone();
    let writer = spawn_in(&tb.ns(1), "beside-writer".into(), move || -> Result<()> {
        let ep = Endpoint::bind_with(SocketAddr::new(host_addr(1).into(), 0), c)
            .map_err(|e| Error::bench(e.to_string()))?;
        let mut s = ep
            .open_stream(server_addr)
            .map_err(|e| Error::bench(e.to_string()))?;
        let chunk = Bytes::from(vec![1u8; CHUNK]);
        while !st.load(Ordering::Relaxed) {
            s.send(chunk.clone())
                .map_err(|e| Error::bench(format!("stream: {e}")))?;
        }
        s.cancel();
        Ok(())
    })?;
    std::thread::sleep(cfg.warmup);
    let (b0, t0, q0) = (
        received.load(Ordering::Relaxed),
        Instant::now(),
        tb.snapshot()?,
    );
    let beside = call(cfg.rpcs);
    let mbps =
        (received.load(Ordering::Relaxed) - b0) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e6;
    let queues = tb.snapshot()?.delta(&q0);
    stop.store(true, Ordering::Relaxed);
    let w = writer
        .join()
        .map_err(|_| Error::bench("stream writer panicked"))?;
    server.shutdown();
    let _ = serve.join();
    let _ = reader.join();
    w?;
    Ok(side("homa", alone, beside?, mbps, queues))
}

fn tcp_side(tb: &Testbed, cfg: &BesideConfig) -> Result<Side> {
    let addr = SocketAddr::new(host_addr(0).into(), TCP_PORT);
    let listener = run_in(&tb.ns(0), move || Ok(TcpListener::bind(addr)?))?;
    let server = std::thread::Builder::new()
        .name("beside-tcp-echo".into())
        .spawn(move || -> Result<()> {
            let (mut s, _) = listener.accept()?;
            s.set_nodelay(true)?;
            let mut buf = [0u8; RPC_BYTES];
            loop {
                match s.read_exact(&mut buf) {
                    Ok(()) => s.write_all(&buf)?,
                    Err(_) => return Ok(()),
                }
            }
        })
        .map_err(|e| Error::bench(format!("spawn: {e}")))?;
    let mut conn = run_in(&tb.ns(2), move || {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        Ok(s)
    })?;
    let mut echo = |n: usize| -> Result<Vec<u64>> {
        let msg = [7u8; RPC_BYTES];
        let mut back = [0u8; RPC_BYTES];
        timed(n, || {
            conn.write_all(&msg)?;
            conn.read_exact(&mut back)?;
            Ok(())
        })
    };
    say(cfg.progress, "TCP: 100 B echoes alone");
    let alone = echo(cfg.rpcs)?;
    say(cfg.progress, "TCP: 100 B echoes beside a bulk flow");
    let flows = bulk::start(
        tb,
        &[FlowSpec {
            sender: 1,
            receiver: 0,
        }],
        "cubic",
    )?;
    std::thread::sleep(cfg.warmup);
    let (b0, t0, q0) = (flows.received_bytes(), Instant::now(), tb.snapshot()?);
    let beside = echo(cfg.rpcs);
    let mbps = (flows.received_bytes() - b0) as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e6;
    let queues = tb.snapshot()?.delta(&q0);
    flows.stop()?;
    drop(conn);
    let _ = server.join();
    Ok(side("tcp", alone, beside?, mbps, queues))
}
