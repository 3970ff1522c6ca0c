//! Bench server and client over Homa (the `homa` crate's runtime).

use super::{
    record, Arrival, ClientResult, ClientSpec, Schedule, ServerHandle, ServerSpec, ServerStats,
    Transport,
};
use super::{Error, Result};
use homa::{Endpoint, EndpointConfig, RpcId};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// The endpoint configuration for a transport: `homa-noprio` writes DSCP 0
/// into every packet, so the switch puts all of them in its lowest queue
/// while the engine itself is unchanged.
pub fn endpoint_config(transport: Transport, base: &EndpointConfig) -> EndpointConfig {
    let mut c = base.clone();
    if transport == Transport::HomaNoprio {
        c.dscp = [0; 8];
    }
    c
}

/// How long a server's bind retries an address still in use.
const BIND_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds a server endpoint at its fixed `addr`, retrying for up to
/// [`BIND_RETRY_FOR`] while the address is in use. A benchmark starts a
/// server where it has just stopped one (a probe, then the measured phase),
/// and in a process with other threads the closed socket can outlive its
/// `close` by a moment: a child being spawned (`ip`, `tc`) holds a copy of
/// every descriptor until its `exec`. With UDP no `SO_REUSEADDR` helps (it
/// would let two live sockets share the port). Measured here in Python: one
/// thread binding, closing and rebinding a UDP port while another spawned
/// `true` in a loop got `EADDRINUSE` on 122,996 of 357,930 binds; the
/// testbed tests, which run in parallel threads that spawn `tc`, failed
/// that way once in CI (2026-11-27).
pub fn bind_server(addr: SocketAddr, cfg: &EndpointConfig) -> Result<Endpoint> {
    let start = Instant::now();
    loop {
        match Endpoint::bind_with(addr, cfg.clone()) {
            Err(homa::Error::Io(e))
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && start.elapsed() < BIND_RETRY_FOR =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            r => return Ok(r?),
        }
    }
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

pub(crate) fn start_server(spec: &ServerSpec) -> Result<ServerHandle> {
    let cfg = endpoint_config(spec.transport, &spec.homa);
    let mut eps = Vec::new();
    for k in 0..spec.ports {
        let addr = SocketAddr::new(spec.ip, spec.base_port + k as u16);
        eps.push(bind_server(addr, &cfg)?);
    }
    let counters = Arc::new(Counters::default());
    let mut threads = Vec::new();
    for ep in &eps {
        for t in 0..spec.threads_per_port.max(1) {
            let (ep, c) = (ep.clone(), counters.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("homa-srv-{}-{t}", ep.local_addr().port()))
                    .spawn(move || serve(&ep, &c))?,
            );
        }
    }
    let addrs = eps.iter().map(Endpoint::local_addr).collect();
    Ok(ServerHandle {
        addrs,
        homa_endpoint: eps.first().cloned(),
        stop: Box::new(move || {
            for ep in &eps {
                ep.shutdown();
            }
            for t in threads {
                t.join()
                    .map_err(|_| Error::Bench("server thread panicked".into()))?;
            }
            Ok(ServerStats {
                requests: counters.requests.load(Relaxed),
                bytes: counters.bytes.load(Relaxed),
                errors: counters.errors.load(Relaxed),
            })
        }),
    })
}

/// Echoes requests inside this thread's own receive passes
/// (`Endpoint::serve`), each from the receive pool without a copy, until
/// the endpoint shuts down.
fn serve(ep: &Endpoint, c: &Counters) {
    let served = ep.serve(|req| {
        let (message, responder) = req.into_parts();
        let len = message.len() as u64;
        match responder.reply(message.into_bytes()) {
            Ok(()) => {
                c.requests.fetch_add(1, Relaxed);
                c.bytes.fetch_add(len, Relaxed);
            }
            // Shutting down, or the client abandoned the RPC meanwhile.
            Err(homa::Error::Shutdown) | Err(homa::Error::UnknownRpc) => {}
            Err(_) => {
                c.errors.fetch_add(1, Relaxed);
            }
        }
    });
    if !matches!(served, Ok(()) | Err(homa::Error::Shutdown)) {
        c.errors.fetch_add(1, Relaxed);
    }
}

