//! Time traces: cheap timestamped events along the runtime's fast path, for
//! latency breakdowns in the style of RAMCloud's TimeTrace (seed 001).
//!
//! Off by default. When off, a trace point costs one relaxed atomic load and
//! a branch. When on, each thread appends `(cycle counter, format, up to
//! four integer arguments)` to its own fixed-size ring (no locks, no
//! allocation after the first event), and [`collect`] merges every
//! thread's ring in time order. Formats are static strings and arguments
//! plain integers, so recording never formats anything: [`TraceEvent::text`]
//! puts the arguments into the format's `{}` when the trace is read.
//! [`record_cost_ns`] measures what one record costs on this machine.
//!
//! Several processes (or hosts) are merged through their dumps
//! ([`dump`], [`parse_dump`], [`merge`]): every event carries its time on
//! `CLOCK_MONOTONIC`, which the processes of one host share; between hosts
//! [`estimate_offset`] takes the clock offset from messages timed at both
//! ends, each way (the smallest one-way times, as the Linux module's
//! tools align their traces).
//!
//! `homa echo-bench --timetrace` prints the mean time between consecutive
//! events of a round trip, which is how the runtime's overhead was found.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Events kept per thread; older ones are overwritten.
const RING: usize = 1 << 16;

static ENABLED: AtomicBool = AtomicBool::new(false);
static SERIALIZED: AtomicBool = AtomicBool::new(false);
static THREADS: Mutex<Vec<Arc<Ring>>> = Mutex::new(Vec::new());
/// The cycle counter, the `Instant` and `CLOCK_MONOTONIC` (ns) at one
/// moment: the origin of every event's times.
static CALIBRATION: OnceLock<(u64, Instant, u64)> = OnceLock::new();

/// One slot: cycle counter, format, arguments.
type Slot = (u64, &'static str, [u64; 4]);

struct Ring {
    thread: String,
    /// Events written so far (the next slot is `next % RING`).
    next: AtomicUsize,
    slots: UnsafeCell<Vec<Slot>>,
}

// SAFETY: only the owning thread writes `slots`, and it publishes each entry
// (Release on `next`) after writing it. `collect` reads only published entries
// and, once the ring has wrapped, skips the oldest one: the only slot a thread
// can still be writing after tracing was disabled (the record it had begun)
// is the one at `next`, which is that oldest slot. The vector never
// reallocates after creation.
unsafe impl Sync for Ring {}
// SAFETY: the same reasoning as for the impl above.
unsafe impl Send for Ring {}

thread_local! {
    static LOCAL: OnceLock<Arc<Ring>> = const { OnceLock::new() };
}

#[inline]
fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions; the TSC is invariant and
        // synchronised across cores on the machines we run on.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let (_, t0, _) = *calibration();
        t0.elapsed().as_nanos() as u64
    }
}

fn calibration() -> &'static (u64, Instant, u64) {
    CALIBRATION.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no preconditions.
        let c = unsafe { core::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        let c = 0;
        (c, Instant::now(), crate::sys::monotonic_ns())
    })
}

/// The cycle counter read after every earlier instruction has completed
/// and before any later one starts (`lfence; rdtsc; lfence`). A plain
/// `rdtsc` may execute while an earlier load still waits on a cache miss,
/// so the miss is billed to the step after the trace point; this is how a
/// ~100 ns hash-map miss on the client's response path was found, after
/// plain traces had put it one step later.
#[inline]
fn serialized_cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: lfence and rdtsc have no preconditions.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            let t = core::arch::x86_64::_rdtsc();
            core::arch::x86_64::_mm_lfence();
            t
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        cycles()
    }
}

/// Makes trace points wait for earlier instructions before reading the
/// clock, and later ones for the read (see `serialized_cycles`): steps
/// are then billed where their time is spent, at ~10-20 ns more per trace
/// point. Off by default.
pub fn set_serialized(on: bool) {
    SERIALIZED.store(on, Ordering::Relaxed);
}

/// Starts (or stops) recording. Starting clears nothing; see [`clear`].
pub fn enable(on: bool) {
    calibration();
    // The engine's own trace points, when compiled in (`engine-trace`).
    homa_proto::trace::set_hook(record);
    ENABLED.store(on, Ordering::Release);
}

