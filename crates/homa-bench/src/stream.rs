//! `homa stream-bench` (issue #21 item 5): one Homa stream against one TCP
//! connection and against one Homa RPC per chunk, on loopback, in the same
//! run.
//!
//! * **transfer**: `bytes` one way in `chunk`-byte writes (capped at
//!   `max_chunks` writes, so that 100-byte chunks do not take minutes); the
//!   clock stops when the receiver's answer to the last byte arrives.
//!   `homa-rpc` keeps `rpc_window` RPCs in flight, each carrying one chunk
//!   and answered with an empty response.
//! * **chunk latency**: one chunk echoed on an otherwise idle stream /
//!   connection / as one RPC, `latency_iters` times.
//! * **echo**: a `size`-byte message echoed as it arrives: the Homa stream
//!   server writes back each piece it reads (incremental delivery both
//!   ways), the TCP server writes back whatever each `read` returns.
//! * **idle streams**: memory per open, idle stream (both ends in this
//!   process, so the figure bounds one end's).
//! * **RPCs beside a stream**: 100-byte RPC echoes to a server, alone and
//!   while one stream saturates the same server with 64 KB chunks.

use crate::baseline::{tcp_pair, tcp_pingpong};
use crate::echo::homa_echo;
use crate::payload::Payloads;
use crate::stats::{new_histogram, record};
use crate::wait::{tcp_read_exact, tcp_write_all, Waiting};
use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct StreamBench {
    pub chunks: Vec<usize>,
    pub transfer_bytes: u64,
    pub max_chunks: u64,
    pub latency_iters: u64,
    pub echo_sizes: Vec<usize>,
    pub echo_iters: u64,
    pub rpc_window: usize,
    pub transports: Vec<String>,
    pub idle_streams: usize,
    /// 100 B RPCs timed alone and beside a saturating stream (0: skip).
    pub beside_iters: u64,
    /// Transfers and latency measurements alternate between transports in
    /// this many rounds.
    pub rounds: u64,
    pub homa: homa::EndpointConfig,
    pub poll: Duration,
    pub progress: bool,
}

/// One transport at one chunk size.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StreamRow {
    pub transport: String,
    /// `transfer` (throughput and one chunk's echo) or `echo` (a message
    /// echoed as it arrives).
    pub mode: String,
    pub chunk_bytes: usize,
    /// Bytes moved by the transfer (`transfer` rows).
    pub bytes: Option<u64>,
    pub gbps: Option<f64>,
    pub chunks_per_sec: Option<f64>,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Memory per idle stream.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct IdleStreams {
    pub streams: usize,
    /// Resident memory added per stream by opening it (the opener's
    /// engine entry and handle, before anything is sent).
    pub opener_bytes_per_stream: f64,
    /// Resident memory added per stream by its first message reaching
    /// the acceptor and being read there (the acceptor's entry and
    /// handle, plus what the opener's entry grows by).
    pub acceptor_bytes_per_stream: f64,
}

/// Short RPCs alone and beside a saturating stream, and the same for TCP
/// (100-byte echoes on one connection beside a bulk transfer on another
/// to the same server thread set), measured the same way in the same run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RpcsBesideStream {
    pub unloaded_p50_us: f64,
    pub unloaded_p99_us: f64,
    pub loaded_p50_us: f64,
    pub loaded_p99_us: f64,
    /// Bytes the stream moved meanwhile, per second, Gbit/s.
    pub stream_gbps: f64,
    pub tcp_unloaded_p99_us: f64,
    pub tcp_loaded_p99_us: f64,
    pub tcp_stream_gbps: f64,
    /// Time the RPC client thread spent runnable but waiting for a CPU
    /// (the kernel's `schedstat` run delay), µs per RPC: alone and beside
    /// the stream; the same for the TCP echo client. What grows here is
    /// the CPU scheduler's share of the latency, not the transport's.
    pub unloaded_cpu_wait_us_per_rpc: f64,
    pub loaded_cpu_wait_us_per_rpc: f64,
    pub tcp_unloaded_cpu_wait_us_per_rpc: f64,
    pub tcp_loaded_cpu_wait_us_per_rpc: f64,
    /// The same question with no transport: 100 B UDP echoes between
    /// threads beside a bulk UDP transfer between two more, for each way
    /// of waiting ([`crate::floor::echoes_beside_bulk`]).
    pub floor: Vec<crate::floor::BesideRow>,
}

