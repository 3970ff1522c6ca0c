//! The echo benchmark: round-trip latency on loopback of Homa, a raw UDP
//! ping-pong and a TCP ping-pong, each waiting the same way (busy-poll, then
//! block), and of Homa's tokio API against tokio's UDP and TCP sockets, for
//! each message size. `homa echo-bench` is its front end.

use crate::async_echo::{self, AsyncTransport};
use crate::baseline::{tcp_pingpong, udp_pingpong, MAX_UDP_PAYLOAD};
use crate::payload::Payloads;
use crate::stats::{new_histogram, record, LatencyRow};
use anyhow::Context;
use hdrhistogram::Histogram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The transports `echo-bench` knows: the blocking ones, then the async
/// ones, then Homa's incremental delivery (`homa-partial`: the client reads
/// the echo with `call_partial`, chunk by chunk, and the round trip ends
/// with its last chunk; `homa-first-chunk`: the same exchange, timed up to
/// the first chunk the client can read).
pub const TRANSPORTS: [&str; 8] = [
    "homa",
    "udp",
    "tcp",
    "homa-async",
    "tokio-udp",
    "tokio-tcp",
    "homa-partial",
    "homa-first-chunk",
];

/// (transport, baseline) pairs whose same-run ratios the goals use.
pub const RATIOS: [(&str, &str); 7] = [
    ("homa", "udp"),
    ("homa", "tcp"),
    ("homa-async", "tokio-udp"),
    ("homa-async", "tokio-tcp"),
    ("homa-partial", "homa"),
    ("homa-partial", "tcp"),
    ("homa-first-chunk", "homa"),
];

/// One echo benchmark run.
#[derive(Clone, Debug)]
pub struct EchoBench {
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// Round trips measured per size for messages up to 64 KB; larger sizes
    /// run proportionally fewer (at least 100), see [`count_for`].
    pub iters: u64,
    /// Names from [`TRANSPORTS`].
    pub transports: Vec<String>,
    /// The transports take turns in this many rounds (each measuring its
    /// share of the round trips after its own warm-up), so that a change in
    /// the machine's speed affects them alike. One round with `timetrace`.
    pub rounds: u64,
    /// Busy-poll time of the blocking baselines' waits (Homa's is in `homa`).
    pub poll: Duration,
    /// Both Homa endpoints' configuration.
    pub homa: homa::EndpointConfig,
    /// The Homa echo server answers inside its own receive pass
    /// (`Endpoint::serve`) rather than through `recv_request` and `reply`.
    pub serve_inline: bool,
    /// Time-trace Homa's fast path and print the mean time of each step.
    pub timetrace: bool,
    /// With `timetrace`: serialize the trace points (lfence).
    pub serialized: bool,
    /// With `timetrace`: record only these events.
    pub timetrace_events: Option<Vec<String>>,
    /// With `timetrace`: also write every event to this file.
    pub timetrace_dump: Option<PathBuf>,
    /// Progress lines on stderr (one per transport and size).
    pub progress: bool,
}

impl EchoBench {
    /// The defaults of `homa echo-bench` for these transports: sizes 100 B
    /// to 100 KB, 20,000 round trips in 5 rounds, 50 µs busy-polling, the
    /// loopback endpoint configuration ([`crate::loopback_config`]).
    pub fn new(transports: Vec<String>) -> EchoBench {
        EchoBench {
            sizes: vec![100, 1000, 10_000, 100_000],
            iters: 20_000,
            transports,
            rounds: 5,
            poll: Duration::from_micros(50),
            homa: crate::loopback_config(),
            serve_inline: true,
            timetrace: false,
            serialized: false,
            timetrace_events: None,
            timetrace_dump: None,
            progress: false,
        }
    }
}

/// Round trips measured in round `r` of `rounds`: an equal share, the first
/// rounds one more when `count` does not divide.
pub fn round_share(count: u64, rounds: u64, r: u64) -> u64 {
    count / rounds + u64::from(r < count % rounds)
}

/// Round trips to measure for `size`.
pub fn count_for(iters: u64, size: usize) -> u64 {
    let scaled = (iters as u128 * 65_536 / size.max(1) as u128) as u64;
    scaled.min(iters).max(iters.min(100))
}