/// Whether trace points record.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Allocates this thread's ring now, without recording anything. A
/// thread's first record otherwise allocates it, delaying that thread by
/// as long as writing 3.7 MB takes (about 1.5 ms on a small VM): a thread
/// that is part of a measurement should call this (or record once) before
/// it starts, as the benchmarks' warm-up rounds do.
pub fn prepare_thread() {
    LOCAL.with(|l| {
        l.get_or_init(new_ring);
    });
}

/// This thread's ring, registered for [`collect`].
fn new_ring() -> Arc<Ring> {
    let r = Arc::new(Ring {
        thread: std::thread::current().name().map_or_else(
            || format!("{:?}", std::thread::current().id()),
            String::from,
        ),
        next: AtomicUsize::new(0),
        slots: UnsafeCell::new(vec![(0, "", [0; 4]); RING]),
    });
    THREADS.lock().unwrap().push(r.clone());
    r
}

/// Records `event` on this thread if tracing is on.
#[inline]
pub fn record(event: &'static str) {
    if enabled() {
        record_slow(event, [0; 4]);
    }
}

/// Records `format` with up to four integer arguments (unused ones 0),
/// which [`TraceEvent::text`] puts into the format's `{}` in order, e.g.
/// `record_args("rpc {} sent {} bytes", [id, len, 0, 0])`. Nothing is
/// formatted while recording. See also [`tt!`](crate::tt).
#[inline]
pub fn record_args(format: &'static str, args: [u64; 4]) {
    if enabled() {
        record_slow(format, args);
    }
}

/// Records a trace point with up to four integer arguments:
/// `homa::tt!("rpc {} reply {} bytes", id, len)` is
/// [`record_args`](crate::timetrace::record_args)`("rpc {} reply {} bytes", [id, len, 0, 0])`
/// (each argument converted `as u64`).
#[macro_export]
macro_rules! tt {
    ($fmt:literal) => {
        $crate::timetrace::record($fmt)
    };
    ($fmt:literal, $a:expr) => {
        $crate::timetrace::record_args($fmt, [$a as u64, 0, 0, 0])
    };
    ($fmt:literal, $a:expr, $b:expr) => {
        $crate::timetrace::record_args($fmt, [$a as u64, $b as u64, 0, 0])
    };
    ($fmt:literal, $a:expr, $b:expr, $c:expr) => {
        $crate::timetrace::record_args($fmt, [$a as u64, $b as u64, $c as u64, 0])
    };
    ($fmt:literal, $a:expr, $b:expr, $c:expr, $d:expr) => {
        $crate::timetrace::record_args($fmt, [$a as u64, $b as u64, $c as u64, $d as u64])
    };
}

/// Records only these events, if set (see [`set_only`]).
static ONLY: AtomicPtr<Vec<String>> = AtomicPtr::new(std::ptr::null_mut());

/// Records only the named events from now on (`None`: all of them). Fewer
/// trace points disturb the path less: with just the socket calls traced,
/// the time between them is the runtime's own, nearly undisturbed.
pub fn set_only(events: Option<&[&str]>) {
    let new = events.map_or(std::ptr::null_mut(), |e| {
        Box::into_raw(Box::new(e.iter().map(|s| s.to_string()).collect()))
    });
    // The old list is leaked: a thread may be reading it right now, and
    // filters are set a handful of times per process.
    ONLY.store(new, Ordering::Release);
}

#[cold]
fn record_slow(event: &'static str, args: [u64; 4]) {
    let only = ONLY.load(Ordering::Acquire);
    // SAFETY: a non-null pointer came from `Box::into_raw` in `set_only`
    // and is never freed.
    if !only.is_null() && !unsafe { &*only }.iter().any(|o| o == event) {
        return;
    }
    LOCAL.with(|l| {
        let ring = l.get_or_init(new_ring);
        // The time is read once the ring exists: a thread's first record
        // allocates it (3.7 MB written, about 1.5 ms on a small VM), and an
        // event dated before that would show the allocation as a stall
        // after it (a time trace of RPCs beside a stream showed 1.5 ms
        // "stalls" that were this). See `prepare_thread`.
        let t = if SERIALIZED.load(Ordering::Relaxed) {
            serialized_cycles()
        } else {
            cycles()
        };
        let i = ring.next.load(Ordering::Relaxed);
        // SAFETY: this thread is the ring's only writer.
        unsafe { (&mut *ring.slots.get())[i % RING] = (t, event, args) };
        ring.next.store(i + 1, Ordering::Release);
    });
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    /// Nanoseconds since tracing was first enabled.
    pub ns: f64,
    /// `CLOCK_MONOTONIC` at the event, ns: comparable across the processes
    /// of one host.
    pub mono_ns: u64,
    pub thread: String,
    /// The event's name, or its format when it has arguments.
    pub event: &'static str,
    /// Up to four arguments (unused ones 0).
    pub args: [u64; 4],
}

