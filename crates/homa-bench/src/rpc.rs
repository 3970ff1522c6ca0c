//! `homa rpc-bench` (issue #23): the cost of the homa-rpc framework over
//! the raw API, in the same run. `homa-raw` is a raw `Endpoint` echo
//! (`serve` + `call`, the request's bytes echoed from the pool);
//! `homa-rpc` is a null method through the framework (an `inline` method
//! taking and returning `Raw` bytes of the same size, so both move the
//! same bytes each way). The two take turns in rounds, each round on
//! freshly bound endpoints after its own warm-up. The fan-out rows time
//! one outer call whose `inline` handler makes 1 or N nested calls to a
//! backend server, started together and then waited for.

use crate::echo::{homa_echo, round_share};
use crate::stats::{new_histogram, record};
use bytes::Bytes;
use hdrhistogram::Histogram;
use homa::Endpoint;
use homa_rpc::{Context, Raw, Server, Status};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

homa_rpc::service! {
    /// The benchmark's services: a null method and a fan-out.
    pub mod bench {
        /// Returns its request's bytes.
        inline fn null(Raw) -> Raw;
        /// Makes `n` nested `null` calls of 100 bytes to the backends in
        /// parallel, run to completion in the receive pass.
        inline fn fan(u32) -> u32;
        /// The same on the worker pool (a thread handoff each way).
        pool fn fan_pool(u32) -> u32;
        /// The same as a tokio task, awaiting the nested calls.
        task fn fan_task(u32) -> u32;
    }
}

/// The fan-out handler's backends.
struct Bench {
    backends: Vec<SocketAddr>,
    nested_payload: Bytes,
}

impl Bench {
    /// Starts `n` nested calls at once (round robin over the backends).
    fn start_nested(&self, cx: &Context, n: u32) -> Result<Vec<homa_rpc::Call<Raw>>, Status> {
        let rpc = cx.client()?;
        (0..n as usize)
            .map(|i| {
                let addr = self.backends[i % self.backends.len()];
                rpc.start::<Raw, Raw>(addr, bench::ids::null, &self.nested_payload)
            })
            .collect()
    }
}

impl bench::Service for Bench {
    fn null(&self, _cx: &Context, m: homa::Message) -> Result<Bytes, Status> {
        Ok(m.into_bytes())
    }
    fn fan(&self, cx: &Context, n: u32) -> Result<u32, Status> {
        for c in self.start_nested(cx, n)? {
            c.wait()?;
        }
        Ok(n)
    }
    fn fan_pool(&self, cx: &Context, n: u32) -> Result<u32, Status> {
        self.fan(cx, n)
    }
    async fn fan_task(self: Arc<Self>, cx: Context, n: u32) -> Result<u32, Status> {
        for c in self.start_nested(&cx, n)? {
            c.wait_async().await?;
        }
        Ok(n)
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct RpcBench {
    pub sizes: Vec<usize>,
    /// Round trips per transport and size (after a tenth as many for
    /// warm-up in each round).
    pub iters: u64,
    /// Transports take turns in this many rounds.
    pub rounds: u64,
    /// Nested calls of the fan-out rows (e.g. `[1, 3]`; empty: skip).
    pub fanout: Vec<u32>,
    /// Outer calls per fan-out width.
    pub fanout_iters: u64,
    /// Modes of the fan-out handler: `inline`, `pool`, `task`.
    pub fanout_modes: Vec<String>,
    /// Backend servers the nested calls go to (round robin).
    pub backends: usize,
    pub homa: homa::EndpointConfig,
    /// Also measure `homa-raw-copy` (see [`raw_copy_echo`]).
    pub copy_baseline: bool,
    /// Also measure the fan-out patterns with no transport ([`crate::floor`]).
    pub floor: bool,
    pub progress: bool,
}

/// One transport at one size.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RpcRow {
    pub transport: String,
    pub size: usize,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// One fan-out width: the outer call's latency.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FanoutRow {
    /// The outer handler's mode: `inline`, `pool` or `task`.
    pub mode: String,
    pub nested: u32,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The framework's own work per null call of one size, timed in a loop
/// on one thread without the network (so the machine's load barely moves
/// it): what `homa-rpc` adds to `homa-raw` apart from cache effects.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CodecRow {
    pub size: usize,
    /// Client: the request's buffer (header + body copied in); server:
    /// header decode, method lookup, the response's buffer (header + body
    /// copied in); client: the response header check. Median of 5 runs.
    pub ns_per_call: f64,
}

/// Everything `--json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct RpcReport {
    pub rows: Vec<RpcRow>,
    pub fanout: Vec<FanoutRow>,
    /// The fan-out patterns over raw UDP between threads, no transport
    /// ([`crate::floor`]): what this machine allows them.
    pub floor: Vec<crate::floor::FloorRow>,
    pub codec: Vec<CodecRow>,
}

