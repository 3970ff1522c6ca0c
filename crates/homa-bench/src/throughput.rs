//! The throughput benchmark: a one-way stream of large messages, each
//! answered by a small reply, over Homa and over one TCP connection, and a
//! raw UDP GSO blast as the ceiling, on loopback. `homa throughput-bench`
//! is its front end.

use crate::baseline::{tcp_throughput, udp_gso_stream};
use crate::payload::Payloads;
use crate::stats::{gbps, ThroughputRow};
use anyhow::Context;
use bytes::Bytes;
use std::time::{Duration, Instant};

/// The transports `throughput-bench` knows.
pub const TRANSPORTS: [&str; 3] = ["homa", "tcp", "udp-gso"];

/// One throughput benchmark run.
#[derive(Clone, Debug)]
pub struct ThroughputBench {
    /// Message size in bytes.
    pub size: usize,
    /// Seconds per transport, over all rounds.
    pub seconds: f64,
    /// The transports take turns in this many rounds (a new connection or
    /// endpoint pair every round); rates are total bytes over total time.
    pub rounds: u64,
    /// Messages in flight at once (unanswered), for Homa and TCP.
    pub window: usize,
    /// Size of the reply to each message.
    pub reply_size: usize,
    /// Names from [`TRANSPORTS`].
    pub transports: Vec<String>,
    /// Send each Homa message from reusable send buffers laid out as
    /// packets (one per message in flight), instead of from one `Bytes`
    /// shared by every message (payloads of 4 KB or more per packet sent
    /// from it, shorter ones copied next to their headers), which is what
    /// TCP's sender does with its one buffer.
    pub send_bufs: bool,
    /// Datagram size of the UDP GSO blast; `None`: the packet size of a
    /// Homa endpoint with [`Self::homa`] on loopback, so that both move the
    /// same packets.
    pub segment: Option<usize>,
    /// Busy-poll time of the TCP baseline's waits.
    pub poll: Duration,
    /// Both Homa endpoints' configuration.
    pub homa: homa::EndpointConfig,
    /// Print the Homa endpoints' counters of the last round to stderr.
    pub report_counters: bool,
}

/// One row per transport: total messages over total time.
pub fn run(args: &ThroughputBench) -> anyhow::Result<Vec<ThroughputRow>> {
    let poll = args.poll;
    for t in &args.transports {
        anyhow::ensure!(TRANSPORTS.contains(&t.as_str()), "unknown transport {t:?}");
    }
    let round_secs = args.seconds / args.rounds as f64;
    let segment = match args.segment {
        Some(s) => s,
        None => homa::Endpoint::bind_with("127.0.0.1:0", args.homa.clone())?
            .config()
            .engine
            .max_packet_size
            .min(crate::baseline::MAX_UDP_PAYLOAD),
    };
    // (messages, seconds) per transport, summed over the rounds.
    let mut totals = vec![(0u64, 0f64); args.transports.len()];
    for round in 0..args.rounds {
        let last = round + 1 == args.rounds;
        for (t, total) in args.transports.iter().zip(totals.iter_mut()) {
            let (count, secs) = match t.as_str() {
                "homa" => homa_stream(args, round_secs, last).context("homa stream")?,
                "tcp" => tcp_throughput(args.size, args.reply_size, args.window, round_secs, poll)?,
                _ => udp_gso_stream(args.size, segment, round_secs)?,
            };
            total.0 += count;
            total.1 += secs;
        }
    }
    let rows: Vec<ThroughputRow> = args
        .transports
        .iter()
        .zip(&totals)
        .map(|(t, &(count, secs))| ThroughputRow {
            transport: t.clone(),
            size: args.size,
            count,
            gbps: gbps(count * args.size as u64, secs),
        })
        .collect();
    Ok(rows)
}

/// Homa / TCP and Homa / UDP-GSO throughput ratios.
pub fn print_ratios(rows: &[ThroughputRow]) {
    let find = |t: &str| rows.iter().find(|r| r.transport == t);
    for base in ["tcp", "udp-gso"] {
        if let (Some(h), Some(b)) = (find("homa"), find(base)) {
            println!("homa/{base} throughput: {:.2}x", h.gbps / b.gbps.max(1e-9));
        }
    }
}