/// Nanoseconds this thread has waited runnable for a CPU so far
/// (`/proc/thread-self/schedstat`, second field; 0 if unavailable).
fn cpu_wait_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Runs `f` and returns its result with this thread's CPU wait during
/// it, µs per `per` operations.
fn with_cpu_wait<T>(per: u64, f: impl FnOnce() -> T) -> (T, f64) {
    let w0 = cpu_wait_ns();
    let r = f();
    let us = cpu_wait_ns().saturating_sub(w0) as f64 / 1e3 / per.max(1) as f64;
    (r, (us * 100.0).round() / 100.0)
}

/// Everything `--json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct StreamReport {
    pub rows: Vec<StreamRow>,
    pub idle_streams: Option<IdleStreams>,
    pub rpcs_beside_stream: Option<RpcsBesideStream>,
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0
}

fn say(on: bool, what: &str) {
    if on {
        eprintln!("stream-bench: {what}");
    }
}

/// One transport's round trips of `size` bytes (`pieces`: the echo as it
/// arrives), `iters` of them after a tenth as many for warm-up.
fn latency(
    b: &StreamBench,
    t: &str,
    size: usize,
    iters: u64,
    pieces: bool,
) -> anyhow::Result<Histogram<u64>> {
    Ok(match (t, pieces) {
        ("homa-stream", _) => homa_stream_echo(&b.homa, size, iters, pieces)?,
        ("tcp", false) => tcp_pingpong(size, iters, iters / 10, b.poll)?,
        ("tcp", true) => tcp_streaming_echo(size, iters, b.poll)?,
        ("homa-rpc", _) => homa_echo(&b.homa, size, iters, iters / 10, false, true)?,
        (other, _) => anyhow::bail!("unknown transport {other} (homa-stream, tcp, homa-rpc)"),
    })
}

/// Every transport's round trips of `size` bytes, in `rounds` turns (each
/// measuring its share after its own warm-up) so that a change in the
/// machine's speed during the run, common on shared machines, affects them
/// alike: one histogram per transport, in `b.transports`' order.
fn latencies(
    b: &StreamBench,
    size: usize,
    iters: u64,
    pieces: bool,
) -> anyhow::Result<Vec<Histogram<u64>>> {
    let mut hs: Vec<Histogram<u64>> = b.transports.iter().map(|_| new_histogram()).collect();
    let rounds = b.rounds.max(1);
    for r in 0..rounds {
        let share = crate::echo::round_share(iters, rounds, r).max(10);
        for (t, h) in b.transports.iter().zip(hs.iter_mut()) {
            h.add(latency(b, t, size, share, pieces)?)?;
        }
    }
    Ok(hs)
}

/// Every transport's transfer of `n` chunks of `chunk` bytes, in
/// `b.rounds` turns (each a transfer of its share on a new stream or
/// connection), as [`latencies`] does for round trips: the machine's slow
/// moments fall on all of them alike. Returns chunks moved and seconds
/// taken per transport, in `b.transports`' order.
fn transfers(b: &StreamBench, chunk: usize, n: u64) -> anyhow::Result<Vec<(u64, f64)>> {
    let mut moved = vec![(0u64, 0f64); b.transports.len()];
    let rounds = b.rounds.max(1);
    for r in 0..rounds {
        let share = crate::echo::round_share(n, rounds, r).max(1);
        for (t, m) in b.transports.iter().zip(moved.iter_mut()) {
            say(
                b.progress,
                &format!(
                    "{t}: {share} chunks of {chunk} B (round {} of {rounds})",
                    r + 1
                ),
            );
            let secs = match t.as_str() {
                "homa-stream" => homa_stream_transfer(&b.homa, chunk, share)?,
                "tcp" => tcp_transfer(chunk, share, b.poll)?,
                "homa-rpc" => homa_rpc_transfer(&b.homa, chunk, share, b.rpc_window)?,
                other => anyhow::bail!("unknown transport {other} (homa-stream, tcp, homa-rpc)"),
            };
            m.0 += share;
            m.1 += secs;
        }
    }
    Ok(moved)
}

