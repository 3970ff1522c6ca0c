//! What the machine allows a nested-call pattern, with no transport at all.
//!
//! A client calls a front server, which makes `nested` calls in parallel to
//! `backends` backend threads (round robin), waits for all their answers and
//! then answers the client: the fan-out of `rpc-bench` and the replicated
//! write of `kv-bench`. Here every hop is one raw UDP datagram of 100 bytes
//! between threads of this process, each thread waiting on its own
//! socket the way the raw UDP baseline does ([`crate::wait`]): no Homa, no
//! framework, no encoding, no log. Whatever a transport adds comes on top,
//! so a goal stated as a ratio between two such patterns (3 nested calls
//! against 1; a write replicated to 3 backups against an echo) cannot be met
//! by any user-space transport on this machine if even these threads miss
//! it: on a machine with fewer cores than busy threads, the pattern's
//! threads take turns on the cores.
//!
//! Three ways to wait are measured and the fastest one counts: `spin`
//! (busy-poll for the poll period, then sleep in `poll(2)`, as the UDP
//! baseline), `yield` (the same, yielding the CPU on every round of the
//! spin, as a polite spinner does) and `block` (sleep at once; the kernel
//! wakes the thread, as a blocking TCP or Redis client is woken).

use crate::stats::{new_histogram, record};
use crate::wait::{udp_recv, Waiting};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes per datagram (the benchmarks' 100-byte messages).
const SIZE: usize = 100;
/// How long a thread busy-polls before it sleeps (the runtime's default).
const POLL: Duration = Duration::from_micros(50);
/// A call that took longer than this lost a datagram: not counted, redone.
const LOST: Duration = Duration::from_millis(100);

/// How every thread of the pattern waits for its next datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    Spin,
    Yield,
    Block,
}

impl Wait {
    pub const ALL: [Wait; 3] = [Wait::Spin, Wait::Yield, Wait::Block];

    pub fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Yield => "yield",
            Wait::Block => "block",
        }
    }

    fn waiting<'a>(self, stop: Option<&'a AtomicBool>, deadline: Option<Instant>) -> Waiting<'a> {
        Waiting {
            poll: if self == Wait::Block {
                Duration::ZERO
            } else {
                POLL
            },
            stop,
            deadline,
            yielding: self == Wait::Yield,
        }
    }
}

/// One pattern's round trips, measured by the client.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FloorRow {
    /// Calls the front makes per client call (0: the front answers at once,
    /// an echo).
    pub nested: u32,
    pub backends: usize,
    /// The fastest way of waiting (by p50) of those measured.
    pub wait: Wait,
    pub p50_us: f64,
    pub p99_us: f64,
    /// The round trip of an ideal schedule: every thread on a core of its
    /// own (no waiting for a CPU, no wake-ups) and nothing but this
    /// machine's measured cost of sending and of receiving one datagram
    /// ([`SyscallCosts`], [`ideal_ns`]).
    pub ideal_us: f64,
}

/// What one 100-byte datagram costs the thread that sends it and the
/// thread that receives it on loopback, ns (medians). On loopback the
/// sender's system call also does the receiving side's protocol work up to
/// the socket's queue, which is why a send costs several times a receive.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct SyscallCosts {
    pub send_ns: f64,
    pub recv_ns: f64,
}

/// Measures [`SyscallCosts`] on one thread: `count` times, a send to a
/// socket of its own and the receive that takes the datagram back. No
/// other thread touches the sockets (a second thread polling the receiving
/// socket makes each send ~0.6 µs dearer here, and one sharing the CPU
/// makes the timings say more about the scheduler than the calls), so
/// these are the least the calls cost.
pub fn syscall_costs(count: u64) -> anyhow::Result<SyscallCosts> {
    let rx = bind()?;
    let to = rx.local_addr()?;
    let tx = bind()?;
    let msg = [7u8; SIZE];
    let mut buf = [0u8; 2048];
    let (mut sent, mut took) = (new_histogram(), new_histogram());
    for _ in 0..count.max(1) {
        let t0 = Instant::now();
        tx.send_to(&msg, to)?;
        let t1 = Instant::now();
        rx.recv_from(&mut buf)?;
        record(&mut sent, (t1 - t0).as_nanos() as u64);
        record(&mut took, t1.elapsed().as_nanos() as u64);
    }
    Ok(SyscallCosts {
        send_ns: sent.value_at_quantile(0.5) as f64,
        recv_ns: took.value_at_quantile(0.5) as f64,
    })
}