impl TraceEvent {
    /// The event with its arguments put into the format's `{}`, in order.
    pub fn text(&self) -> String {
        format_args_into(self.event, &self.args)
    }
}

/// `format` with each `{}` replaced by the next of `args`.
fn format_args_into(format: &str, args: &[u64; 4]) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut rest = format;
    let mut k = 0;
    while let Some(i) = rest.find("{}") {
        out.push_str(&rest[..i]);
        match args.get(k) {
            Some(a) => out.push_str(&a.to_string()),
            None => out.push_str("{}"),
        }
        k += 1;
        rest = &rest[i + 2..];
    }
    out.push_str(rest);
    out
}

/// The mean cost of one [`record_args`] with tracing on, ns: measured on a
/// thread of its own (whose ring is dropped afterwards), `n` records after
/// a warm-up that fills the ring's pages. Leaves tracing as it was.
pub fn record_cost_ns(n: usize) -> f64 {
    let was = enabled();
    enable(true);
    let cost = std::thread::spawn(move || {
        for i in 0..RING as u64 {
            record_args("warm {}", [i, 0, 0, 0]);
        }
        let t0 = Instant::now();
        for i in 0..n as u64 {
            record_args("cost {} {}", [i, i ^ 7, 0, 0]);
        }
        let ns = t0.elapsed().as_nanos() as f64 / n.max(1) as f64;
        LOCAL.with(|l| {
            if let Some(mine) = l.get() {
                THREADS.lock().unwrap().retain(|r| !Arc::ptr_eq(r, mine));
            }
        });
        ns
    })
    .join()
    .unwrap_or(f64::NAN);
    enable(was);
    cost
}

/// Every thread's retained events, merged in time order. Call after
/// `enable(false)`.
pub fn collect() -> Vec<TraceEvent> {
    let Some(&(c0, t0, mono0)) = CALIBRATION.get() else {
        return Vec::new();
    };
    let elapsed = t0.elapsed().as_nanos() as f64;
    let dc = cycles().saturating_sub(c0).max(1) as f64;
    let ns_per_cycle = if cfg!(target_arch = "x86_64") {
        elapsed / dc
    } else {
        1.0
    };
    let mut out = Vec::new();
    for ring in THREADS.lock().unwrap().iter() {
        let n = ring.next.load(Ordering::Acquire);
        // Once wrapped, the oldest slot is the one an in-flight record may
        // be overwriting: leave it out.
        let first = if n > RING { n - RING + 1 } else { 0 };
        // SAFETY: see `Ring`; entries in first..n are published and no
        // longer written.
        let slots = unsafe { &*ring.slots.get() };
        for i in first..n {
            let (c, e, args) = slots[i % RING];
            let ns = c.saturating_sub(c0) as f64 * ns_per_cycle;
            out.push(TraceEvent {
                ns,
                mono_ns: mono0 + ns as u64,
                thread: ring.thread.clone(),
                event: e,
                args,
            });
        }
    }
    out.sort_by(|a, b| a.ns.total_cmp(&b.ns));
    out
}

/// Writes `events` as text, one per line: `CLOCK_MONOTONIC` ns, `host`,
/// thread and the event's text, tab-separated (what [`parse_dump`] reads;
/// tabs in names become spaces).
pub fn dump(
    events: &[TraceEvent],
    host: &str,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let host = clean(host);
    for e in events {
        writeln!(
            out,
            "{}\t{}\t{}\t{}",
            e.mono_ns,
            host,
            clean(&e.thread),
            clean(&e.text())
        )?;
    }
    Ok(())
}

/// One line of a [`dump`]: an event of some process, already formatted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpedEvent {
    /// The host's `CLOCK_MONOTONIC` at the event, ns (plus the offset
    /// [`merge`] applied).
    pub ns: i64,
    pub host: String,
    pub thread: String,
    pub text: String,
}

