//! Measures heap memory per outstanding RPC and per idle peer, using glibc's
//! allocator statistics (bytes in use), in one process over loopback.
//!
//! Run: `cargo run --release -p homa --example memory`
//!
//! * Per RPC: one client endpoint starts N shared RPCs of 100 bytes to a
//!   server whose application does not answer yet; the growth of heap in use
//!   on both sides, divided by N, is the cost of one outstanding RPC
//!   (client state + server state + queued request, excluding the 100-byte
//!   payload's pool space, which is preallocated).
//! * Per idle peer: P client endpoints each complete one RPC with the server;
//!   after their RPCs are done the server still remembers each peer until
//!   `peer_idle_ns`. The server's heap growth divided by P (minus what the P
//!   client endpoints themselves allocated, measured separately) is the cost
//!   of one idle peer.

use homa::{Endpoint, EndpointConfig};
use std::time::Duration;

fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads allocator statistics.
    let m = unsafe { libc::mallinfo2() };
    m.uordblks + m.hblkhd
}

fn main() -> homa::Result<()> {
    let cfg = EndpointConfig::builder()
        .poll(Duration::from_micros(10))
        .build();
    let server = Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let client = Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    // Warm up both endpoints (first-use allocations, peer entries).
    client
        .call_timeout(addr, vec![0u8; 100], Duration::from_millis(1))
        .ok();
    while let Ok(Some(r)) = server.recv_request_timeout(Duration::from_millis(20)) {
        r.reply(&b""[..])?;
    }

    let n = 10_000;
    let before = heap_in_use();
    let mut ids = Vec::with_capacity(n);
    let ids_bytes = n * std::mem::size_of::<homa::RpcId>();
    for _ in 0..n {
        ids.push(client.send_request_shared(addr, vec![0u8; 100])?);
    }
    // Let every request arrive and queue at the server.
    let start = std::time::Instant::now();
    while server.queued_requests() < n && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = heap_in_use();
    let per_rpc = (during.saturating_sub(before + ids_bytes)) as f64 / n as f64;
    println!(
        "outstanding RPCs: {} queued at the server, client has {}; heap per RPC (client+server, incl. 100 B request buffers): {:.0} bytes",
        server.queued_requests(),
        client.engine_stats().client_rpcs,
        per_rpc
    );
    client.shutdown();
    drop(ids);
    while let Ok(Some(r)) = server.try_recv_request() {
        drop(r);
    }

    // Idle peers.
    let p = 200;
    let base = heap_in_use();
    let clients: Vec<Endpoint> = (0..p)
        .map(|_| Endpoint::bind_with("127.0.0.1:0", cfg.clone()))
        .collect::<Result<_, _>>()?;
    let with_clients = heap_in_use();
    let s2 = server.clone();
    let answer = std::thread::spawn(move || {
        for _ in 0..p {
            if let Ok(r) = s2.recv_request() {
                r.reply(&b"ok"[..]).ok();
            }
        }
    });
    for c in &clients {
        c.call(addr, &b"hi"[..])?;
    }
    answer.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let after = heap_in_use();
    let peers = server.engine_stats().peers;
    let client_growth = with_clients - base;
    println!(
        "idle peers at the server: {peers}; heap per peer relationship (state at both ends after one RPC): {:.0} bytes (each endpoint itself: {:.0} KiB of address space, mostly the receive pool, touched only as used)",
        (after.saturating_sub(with_clients)) as f64 / p as f64,
        client_growth as f64 / p as f64 / 1024.0
    );
    Ok(())
}