pub fn measure(b: &StreamBench) -> anyhow::Result<StreamReport> {
    let mut rows = Vec::new();
    for &chunk in &b.chunks {
        let n = (b.transfer_bytes / chunk as u64).clamp(1, b.max_chunks);
        let iters = if chunk >= 500_000 {
            (b.latency_iters / 20).max(50)
        } else if chunk >= 50_000 {
            (b.latency_iters / 4).max(100)
        } else {
            b.latency_iters
        };
        say(b.progress, &format!("echoes of one {chunk} B chunk"));
        let lats = latencies(b, chunk, iters, false)?;
        let moved = transfers(b, chunk, n)?;
        for ((t, lat), (chunks, secs)) in b.transports.iter().zip(&lats).zip(moved) {
            let bytes = chunks * chunk as u64;
            rows.push(StreamRow {
                transport: t.clone(),
                mode: "transfer".into(),
                chunk_bytes: chunk,
                bytes: Some(bytes),
                gbps: Some((bytes as f64 * 8.0 / secs / 1e9 * 1000.0).round() / 1000.0),
                chunks_per_sec: Some((chunks as f64 / secs).round()),
                p50_us: us(lat, 0.5),
                p99_us: us(lat, 0.99),
            });
        }
    }
    for &size in &b.echo_sizes {
        say(b.progress, &format!("echoes of {size} B as it arrives"));
        let hs = latencies(b, size, b.echo_iters, true)?;
        for (t, h) in b.transports.iter().zip(&hs) {
            rows.push(StreamRow {
                transport: t.clone(),
                mode: "echo".into(),
                chunk_bytes: size,
                bytes: None,
                gbps: None,
                chunks_per_sec: None,
                p50_us: us(h, 0.5),
                p99_us: us(h, 0.99),
            });
        }
    }
    let idle_streams = if b.idle_streams > 0 {
        say(b.progress, &format!("{} idle streams", b.idle_streams));
        Some(idle_streams(&b.homa, b.idle_streams)?)
    } else {
        None
    };
    let rpcs_beside_stream =
        if b.beside_iters > 0 && b.transports.iter().any(|t| t == "homa-stream") {
            say(b.progress, "100 B RPCs beside a saturating stream");
            Some(rpcs_beside_stream(&b.homa, b.beside_iters)?)
        } else {
            None
        };
    Ok(StreamReport {
        rows,
        idle_streams,
        rpcs_beside_stream,
    })
}