/// The round trip of the pattern under an ideal schedule: each thread on
/// its own core, a datagram visible to its receiver when its sender's
/// system call returns, nothing else costing time. The front sends its
/// `nested` requests one after another; each backend answers its requests
/// in turn as they arrive; the front answers the client after the last
/// answer. An echo (`nested` 0) is one send and one receive each way.
///
/// Where a hop (a send and its receive) is all a datagram costs, as on
/// loopback, the ratios follow from the pattern's shape whatever the
/// costs: 3 nested calls to one backend are 6 hops against one nested
/// call's 4 (the backend's answers are one hop each, in turn), 1.5x; a
/// write to 3 backends is `6 send + 4 recv` against an echo's
/// `2 send + 2 recv`, between 2.5x (a receive costing a send) and 3x (a
/// free receive).
pub fn ideal_ns(nested: u32, backends: usize, c: SyscallCosts) -> f64 {
    let (send, recv) = (c.send_ns, c.recv_ns);
    // The request is in the front's hands.
    let front = send + recv;
    let mut backend_free = vec![0.0f64; backends.max(1)];
    let mut last_answer: f64 = front;
    for i in 0..nested as usize {
        let arrives = front + (i as f64 + 1.0) * send;
        let b = i % backend_free.len();
        let done = backend_free[b].max(arrives) + recv + send;
        backend_free[b] = done;
        last_answer = last_answer.max(done);
    }
    let front_done = if nested == 0 {
        front
    } else {
        // Every answer is received by the front; the last one ends it.
        last_answer.max(front + nested as f64 * send) + recv
    };
    front_done + send + recv
}

/// The sequence number every datagram of one client call carries, so that a
/// late answer to an earlier call is never taken for this one's.
fn seq_of(buf: &[u8]) -> u64 {
    u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"))
}

fn bind() -> std::io::Result<UdpSocket> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Runs `f` on a thread named `name`.
fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<T>>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

fn stopped(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Interrupted
}