/// See [`CodecRow`]: `iters` calls' worth of the framework's steps.
pub fn codec_ns(size: usize, iters: u64) -> f64 {
    use homa_rpc::wire::{decode_response, RequestHeader, REQUEST_HEADER_LEN};
    use homa_rpc::{Dispatch, Payload};
    let body = crate::payload::Payloads::new(size).payload(4, size);
    let svc = bench::server(Bench {
        backends: Vec::new(),
        nested_payload: Bytes::new(),
    });
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..iters {
                // Client: header and body into one buffer.
                let mut out = Vec::with_capacity(REQUEST_HEADER_LEN + Raw::size_hint(&body));
                out.extend_from_slice(&RequestHeader::new(bench::ids::null, 0, 0).encode());
                Raw::encode(&body, &mut out).unwrap();
                let req = Bytes::from(out);
                // Server: header, method, response buffer.
                let mut first = [0u8; REQUEST_HEADER_LEN];
                first.copy_from_slice(&req[..REQUEST_HEADER_LEN]);
                let h = RequestHeader::decode(&first, req.len()).unwrap();
                assert!(svc.mode(h.method).is_some());
                let echoed = req.slice(h.body_offset as usize..);
                let resp = homa_rpc::encode_ok::<Raw>(&echoed).unwrap();
                // Client: the response header.
                let off = decode_response(&resp[..4], resp.len()).unwrap();
                std::hint::black_box(&resp[off..]);
            }
            t0.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    runs.sort_by(|a, b| a.total_cmp(b));
    (runs[2] * 10.0).round() / 10.0
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0
}

fn say(on: bool, what: &str) {
    if on {
        eprintln!("rpc-bench: {what}");
    }
}

/// Serves `s` on its own thread, named `name` (the breakdown finds the
/// server's events by it), until it is shut down.
fn serve(s: &Server, name: &str) -> std::thread::JoinHandle<homa::Result<()>> {
    let s = s.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || s.serve())
        .expect("a thread for the server")
}