/// A server thread that takes one stream and runs `f` on it.
fn stream_server(
    cfg: &homa::EndpointConfig,
    f: impl FnOnce(homa::Stream) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<(homa::Endpoint, std::thread::JoinHandle<anyhow::Result<()>>)> {
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let srv = server.clone();
    let t = std::thread::spawn(move || f(srv.accept_stream()?));
    Ok((server, t))
}

fn join(t: std::thread::JoinHandle<anyhow::Result<()>>) -> anyhow::Result<()> {
    t.join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?
}

/// Waits (briefly) until both sides of `s` ended, so that dropping it
/// does not cancel what the peer still reads.
fn linger(s: &homa::Stream) {
    let until = Instant::now() + Duration::from_secs(2);
    while !s.is_done() && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `n` chunks one way over a Homa stream; seconds until the receiver's
/// answer to the end.
fn homa_stream_transfer(cfg: &homa::EndpointConfig, chunk: usize, n: u64) -> anyhow::Result<f64> {
    let total = n * chunk as u64;
    let (server, t) = stream_server(cfg, move |mut s| {
        let mut got = 0u64;
        while let Some(c) = s.recv_chunk()? {
            got += c.bytes.len() as u64;
        }
        anyhow::ensure!(got == total, "stream server got {got} of {total} bytes");
        s.send(Bytes::from_static(b"k"))?;
        s.finish()?;
        linger(&s);
        Ok(())
    })?;
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let mut s = client.open_stream(server.local_addr())?;
    let payload = Payloads::new(chunk).payload(5, chunk);
    let start = Instant::now();
    for _ in 0..n {
        s.send(payload.clone())?;
    }
    s.finish()?;
    let answer = s.recv()?.context("stream ended without the answer")?;
    let secs = start.elapsed().as_secs_f64();
    anyhow::ensure!(&answer[..] == b"k");
    anyhow::ensure!(s.recv()?.is_none());
    linger(&s);
    drop(s);
    join(t)?;
    server.shutdown();
    Ok(secs)
}

/// Reads a non-blocking connection until `limit` bytes or its end;
/// returns the bytes read.
fn tcp_drain(s: &mut std::net::TcpStream, limit: u64) -> anyhow::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    while got < limit {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => got += k as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                crate::wait::wait_fd(
                    std::os::fd::AsRawFd::as_raw_fd(s),
                    libc::POLLIN,
                    Duration::from_millis(50),
                )?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// `n` chunks one way over one TCP connection.
fn tcp_transfer(chunk: usize, n: u64, poll: Duration) -> anyhow::Result<f64> {
    let (mut c, mut s) = tcp_pair()?;
    let total = n * chunk as u64;
    let t = std::thread::spawn(move || -> anyhow::Result<()> {
        let w = Waiting::polling(poll);
        let got = tcp_drain(&mut s, total)?;
        anyhow::ensure!(got == total, "TCP server got {got} of {total} bytes");
        tcp_write_all(&mut s, b"k", w)?;
        Ok(())
    });
    let payload = Payloads::new(chunk).payload(5, chunk);
    let w = Waiting::polling(poll);
    let start = Instant::now();
    for _ in 0..n {
        tcp_write_all(&mut c, &payload, w)?;
    }
    let mut k = [0u8; 1];
    tcp_read_exact(&mut c, &mut k, w)?;
    let secs = start.elapsed().as_secs_f64();
    join(t)?;
    Ok(secs)
}

/// `n` RPCs carrying one chunk each, `window` in flight, answered empty.
fn homa_rpc_transfer(
    cfg: &homa::EndpointConfig,
    chunk: usize,
    n: u64,
    window: usize,
) -> anyhow::Result<f64> {
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let srv = server.clone();
    let t = std::thread::spawn(move || -> anyhow::Result<()> {
        match srv.serve(|req| {
            let _ = req.reply(Bytes::new());
        }) {
            Ok(()) | Err(homa::Error::Shutdown) => Ok(()),
            Err(e) => Err(e.into()),
        }
    });
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let payload = Payloads::new(chunk).payload(5, chunk);
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < n {
        while sent < n && sent - done < window.max(1) as u64 {
            client.send_request_shared(addr, payload.clone())?;
            sent += 1;
        }
        let r = client.recv_response()?;
        r.result?;
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    server.shutdown();
    join(t)?;
    Ok(secs)
}

/// Round trips of a `size`-byte message over one Homa stream. `pieces`:
/// the server writes back each piece as it reads it and the client reads
/// pieces until all bytes are back (incremental delivery both ways);
/// otherwise whole messages both ways.
fn homa_stream_echo(
    cfg: &homa::EndpointConfig,
    size: usize,
    iters: u64,
    pieces: bool,
) -> anyhow::Result<Histogram<u64>> {
    let (server, t) = stream_server(cfg, move |mut s| {
        if pieces {
            while let Some(c) = s.recv_chunk()? {
                s.send(c.bytes)?;
            }
        } else {
            while let Some(m) = s.recv()? {
                s.send(m)?;
            }
        }
        s.finish()?;
        linger(&s);
        Ok(())
    })?;
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let mut s = client.open_stream(server.local_addr())?;
    let payloads = Payloads::new(size);
    let msg = payloads.payload(7, size);
    let mut h = new_histogram();
    let warmup = iters / 10;
    // The echo comes back as pieces that stay where they landed (the
    // stream's zero-copy delivery); they are joined and checked after the
    // clock stops. TCP's client has to read into a buffer of its own.
    let mut back: Vec<bytes::Bytes> = Vec::new();
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        s.send(msg.clone())?;
        back.clear();
        if pieces {
            let mut got = 0;
            while got < size {
                let c = s.recv_chunk()?.context("stream ended early")?;
                got += c.bytes.len();
                back.push(c.bytes);
            }
        } else {
            back.push(s.recv()?.context("stream ended early")?);
        }
        if i >= warmup {
            record(&mut h, t0.elapsed().as_nanos() as u64);
        }
    }
    anyhow::ensure!(
        payloads.matches(7, &back.concat()),
        "stream echo corrupted the payload"
    );
    s.finish()?;
    anyhow::ensure!(s.recv()?.is_none());
    linger(&s);
    drop(s);
    join(t)?;
    server.shutdown();
    Ok(h)
}

/// Round trips of a `size`-byte message over one TCP connection whose
/// server writes back whatever each read returns.
fn tcp_streaming_echo(size: usize, iters: u64, poll: Duration) -> anyhow::Result<Histogram<u64>> {
    let (mut c, mut s) = tcp_pair()?;
    let warmup = iters / 10;
    let total = (warmup + iters) * size as u64;
    let t = std::thread::spawn(move || -> anyhow::Result<()> {
        let w = Waiting::polling(poll);
        let mut buf = vec![0u8; 256 * 1024];
        let mut moved = 0u64;
        while moved < total {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    tcp_write_all(&mut s, &buf[..k], w)?;
                    moved += k as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    crate::wait::wait_fd(
                        std::os::fd::AsRawFd::as_raw_fd(&s),
                        libc::POLLIN,
                        Duration::from_millis(50),
                    )?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    });
    let payloads = Payloads::new(size);
    let msg = payloads.payload(7, size);
    let mut back = vec![0u8; size];
    let w = Waiting::polling(poll);
    let mut h = new_histogram();
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        tcp_write_all(&mut c, &msg, w)?;
        tcp_read_exact(&mut c, &mut back, w)?;
        if i >= warmup {
            record(&mut h, t0.elapsed().as_nanos() as u64);
        }
    }
    anyhow::ensure!(payloads.matches(7, &back), "TCP echo corrupted the payload");
    c.flush()?;
    drop(c);
    join(t)?;
    Ok(h)
}

/// Resident memory of this process, bytes (Linux `/proc/self/statm`).
fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * 4096)
}

/// Memory per open, idle stream: `count` streams opened, each with one
/// 1-byte message read at the server, then left open.
fn idle_streams(cfg: &homa::EndpointConfig, count: usize) -> anyhow::Result<IdleStreams> {
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr: SocketAddr = server.local_addr();
    // Warm up allocators and tables with a few streams first.
    let mut keep = Vec::new();
    let mut accepted = Vec::new();
    let open = |k: usize, keep: &mut Vec<homa::Stream>, accepted: &mut Vec<homa::Stream>| {
        for _ in 0..k {
            let mut s = client.open_stream(addr)?;
            s.send(Bytes::from_static(b"x"))?;
            let mut a = server.accept_stream()?;
            anyhow::ensure!(a.recv()?.as_deref() == Some(&b"x"[..]));
            keep.push(s);
            accepted.push(a);
        }
        Ok::<_, anyhow::Error>(())
    };
    open(100, &mut keep, &mut accepted)?;
    // Opened only: the opener's side.
    let before = rss_bytes()?;
    let mut fresh = Vec::with_capacity(count);
    for _ in 0..count {
        fresh.push(client.open_stream(addr)?);
    }
    let opened = rss_bytes()?;
    // First message in and read: the acceptor's side.
    let mut there = Vec::with_capacity(count);
    for s in &mut fresh {
        s.send(Bytes::from_static(b"x"))?;
    }
    for _ in 0..count {
        let mut a = server.accept_stream()?;
        anyhow::ensure!(a.recv()?.as_deref() == Some(&b"x"[..]));
        there.push(a);
    }
    let accepted_rss = rss_bytes()?;
    anyhow::ensure!(server.engine_stats().streams >= count);
    let per = |a: u64, b: u64| (b.saturating_sub(a) as f64 / count as f64).round();
    drop((keep, accepted, fresh, there));
    Ok(IdleStreams {
        streams: count,
        opener_bytes_per_stream: per(before, opened),
        acceptor_bytes_per_stream: per(opened, accepted_rss),
    })
}

/// 100-byte RPC echoes to a server, alone and beside one stream that
/// saturates the same server with 64 KB chunks.
fn rpcs_beside_stream(cfg: &homa::EndpointConfig, iters: u64) -> anyhow::Result<RpcsBesideStream> {
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let srv = server.clone();
    let rpc_server = std::thread::spawn(move || -> anyhow::Result<()> {
        match srv.serve(|req| {
            let m = req.message().to_vec();
            let _ = req.reply(m);
        }) {
            Ok(()) | Err(homa::Error::Shutdown) => Ok(()),
            Err(e) => Err(e.into()),
        }
    });
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let msg = Payloads::new(100).payload(3, 100);
    let run = |h: &mut Histogram<u64>| -> anyhow::Result<()> {
        for i in 0..iters + iters / 10 {
            let t0 = Instant::now();
            let r = client.call(addr, msg.clone())?;
            anyhow::ensure!(r.len() == 100);
            if i >= iters / 10 {
                record(h, t0.elapsed().as_nanos() as u64);
            }
        }
        Ok(())
    };
    let timed = iters + iters / 10;
    let mut alone = new_histogram();
    let (r, wait_alone) = with_cpu_wait(timed, || run(&mut alone));
    r?;
    // The stream's reader starts only now: a thread waiting in
    // `accept_stream` polls the server's endpoint while the RPCs keep it
    // busy, a third spinner that would slow the unloaded RPCs too.
    let srv = server.clone();
    let sink = std::thread::spawn(move || -> anyhow::Result<u64> {
        let mut s = srv.accept_stream()?;
        let mut got = 0u64;
        loop {
            match s.recv_chunk() {
                Ok(Some(c)) => got += c.bytes.len() as u64,
                Ok(None) => break,
                Err(homa::Error::Shutdown) => break,
                Err(e) => return Err(e.into()),
            }
        }
        linger(&s);
        Ok(got)
    });
    // The stream, from its own endpoint and thread.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let cfg = cfg.clone();
        std::thread::spawn(move || -> anyhow::Result<(u64, f64)> {
            let ep = homa::Endpoint::bind_with("127.0.0.1:0", cfg)?;
            let mut s = ep.open_stream(addr)?;
            let chunk = Payloads::new(65_536).payload(1, 65_536);
            let start = Instant::now();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                s.send(chunk.clone())?;
                sent += chunk.len() as u64;
            }
            let secs = start.elapsed().as_secs_f64();
            s.finish()?;
            linger(&s);
            Ok((sent, secs))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let mut loaded = new_histogram();
    let (r, wait_loaded) = with_cpu_wait(timed, || run(&mut loaded));
    stop.store(true, Ordering::Relaxed);
    let (sent, secs) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("stream writer panicked"))??;
    r?;
    let got = sink
        .join()
        .map_err(|_| anyhow::anyhow!("stream reader panicked"))??;
    anyhow::ensure!(got == sent, "stream reader got {got} of {sent} bytes");
    server.shutdown();
    rpc_server
        .join()
        .map_err(|_| anyhow::anyhow!("RPC server panicked"))??;
    let tcp = tcp_beside_bulk(iters)?;
    let floor = crate::floor::echoes_beside_bulk(iters)?;
    Ok(RpcsBesideStream {
        floor,
        unloaded_p50_us: us(&alone, 0.5),
        unloaded_p99_us: us(&alone, 0.99),
        loaded_p50_us: us(&loaded, 0.5),
        loaded_p99_us: us(&loaded, 0.99),
        stream_gbps: (sent as f64 * 8.0 / secs / 1e9 * 1000.0).round() / 1000.0,
        tcp_unloaded_p99_us: us(&tcp.alone, 0.99),
        tcp_loaded_p99_us: us(&tcp.loaded, 0.99),
        tcp_stream_gbps: tcp.gbps,
        unloaded_cpu_wait_us_per_rpc: wait_alone,
        loaded_cpu_wait_us_per_rpc: wait_loaded,
        tcp_unloaded_cpu_wait_us_per_rpc: tcp.waits.0,
        tcp_loaded_cpu_wait_us_per_rpc: tcp.waits.1,
    })
}

/// TCP's answer to the same question: 100-byte echoes on one connection,
/// alone and while another connection carries a bulk transfer in 64 KB
/// writes (each connection served by its own thread, as Homa's RPC server
/// and stream reader are).
/// TCP's echoes alone and beside a bulk connection.
struct TcpBeside {
    alone: Histogram<u64>,
    loaded: Histogram<u64>,
    /// The bulk connection's rate, Gbit/s.
    gbps: f64,
    /// The echo client's CPU wait per echo, µs: alone, beside.
    waits: (f64, f64),
}

fn tcp_beside_bulk(iters: u64) -> anyhow::Result<TcpBeside> {
    let poll = Duration::from_micros(50);
    let timed = iters + iters / 10;
    let (alone, wait_alone) = with_cpu_wait(timed, || tcp_pingpong(100, iters, iters / 10, poll));
    let alone = alone?;
    let (mut c, mut s) = tcp_pair()?;
    let stop = Arc::new(AtomicBool::new(false));
    let sink = std::thread::spawn(move || tcp_drain(&mut s, u64::MAX));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || -> anyhow::Result<(u64, f64)> {
            let chunk = Payloads::new(65_536).payload(1, 65_536);
            let w = Waiting::polling(poll);
            let start = Instant::now();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tcp_write_all(&mut c, &chunk, w)?;
                sent += chunk.len() as u64;
            }
            Ok((sent, start.elapsed().as_secs_f64()))
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let (loaded, wait_loaded) = with_cpu_wait(timed, || tcp_pingpong(100, iters, iters / 10, poll));
    stop.store(true, Ordering::Relaxed);
    let (sent, secs) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("TCP writer panicked"))??;
    let got = sink
        .join()
        .map_err(|_| anyhow::anyhow!("TCP reader panicked"))??;
    anyhow::ensure!(got == sent, "TCP reader got {got} of {sent} bytes");
    let gbps = (sent as f64 * 8.0 / secs / 1e9 * 1000.0).round() / 1000.0;
    Ok(TcpBeside {
        alone,
        loaded: loaded?,
        gbps,
        waits: (wait_alone, wait_loaded),
    })
}

