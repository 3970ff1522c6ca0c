//! `homa client`: sends `count` requests of `size` bytes to a server, keeping
//! `concurrency` in flight, and reports latency and throughput.

use crate::bench::report::{gbps, new_histogram, print_latency_table, record, to_json, LatencyRow};
use crate::bench::{check_payload, parse_size, payload, HomaOpts};
use bytes::Bytes;
use clap::Args;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// The server's address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Request size in bytes (k and m suffixes allowed).
    #[arg(long, value_parser = parse_size)]
    pub size: usize,
    /// Number of RPCs.
    #[arg(long)]
    pub count: u64,
    /// RPCs in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Local address (default: any address of the server's family).
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    let bind = args.bind.unwrap_or_else(|| {
        if args.server.is_ipv6() {
            "[::]:0".parse().unwrap()
        } else {
            "0.0.0.0:0".parse().unwrap()
        }
    });
    let ep = homa::Endpoint::bind_with(bind, args.homa.config()?)?;
    let msg = Bytes::from(payload(args.size, 6));
    let mut started: HashMap<homa::RpcId, Instant> = HashMap::new();
    let mut h = new_histogram();
    let (mut sent, mut failed, mut bad_echo, mut bytes_back) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    let start = Instant::now();
    while sent < args.count || !started.is_empty() {
        while sent < args.count && started.len() < args.concurrency.max(1) {
            let id = ep.send_request_shared(args.server, msg.clone())?;
            started.insert(id, Instant::now());
            sent += 1;
        }
        let r = ep.recv_response()?;
        let Some(t0) = started.remove(&r.id) else {
            continue;
        };
        match r.result {
            Ok(m) => {
                record(&mut h, t0.elapsed().as_nanos() as u64);
                bytes_back += m.len() as u64;
                // An echo server returns the payload; check it when it does.
                if m.len() == args.size && !check_payload(&m.contiguous(), 6) {
                    bad_echo += 1;
                }
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let row = LatencyRow::from_histogram("homa", args.size, &h);
    if args.json {
        println!("{}", to_json(vec![row]));
    } else {
        print_latency_table(&[row]);
        println!(
            "{} RPCs in {:.3} s: {:.0} RPC/s, requests {:.3} Gbit/s, responses {:.3} Gbit/s",
            h.len(),
            secs,
            h.len() as f64 / secs,
            gbps(h.len() * args.size as u64, secs),
            gbps(bytes_back, secs)
        );
    }
    if let Some(e) = first_error {
        anyhow::bail!("{failed} of {} RPCs failed; first error: {e}", args.count);
    }
    anyhow::ensure!(
        bad_echo == 0,
        "{bad_echo} echoed responses differ from their request"
    );
    Ok(())
}