/// Runs `call` `warmup` times untimed, then `count` times into a
/// histogram of its durations. With `marks`, each timed call is framed by
/// the `rpc-bench call {i}` / `rpc-bench done {i}` trace points that
/// `--breakdown` cuts the trace at (the end mark follows every call, as
/// it did in each benchmark's own loop).
fn timed_calls(
    warmup: u64,
    count: u64,
    marks: bool,
    mut call: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Histogram<u64>> {
    let mut h = new_histogram();
    for i in 0..warmup + count {
        if marks && i >= warmup {
            homa::tt!("rpc-bench call {}", i);
        }
        let t0 = Instant::now();
        let r = call();
        let ns = t0.elapsed().as_nanos() as u64;
        if marks {
            homa::tt!("rpc-bench done {}", i);
        }
        r?;
        if i >= warmup {
            record(&mut h, ns);
        }
    }
    Ok(h)
}

/// `count` null calls of `size` bytes through the framework, after
/// `warmup`, on a fresh server and client.
pub fn rpc_echo(
    cfg: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
) -> anyhow::Result<Histogram<u64>> {
    let server = Server::builder(Endpoint::bind_with("127.0.0.1:0", cfg.clone())?)
        .workers(1)
        .service(bench::server(Bench {
            backends: Vec::new(),
            nested_payload: Bytes::new(),
        }))
        .build();
    let t = serve(&server, crate::rpc_breakdown::SERVER_THREAD);
    let client = homa_rpc::Client::new(Endpoint::bind_with("127.0.0.1:0", cfg.clone())?);
    let stub = bench::Client::new(client, server.endpoint().local_addr());
    let req = crate::payload::Payloads::new(size).payload(4, size);
    let result = timed_calls(warmup, count, true, || {
        let reply = stub.null(&req)?;
        anyhow::ensure!(
            reply.len() == size,
            "echo of {} bytes, sent {size}",
            reply.len()
        );
        Ok(())
    });
    server.shutdown();
    let _ = t.join();
    result
}

/// A raw echo that copies as the framework does (`homa-raw-copy`): the
/// client writes each request into a fresh buffer behind 12 bytes, the
/// server copies the body into a fresh buffer behind 4 bytes; no header
/// is read and no method looked up. Separates the cost of those two
/// buffers from the framework's other steps.
pub fn raw_copy_echo(
    cfg: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
) -> anyhow::Result<Histogram<u64>> {
    let server = Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let srv = server.clone();
    let t = std::thread::spawn(move || {
        srv.serve(|req| {
            let (m, responder) = req.into_parts();
            let mut out = Vec::with_capacity(4 + m.len());
            out.extend_from_slice(&[0; 4]);
            for f in m.fragments() {
                out.extend_from_slice(f);
            }
            let _ = responder.reply(out);
        })
    });
    let client = Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let body = crate::payload::Payloads::new(size).payload(4, size);
    let result = timed_calls(warmup, count, false, || {
        let mut out = Vec::with_capacity(12 + size);
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(&body);
        let reply = client.call(addr, out)?;
        anyhow::ensure!(reply.len() == size + 16, "echo of {} bytes", reply.len());
        Ok(())
    });
    server.shutdown();
    let _ = t.join();
    result
}

/// Outer calls whose handler makes `n` nested calls, `count` of them
/// after `warmup`, on fresh servers.
pub fn fanout(
    cfg: &homa::EndpointConfig,
    mode: &str,
    n: u32,
    backends: usize,
    count: u64,
    warmup: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..backends.max(1) {
        let s = Server::builder(Endpoint::bind_with("127.0.0.1:0", cfg.clone())?)
            .workers(1)
            .service(bench::server(Bench {
                backends: Vec::new(),
                nested_payload: Bytes::new(),
            }))
            .build();
        addrs.push(s.endpoint().local_addr());
        servers.push(s);
    }
    // One worker thread: the task mode's handlers and their nested
    // calls' wake-ups.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let front = Server::builder(Endpoint::bind_with("127.0.0.1:0", cfg.clone())?)
        .workers(1)
        .runtime(rt.handle().clone())
        .service(bench::server(Bench {
            backends: addrs,
            nested_payload: crate::payload::Payloads::new(100).payload(5, 100),
        }))
        .build();
    let names = |i: usize| {
        if i < backends.max(1) {
            crate::rpc_breakdown::BACKEND_THREAD
        } else {
            crate::rpc_breakdown::SERVER_THREAD
        }
    };
    servers.push(front.clone());
    let threads: Vec<_> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| serve(s, names(i)))
        .collect();
    let client = homa_rpc::Client::new(Endpoint::bind_with("127.0.0.1:0", cfg.clone())?);
    let stub = bench::Client::new(client, front.endpoint().local_addr());
    let result = timed_calls(warmup, count, true, || {
        let got = match mode {
            "inline" => stub.fan(&n)?,
            "pool" => stub.fan_pool(&n)?,
            "task" => stub.fan_task(&n)?,
            other => anyhow::bail!("unknown fan-out mode {other} (inline, pool, task)"),
        };
        anyhow::ensure!(got == n, "fan-out answered {got}, asked {n}");
        Ok(())
    });
    for s in &servers {
        s.shutdown();
    }
    for t in threads {
        let _ = t.join();
    }
    result
}

