//! `homa kv-bench`: closed-loop random reads and writes of the store (one
//! master, R backups, in this process on loopback), beside a raw Homa echo
//! of the same size and Redis GET and SET+WAIT R (a primary and R replica
//! processes), all in the same run, taking turns in rounds.

use crate::cluster::{ClusterSpec, LocalCluster};
use crate::redis_bench::{timed, RedisCluster};
use crate::KvClient;
use bytes::Bytes;
use hdrhistogram::Histogram;
use homa_bench::stats::new_histogram;
use rand::Rng;
use serde::Serialize;
use std::time::Duration;

/// What to measure.
#[derive(Clone, Debug)]
pub struct KvBench {
    /// Value sizes in bytes.
    pub sizes: Vec<usize>,
    /// Timed operations per system, operation and size (split over the
    /// rounds; a tenth as many again as warm-up in each round).
    pub iters: u64,
    /// Rounds the systems take turns in.
    pub rounds: u64,
    /// R: backups per homa-kv write, replicas per Redis WAIT.
    pub replicas: usize,
    /// Keys read and written at random.
    pub keys: usize,
    /// Longest a single row may run (then it stops early).
    pub max_per_row: Duration,
    /// Open-loop rows at this many operations per second (Poisson
    /// arrivals, 100 B, homa-kv and Redis, reads and writes); 0: none.
    pub rate: f64,
    /// Measure Redis too.
    pub redis: bool,
    /// Measure what the machine allows the read and write patterns with no
    /// transport at all (`homa_bench::floor`: raw UDP between threads).
    pub floor: bool,
    /// Extra rows: 100 B writes with these other numbers of backups (each
    /// on a cluster of its own, after the main rows), to show what each
    /// replica adds (0: the master's log alone).
    pub write_replicas: Vec<usize>,
    pub homa: homa::EndpointConfig,
    /// The backups' busy-poll time (None: `homa.poll`).
    pub backup_poll: Option<Duration>,
    /// The master's replication endpoint's busy-poll time.
    pub nested_poll: Option<Duration>,
    /// The homa-kv client endpoint's busy-poll time.
    pub client_poll: Option<Duration>,
    pub progress: bool,
}