/// The same-run ratios the goals are stated in, as text.
pub fn print_ratios(r: &StreamReport) {
    let find = |t: &str, mode: &str, c: usize| {
        r.rows
            .iter()
            .find(|x| x.transport == t && x.mode == mode && x.chunk_bytes == c)
    };
    for row in r.rows.iter().filter(|x| x.transport == "homa-stream") {
        let c = row.chunk_bytes;
        if let (Some(tcp), "transfer") = (find("tcp", &row.mode, c), row.mode.as_str()) {
            println!(
                "{c} B chunks: stream/tcp throughput {:.2}x",
                row.gbps.unwrap_or(0.0) / tcp.gbps.unwrap_or(1.0)
            );
        }
        if let (Some(rpc), "transfer") = (find("homa-rpc", &row.mode, c), row.mode.as_str()) {
            println!(
                "{c} B chunks: stream/rpc chunks per second {:.2}x, chunk echo p50 stream/rpc {:.2}x",
                row.chunks_per_sec.unwrap_or(0.0) / rpc.chunks_per_sec.unwrap_or(1.0),
                row.p50_us / rpc.p50_us
            );
        }
        if let (Some(tcp), "echo") = (find("tcp", "echo", c), row.mode.as_str()) {
            println!(
                "{c} B echo as it arrives: p50 stream/tcp {:.2}x, p99 {:.2}x",
                row.p50_us / tcp.p50_us,
                row.p99_us / tcp.p99_us
            );
        }
    }
    if let Some(i) = &r.idle_streams {
        println!(
            "{} idle streams: {:.0} bytes each at the opener, {:.0} at the acceptor",
            i.streams, i.opener_bytes_per_stream, i.acceptor_bytes_per_stream
        );
    }
    if let Some(b) = &r.rpcs_beside_stream {
        println!(
            "100 B RPCs beside a saturating stream ({:.1} Gbit/s): p99 {:.1} vs {:.1} us alone ({:.2}x); p50 {:.1} vs {:.1}",
            b.stream_gbps,
            b.loaded_p99_us,
            b.unloaded_p99_us,
            b.loaded_p99_us / b.unloaded_p99_us,
            b.loaded_p50_us,
            b.unloaded_p50_us
        );
        println!(
            "100 B TCP echoes beside a bulk TCP connection ({:.1} Gbit/s): p99 {:.1} vs {:.1} us alone ({:.2}x)",
            b.tcp_stream_gbps,
            b.tcp_loaded_p99_us,
            b.tcp_unloaded_p99_us,
            b.tcp_loaded_p99_us / b.tcp_unloaded_p99_us
        );
        for f in &b.floor {
            println!(
                "floor, raw UDP threads waiting by {}: 100 B echoes beside a bulk UDP transfer ({:.1} Gbit/s): p99 {:.1} vs {:.1} us alone ({:.2}x)",
                f.wait.name(),
                f.bulk_gbps,
                f.beside_p99_us,
                f.alone_p99_us,
                f.beside_p99_us / f.alone_p99_us
            );
        }
        println!(
            "RPC client thread waiting for a CPU, us per RPC: Homa {:.2} alone, {:.2} beside the stream; TCP {:.2} alone, {:.2} beside the bulk connection",
            b.unloaded_cpu_wait_us_per_rpc,
            b.loaded_cpu_wait_us_per_rpc,
            b.tcp_unloaded_cpu_wait_us_per_rpc,
            b.tcp_loaded_cpu_wait_us_per_rpc
        );
    }
}