pub fn measure(b: &RpcBench) -> anyhow::Result<RpcReport> {
    let rounds = b.rounds.max(1);
    let mut rows = Vec::new();
    for &size in &b.sizes {
        say(
            b.progress,
            &format!("{size} B: homa-raw and homa-rpc, {rounds} rounds"),
        );
        let (mut raw, mut rpc, mut copy) = (new_histogram(), new_histogram(), new_histogram());
        for r in 0..rounds {
            let share = round_share(b.iters, rounds, r).max(10);
            raw.add(homa_echo(&b.homa, size, share, share / 10, false, true)?)?;
            rpc.add(rpc_echo(&b.homa, size, share, share / 10)?)?;
            if b.copy_baseline {
                copy.add(raw_copy_echo(&b.homa, size, share, share / 10)?)?;
            }
        }
        let mut ts = vec![("homa-raw", &raw), ("homa-rpc", &rpc)];
        if b.copy_baseline {
            ts.push(("homa-raw-copy", &copy));
        }
        for (t, h) in ts {
            rows.push(RpcRow {
                transport: t.into(),
                size,
                p50_us: us(h, 0.5),
                p99_us: us(h, 0.99),
            });
        }
    }
    let mut fan = Vec::new();
    if !b.fanout.is_empty() {
        let cases: Vec<(&str, u32)> = b
            .fanout_modes
            .iter()
            .flat_map(|m| b.fanout.iter().map(move |&n| (m.as_str(), n)))
            .collect();
        say(b.progress, &format!("fan-out {cases:?}, {rounds} rounds"));
        let mut hs: Vec<_> = cases.iter().map(|_| new_histogram()).collect();
        for r in 0..rounds {
            let share = round_share(b.fanout_iters, rounds, r).max(10);
            for (&(m, n), h) in cases.iter().zip(hs.iter_mut()) {
                h.add(fanout(&b.homa, m, n, b.backends, share, share / 10)?)?;
            }
        }
        for (&(m, n), h) in cases.iter().zip(&hs) {
            fan.push(FanoutRow {
                mode: m.into(),
                nested: n,
                p50_us: us(h, 0.5),
                p99_us: us(h, 0.99),
            });
        }
    }
    let floor = if b.floor && !b.fanout.is_empty() {
        say(
            b.progress,
            "floor: the fan-out patterns over raw UDP between threads",
        );
        let patterns: Vec<_> = b.fanout.iter().map(|&n| (n, b.backends.max(1))).collect();
        crate::floor::measure(&patterns, b.fanout_iters, rounds)?
    } else {
        Vec::new()
    };
    let codec = b
        .sizes
        .iter()
        .map(|&size| CodecRow {
            size,
            ns_per_call: codec_ns(size, 20_000),
        })
        .collect();
    Ok(RpcReport {
        rows,
        fanout: fan,
        floor,
        codec,
    })
}

/// `--breakdown`: one traced case, its untraced twin measured just before.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownCase {
    pub breakdown: crate::rpc_breakdown::Breakdown,
    /// Median round trip of the traced calls (timed by the bench).
    pub traced_p50_ns: f64,
    /// Median round trip of as many untraced calls, same run, just
    /// before the traced ones and just after.
    pub untraced_p50_ns: f64,
    pub untraced_after_p50_ns: f64,
}

/// Everything `--breakdown` prints.
#[derive(Clone, Debug, Serialize)]
pub struct BreakdownReport {
    /// One null call of 100 B (`inline`).
    pub null: BreakdownCase,
    /// One outer call whose `inline` handler makes one nested call.
    pub nested: Option<BreakdownCase>,
    /// `timetrace::record_cost_ns`: one record, ns.
    pub record_cost_ns: f64,
}

/// Runs `run` untraced, then traced, and cuts the trace by `plan`.
fn traced_case(
    plan: &[crate::rpc_breakdown::Boundary],
    run: impl Fn() -> anyhow::Result<Histogram<u64>>,
) -> anyhow::Result<BreakdownCase> {
    use homa::timetrace;
    let before = run()?;
    timetrace::clear();
    timetrace::enable(true);
    let traced = run();
    timetrace::enable(false);
    let events = timetrace::collect();
    timetrace::clear();
    let traced = traced?;
    let after = run()?;
    Ok(BreakdownCase {
        breakdown: crate::rpc_breakdown::compute(&events, plan),
        traced_p50_ns: traced.value_at_quantile(0.5) as f64,
        untraced_p50_ns: before.value_at_quantile(0.5) as f64,
        untraced_after_p50_ns: after.value_at_quantile(0.5) as f64,
    })
}

/// `--breakdown`: the null method (`size` bytes, inline), `iters` calls
/// traced; with `nested`, also one outer `inline` call with one nested
/// call, `nested_iters` of them.
pub fn measure_breakdown(
    cfg: &homa::EndpointConfig,
    size: usize,
    iters: u64,
    nested: Option<u64>,
) -> anyhow::Result<BreakdownReport> {
    use crate::rpc_breakdown::{nested_plan, null_plan};
    let null = traced_case(&null_plan(), || rpc_echo(cfg, size, iters, iters / 10))?;
    let nested = nested
        .map(|n| traced_case(&nested_plan(), || fanout(cfg, "inline", 1, 1, n, n / 10)))
        .transpose()?;
    Ok(BreakdownReport {
        null,
        nested,
        record_cost_ns: homa::timetrace::record_cost_ns(1_000_000),
    })
}