/// One row of the report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Row {
    /// `homa-kv`, `redis` or `homa-echo`.
    pub system: String,
    /// `read`, `write` or `echo`.
    pub op: String,
    pub value_bytes: usize,
    pub replicas: usize,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Everything `--json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The machine's load before the run (homa_bench::machine).
    pub machine: String,
    pub warning: Option<String>,
    /// The homa-kv side's busy-poll times (µs): client, backups, master's
    /// replication endpoint; the master's serving endpoint and the echo
    /// use the common setting (`--poll-us`).
    pub homa_kv_poll_us: [u64; 3],
    pub rows: Vec<Row>,
    /// The same call patterns over raw UDP between threads, no transport
    /// (`homa_bench::floor`): an echo (`nested` 0), a write replicated to
    /// one backup and to R (`nested` = `backends` = R), 100 B each.
    pub floor: Vec<homa_bench::floor::FloorRow>,
    /// Open-loop rows (`rate` > 0).
    pub open_loop: Vec<OpenRow>,
}

/// One open-loop row: latency from each operation's scheduled start.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct OpenRow {
    pub system: String,
    pub op: String,
    pub value_bytes: usize,
    pub replicas: usize,
    /// The target rate (operations per second, Poisson arrivals).
    pub rate_per_s: f64,
    /// Operations issued.
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Threads that issue the open-loop operations (each its own client).
const OPEN_WORKERS: usize = 4;

/// `count` operations at Poisson arrivals of `rate` per second, issued by
/// [`OPEN_WORKERS`] threads (each with its own `op`, made by `make`);
/// an operation issued late (every worker was busy) is timed from its
/// scheduled start, so the wait for a worker counts (no coordinated
/// omission); one issued on time is timed from when its worker woke.
pub fn open_loop<F>(
    rate: f64,
    count: u64,
    make: impl Fn() -> anyhow::Result<F> + Sync,
) -> anyhow::Result<Histogram<u64>>
where
    F: FnMut(&mut rand::rngs::ThreadRng) -> anyhow::Result<()>,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut rng = rand::thread_rng();
    let mut at = 0.0f64;
    let offsets: Vec<Duration> = (0..count)
        .map(|_| {
            let u: f64 = rng.gen_range(f64::EPSILON..1.0);
            at += -u.ln() / rate.max(1.0);
            Duration::from_secs_f64(at)
        })
        .collect();
    let next = AtomicUsize::new(0);
    let t0 = std::time::Instant::now() + Duration::from_millis(20);
    let hists: Vec<anyhow::Result<Histogram<u64>>> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..OPEN_WORKERS)
            .map(|_| {
                s.spawn(|| -> anyhow::Result<Histogram<u64>> {
                    let mut op = make()?;
                    let mut rng = rand::thread_rng();
                    let mut h = new_histogram();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(off) = offsets.get(i) else {
                            return Ok(h);
                        };
                        let due = t0 + *off;
                        let now = std::time::Instant::now();
                        // Behind schedule: timed from when it was due (the
                        // wait for a worker counts). Ahead: from when the
                        // sleep ends (its overshoot is the generator's,
                        // not the system's).
                        let from = if due > now {
                            std::thread::sleep(due - now);
                            std::time::Instant::now()
                        } else {
                            due
                        };
                        op(&mut rng)?;
                        homa_bench::stats::record(&mut h, from.elapsed().as_nanos() as u64);
                    }
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a worker panicked")))
            })
            .collect()
    });
    let mut all = new_histogram();
    for h in hists {
        all.add(h?)?;
    }
    Ok(all)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0
}

fn say(on: bool, what: &str) {
    if on {
        eprintln!("kv-bench: {what}");
    }
}

/// A value of `size` bytes that says which write it is.
fn value(size: usize, tag: u64) -> Bytes {
    let mut v = vec![b'v'; size];
    let t = tag.to_le_bytes();
    let n = t.len().min(size);
    v[..n].copy_from_slice(&t[..n]);
    Bytes::from(v)
}

struct Hists {
    echo: Histogram<u64>,
    read: Histogram<u64>,
    write: Histogram<u64>,
    get: Histogram<u64>,
    set: Histogram<u64>,
}

/// Runs the benchmark; the machine's load is sampled first.
pub fn measure(b: &KvBench) -> anyhow::Result<Report> {
    let load = homa_bench::machine::MachineLoad::sample(Duration::from_millis(200));
    load.report("kv-bench");
    let r = b.replicas.max(1);
    let spec = |replicas: usize| ClusterSpec {
        masters: 1,
        backups: replicas,
        replicas,
        homa: b.homa.clone(),
        backup_poll: b.backup_poll,
        nested_poll: b.nested_poll,
        ..ClusterSpec::default()
    };
    // A fresh store (and client endpoint) per round, as rpc-bench takes
    // fresh endpoints per round: a run of threads that fell into the slow
    // wake-up mode (docs/rpc.md, "Breakdown") does not decide every round.
    let start = |replicas: usize| -> anyhow::Result<(LocalCluster, KvClient)> {
        let c = LocalCluster::start(spec(replicas))?;
        let mut cfg = b.homa.clone();
        if let Some(p) = b.client_poll {
            cfg.poll = p;
        }
        let ep = homa::Endpoint::bind_with("127.0.0.1:0", cfg)?;
        let kv = KvClient::with_rpc(homa_rpc::Client::new(ep), c.coordinator())?;
        Ok((c, kv))
    };
    let redis = if b.redis {
        say(
            b.progress,
            &format!("starting redis: a primary, {r} replicas"),
        );
        Some(RedisCluster::start(r)?)
    } else {
        None
    };
    let keys: Vec<String> = (0..b.keys.max(1)).map(|i| format!("key{i:08}")).collect();
    let rounds = b.rounds.max(1);
    let mut rows = Vec::new();
    let mut tag = 0u64;
    for &size in &b.sizes {
        if let Some(rc) = &redis {
            rc.load(&keys, size)?;
        }
        let mut h = Hists {
            echo: new_histogram(),
            read: new_histogram(),
            write: new_histogram(),
            get: new_histogram(),
            set: new_histogram(),
        };
        let per = (b.iters / rounds).max(10);
        let warm = per / 10;
        let max = b.max_per_row / rounds as u32;
        for round in 0..rounds {
            say(
                b.progress,
                &format!(
                    "{size} B: round {} of {rounds} (homa-kv: 1 master, {r} backups, {} keys)",
                    round + 1,
                    keys.len()
                ),
            );
            h.echo.add(homa_bench::echo::homa_echo(
                &b.homa, size, per, warm, false, true,
            )?)?;
            let (cluster, kv) = start(r)?;
            for k in &keys {
                tag += 1;
                kv.put(k.as_bytes(), value(size, tag))?;
            }
            h.read.add(timed(per, warm, max, |rng| {
                let k = &keys[rng.gen_range(0..keys.len())];
                let v = kv.get(k.as_bytes())?;
                anyhow::ensure!(v.map(|v| v.value.len()) == Some(size), "read of {k}");
                Ok(())
            })?)?;
            h.write.add(timed(per, warm, max, |rng| {
                let k = &keys[rng.gen_range(0..keys.len())];
                tag += 1;
                kv.put(k.as_bytes(), value(size, tag))?;
                Ok(())
            })?)?;
            drop(kv);
            cluster.stop();
            if let Some(rc) = &redis {
                h.get.add(rc.get(&keys, size, per, warm, max)?)?;
                h.set.add(rc.set_wait(&keys, size, per, warm, max)?)?;
            }
        }
        let mut row = |system: &str, op: &str, replicas: usize, hist: &Histogram<u64>| {
            rows.push(Row {
                system: system.into(),
                op: op.into(),
                value_bytes: size,
                replicas,
                p50_us: us(hist, 0.5),
                p99_us: us(hist, 0.99),
            })
        };
        row("homa-echo", "echo", 0, &h.echo);
        row("homa-kv", "read", r, &h.read);
        row("homa-kv", "write", r, &h.write);
        if redis.is_some() {
            row("redis", "read", r, &h.get);
            row("redis", "write", r, &h.set);
        }
    }
    let mut open = Vec::new();
    if b.rate > 0.0 {
        let count =
            ((b.rate * b.max_per_row.as_secs_f64().min(5.0)) as u64).clamp(100, b.iters.max(100));
        say(
            b.progress,
            &format!("open loop: {count} operations at {} per second", b.rate),
        );
        let (cluster, kv) = start(r)?;
        for k in &keys {
            tag += 1;
            kv.put(k.as_bytes(), value(100, tag))?;
        }
        let client = || -> anyhow::Result<KvClient> {
            let ep = homa::Endpoint::bind_with("127.0.0.1:0", b.homa.clone())?;
            Ok(KvClient::with_rpc(
                homa_rpc::Client::new(ep),
                cluster.coordinator(),
            )?)
        };
        let mut add = |system: &str, op: &str, h: Histogram<u64>| {
            open.push(OpenRow {
                system: system.into(),
                op: op.into(),
                value_bytes: 100,
                replicas: r,
                rate_per_s: b.rate,
                ops: h.len(),
                p50_us: us(&h, 0.5),
                p99_us: us(&h, 0.99),
            })
        };
        let keys = &keys;
        let h = open_loop(b.rate, count, || {
            let kv = client()?;
            Ok(move |rng: &mut rand::rngs::ThreadRng| {
                let k = &keys[rng.gen_range(0..keys.len())];
                anyhow::ensure!(kv.get(k.as_bytes())?.is_some(), "read of {k}");
                Ok(())
            })
        })?;
        add("homa-kv", "read", h);
        let h = open_loop(b.rate, count, || {
            let kv = client()?;
            Ok(move |rng: &mut rand::rngs::ThreadRng| {
                let k = &keys[rng.gen_range(0..keys.len())];
                kv.put(k.as_bytes(), value(100, rng.gen()))?;
                Ok(())
            })
        })?;
        add("homa-kv", "write", h);
        drop(kv);
        cluster.stop();
        if let Some(rc) = &redis {
            rc.load(keys, 100)?;
            let h = open_loop(b.rate, count, || {
                let mut con = rc.connection()?;
                Ok(move |rng: &mut rand::rngs::ThreadRng| {
                    let k = &keys[rng.gen_range(0..keys.len())];
                    let v: Option<Vec<u8>> = redis::cmd("GET").arg(k).query(&mut con)?;
                    anyhow::ensure!(v.is_some(), "redis GET of {k}");
                    Ok(())
                })
            })?;
            add("redis", "read", h);
            let h = open_loop(b.rate, count, || {
                let mut con = rc.connection()?;
                let v = vec![b'w'; 100];
                Ok(move |rng: &mut rand::rngs::ThreadRng| {
                    let k = &keys[rng.gen_range(0..keys.len())];
                    crate::redis_bench::set_wait(&mut con, k, &v, r)
                })
            })?;
            add("redis", "write", h);
        }
    }
    drop(redis);
    let floor = if b.floor {
        say(
            b.progress,
            "floor: the echo and write patterns over raw UDP between threads",
        );
        homa_bench::floor::measure(&[(0, 1), (1, 1), (r as u32, r)], b.iters, rounds)?
    } else {
        Vec::new()
    };
    for &r2 in &b.write_replicas {
        say(b.progress, &format!("100 B writes with {r2} backups"));
        let mut hist = new_histogram();
        let per = (b.iters / rounds).max(10);
        for _ in 0..rounds {
            let (c, kv) = start(r2)?;
            hist.add(timed(
                per,
                per / 10,
                b.max_per_row / rounds as u32,
                |rng| {
                    let k = &keys[rng.gen_range(0..keys.len())];
                    tag += 1;
                    kv.put(k.as_bytes(), value(100, tag))?;
                    Ok(())
                },
            )?)?;
            drop(kv);
            c.stop();
        }
        rows.push(Row {
            system: "homa-kv".into(),
            op: "write".into(),
            value_bytes: 100,
            replicas: r2,
            p50_us: us(&hist, 0.5),
            p99_us: us(&hist, 0.99),
        });
    }
    Ok(Report {
        machine: load.describe(),
        warning: load.warning(),
        floor,
        open_loop: open,
        homa_kv_poll_us: [b.client_poll, b.backup_poll, b.nested_poll]
            .map(|p| p.unwrap_or(b.homa.poll).as_micros() as u64),
        rows,
    })
}

/// The write goal's ratio as the floor gives it: the write pattern with R
/// backups over raw UDP threads against their echo, measured and under
/// the ideal schedule (`None` without a floor).
pub fn floor_ratio(r: &Report) -> Option<(String, f64, f64)> {
    let replicas = r.rows.iter().find(|x| x.op == "write")?.replicas;
    let find = |n: u32, b: usize| r.floor.iter().find(|f| f.nested == n && f.backends == b);
    let (echo, write) = (find(0, 1)?, find(replicas as u32, replicas)?);
    Some((
        format!("floor: write pattern R={replicas} p50 / echo p50, raw UDP threads"),
        write.p50_us / echo.p50_us,
        write.ideal_us / echo.ideal_us,
    ))
}

/// The goals, from a report's 100-byte rows: (goal, ratio, limit).
pub fn goals(rows: &[Row]) -> Vec<(String, f64, f64)> {
    // The main rows (the first of each system and operation at 100 B).
    let p50 = |system: &str, op: &str| {
        rows.iter()
            .find(|r| r.system == system && r.op == op && r.value_bytes == 100)
            .map(|r| r.p50_us)
    };
    let mut out = Vec::new();
    let mut add = |what: &str, a: Option<f64>, b: Option<f64>, limit: f64| {
        if let (Some(a), Some(b)) = (a, b) {
            out.push((what.to_string(), a / b, limit));
        }
    };
    let (echo, read, write) = (
        p50("homa-echo", "echo"),
        p50("homa-kv", "read"),
        p50("homa-kv", "write"),
    );
    add("read 100 B p50 / echo p50", read, echo, 1.3);
    add(
        "read 100 B p50 / Redis GET p50",
        read,
        p50("redis", "read"),
        0.5,
    );
    add("write 100 B p50 / echo p50", write, echo, 2.5);
    add(
        "write 100 B p50 / Redis SET+WAIT p50",
        write,
        p50("redis", "write"),
        0.5,
    );
    out
}

/// One traced case: its steps (homa_bench::rpc_breakdown), the median of
/// the traced operations, and of as many untraced ones just before and
/// just after.
#[derive(Clone, Debug, Serialize)]
pub struct TracedCase {
    pub breakdown: homa_bench::rpc_breakdown::Breakdown,
    pub traced_p50_ns: f64,
    pub untraced_p50_ns: f64,
    pub untraced_after_p50_ns: f64,
}

/// `kv-bench --breakdown`: one read and one write with one backup, each
/// cut into its steps across client, network, master and backup.
#[derive(Clone, Debug, Serialize)]
pub struct KvBreakdown {
    pub value_bytes: usize,
    pub read: TracedCase,
    pub write: TracedCase,
    pub record_cost_ns: f64,
}

/// Traces `iters` reads and `iters` writes of the first size on a store
/// with one master and **one** backup (a write is then one outer call
/// with one nested call: rpc-bench's nested plan applies as it is; with
/// three backups the three nested legs overlap and no serial plan fits).
/// The master's and the backup's serving threads carry the names the
/// plans look for.
pub fn measure_breakdown(b: &KvBench, iters: u64) -> anyhow::Result<KvBreakdown> {
    use homa::timetrace;
    use homa_bench::rpc_breakdown::{
        compute, nested_plan, null_plan, BACKEND_THREAD, SERVER_THREAD,
    };
    let size = b.sizes.first().copied().unwrap_or(100);
    let c = LocalCluster::start(ClusterSpec {
        masters: 1,
        backups: 1,
        replicas: 1,
        homa: b.homa.clone(),
        backup_poll: b.backup_poll,
        nested_poll: b.nested_poll,
        thread_names: (SERVER_THREAD, BACKEND_THREAD),
        ..ClusterSpec::default()
    })?;
    let mut cfg = b.homa.clone();
    if let Some(p) = b.client_poll {
        cfg.poll = p;
    }
    let kv = KvClient::with_rpc(
        homa_rpc::Client::new(homa::Endpoint::bind_with("127.0.0.1:0", cfg)?),
        c.coordinator(),
    )?;
    let keys: Vec<String> = (0..b.keys.clamp(1, 1_000))
        .map(|i| format!("key{i:08}"))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        kv.put(k.as_bytes(), value(size, i as u64))?;
    }
    let iters = iters.max(10);
    // The calls, each framed by the marks the plans cut the trace at.
    let run = |write: bool| -> anyhow::Result<Histogram<u64>> {
        let mut h = new_histogram();
        let warm = iters / 10;
        for i in 0..warm + iters {
            let k = keys[i as usize % keys.len()].as_bytes();
            if i >= warm {
                homa::tt!("rpc-bench call {}", i);
            }
            let t0 = std::time::Instant::now();
            if write {
                kv.put(k, value(size, i))?;
            } else {
                anyhow::ensure!(kv.get(k)?.is_some(), "read of a loaded key");
            }
            let ns = t0.elapsed().as_nanos() as u64;
            homa::tt!("rpc-bench done {}", i);
            if i >= warm {
                homa_bench::stats::record(&mut h, ns);
            }
        }
        Ok(h)
    };
    let case = |write: bool| -> anyhow::Result<TracedCase> {
        let before = run(write)?;
        timetrace::clear();
        timetrace::enable(true);
        let traced = run(write);
        timetrace::enable(false);
        let events = timetrace::collect();
        timetrace::clear();
        let traced = traced?;
        let after = run(write)?;
        let plan = if write { nested_plan() } else { null_plan() };
        Ok(TracedCase {
            breakdown: compute(&events, &plan),
            traced_p50_ns: traced.value_at_quantile(0.5) as f64,
            untraced_p50_ns: before.value_at_quantile(0.5) as f64,
            untraced_after_p50_ns: after.value_at_quantile(0.5) as f64,
        })
    };
    let read = case(false)?;
    let write = case(true)?;
    drop(kv);
    c.stop();
    Ok(KvBreakdown {
        value_bytes: size,
        read,
        write,
        record_cost_ns: timetrace::record_cost_ns(1_000_000),
    })
}

/// Prints a [`KvBreakdown`] (as `rpc-bench --breakdown` prints its own).
pub fn print_breakdown(r: &KvBreakdown, events: bool) {
    use homa_bench::rpc_breakdown::{print, print_events};
    for (title, c) in [
        (format!("homa-kv read, {} B", r.value_bytes), &r.read),
        (
            format!(
                "homa-kv write, {} B, one backup (server = master, backend = backup)",
                r.value_bytes
            ),
            &r.write,
        ),
    ] {
        print(
            &title,
            &c.breakdown,
            c.traced_p50_ns,
            Some((c.untraced_p50_ns, c.untraced_after_p50_ns)),
        );
        if events {
            print_events(&c.breakdown);
        }
        println!();
    }
    println!(
        "timetrace::record_cost_ns: {:.1} ns per record",
        r.record_cost_ns
    );
}
