//! The soak test: 100,000 RPCs with random request and response sizes from
//! 1 byte to 1,000,000 bytes (log-uniform, so every size class is well covered)
//! among 8 endpoints, under 5% loss, 10% reordering, 1% duplication and 0.1%
//! corruption. Every RPC must complete exactly once with exactly the bytes sent
//! (compared byte by byte against a regenerated pattern), no request may be
//! executed twice, and at the end every endpoint's RPC and peer tables and its
//! receive pool must be empty.
//!
//! `HOMA_SOAK_RPCS` overrides the number of RPCs (default 100,000). Run it in
//! release mode (`cargo test --release`): it is sized for that.

use bytes::Bytes;
use homa_proto::{Config, Event, Message, RpcId};
use homa_testnet::{App, EngineNet, Fabric, FaultConfig, HostCtx};
use rand::Rng;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::rc::Rc;

const HOSTS: usize = 8;
const CONCURRENCY: usize = 8;
const MAX_LEN: f64 = 1_000_000.0;

/// What the harness knows about every RPC in flight (shared by all apps: the
/// test is omniscient, the endpoints are not).
#[derive(Default)]
struct Ledger {
    /// (client address, id) -> (request seed, request len, response seed, response len)
    rpcs: BTreeMap<(SocketAddr, u64), (u64, usize, u64, usize)>,
    executed: BTreeSet<(SocketAddr, u64)>,
    completed: u64,
    issued: u64,
    target: u64,
    errors: Vec<String>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `len` bytes determined by `seed`, fast to generate.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        v.extend_from_slice(&splitmix(seed ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03)).to_le_bytes());
        i += 1;
    }
    v.truncate(len);
    v
}

fn matches(msg: &Message, seed: u64, len: usize) -> bool {
    if msg.len() != len {
        return false;
    }
    let want = payload(seed, len);
    let mut at = 0;
    for frag in msg.fragments() {
        if frag != &want[at..at + frag.len()] {
            return false;
        }
        at += frag.len();
    }
    at == len
}

fn log_uniform(rng: &mut impl Rng) -> usize {
    (MAX_LEN.powf(rng.gen::<f64>()).floor() as usize).clamp(1, MAX_LEN as usize)
}

struct SoakApp {
    ledger: Rc<RefCell<Ledger>>,
}

impl SoakApp {
    fn issue(&mut self, ctx: &mut HostCtx<'_>) {
        let mut l = self.ledger.borrow_mut();
        if l.issued >= l.target {
            return;
        }
        l.issued += 1;
        let me = ctx.host();
        let mut dst = ctx.rng().gen_range(0..HOSTS - 1);
        if dst >= me {
            dst += 1;
        }
        let req_len = log_uniform(ctx.rng());
        let resp_len = log_uniform(ctx.rng());
        let req_seed: u64 = ctx.rng().gen();
        let resp_seed: u64 = ctx.rng().gen();
        let addr = ctx.addr();
        match ctx.send_request(dst, Bytes::from(payload(req_seed, req_len))) {
            Ok(id) => {
                l.rpcs
                    .insert((addr, id.0), (req_seed, req_len, resp_seed, resp_len));
            }
            Err(e) => l.errors.push(format!("send_request: {e}")),
        }
    }
}

impl App for SoakApp {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        for _ in 0..CONCURRENCY {
            self.issue(ctx);
        }
    }

    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        match event {
            Event::Request { rpc, message } => {
                let mut l = self.ledger.borrow_mut();
                let Some(&(req_seed, req_len, resp_seed, resp_len)) =
                    l.rpcs.get(&(rpc.peer, rpc.id))
                else {
                    l.errors.push(format!("request for unknown rpc {rpc:?}"));
                    return;
                };
                if !l.executed.insert((rpc.peer, rpc.id)) {
                    l.errors.push(format!("request {rpc:?} executed twice"));
                }
                if !matches(&message, req_seed, req_len) {
                    l.errors.push(format!("request {rpc:?} payload differs"));
                }
                drop(message);
                drop(l);
                if let Err(e) = ctx.send_response(rpc, Bytes::from(payload(resp_seed, resp_len))) {
                    self.ledger
                        .borrow_mut()
                        .errors
                        .push(format!("send_response: {e}"));
                }
            }
            Event::Response { id, message } => {
                {
                    let mut l = self.ledger.borrow_mut();
                    let key = (ctx.addr(), id.0);
                    match l.rpcs.remove(&key) {
                        Some((_, _, resp_seed, resp_len)) => {
                            if !matches(&message, resp_seed, resp_len) {
                                l.errors.push(format!("response {id:?} payload differs"));
                            }
                            l.completed += 1;
                        }
                        None => l
                            .errors
                            .push(format!("response for unknown or finished {id:?}")),
                    }
                }
                drop(message);
                self.issue(ctx);
            }
            Event::Failed { id, error } => {
                let RpcId(id) = id;
                self.ledger
                    .borrow_mut()
                    .errors
                    .push(format!("rpc {id} failed: {error}"));
                self.issue(ctx);
            }
            ev => self
                .ledger
                .borrow_mut()
                .errors
                .push(format!("not asked for: {ev:?}")),
        }
    }
}

