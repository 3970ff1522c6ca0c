//! `homa server`: an echo server (or a fixed-size replier) on one endpoint,
//! served by any number of threads.

use crate::bench::HomaOpts;
use bytes::Bytes;
use clap::Args;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct ServerArgs {
    /// Address to listen on, e.g. 127.0.0.1:4000 or [::]:4000.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Threads receiving and answering requests.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Answer every request with this many bytes instead of echoing it.
    #[arg(long)]
    pub reply_size: Option<usize>,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Print counters to stderr this often (seconds; 0 = only at exit).
    #[arg(long, default_value_t = 10.0)]
    pub stats_interval: f64,
    #[command(flatten)]
    pub homa: HomaOpts,
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let ep = homa::Endpoint::bind_with(args.listen, args.homa.config()?)?;
    println!("homa server listening on {}", ep.local_addr());
    let served = Arc::new(AtomicU64::new(0));
    let fixed = args.reply_size.map(|n| Bytes::from(vec![0u8; n]));
    let mut workers = Vec::new();
    for _ in 0..args.threads.max(1) {
        let (ep, served, fixed) = (ep.clone(), served.clone(), fixed.clone());
        workers.push(std::thread::spawn(move || serve(&ep, &served, fixed)));
    }
    let start = Instant::now();
    let mut last_report = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if args
            .seconds
            .is_some_and(|s| start.elapsed().as_secs_f64() >= s)
        {
            break;
        }
        if workers.iter().all(|w| w.is_finished()) {
            break;
        }
        if args.stats_interval > 0.0 && last_report.elapsed().as_secs_f64() >= args.stats_interval {
            report(&ep, &served);
            last_report = Instant::now();
        }
    }
    ep.shutdown();
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    }
    report(&ep, &served);
    Ok(())
}

/// One worker: answers requests inside its own receive passes
/// (`Endpoint::serve`) until the endpoint shuts down.
fn serve(ep: &homa::Endpoint, served: &AtomicU64, fixed: Option<Bytes>) -> anyhow::Result<()> {
    let mut failed = None;
    ep.serve(|req| {
        let (message, responder) = req.into_parts();
        let body = match &fixed {
            Some(b) => b.clone(),
            // The echo shares the request's pool space: no copy.
            None => message.into_bytes(),
        };
        match responder.reply(body) {
            // The client gave up on this RPC meanwhile: nothing to answer.
            Ok(()) | Err(homa::Error::UnknownRpc) | Err(homa::Error::Shutdown) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
        served.fetch_add(1, Ordering::Relaxed);
    })?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn report(ep: &homa::Endpoint, served: &AtomicU64) {
    let m = ep.metrics();
    let s = ep.socket_stats();
    eprintln!(
        "served {} requests; packets in {} out {}; dropped by engine {} (malformed {}, bad checksum {}); truncated {}",
        served.load(Ordering::Relaxed),
        s.packets_received,
        s.packets_sent,
        m.total_drops(),
        m.drops(homa::DropReason::Malformed),
        m.drops(homa::DropReason::BadChecksum),
        s.truncated
    );
}
