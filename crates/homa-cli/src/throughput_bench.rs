//! `homa throughput-bench`: a one-way stream of large messages, each answered
//! by a small reply, over Homa and over one TCP connection, on loopback.

use crate::opts::{parse_size, HomaOpts};
use anyhow::Context;
use bytes::Bytes;
use homa_bench::baseline::{tcp_throughput, udp_gso_stream};
use homa_bench::payload::Pattern;
use homa_bench::stats::{gbps, print_throughput_table, to_json, ThroughputRow};
use clap::Args;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ThroughputBenchArgs {
    /// Message size in bytes (k and m suffixes allowed).
    #[arg(long, default_value = "500000", value_parser = parse_size)]
    pub size: usize,
    /// Seconds to run each transport.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// The transports take turns in this many rounds of `seconds / rounds`
    /// each (a new connection or endpoint pair every round), so that the
    /// machine's drift during a run, and loopback TCP's run-to-run swings,
    /// are shared alike; rates are total bytes over total time.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// Messages in flight at once (unanswered), for both transports.
    #[arg(long, default_value_t = 4)]
    pub window: usize,
    /// Size of the reply to each message.
    #[arg(long, default_value_t = 8)]
    pub reply_size: usize,
    /// Transports to measure, comma-separated: homa, tcp, udp-gso (a raw
    /// one-way UDP GSO/GRO blast with no protocol: the ceiling for anything
    /// built on UDP sockets here).
    #[arg(long, default_value = "homa,tcp,udp-gso", value_delimiter = ',')]
    pub transports: Vec<String>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Send each Homa message as plain `Bytes` (the runtime gathers every
    /// packet's header and payload into one buffer: a copy) instead of from
    /// reusable send buffers laid out as packets (no copy; the default, as
    /// TCP writes from the same buffer every time).
    #[arg(long)]
    pub plain: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ThroughputBenchArgs) -> anyhow::Result<()> {
    let poll = Duration::from_micros(args.homa.poll_us);
    for t in &args.transports {
        anyhow::ensure!(
            ["homa", "tcp", "udp-gso"].contains(&t.as_str()),
            "unknown transport {t:?}"
        );
    }
    let round_secs = args.seconds / args.rounds as f64;
    // (messages, seconds) per transport, summed over the rounds.
    let mut totals = vec![(0u64, 0f64); args.transports.len()];
    for round in 0..args.rounds {
        let last = round + 1 == args.rounds;
        for (t, total) in args.transports.iter().zip(totals.iter_mut()) {
            let (count, secs) = match t.as_str() {
                "homa" => homa_stream(&args, round_secs, last).context("homa stream")?,
                "tcp" => tcp_throughput(args.size, args.reply_size, args.window, round_secs, poll)?,
                _ => {
                    // The largest UDP payload that fits the MTU (IPv4 + UDP
                    // headers: 28 bytes), as Homa's packets.
                    let segment = args.homa.mtu.saturating_sub(28);
                    udp_gso_stream(args.size, segment, round_secs)?
                }
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
    if args.json {
        println!("{}", to_json(rows));
    } else {
        print_throughput_table(&rows);
        let find = |t: &str| rows.iter().find(|r| r.transport == t);
        for base in ["tcp", "udp-gso"] {
            if let (Some(h), Some(b)) = (find("homa"), find(base)) {
                println!("homa/{base} throughput: {:.2}x", h.gbps / b.gbps.max(1e-9));
            }
        }
    }
    Ok(())
}

/// Streams messages to a Homa echo server with `window` in flight for
/// `seconds`; returns (messages answered, seconds). `report`: print the
/// endpoints' counters (to stderr, unless --json).
fn homa_stream(
    args: &ThroughputBenchArgs,
    seconds: f64,
    report: bool,
) -> anyhow::Result<(u64, f64)> {
    let cfg = args.homa.config_with_link(homa_bench::LOOPBACK_GBPS)?;
    let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let srv = server.clone();
    let reply = Bytes::from(vec![0u8; args.reply_size]);
    let size = args.size;
    let pattern = Pattern::new(size);
    let check = pattern.clone();
    let sink = std::thread::spawn(move || -> homa::Result<u64> {
        let mut n = 0;
        loop {
            match srv.recv_request() {
                Ok(req) => {
                    if req.message().len() != size {
                        return Err(homa::Error::InvalidArgument(format!(
                            "request of {} bytes, expected {size}",
                            req.message().len()
                        )));
                    }
                    // Spot-check the bytes (every 1024th message).
                    if n % 1024 == 0 && !check.matches(5, &req.message().contiguous()) {
                        return Err(homa::Error::InvalidArgument(format!(
                            "message {n} arrived corrupted"
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
    let msg: Bytes = pattern.payload(5, args.size);
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
                if args.plain {
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
    if report && !args.json {
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
            "homa server (last round): {} packets in {} recvmmsg calls with data ({} GRO datagrams), {} empty polls",
            sstats.packets_received, sstats.recv_batches, sstats.gro_datagrams, sstats.recv_empty
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