/// Reads a [`dump`]; lines that do not parse are skipped (a dump is
/// diagnostic input, not a protocol).
pub fn parse_dump(text: &str) -> Vec<DumpedEvent> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, '\t');
            let ns = f.next()?.parse::<i64>().ok()?;
            Some(DumpedEvent {
                ns,
                host: f.next()?.to_string(),
                thread: f.next()?.to_string(),
                text: f.next()?.to_string(),
            })
        })
        .collect()
}

/// Merges dumps of several processes into one time line: each dump's
/// times are moved by its offset (ns to add to bring that host's clock to
/// the reference host's; 0 for processes of one host), then all events
/// are sorted by time.
pub fn merge(dumps: Vec<(Vec<DumpedEvent>, i64)>) -> Vec<DumpedEvent> {
    let mut all: Vec<DumpedEvent> = dumps
        .into_iter()
        .flat_map(|(events, offset)| {
            events.into_iter().map(move |mut e| {
                e.ns += offset;
                e
            })
        })
        .collect();
    all.sort_by_key(|e| e.ns);
    all
}

/// The offset of host B's clock from host A's (ns to add to B's times),
/// from messages timed at both ends: `a_to_b` holds (sent on A's clock,
/// received on B's) and `b_to_a` (sent on B's, received on A's). The
/// quickest message each way took the least queueing; assuming the two
/// quickest took equally long, the offset is half the difference of the
/// two smallest apparent one-way times. `None` without a message each way.
pub fn estimate_offset(a_to_b: &[(i64, i64)], b_to_a: &[(i64, i64)]) -> Option<i64> {
    let ab = a_to_b.iter().map(|&(s, r)| r - s).min()?;
    let ba = b_to_a.iter().map(|&(s, r)| r - s).min()?;
    // ab = d + (B - A), ba = d - (B - A): B - A = (ab - ba) / 2, and B's
    // times are brought to A's by subtracting it.
    Some(-(ab - ba) / 2)
}

/// Forgets every recorded event. Call it while tracing is off (a record in
/// flight on another thread could otherwise bring back its old count).
pub fn clear() {
    for ring in THREADS.lock().unwrap().iter() {
        // Only resets the count; the owning thread overwrites from slot 0.
        ring.next.store(0, Ordering::Release);
    }
}

/// Mean time from each event to the next (in merged order), for each
/// distinct `(thread, event) -> (thread, event)` step, in order of first
/// appearance: a latency breakdown of a repeated operation.
pub fn breakdown(events: &[TraceEvent]) -> Vec<(String, f64, usize)> {
    let mut steps: Vec<(String, f64, usize)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for w in events.windows(2) {
        let name = step_name(w);
        let i = *index.entry(name.clone()).or_insert_with(|| {
            steps.push((name, 0.0, 0));
            steps.len() - 1
        });
        steps[i].1 += w[1].ns - w[0].ns;
        steps[i].2 += 1;
    }
    for s in &mut steps {
        s.1 /= s.2.max(1) as f64;
    }
    steps
}

/// The name of the step between two consecutive events.
fn step_name(w: &[TraceEvent]) -> String {
    format!(
        "{}:{} -> {}:{}",
        w[0].thread, w[0].event, w[1].thread, w[1].event
    )
}

/// The median of every step of [`breakdown`] (same names): unlike its
/// means, untouched by the few steps that a preemption or a page fault
/// stretched, so it shows what a step usually costs.
pub fn step_medians(events: &[TraceEvent]) -> std::collections::HashMap<String, f64> {
    let mut per: std::collections::HashMap<String, Vec<f64>> = std::collections::HashMap::new();
    for w in events.windows(2) {
        per.entry(step_name(w)).or_default().push(w[1].ns - w[0].ns);
    }
    per.into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            (name, v[v.len() / 2])
        })
        .collect()
}

/// For each thread, the median time from a `from` event to that thread's
/// next `to` event, and how many there were: e.g. from a datagram received
/// to the next system call that sends, a thread's turnaround, which a
/// ping-pong pays once per side and round trip. Medians resist the
/// preemptions and page faults that skew the means of [`breakdown`].
pub fn turnarounds(events: &[TraceEvent], from: &str, to: &str) -> Vec<(String, f64, usize)> {
    let mut per: Vec<(String, Vec<f64>, Option<f64>)> = Vec::new();
    for e in events {
        let i = match per.iter().position(|p| p.0 == e.thread) {
            Some(i) => i,
            None => {
                per.push((e.thread.clone(), Vec::new(), None));
                per.len() - 1
            }
        };
        let p = &mut per[i];
        if e.event == from {
            p.2 = Some(e.ns);
        } else if e.event == to {
            if let Some(t) = p.2.take() {
                p.1.push(e.ns - t);
            }
        }
    }
    per.into_iter()
        .filter(|p| !p.1.is_empty())
        .map(|(thread, mut v, _)| {
            v.sort_by(f64::total_cmp);
            (thread, v[v.len() / 2], v.len())
        })
        .collect()
}