/// Streams messages to a Homa echo server with `window` in flight for
/// `seconds`; returns (messages answered, seconds). `report`: print the
/// endpoints' counters (to stderr, if `report_counters`).
fn homa_stream(args: &ThroughputBench, seconds: f64, report: bool) -> anyhow::Result<(u64, f64)> {
    let cfg = args.homa.clone();
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let srv = server.clone();
    let reply = Bytes::from(vec![0u8; args.reply_size]);
    let size = args.size;
    let payloads = Payloads::new(size);
    let check = payloads.clone();
    let sink = std::thread::spawn(move || -> homa::Result<u64> {
        let mut n = 0;
        loop {
            match srv.recv_request() {
                Ok(req) => {
                    if req.message().len() != size {
                        return Err(homa::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("request of {} bytes, expected {size}", req.message().len()),
                        )));
                    }
                    // Spot-check the bytes (every 1024th message).
                    if n % 1024 == 0 && !check.matches(5, &req.message().contiguous()) {
                        return Err(homa::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("message {n} arrived corrupted"),
                        )));
                    }
                    n += 1;
                    req.reply(reply.clone())?;
                }
                Err(homa::Error::Shutdown) => return Ok(n),
                Err(e) => return Err(e),
            }
        }
    });
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg)?;
    let msg: Bytes = payloads.payload(5, args.size);
    let data = &msg;
    // Send buffers, filled once and reused whenever the RPC that sent one
    // is over (a new one is made if all are still in flight).
    let mut bufs: Vec<homa::SendBuf> = Vec::new();
    let mut next_buf = |client: &homa::Endpoint| -> homa::SendBuf {
        if let Some(b) = bufs.iter().find(|b| !b.in_flight()) {
            return b.clone();
        }
        let mut b = client.new_send_buf(data.len());
        b.write(0, data).expect("a new buffer is unique");
        bufs.push(b.clone());
        b
    };
    let limit = Duration::from_secs_f64(seconds);
    let result = (|| -> anyhow::Result<(u64, f64)> {
        let start = Instant::now();
        let mut outstanding = 0;
        let mut done = 0u64;
        loop {
            let more = start.elapsed() < limit;
            while more && outstanding < args.window.max(1) {
                if !args.send_bufs {
                    client.send_request_shared(addr, msg.clone())?;
                } else {
                    client.send_request_shared(addr, next_buf(&client))?;
                }
                outstanding += 1;
            }
            if outstanding == 0 {
                break;
            }
            let r = client.recv_response()?;
            r.result?;
            outstanding -= 1;
            done += 1;
        }
        Ok((done, start.elapsed().as_secs_f64()))
    })();
    let stats = client.socket_stats();
    let m = client.metrics();
    let sstats = server.socket_stats();
    let sm = server.metrics();
    let (crs, srs) = (client.runtime_stats(), server.runtime_stats());
    server.shutdown();
    let served = sink
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    let (done, secs) = result?;
    anyhow::ensure!(
        served >= done,
        "server answered {served} messages, client saw {done}"
    );
    if report && args.report_counters {
        eprintln!(
            "homa client (last round): {} packets in {} sendmmsg calls ({} GSO sends, {} would block), {} recvmmsg calls with data, {} empty, {} retransmitted, {} resends; gso/gro {:?}",
            stats.packets_sent,
            stats.send_calls,
            stats.gso_sends,
            stats.send_would_block,
            stats.recv_batches,
            stats.recv_empty,
            m.retransmitted_packets,
            m.resends_sent,
            client.offloads()
        );
        eprintln!(
            "homa server (last round): {} packets in {} receive calls with data ({} GRO datagrams, {} landed in the pool, {} landing switches), {} empty polls",
            sstats.packets_received,
            sstats.recv_batches,
            sstats.gro_datagrams,
            sstats.landed,
            sstats.landing_switches,
            sstats.recv_empty
        );
        let drops: Vec<String> = sm
            .iter()
            .into_iter()
            .filter(|(k, v)| {
                *v > 0
                    && (k.starts_with("drop_")
                        || k.starts_with("resend")
                        || k.starts_with("busy")
                        || k.contains("pool"))
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        eprintln!("homa server counters (last round): {}", drops.join(" "));
        eprintln!("homa waits (last round): client {crs:?}; server {srs:?}");
    }
    Ok((done, secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every transport moves whole messages in a tiny run.
    #[test]
    fn every_transport_gives_a_row() {
        let spec = ThroughputBench {
            size: 50_000,
            seconds: 0.1,
            rounds: 2,
            window: 2,
            reply_size: 8,
            transports: TRANSPORTS.iter().map(|t| t.to_string()).collect(),
            send_bufs: false,
            segment: Some(1472),
            poll: Duration::from_micros(10),
            homa: crate::loopback_config(),
            report_counters: false,
        };
        let rows = run(&spec).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.transport.as_str()).collect();
        assert_eq!(names, TRANSPORTS);
        assert!(rows.iter().all(|r| r.count > 0 && r.gbps > 0.0), "{rows:?}");
        assert!(run(&ThroughputBench {
            transports: vec!["quic".into()],
            ..spec
        })
        .is_err());
    }
}