/// `count` client calls (after `warmup`) through the pattern, every thread
/// waiting as `wait` says.
pub fn nested_udp(
    nested: u32,
    backends: usize,
    count: u64,
    warmup: u64,
    wait: Wait,
) -> anyhow::Result<Histogram<u64>> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..backends.max(1) {
        let sock = bind()?;
        addrs.push(sock.local_addr()?);
        let st = stop.clone();
        threads.push(spawn("floor-backend", move || {
            let mut buf = [0u8; 2048];
            let w = wait.waiting(Some(&st), None);
            loop {
                match udp_recv(&sock, &mut buf, w) {
                    Ok((n, from)) => {
                        sock.send_to(&buf[..n], from)?;
                    }
                    Err(e) if stopped(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })?);
    }
    let front = bind()?;
    let front_addr = front.local_addr()?;
    let st = stop.clone();
    let backend_addrs = addrs.clone();
    threads.push(spawn("floor-front", move || {
        let mut buf = [0u8; 2048];
        let mut answer = [0u8; 2048];
        let w = wait.waiting(Some(&st), None);
        'calls: loop {
            let (n, client) = match udp_recv(&front, &mut buf, w) {
                Ok(r) => r,
                Err(e) if stopped(&e) => return Ok(()),
                Err(e) => return Err(e),
            };
            if n < 8 {
                continue;
            }
            let seq = seq_of(&buf);
            for i in 0..nested as usize {
                front.send_to(&buf[..n], backend_addrs[i % backend_addrs.len()])?;
            }
            let mut answered = 0;
            let give_up = Instant::now() + LOST;
            while answered < nested {
                let w = wait.waiting(Some(&st), Some(give_up));
                match udp_recv(&front, &mut answer, w) {
                    Ok((m, _)) if m >= 8 && seq_of(&answer) == seq => answered += 1,
                    Ok(_) => {}
                    Err(e) if stopped(&e) => return Ok(()),
                    // A datagram was lost: the client calls again.
                    Err(e) if e.kind() == ErrorKind::TimedOut => continue 'calls,
                    Err(e) => return Err(e),
                }
            }
            front.send_to(&buf[..n], client)?;
        }
    })?);
    let client = bind()?;
    let mut h = new_histogram();
    let result = (|| -> anyhow::Result<()> {
        let mut msg = [7u8; SIZE];
        let mut buf = [0u8; 2048];
        let mut seq = 0u64;
        let mut done = 0u64;
        while done < warmup + count {
            seq += 1;
            msg[..8].copy_from_slice(&seq.to_le_bytes());
            let t0 = Instant::now();
            client.send_to(&msg, front_addr)?;
            let w = wait.waiting(None, Some(t0 + LOST));
            loop {
                match udp_recv(&client, &mut buf, w) {
                    Ok((n, _)) if n == SIZE && seq_of(&buf) == seq => {
                        if done >= warmup {
                            record(&mut h, t0.elapsed().as_nanos() as u64);
                        }
                        done += 1;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::TimedOut => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a floor thread panicked"))??;
    }
    result.map(|_| h)
}

/// Each pattern `(nested, backends)` under every way of waiting, the ways
/// taking turns in `rounds` rounds; the fastest way's row per pattern.
pub fn measure(
    patterns: &[(u32, usize)],
    count: u64,
    rounds: u64,
) -> anyhow::Result<Vec<FloorRow>> {
    let rounds = rounds.max(1);
    let per = (count / rounds).max(10);
    let mut hs: Vec<Vec<Histogram<u64>>> = patterns
        .iter()
        .map(|_| Wait::ALL.iter().map(|_| new_histogram()).collect())
        .collect();
    for _ in 0..rounds {
        for (p, &(nested, backends)) in patterns.iter().enumerate() {
            for (i, &wait) in Wait::ALL.iter().enumerate() {
                hs[p][i].add(nested_udp(nested, backends, per, per / 10, wait)?)?;
            }
        }
    }
    let us = |h: &Histogram<u64>, q: f64| (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0;
    let costs = syscall_costs(5_000)?;
    Ok(patterns
        .iter()
        .zip(&hs)
        .map(|(&(nested, backends), by_wait)| {
            let (wait, h) = Wait::ALL
                .iter()
                .zip(by_wait)
                .min_by_key(|(_, h)| h.value_at_quantile(0.5))
                .expect("three ways");
            FloorRow {
                nested,
                backends,
                wait: *wait,
                p50_us: us(h, 0.5),
                p99_us: us(h, 0.99),
                ideal_us: (ideal_ns(nested, backends, costs) / 10.0).round() / 100.0,
            }
        })
        .collect())
}

/// 100-byte echoes beside a bulk transfer, with no transport: the echo
/// pattern (`nested` 0) timed alone and while two more threads move 64 KB
/// datagrams as fast as they can (a writer that never waits, a reader
/// that waits the same way as the echo's threads), for one way of waiting.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct BesideRow {
    pub wait: Wait,
    pub alone_p50_us: f64,
    pub alone_p99_us: f64,
    pub beside_p50_us: f64,
    pub beside_p99_us: f64,
    /// What the reader received meanwhile, Gbit/s.
    pub bulk_gbps: f64,
}

/// Datagrams of the bulk transfer beside the echoes (fits loopback's MTU).
const BULK: usize = 65_000;

/// [`BesideRow`]s for every way of waiting, `count` echoes each way.
pub fn echoes_beside_bulk(count: u64) -> anyhow::Result<Vec<BesideRow>> {
    let us = |h: &Histogram<u64>, q: f64| (h.value_at_quantile(q) as f64 / 10.0).round() / 100.0;
    let mut rows = Vec::new();
    for wait in Wait::ALL {
        let alone = nested_udp(0, 1, count, count / 10, wait)?;
        let sink = bind()?;
        let to = sink.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (st, gt) = (stop.clone(), got.clone());
        let reader = spawn("floor-bulk-reader", move || {
            let mut buf = vec![0u8; BULK + 1];
            let w = wait.waiting(Some(&st), None);
            loop {
                match udp_recv(&sink, &mut buf, w) {
                    Ok((n, _)) => {
                        gt.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) if stopped(&e) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })?;
        let st = stop.clone();
        let writer = spawn("floor-bulk-writer", move || {
            let tx = UdpSocket::bind("127.0.0.1:0")?;
            let chunk = vec![1u8; BULK];
            while !st.load(Ordering::Relaxed) {
                // A full socket buffer drops the datagram: the writer
                // goes on, as a transfer without flow control would.
                let _ = tx.send_to(&chunk, to);
            }
            Ok(())
        })?;
        std::thread::sleep(Duration::from_millis(20));
        let (t0, b0) = (Instant::now(), got.load(Ordering::Relaxed));
        let beside = nested_udp(0, 1, count, count / 10, wait);
        let moved = got.load(Ordering::Relaxed) - b0;
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for t in [writer, reader] {
            t.join()
                .map_err(|_| anyhow::anyhow!("a floor bulk thread panicked"))??;
        }
        let beside = beside?;
        rows.push(BesideRow {
            wait,
            alone_p50_us: us(&alone, 0.5),
            alone_p99_us: us(&alone, 0.99),
            beside_p50_us: us(&beside, 0.5),
            beside_p99_us: us(&beside, 0.99),
            bulk_gbps: (moved as f64 * 8.0 / secs / 1e9 * 100.0).round() / 100.0,
        });
    }
    Ok(rows)
}

/// The round trip of `(nested, backends)` among `rows`, µs at p50.
pub fn p50_of(rows: &[FloorRow], nested: u32, backends: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.nested == nested && r.backends == backends)
        .map(|r| r.p50_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_and_way_of_waiting_completes_its_calls() {
        for wait in Wait::ALL {
            for (nested, backends) in [(0, 1), (1, 1), (3, 1), (3, 3)] {
                let h = nested_udp(nested, backends, 50, 5, wait).unwrap();
                assert_eq!(h.len(), 50, "{nested} nested, {wait:?}");
            }
        }
    }

    #[test]
    fn the_ideal_schedule_adds_up_the_critical_path() {
        let c = SyscallCosts {
            send_ns: 3.0,
            recv_ns: 0.5,
        };
        // Echo: a send and a receive each way.
        assert_eq!(ideal_ns(0, 1, c), 7.0);
        // One nested call: four hops.
        assert_eq!(ideal_ns(1, 1, c), 14.0);
        // Three to one backend: it answers them in turn, each as it comes
        // (it is slower than the front's sends, so it decides).
        assert_eq!(ideal_ns(3, 1, c), 3.5 + 3.0 + 3.0 * 3.5 + 0.5 + 3.5);
        // Three to three backends: the front's three sends decide.
        assert_eq!(ideal_ns(3, 3, c), 3.5 + 9.0 + 3.5 + 0.5 + 3.5);
    }

    #[test]
    fn the_ideal_ratios_follow_from_the_shape() {
        for (send_ns, recv_ns) in [(3.0, 0.5), (1.0, 1.0), (5.0, 0.1)] {
            let c = SyscallCosts { send_ns, recv_ns };
            let r = ideal_ns(3, 1, c) / ideal_ns(1, 1, c);
            assert!((r - 1.5).abs() < 1e-9, "{c:?}: {r}");
            let w = ideal_ns(3, 3, c) / ideal_ns(0, 1, c);
            assert!((2.5 - 1e-9..=3.0).contains(&w), "{c:?}: {w}");
        }
    }

    #[test]
    fn sending_costs_something_and_receiving_too() {
        let c = syscall_costs(200).unwrap();
        assert!(c.send_ns > 0.0 && c.recv_ns > 0.0, "{c:?}");
    }

    #[test]
    fn echoes_beside_a_bulk_transfer_are_timed_every_way() {
        let rows = echoes_beside_bulk(100).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(
            rows.iter()
                .all(|r| r.bulk_gbps > 0.0 && r.beside_p50_us > 0.0),
            "{rows:?}"
        );
    }

    #[test]
    fn more_nested_calls_take_longer_than_an_echo() {
        let rows = measure(&[(0, 1), (3, 3)], 400, 2).unwrap();
        let echo = p50_of(&rows, 0, 1).unwrap();
        let write = p50_of(&rows, 3, 3).unwrap();
        assert!(write > echo, "3 nested {write} us, echo {echo} us");
    }
}