/// One row per transport and size (UDP only for sizes that fit a datagram).
pub fn measure(args: &EchoBench) -> anyhow::Result<Vec<LatencyRow>> {
    let sizes = &args.sizes;
    let poll = args.poll;
    for t in &args.transports {
        anyhow::ensure!(TRANSPORTS.contains(&t.as_str()), "unknown transport {t:?}");
    }
    let mut rows = Vec::new();
    let rounds = if args.timetrace { 1 } else { args.rounds };
    for &size in sizes {
        homa::timetrace::set_serialized(args.serialized);
        let only: Option<Vec<&str>> = args
            .timetrace_events
            .as_ref()
            .map(|v| v.iter().map(String::as_str).collect());
        homa::timetrace::set_only(only.as_deref());
        let count = count_for(args.iters, size);
        let mut hists: Vec<Option<Histogram<u64>>> = vec![None; args.transports.len()];
        for r in 0..rounds {
            let n = round_share(count, rounds, r);
            if n == 0 {
                continue;
            }
            // Each round's endpoints are new: warm them up as fully as a
            // single round would (a tenth of the whole count), or the first
            // touches of their receive pool's pages (a page fault every ~40
            // 100-byte messages until the first 64 KB page is used up) show
            // in Homa's tail.
            let warmup = (count / 10).max(10);
            for (t, slot) in args.transports.iter().zip(hists.iter_mut()) {
                let h = match t.as_str() {
                    "homa" => {
                        let h = homa_echo(
                            &args.homa,
                            size,
                            n,
                            warmup,
                            args.timetrace,
                            args.serve_inline,
                        )
                        .context("homa echo")?;
                        if args.timetrace {
                            print_timetrace(size, n, args.timetrace_dump.as_deref())?;
                        }
                        h
                    }
                    "udp" if size <= MAX_UDP_PAYLOAD => {
                        let h = udp_pingpong(size, n, warmup, poll, args.timetrace)?;
                        if args.timetrace {
                            print_socket_times("udp", &homa::timetrace::collect());
                            homa::timetrace::clear();
                        }
                        h
                    }
                    "udp" | "tokio-udp" if size > MAX_UDP_PAYLOAD => continue,
                    "homa-partial" | "homa-first-chunk" => {
                        let first = t == "homa-first-chunk";
                        homa_partial_echo(&args.homa, size, n, warmup, first)
                            .with_context(|| format!("{t} echo"))?
                    }
                    "tcp" => tcp_pingpong(size, n, warmup, poll)?,
                    name => {
                        let t = AsyncTransport::parse(name).expect("checked above");
                        async_echo::measure(t, &args.homa, size, n, warmup)
                            .with_context(|| format!("{name} echo"))?
                    }
                };
                match slot {
                    Some(all) => all.add(&h).context("merging histograms")?,
                    None => *slot = Some(h),
                }
            }
        }
        for (t, h) in args.transports.iter().zip(&hists) {
            let Some(h) = h else { continue };
            let row = LatencyRow::from_histogram(t, size, h);
            if args.progress {
                eprintln!("{t} {size}: p50 {:.2} µs", row.p50_us);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Homa / UDP and Homa / TCP ratios (and the same for the async
/// transports), the numbers the performance goals use.
pub fn print_ratios(rows: &[LatencyRow]) {
    let find = |t: &str, s: usize| rows.iter().find(|r| r.transport == t && r.size == s);
    for (ours, base) in RATIOS {
        for r in rows.iter().filter(|r| r.transport == ours) {
            if let Some(b) = find(base, r.size) {
                println!(
                    "size {:>8}: {ours}/{base} p50 {:.2}x  p99 {:.2}x",
                    r.size,
                    r.p50_us / b.p50_us.max(1e-9),
                    r.p99_us / b.p99_us.max(1e-9)
                );
            }
        }
    }
}

/// The mean duration of each step of a round trip, from the time trace of
/// the last run; steps seen in fewer than half the round trips are left out.
fn print_timetrace(size: usize, count: u64, dump: Option<&std::path::Path>) -> anyhow::Result<()> {
    let events = homa::timetrace::collect();
    homa::timetrace::clear();
    if let Some(path) = dump {
        use std::io::Write;
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut f = std::io::BufWriter::new(file);
        homa::timetrace::dump(&events, "echo-bench", &mut f)?;
        f.flush()?;
    }
    let rts = events
        .iter()
        .filter(|e| e.event == "response returned")
        .count()
        .max(1);
    eprintln!(
        "time trace, {size} B echo ({rts} of {count} round trips retained; one trace record costs {:.1} ns here):",
        homa::timetrace::record_cost_ns(1_000_000)
    );
    let medians = homa::timetrace::step_medians(&events);
    eprintln!("  mean/round trip   median   step");
    let (mut total, mut total_median) = (0.0, 0.0);
    for (step, mean_ns, n) in homa::timetrace::breakdown(&events) {
        if n * 2 >= rts {
            let per_rt = mean_ns * n as f64 / rts as f64;
            let median = medians.get(&step).copied().unwrap_or(0.0);
            total += per_rt;
            total_median += median;
            eprintln!(
                "  {per_rt:8.0} ns  {median:8.0} ns  {step}  (x{:.2} per round trip)",
                n as f64 / rts as f64
            );
        }
    }
    eprintln!("  {total:8.0} ns  {total_median:8.0} ns  total of the steps shown");
    let (blamed, cutoff) = homa::timetrace::tail_steps(&events, "response returned", 0.01);
    eprintln!(
        "slowest 1% of round trips (over {cutoff:.0} ns), the step that ran longest past its mean:"
    );
    for (step, n, excess) in blamed.iter().take(8) {
        eprintln!("  {n:6} x  +{excess:8.0} ns  {step}");
    }
    print_socket_times("homa", &events);
    Ok(())
}

/// A round trip's split between the transport's own work and the kernel's,
/// by medians (resistant to preemptions): each side's turnaround (datagram
/// received to its next send system call) and each direction's one-way
/// time (send system call to the other side's receive returning). The UDP
/// ping-pong records the same events, so the two compare directly. Only
/// one-datagram exchanges pair up.
fn print_socket_times(transport: &str, events: &[homa::timetrace::TraceEvent]) {
    eprintln!("{transport}: turnaround, median (datagram received -> next send system call):");
    for (thread, median, n) in
        homa::timetrace::turnarounds(events, "recvmmsg got", "sendmmsg start")
    {
        eprintln!("  {median:8.0} ns  {thread}  ({n} samples)");
    }
    eprintln!(
        "{transport}: one way, median (send system call -> the other side's receive returns):"
    );
    for (from, to, median, n) in homa::timetrace::one_ways(events, "sendmmsg start", "recvmmsg got")
    {
        eprintln!("  {median:8.0} ns  {from} -> {to}  ({n} samples)");
    }
}

/// The requests of a Homa echo run and the checks of their replies (shared
/// by the blocking and the async client).
/// The echo read incrementally: `call_partial`, then every chunk of the
/// response in order (checked against the request in the first and the
/// last round trip, as for `homa`). Recorded: the time to the last chunk,
/// or with `first_chunk` to the first one (the rest is still read before
/// the next round trip).
fn homa_partial_echo(
    cfg: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
    first_chunk: bool,
) -> anyhow::Result<Histogram<u64>> {
    let (server, echo) = EchoServer::start(cfg, true)?;
    let addr = server.local_addr();
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let run = HomaEchoes::new(size, 4, warmup, count);
    let msg = run.request();
    let mut h = new_histogram();
    let mut got = Vec::with_capacity(size);
    let result = (|| -> anyhow::Result<()> {
        for i in 0..warmup + count {
            let t0 = Instant::now();
            let mut incoming = client.call_partial(addr, msg.clone())?;
            let mut first = None;
            let check = i == 0 || i + 1 == warmup + count;
            got.clear();
            while let Some(chunk) = incoming.next_chunk()? {
                first.get_or_insert_with(|| t0.elapsed());
                if check {
                    got.extend_from_slice(chunk);
                }
            }
            let ns = if first_chunk {
                first.unwrap_or_else(|| t0.elapsed())
            } else {
                t0.elapsed()
            }
            .as_nanos() as u64;
            anyhow::ensure!(
                incoming.position() == size,
                "echo of {} bytes",
                incoming.position()
            );
            if check {
                anyhow::ensure!(got[..] == msg[..], "echo differs from the request");
            }
            if i >= warmup {
                record(&mut h, ns);
            }
        }
        Ok(())
    })();
    EchoServer::stop(&server, echo)?;
    result.map(|_| h)
}

pub(crate) struct HomaEchoes {
    payloads: Payloads,
    seq: u64,
    size: usize,
    warmup: u64,
    total: u64,
}

impl HomaEchoes {
    pub(crate) fn new(size: usize, seq: u64, warmup: u64, count: u64) -> HomaEchoes {
        HomaEchoes {
            payloads: Payloads::new(size),
            seq,
            size,
            warmup,
            total: warmup + count,
        }
    }

    /// Every request's bytes.
    pub(crate) fn request(&self) -> bytes::Bytes {
        self.payloads.payload(self.seq, self.size)
    }

    /// Checks the reply of round trip `i` (its length always, its bytes in
    /// the first and the last) and records its time after the warm-up.
    pub(crate) fn take(
        &self,
        i: u64,
        reply: &homa::Message,
        ns: u64,
        h: &mut Histogram<u64>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            reply.len() == self.size,
            "echo of {} bytes, sent {}",
            reply.len(),
            self.size
        );
        if i == 0 || i + 1 == self.total {
            anyhow::ensure!(
                self.payloads.matches(self.seq, &reply.contiguous()),
                "Homa echo corrupted the payload"
            );
        }
        if i >= self.warmup {
            record(h, ns);
        }
        Ok(())
    }
}

/// Round trips of `size`-byte echoes between two Homa endpoints.
pub fn homa_echo(
    cfg: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
    timetrace: bool,
    inline: bool,
) -> anyhow::Result<Histogram<u64>> {
    let (server, echo) = EchoServer::start(cfg, inline)?;
    let addr = server.local_addr();
    let client = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let run = HomaEchoes::new(size, 4, warmup, count);
    let msg = run.request();
    let mut h = new_histogram();
    let result = (|| -> anyhow::Result<()> {
        for i in 0..warmup + count {
            if timetrace && i == warmup {
                homa::timetrace::enable(true);
            }
            let t0 = Instant::now();
            let reply = client.call(addr, msg.clone())?;
            run.take(i, &reply, t0.elapsed().as_nanos() as u64, &mut h)?;
        }
        Ok(())
    })();
    homa::timetrace::enable(false);
    EchoServer::stop(&server, echo)?;
    result.map(|_| h)
}

/// The Homa echo server of `homa` and `homa-partial`, on its own thread.
struct EchoServer;

impl EchoServer {
    /// Binds it on loopback and starts answering: inside its receive pass
    /// (`serve`, with `inline`) or through `recv_request` and `reply`.
    fn start(
        cfg: &homa::EndpointConfig,
        inline: bool,
    ) -> anyhow::Result<(homa::Endpoint, std::thread::JoinHandle<homa::Result<()>>)> {
        let server = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
        let srv = server.clone();
        let echo = std::thread::Builder::new().name("server".into()).spawn(
            move || -> homa::Result<()> {
                if inline {
                    // Echoed from the pool without a copy, as the UDP
                    // baseline echoes from its receive buffer.
                    return srv.serve(|req| {
                        let (message, responder) = req.into_parts();
                        let _ = responder.reply(message.into_bytes());
                    });
                }
                loop {
                    match srv.recv_request() {
                        Ok(req) => {
                            let (message, responder) = req.into_parts();
                            responder.reply(message.into_bytes())?;
                        }
                        Err(homa::Error::Shutdown) => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            },
        )?;
        Ok((server, echo))
    }

    /// Shuts the server down and waits for its thread.
    fn stop(
        server: &homa::Endpoint,
        echo: std::thread::JoinHandle<homa::Result<()>>,
    ) -> anyhow::Result<()> {
        server.shutdown();
        echo.join()
            .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_share_the_round_trips() {
        for (count, rounds) in [(20_000, 5), (7, 3), (2, 5), (100, 1)] {
            let shares: Vec<u64> = (0..rounds).map(|r| round_share(count, rounds, r)).collect();
            assert_eq!(shares.iter().sum::<u64>(), count, "{shares:?}");
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(hi - lo <= 1, "{shares:?}");
        }
    }

    /// (transport, size, count) of each row.
    fn shape(rows: &[LatencyRow]) -> Vec<(&str, usize, u64)> {
        rows.iter()
            .map(|r| (r.transport.as_str(), r.size, r.count))
            .collect()
    }

    /// Every transport is measured in every round and the rows count all
    /// round trips of all rounds.
    #[test]
    fn rounds_merge_into_one_row_per_transport_and_size() {
        let spec = EchoBench {
            sizes: vec![100, 70_000],
            iters: 31,
            rounds: 3,
            poll: Duration::ZERO,
            homa: homa::Endpoint::builder().poll(Duration::ZERO).build(),
            ..EchoBench::new(vec!["homa".into(), "udp".into(), "tcp".into()])
        };
        let rows = measure(&spec).unwrap();
        assert_eq!(
            shape(&rows),
            [
                ("homa", 100, 31),
                ("udp", 100, 31),
                ("tcp", 100, 31),
                ("homa", 70000, 31),
                ("tcp", 70000, 31)
            ]
        );
    }

    /// The async transports, with tiny counts: one row each, every round
    /// trip counted (the UDP one only where a datagram holds the message).
    #[test]
    fn async_transports_measure_every_round_trip() {
        let spec = EchoBench {
            sizes: vec![100, 70_000],
            iters: 12,
            rounds: 2,
            ..EchoBench::new(vec![
                "homa-async".into(),
                "tokio-udp".into(),
                "tokio-tcp".into(),
            ])
        };
        let rows = measure(&spec).unwrap();
        assert_eq!(
            shape(&rows),
            [
                ("homa-async", 100, 12),
                ("tokio-udp", 100, 12),
                ("tokio-tcp", 100, 12),
                ("homa-async", 70000, 12),
                ("tokio-tcp", 70000, 12)
            ]
        );
        assert!(rows.iter().all(|r| r.p50_us > 0.0 && r.p99_us >= r.p50_us));
    }

    #[test]
    fn large_sizes_run_fewer_iterations() {
        assert_eq!(count_for(10_000, 100), 10_000);
        assert_eq!(count_for(10_000, 65_536), 10_000);
        assert_eq!(count_for(10_000, 655_360), 1_000);
        assert_eq!(count_for(10_000, 100_000_000), 100);
        assert_eq!(count_for(5, 100_000_000), 5);
    }
}