/// Prints a [`BreakdownReport`].
pub fn print_breakdown(r: &BreakdownReport, events: bool) {
    use crate::rpc_breakdown::{print, print_events};
    let c = &r.null;
    print(
        "null RPC (inline)",
        &c.breakdown,
        c.traced_p50_ns,
        Some((c.untraced_p50_ns, c.untraced_after_p50_ns)),
    );
    if events {
        print_events(&c.breakdown);
    }
    if let Some(c) = &r.nested {
        println!();
        print(
            "one outer call, one nested call (fan-out inline, 1 nested)",
            &c.breakdown,
            c.traced_p50_ns,
            Some((c.untraced_p50_ns, c.untraced_after_p50_ns)),
        );
        if events {
            print_events(&c.breakdown);
        }
    }
    println!(
        "timetrace::record_cost_ns: {:.1} ns per record (goal <= 20 ns)",
        r.record_cost_ns
    );
}

/// The same-run ratios the goals are stated in.
pub fn print_ratios(r: &RpcReport) {
    for raw in r.rows.iter().filter(|x| x.transport == "homa-raw") {
        if let Some(rpc) = r
            .rows
            .iter()
            .find(|x| x.transport == "homa-rpc" && x.size == raw.size)
        {
            println!(
                "{} B: homa-rpc / homa-raw p50 {:.2}x, p99 {:.2}x (goal p50 <= 1.1x)",
                raw.size,
                rpc.p50_us / raw.p50_us,
                rpc.p99_us / raw.p99_us
            );
        }
        if let Some(copy) = r
            .rows
            .iter()
            .find(|x| x.transport == "homa-raw-copy" && x.size == raw.size)
        {
            println!(
                "{} B: homa-raw-copy / homa-raw p50 {:.2}x (the framework's two buffers alone)",
                raw.size,
                copy.p50_us / raw.p50_us
            );
        }
    }
    for c in &r.codec {
        println!(
            "{} B: the framework's own steps (headers, buffers, lookup) {:.0} ns per call, no network",
            c.size, c.ns_per_call
        );
    }
    for mode in ["inline", "pool", "task"] {
        let rows: Vec<_> = r.fanout.iter().filter(|f| f.mode == mode).collect();
        let one = rows.iter().find(|f| f.nested == 1);
        let wide = rows
            .iter()
            .filter(|f| f.nested > 1)
            .max_by_key(|f| f.nested);
        if let (Some(one), Some(wide)) = (one, wide) {
            println!(
                "fan-out ({mode}): {} nested / 1 nested p50 {:.2}x (goal for 3 <= 1.5x)",
                wide.nested,
                wide.p50_us / one.p50_us
            );
        }
    }
    let one = r.floor.iter().find(|f| f.nested == 1);
    let wide = r
        .floor
        .iter()
        .filter(|f| f.nested > 1)
        .max_by_key(|f| f.nested);
    if let (Some(one), Some(wide)) = (one, wide) {
        println!(
            "fan-out floor (raw UDP threads, no transport; fastest wait {} / {}): {} nested / 1 nested p50 {:.2}x ({:.2} / {:.2} us); ideal schedule, a core per thread: {:.2}x ({:.2} / {:.2} us)",
            wide.wait.name(),
            one.wait.name(),
            wide.nested,
            wide.p50_us / one.p50_us,
            wide.p50_us,
            one.p50_us,
            wide.ideal_us / one.ideal_us,
            wide.ideal_us,
            one.ideal_us
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_measures_every_row() {
        let r = measure(&RpcBench {
            sizes: vec![100],
            iters: 40,
            rounds: 2,
            fanout: vec![1, 3],
            fanout_modes: vec!["inline".into(), "pool".into(), "task".into()],
            fanout_iters: 40,
            backends: 1,
            homa: crate::loopback_config(),
            copy_baseline: true,
            floor: true,
            progress: false,
        })
        .unwrap();
        assert_eq!(r.rows.len(), 3);
        assert_eq!(r.fanout.len(), 6);
        assert!(r.rows.iter().all(|x| x.p50_us > 0.0));
    }
}