/// For each direction between two threads, the median time from a `send`
/// event on one to the next `recv` event on the other, and how many there
/// were: in a ping-pong, a datagram's one-way latency through the kernel
/// (the sender's system call until the receiver's returns with it).
pub fn one_ways(
    events: &[TraceEvent],
    send: &str,
    recv: &str,
) -> Vec<(String, String, f64, usize)> {
    // The latest unanswered send per thread.
    let mut pending: Vec<(String, f64)> = Vec::new();
    let mut per: Vec<(String, String, Vec<f64>)> = Vec::new();
    for e in events {
        if e.event == send {
            match pending.iter_mut().find(|p| p.0 == e.thread) {
                Some(p) => p.1 = e.ns,
                None => pending.push((e.thread.clone(), e.ns)),
            }
        } else if e.event == recv {
            let Some(i) = pending
                .iter()
                .enumerate()
                .filter(|(_, p)| p.0 != e.thread)
                .max_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
                .map(|(i, _)| i)
            else {
                continue;
            };
            let (from, t) = pending.swap_remove(i);
            match per.iter_mut().find(|p| p.0 == from && p.1 == e.thread) {
                Some(p) => p.2.push(e.ns - t),
                None => per.push((from, e.thread.clone(), vec![e.ns - t])),
            }
        }
    }
    per.into_iter()
        .map(|(from, to, mut v)| {
            v.sort_by(f64::total_cmp);
            (from, to, v[v.len() / 2], v.len())
        })
        .collect()
}