#[test]
fn soak_100k_rpcs_under_faults() {
    let target: u64 = std::env::var("HOMA_SOAK_RPCS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let started = std::time::Instant::now();
    let ledger = Rc::new(RefCell::new(Ledger {
        target,
        ..Ledger::default()
    }));
    let mut fabric = Fabric::star(HOSTS, 25_000_000_000, 500, 250).with_seed(0x50a4);
    fabric.set_faults(FaultConfig {
        loss: 0.05,
        duplicate: 0.01,
        reorder: 0.10,
        reorder_max_ns: 20_000,
        corrupt: 0.001,
    });
    let config = Config::default()
        // Small enough that the pool fills up now and then under this load.
        .with_pool_bytes(16 << 20)
        .with_peer_idle_ns(100_000_000);
    let mut net = EngineNet::uniform(fabric, config, |_| SoakApp {
        ledger: ledger.clone(),
    })
    .unwrap();
    let limit = 3_600_000_000_000; // one virtual hour: never reached when healthy
    let done = net.run_until_cond(limit, |_| {
        let l = ledger.borrow();
        l.completed + l.errors.len() as u64 >= target || !l.errors.is_empty()
    });
    {
        let l = ledger.borrow();
        assert!(
            l.errors.is_empty(),
            "errors: {:?}",
            &l.errors[..l.errors.len().min(10)]
        );
        assert!(done, "only {} of {} RPCs completed", l.completed, target);
        assert_eq!(l.completed, target);
        assert_eq!(l.executed.len() as u64, target);
    }
    // Let ACKs, NEED_ACKs and peer garbage collection finish.
    let idle = net.run_until_cond(net.now() + 10_000_000_000, |net| {
        (0..HOSTS).all(|h| {
            let s = net.endpoint(h).stats();
            s.client_rpcs == 0 && s.server_rpcs == 0 && s.peers == 0 && s.pool_empty
        })
    });
    let mut totals = homa_proto::Metrics::default();
    for h in 0..HOSTS {
        let m = net.endpoint(h).metrics();
        totals.retransmitted_packets += m.retransmitted_packets;
        totals.resends_sent += m.resends_sent;
        totals.restarts += m.restarts;
        totals.timeouts += m.timeouts;
        totals.pool_waits += m.pool_waits;
        totals.data_bytes_received += m.data_bytes_received;
        for (i, d) in m.drops.iter().enumerate() {
            totals.drops[i] += d;
        }
    }
    eprintln!(
        "soak: {target} RPCs in {:.1?} wall, {:.3} s virtual; {:.2} GB delivered; faults {:?}; \
         resends {} retransmitted packets {} restarts {} pool waits {} timeouts {}; drops {:?}",
        started.elapsed(),
        net.now() as f64 / 1e9,
        totals.data_bytes_received as f64 / 1e9,
        net.fabric().fault_stats(),
        totals.resends_sent,
        totals.retransmitted_packets,
        totals.restarts,
        totals.pool_waits,
        totals.timeouts,
        homa_proto::DropReason::ALL
            .iter()
            .map(|r| (r.name(), totals.drops(*r)))
            .filter(|x| x.1 > 0)
            .collect::<Vec<_>>(),
    );
    for h in 0..HOSTS {
        let s = net.endpoint(h).stats();
        assert!(
            idle,
            "host {h} not idle at the end: {s:?} (metrics {:?})",
            net.endpoint(h).metrics()
        );
    }
    assert_eq!(totals.timeouts, 0, "no RPC may time out in the soak");
}