/// One client port: an endpoint issuing the schedule's arrivals.
pub(crate) fn client_port(spec: &ClientSpec, mut sched: Schedule) -> Result<ClientResult> {
    let (ep, own) = match &spec.homa_endpoint {
        Some(ep) => (ep.clone(), false),
        None => {
            let cfg = endpoint_config(spec.transport, &spec.homa);
            (Endpoint::bind_with(SocketAddr::new(spec.ip, 0), cfg)?, true)
        }
    };
    let mut r = ClientResult {
        window_secs: sched.window_secs(),
        ..Default::default()
    };
    let mut pending: HashMap<RpcId, (Arrival, Instant)> = HashMap::new();
    let mut backlog: VecDeque<Arrival> = VecDeque::new();
    loop {
        let now = Instant::now();
        while let Some(t) = sched.next_arrival() {
            if t > now {
                break;
            }
            if pending.len() + backlog.len() >= spec.max_outstanding {
                r.cap_waits += 1;
            }
            backlog.push_back(sched.take_arrival(&mut r));
        }
        while pending.len() < spec.max_outstanding {
            let Some(a) = backlog.pop_front() else {
                break;
            };
            let ports = &spec.servers[a.server];
            let dest = ports[sched.pick(ports.len())];
            let t0 = Instant::now();
            r.issued += 1;
            match ep.send_request_shared(dest, spec.payloads.payload(a.seq, a.len)) {
                Ok(id) => {
                    pending.insert(id, (a, t0));
                }
                Err(e) => r.error(format!("send to {dest}: {e}")),
            }
        }
        let done_issuing = sched.next_arrival().is_none() && backlog.is_empty();
        if done_issuing && pending.is_empty() {
            break;
        }
        if now >= sched.drain_end {
            r.unfinished = (pending.len() + backlog.len()) as u64;
            break;
        }
        let until = sched
            .next_arrival()
            .unwrap_or(sched.drain_end)
            .min(sched.drain_end);
        let resp = match ep.recv_response_timeout(until.saturating_duration_since(now)) {
            Ok(Some(resp)) => resp,
            Ok(None) => continue,
            Err(e) => return Err(e.into()),
        };
        let done = Instant::now();
        let Some((a, t0)) = pending.remove(&resp.id) else {
            continue;
        };
        let (seq, len) = (a.seq, a.len);
        match resp.result {
            Ok(msg) => {
                let expect = spec.payloads.payload(seq, len);
                if msg.len() == len && msg == *expect {
                    record(&mut r, &sched, &a, t0, done, &spec.progress);
                } else {
                    r.mismatches += 1;
                    r.error(format!(
                        "response to RPC {seq} ({len} bytes) differs from the request ({} bytes)",
                        msg.len()
                    ));
                }
            }
            Err(e) => r.error(format!("RPC of {len} bytes to {}: {e}", resp.peer)),
        }
    }
    if own {
        ep.shutdown();
    } else {
        // Abandon what is left so that the shared endpoint forgets it.
        for id in pending.keys() {
            ep.cancel(*id);
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_bind_waits_for_an_address_being_released() {
        let cfg = EndpointConfig::default();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let old = Endpoint::bind_with(any, cfg.clone()).unwrap();
        let addr = old.local_addr();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(old);
        });
        let start = Instant::now();
        let ep = bind_server(addr, &cfg).expect("bound once the old socket closed");
        assert_eq!(ep.local_addr(), addr);
        assert!(start.elapsed() >= std::time::Duration::from_millis(40));
        t.join().unwrap();
    }
}