/// What makes the slowest operations slow. The trace is cut into
/// operations, each ending at an `end` event; for the slowest `fraction` of
/// them, the step (as in [`breakdown`]) that exceeded its own mean by the
/// most is blamed. Returns `(step, operations blamed, mean excess ns)`, most
/// blamed first, and the duration at the cut-off.
pub fn tail_steps(
    events: &[TraceEvent],
    end: &str,
    fraction: f64,
) -> (Vec<(String, usize, f64)>, f64) {
    let means: std::collections::HashMap<String, f64> = breakdown(events)
        .into_iter()
        .map(|(name, mean, _)| (name, mean))
        .collect();
    // (duration, worst step, its excess) per operation.
    let mut ops: Vec<(f64, String, f64)> = Vec::new();
    let mut start: Option<usize> = None;
    for (i, e) in events.iter().enumerate() {
        if e.event != end {
            continue;
        }
        if let Some(s) = start {
            let mut worst = (String::new(), f64::MIN);
            for w in events[s..=i].windows(2) {
                let name = format!(
                    "{}:{} -> {}:{}",
                    w[0].thread, w[0].event, w[1].thread, w[1].event
                );
                let excess = (w[1].ns - w[0].ns) - means.get(&name).copied().unwrap_or(0.0);
                if excess > worst.1 {
                    worst = (name, excess);
                }
            }
            ops.push((events[i].ns - events[s].ns, worst.0, worst.1));
        }
        start = Some(i);
    }
    if ops.is_empty() {
        return (Vec::new(), 0.0);
    }
    ops.sort_by(|a, b| b.0.total_cmp(&a.0));
    let n = ((ops.len() as f64 * fraction).ceil() as usize).clamp(1, ops.len());
    let cutoff = ops[n - 1].0;
    let mut blamed: Vec<(String, usize, f64)> = Vec::new();
    for (_, step, excess) in &ops[..n] {
        match blamed.iter_mut().find(|b| &b.0 == step) {
            Some(b) => {
                b.1 += 1;
                b.2 += excess;
            }
            None => blamed.push((step.clone(), 1, *excess)),
        }
    }
    for b in &mut blamed {
        b.2 /= b.1 as f64;
    }
    blamed.sort_by_key(|b| std::cmp::Reverse(b.1));
    (blamed, cutoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tracing is process-wide: tests that turn it on and off take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_prepared_thread_records_nothing_until_it_records() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let name = "timetrace-prepared";
        let before = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                prepare_thread();
                let before = collect().into_iter().filter(|e| e.thread == name).count();
                enable(true);
                record("prepared-first");
                enable(false);
                before
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(before, 0);
        let ev: Vec<_> = collect().into_iter().filter(|e| e.thread == name).collect();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].event, "prepared-first");
    }

    #[test]
    fn records_in_order_and_breaks_down() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable(true);
        for _ in 0..100 {
            record("test-a");
            std::hint::black_box(0);
            record("test-b");
        }
        enable(false);
        let me = std::thread::current()
            .name()
            .map(String::from)
            .unwrap_or_default();
        let ev: Vec<_> = collect()
            .into_iter()
            .filter(|e| e.event.starts_with("test-") && e.thread == me)
            .collect();
        assert!(ev.len() >= 200);
        assert!(ev.windows(2).all(|w| w[0].ns <= w[1].ns));
        let b = breakdown(&ev);
        let step = format!("{me}:test-a -> {me}:test-b");
        let ab = b.iter().find(|s| s.0 == step).unwrap();
        assert_eq!(ab.2, 100);
        assert!(ab.1 >= 0.0 && ab.1 < 1e6);
    }

    #[test]
    fn a_wrapped_ring_keeps_all_but_its_oldest_slot() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        enable(true);
        std::thread::Builder::new()
            .name("tt-wrap".into())
            .spawn(|| {
                for _ in 0..RING + 10 {
                    record("wrap");
                }
            })
            .unwrap()
            .join()
            .unwrap();
        enable(false);
        let mine: Vec<_> = collect()
            .into_iter()
            .filter(|e| e.thread == "tt-wrap")
            .collect();
        assert_eq!(mine.len(), RING - 1);
        assert!(mine.iter().all(|e| e.event == "wrap"));
    }

    /// Arguments are kept as integers and put into the format only when
    /// read; events carry the monotonic clock.
    #[test]
    fn arguments_are_formatted_when_read() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        clear();
        let before = crate::sys::monotonic_ns();
        enable(true);
        crate::tt!("args {} and {} of {}", 7, 11u32, 3usize);
        crate::tt!("no args");
        enable(false);
        let after = crate::sys::monotonic_ns();
        let me = std::thread::current()
            .name()
            .map(String::from)
            .unwrap_or_default();
        let ev: Vec<_> = collect().into_iter().filter(|e| e.thread == me).collect();
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].text(), "args 7 and 11 of 3");
        assert_eq!(ev[0].args, [7, 11, 3, 0]);
        assert_eq!(ev[1].text(), "no args");
        // The calibration is taken once per process: its origin is at or
        // before this test's start, and the events fall within the test
        // (with a microsecond of slack for the cycle counter's rate).
        assert!(
            ev[0].mono_ns <= after + 1_000,
            "{} {}",
            ev[0].mono_ns,
            after
        );
        assert!(ev[0].mono_ns + 1_000_000_000 >= before);
        assert!(ev[1].mono_ns >= ev[0].mono_ns);
        assert_eq!(
            format_args_into("{} {} {} {} {}", &[1, 2, 3, 4]),
            "1 2 3 4 {}"
        );
    }

    #[test]
    fn dumps_parse_back_and_merge_with_offsets() {
        let e = |mono_ns: u64, event: &'static str, a: u64| TraceEvent {
            ns: 0.0,
            mono_ns,
            thread: "th\tread".into(),
            event,
            args: [a, 0, 0, 0],
        };
        let mut out = Vec::new();
        dump(
            &[e(100, "send {}", 1), e(300, "done", 0)],
            "client",
            &mut out,
        )
        .unwrap();
        let a = parse_dump(std::str::from_utf8(&out).unwrap());
        assert_eq!(a.len(), 2);
        assert_eq!(
            (a[0].ns, a[0].host.as_str(), a[0].thread.as_str()),
            (100, "client", "th read")
        );
        assert_eq!(a[0].text, "send 1");
        let mut out = Vec::new();
        dump(&[e(5_150, "recv {}", 1)], "server", &mut out).unwrap();
        out.extend_from_slice(b"garbage line\n");
        let b = parse_dump(std::str::from_utf8(&out).unwrap());
        assert_eq!(b.len(), 1);
        let m = merge(vec![(a, 0), (b, -5_000)]);
        let order: Vec<_> = m.iter().map(|e| (e.ns, e.text.as_str())).collect();
        assert_eq!(order, vec![(100, "send 1"), (150, "recv 1"), (300, "done")]);
    }

    /// B's clock runs 5 µs ahead of A's; messages take 1 µs plus queueing.
    #[test]
    fn the_offset_comes_from_the_quickest_message_each_way() {
        let off = 5_000i64;
        let a_to_b: Vec<(i64, i64)> = [0, 300, 50, 900]
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let s = i as i64 * 10_000;
                (s, s + 1_000 + q + off)
            })
            .collect();
        let b_to_a: Vec<(i64, i64)> = [700, 0, 20]
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let s = i as i64 * 10_000 + off;
                (s, s - off + 1_000 + q)
            })
            .collect();
        assert_eq!(estimate_offset(&a_to_b, &b_to_a), Some(-off));
        assert_eq!(estimate_offset(&a_to_b, &[]), None);
    }

    #[test]
    fn a_record_costs_a_finite_time() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let ns = record_cost_ns(10_000);
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
        assert!(!enabled());
    }

    fn ev(ns: f64, event: &'static str) -> TraceEvent {
        TraceEvent {
            ns,
            mono_ns: ns as u64,
            thread: "t".into(),
            event,
            args: [0; 4],
        }
    }

    #[test]
    fn turnarounds_pair_each_start_with_its_threads_next_end() {
        let on = |thread: &str, ns: f64, event: &'static str| TraceEvent {
            ns,
            mono_ns: ns as u64,
            thread: thread.into(),
            event,
            args: [0; 4],
        };
        let events = vec![
            on("a", 0.0, "got"),
            on("b", 1.0, "got"),
            on("a", 2.0, "other"),
            on("a", 10.0, "send"),
            on("b", 31.0, "send"),
            on("a", 40.0, "send"), // no start since the last end: ignored
            on("a", 50.0, "got"),
            on("a", 62.0, "send"),
            on("a", 70.0, "got"),
            on("a", 84.0, "send"),
        ];
        let t = turnarounds(&events, "got", "send");
        assert_eq!(
            t,
            vec![("a".to_string(), 12.0, 3), ("b".to_string(), 30.0, 1)]
        );
    }

    #[test]
    fn one_ways_pair_a_send_with_the_other_threads_next_receive() {
        let on = |thread: &str, ns: f64, event: &'static str| TraceEvent {
            ns,
            mono_ns: ns as u64,
            thread: thread.into(),
            event,
            args: [0; 4],
        };
        let mut events = Vec::new();
        for i in 0..3 {
            let t = i as f64 * 100.0;
            events.push(on("c", t, "send"));
            events.push(on("s", t + 20.0, "got"));
            events.push(on("s", t + 30.0, "send"));
            events.push(on("c", t + 60.0 + i as f64, "got"));
        }
        let w = one_ways(&events, "send", "got");
        assert_eq!(
            w,
            vec![
                ("c".to_string(), "s".to_string(), 20.0, 3),
                ("s".to_string(), "c".to_string(), 31.0, 3)
            ]
        );
    }

    #[test]
    fn a_filter_records_only_the_named_events() {
        let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        set_only(Some(&["keep-me"]));
        enable(true);
        let names: Vec<&str> = std::thread::Builder::new()
            .name("tt-only".into())
            .spawn(|| {
                record("drop-me");
                record("keep-me");
            })
            .unwrap()
            .join()
            .map(|_| {
                collect()
                    .into_iter()
                    .filter(|e| e.thread == "tt-only")
                    .map(|e| e.event)
                    .collect()
            })
            .unwrap();
        enable(false);
        set_only(None);
        assert_eq!(names, vec!["keep-me"]);
    }

    #[test]
    fn tail_blames_the_step_that_ran_long() {
        // Ten operations a -> b -> end; in one of them a -> b takes 100 ns
        // instead of 10.
        let mut events = Vec::new();
        let mut t = 0.0;
        for i in 0..10 {
            events.push(ev(t, "a"));
            t += if i == 7 { 100.0 } else { 10.0 };
            events.push(ev(t, "b"));
            t += 5.0;
            events.push(ev(t, "end"));
            t += 1.0;
        }
        let (blamed, cutoff) = tail_steps(&events, "end", 0.1);
        assert_eq!(blamed.len(), 1);
        assert_eq!(blamed[0].0, "t:a -> t:b");
        assert_eq!(blamed[0].1, 1);
        assert!(blamed[0].2 > 80.0, "{blamed:?}");
        assert!(cutoff > 100.0);
    }
}
