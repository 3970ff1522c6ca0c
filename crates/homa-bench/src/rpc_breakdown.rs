//! `homa rpc-bench --breakdown` (issue #23): one framework RPC cut into
//! its steps across client, network and server, RAMCloud style (seed 001),
//! from the time trace (`homa::timetrace`).
//!
//! A *plan* is the list of boundary events of one RPC, in the order they
//! happen, each with the thread it must happen on (the calling client
//! thread, the server's serving thread, the backend's, or any thread but
//! one of those: the thread that receives a response need not be the one
//! waiting for it). Every traced RPC is one window of the trace, from the
//! bench's `rpc-bench call {i}` to its `rpc-bench done {i}` on the calling
//! thread; inside it, each boundary is the first matching event after the
//! previous boundary, and a step is the time between two consecutive
//! boundaries. With one RPC in flight, the events of the window are that
//! RPC's. A network leg runs from the sender's `sendmmsg start` to the
//! receiver's `recvmmsg got`: on loopback the system call delivers the
//! datagram and wakes the receiver, which may return before the sender's
//! call does (so `sendmmsg done` is no boundary). Each step's median is taken over the RPCs that had every
//! boundary and whose round trip lies between the 40th and 60th percentiles
//! (the RPCs around the median, so that a step that is bimodal across all
//! RPCs does not skew the sum); the medians' sum is set beside the measured
//! round trip.

use homa::timetrace::TraceEvent;
use serde::Serialize;

/// The serving thread's name in the benchmark (the outer server).
pub const SERVER_THREAD: &str = "rpc-server";
/// A backend's serving thread (the nested calls' server).
pub const BACKEND_THREAD: &str = "rpc-backend";

/// Which thread a boundary event must happen on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// The thread that made the call (the window's first event).
    Client,
    /// The outer server's serving thread.
    Server,
    /// A backend's serving thread.
    Backend,
    /// Any thread but the server's and the backends' serving threads: who
    /// receives the client's response.
    NotServer,
    /// Any thread but the backends': who receives a nested response.
    NotBackend,
    /// Any thread but the client's and the backends': who receives the
    /// outer request (the serving thread, or a background thread that
    /// queues it for the serving thread).
    NotClient,
    /// Any thread but the client's and the outer server's: who receives
    /// a nested request.
    NotClientServer,
}

/// One boundary: the step that ends here, the event that ends it, where.
#[derive(Clone, Copy, Debug)]
pub struct Boundary {
    /// Side (`client`, `net`, `server`, `backend`) and step name.
    pub side: &'static str,
    pub step: &'static str,
    pub event: &'static str,
    pub who: Who,
    /// Set on a "response got" boundary: report whether the thread that
    /// waits (this role) also received the response (it polled), or
    /// another thread did (a handoff).
    pub waiter: Option<Who>,
}

/// Whether `e` is boundary `bd`'s event: a datagram comes in through
/// `recvmmsg` (a poller) or `recvmsg` (`recvmsg landed`, a watcher's
/// single-datagram read).
fn is_event(bd: &Boundary, e: &str) -> bool {
    e == bd.event || (bd.event == "recvmmsg got" && e == "recvmsg landed")
}

const fn b(side: &'static str, step: &'static str, event: &'static str, who: Who) -> Boundary {
    Boundary {
        side,
        step,
        event,
        who,
        waiter: None,
    }
}

const START: &str = "rpc-bench call {}";
const END: &str = "rpc-bench done {}";

/// The client's side of a call up to its request datagram.
const CLIENT_SEND: [Boundary; 6] = [
    b("client", "start", START, Who::Client),
    b("client", "stub call", "rpc call start {}", Who::Client),
    b(
        "client",
        "request header + encode",
        "rpc request encoded {}",
        Who::Client,
    ),
    b("client", "to send_request", "send_request", Who::Client),
    b(
        "client",
        "engine send_request",
        "engine send_request done",
        Who::Client,
    ),
    b("client", "to sendmmsg", "sendmmsg start", Who::Client),
];

/// A server's side, request datagram in to response datagram out,
/// `handler` being the boundaries inside the handler.
fn server_side(side: &'static str, who: Who, handler: &[Boundary]) -> Vec<Boundary> {
    let rx = if who == Who::Server {
        Who::NotClient
    } else {
        Who::NotClientServer
    };
    let mut v = vec![
        b(
            "net",
            "network: sendmmsg start -> server recv(m)msg returns",
            "recvmmsg got",
            rx,
        ),
        b(side, "engine rx", "engine rx done", rx),
        Boundary {
            waiter: Some(who),
            ..b(side, "dispatch to the framework", "rpc request in", who)
        },
        b(
            side,
            "header decode + method lookup",
            "rpc method found {}",
            who,
        ),
        b(side, "request decode", "rpc handler start", who),
    ];
    v.extend_from_slice(handler);
    v.extend_from_slice(&[
        b(side, "handler", "rpc handler done", who),
        b(side, "reply encode", "rpc response encoded", who),
        b(side, "to reply", "rpc reply", who),
        b(
            side,
            "engine send_response",
            "engine send_response done",
            who,
        ),
        b(side, "to sendmmsg", "sendmmsg start", who),
    ]);
    v
}

/// A caller's side from its response datagram: `rx` receives it, `waiter`
/// waits for it.
fn client_receive(side: &'static str, rx: Who, waiter: Who) -> [Boundary; 4] {
    [
        b(
            "net",
            "network: sendmmsg start -> client recv(m)msg returns",
            "recvmmsg got",
            rx,
        ),
        b(side, "engine rx", "engine rx done", rx),
        Boundary {
            waiter: Some(waiter),
            ..b(
                side,
                "result to the waiting thread",
                "rpc response got {}",
                waiter,
            )
        },
        b(side, "response decode", "rpc call done", waiter),
    ]
}

/// The boundaries of one null call (`inline`).
pub fn null_plan() -> Vec<Boundary> {
    let mut v = CLIENT_SEND.to_vec();
    v.extend(server_side("server", Who::Server, &[]));
    v.extend(client_receive("client", Who::NotServer, Who::Client));
    v.push(b("client", "stub return", END, Who::Client));
    v
}

/// The boundaries of one outer call whose `inline` handler makes one
/// nested call to a backend.
pub fn nested_plan() -> Vec<Boundary> {
    let mut nested: Vec<Boundary> = CLIENT_SEND[1..]
        .iter()
        .map(|x| Boundary {
            side: "server (nested call)",
            who: Who::Server,
            ..*x
        })
        .collect();
    nested[0].step = "handler to nested call";
    nested.extend(server_side("backend", Who::Backend, &[]));
    nested.extend(client_receive(
        "server (nested call)",
        Who::NotBackend,
        Who::Server,
    ));
    let mut v = CLIENT_SEND.to_vec();
    v.extend(server_side("server", Who::Server, &nested));
    v.extend(client_receive("client", Who::NotServer, Who::Client));
    v.push(b("client", "stub return", END, Who::Client));
    v
}

/// One step's median.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Step {
    pub side: String,
    pub step: String,
    pub median_ns: f64,
}

/// Who received a request or response and who waited for it, per RPC.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Handoff {
    /// The boundary's side (whose response).
    pub side: String,
    /// RPCs whose waiting thread received the response itself (polling).
    pub polled_itself: usize,
    /// RPCs whose response another thread received and handed over,
    /// with that thread's name (the most frequent).
    pub handed_off: usize,
    pub by: Option<String>,
}

/// The breakdown of one plan over a trace.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Breakdown {
    pub steps: Vec<Step>,
    /// RPCs with every boundary.
    pub rpcs: usize,
    /// Of those, the RPCs around the median round trip (40th to 60th
    /// percentile) that the step medians are taken over.
    pub band: usize,
    /// Windows that missed a boundary.
    pub incomplete: usize,
    /// The first boundary each incomplete window missed, and how often.
    pub missed: Vec<(String, usize)>,
    /// The median time from the first boundary to the last, per RPC.
    pub traced_median_ns: f64,
    pub handoffs: Vec<Handoff>,
    /// The events of the RPC whose duration is the median one:
    /// `(ns from its start, thread, event text)`.
    pub median_rpc: Vec<(f64, String, String)>,
}

impl Breakdown {
    /// The sum of the steps' medians.
    pub fn sum_ns(&self) -> f64 {
        self.steps.iter().map(|s| s.median_ns).sum()
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Indices of the RPCs whose duration (`totals[i].0`) lies between the
/// 40th and 60th percentiles (at least one: the median).
fn median_band(totals: &[(f64, usize, usize)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..totals.len()).collect();
    order.sort_by(|&a, &b| totals[a].0.total_cmp(&totals[b].0));
    let n = order.len();
    if n == 0 {
        return order;
    }
    let (lo, hi) = (n * 2 / 5, (n * 3 / 5).max(n * 2 / 5 + 1).min(n));
    order[lo..hi].to_vec()
}

/// The breakdown of every window of `events` (time order, as
/// `timetrace::collect` gives them) by `plan`.
pub fn compute(events: &[TraceEvent], plan: &[Boundary]) -> Breakdown {
    let n = plan.len();
    let mut per_step: Vec<Vec<f64>> = vec![Vec::new(); n.saturating_sub(1)];
    let mut totals: Vec<(f64, usize, usize)> = Vec::new(); // (duration, start, end)
    let mut incomplete = 0;
    let mut missed = vec![0usize; n];
    let mut first_incomplete = None;
    // Per "waiter" boundary: (polled itself, handed off, by whom).
    let mut hand: Vec<(usize, usize, Vec<String>)> = vec![(0, 0, Vec::new()); n];
    let first = plan[0];
    let last = plan[n - 1];
    for (s, start) in events.iter().enumerate() {
        if start.event != first.event {
            continue;
        }
        let client = &start.thread;
        let Some(e) = events[s + 1..]
            .iter()
            .position(|x| x.event == last.event && &x.thread == client && x.args == start.args)
            .map(|p| s + 1 + p)
        else {
            missed[n - 1] += 1;
            incomplete += 1;
            continue;
        };
        // The serving threads of this trace (by name).
        let matches = |who: Who, x: &TraceEvent| match who {
            Who::Client => &x.thread == client,
            Who::Server => x.thread == SERVER_THREAD,
            Who::Backend => x.thread == BACKEND_THREAD,
            Who::NotServer => x.thread != SERVER_THREAD && x.thread != BACKEND_THREAD,
            Who::NotBackend => x.thread != BACKEND_THREAD,
            Who::NotClient => &x.thread != client && x.thread != BACKEND_THREAD,
            Who::NotClientServer => &x.thread != client && x.thread != SERVER_THREAD,
        };
        let mut at = vec![s];
        let mut pos = s;
        for bd in &plan[1..n - 1] {
            match events[pos + 1..e]
                .iter()
                .position(|x| is_event(bd, x.event) && matches(bd.who, x))
            {
                Some(p) => {
                    pos = pos + 1 + p;
                    at.push(pos);
                }
                None => break,
            }
        }
        if at.len() != n - 1 {
            if first_incomplete.is_none() {
                first_incomplete = Some((s, e));
            }
            missed[at.len()] += 1;
            incomplete += 1;
            continue;
        }
        at.push(e);
        for (k, w) in at.windows(2).enumerate() {
            per_step[k].push(events[w[1]].ns - events[w[0]].ns);
        }
        // Who received each request or response: the thread of the
        // "recvmmsg got" two boundaries before the waiter's boundary.
        for (k, bd) in plan.iter().enumerate() {
            if let (Some(_), true) = (bd.waiter, k >= 2) {
                let rx = &events[at[k - 2]].thread;
                let waiter = &events[at[k]].thread;
                if rx == waiter {
                    hand[k].0 += 1;
                } else {
                    hand[k].1 += 1;
                    hand[k].2.push(rx.clone());
                }
            }
        }
        totals.push((events[e].ns - events[s].ns, s, e));
    }
    // The steps of the RPCs around the median: each step's median over
    // the RPCs whose round trip lies between the 40th and 60th
    // percentiles. Over all RPCs, the medians of steps whose times are
    // bimodal (a leg that sometimes waits for a CPU) need not add up to
    // the median round trip: RPCs with one slow leg of two had a sum of
    // 132 µs against an 84 µs median (nineteenth session).
    let band = median_band(&totals);
    let steps = plan[1..]
        .iter()
        .zip(per_step.iter())
        .map(|(bd, v)| {
            let mut in_band: Vec<f64> = band.iter().map(|&i| v[i]).collect();
            Step {
                side: bd.side.into(),
                step: bd.step.into(),
                median_ns: median(&mut in_band),
            }
        })
        .collect();
    let handoffs = plan
        .iter()
        .zip(hand)
        .filter(|(bd, _)| bd.waiter.is_some())
        .map(|(bd, (own, other, mut by))| {
            by.sort();
            let most = by
                .chunk_by(|a, b| a == b)
                .max_by_key(|c| c.len())
                .map(|c| c[0].clone());
            Handoff {
                side: bd.side.into(),
                polled_itself: own,
                handed_off: other,
                by: most,
            }
        })
        .collect();
    let mut durations: Vec<f64> = totals.iter().map(|t| t.0).collect();
    let traced_median_ns = median(&mut durations);
    // (Without a complete RPC, the first incomplete one: what it missed.)
    let median_rpc = totals
        .iter()
        .find(|t| t.0 == traced_median_ns)
        .map(|&(_, s, e)| (s, e))
        .or(first_incomplete)
        .map(|(s, e)| {
            events[s..=e]
                .iter()
                .map(|x| (x.ns - events[s].ns, x.thread.clone(), x.text()))
                .collect()
        })
        .unwrap_or_default();
    let missed = plan
        .iter()
        .zip(missed)
        .filter(|(_, m)| *m > 0)
        .map(|(bd, m)| (format!("{} {} ({})", bd.side, bd.step, bd.event), m))
        .collect();
    Breakdown {
        steps,
        missed,
        band: band.len(),
        rpcs: totals.len(),
        incomplete,
        traced_median_ns,
        handoffs,
        median_rpc,
    }
}

/// Prints `bd` in the seed's style: one line per step, then the sum
/// beside the measured round trip.
pub fn print(title: &str, bd: &Breakdown, measured_ns: f64, untraced_ns: Option<(f64, f64)>) {
    println!(
        "{title}: median of each step over the {} RPCs around the median round trip (40th-60th percentile) of {} ({} incomplete)",
        bd.band, bd.rpcs, bd.incomplete
    );
    for (what, k) in &bd.missed {
        println!("  ({k} windows missed {what})");
    }
    let mut at = 0.0;
    for s in &bd.steps {
        at += s.median_ns;
        println!(
            "  {:>9.0} ns  {:>8.0}  {:<22} {}",
            s.median_ns, at, s.side, s.step
        );
    }
    let sum = bd.sum_ns();
    println!(
        "  sum of step medians {:.0} ns; measured round trip (same calls, median) {:.0} ns: coverage {:.1}%",
        sum,
        measured_ns,
        100.0 * sum / measured_ns
    );
    if let Some((u, v)) = untraced_ns {
        println!(
            "  untraced round trips (medians, same run, before / after the traced calls) {:.0} / {:.0} ns: sum / untraced {:.1}% / {:.1}%",
            u,
            v,
            100.0 * sum / u,
            100.0 * sum / v
        );
    }
    for h in &bd.handoffs {
        println!(
            "  {}: message received by the thread that waits for it (polling, or woken from its own ppoll) in {} RPCs, handed over by another thread in {}{}",
            h.side,
            h.polled_itself,
            h.handed_off,
            h.by.as_ref().map(|b| format!(" (mostly {b})")).unwrap_or_default()
        );
    }
}

/// Prints the events of the median RPC (its steps in full).
pub fn print_events(bd: &Breakdown) {
    println!("  events of the median RPC:");
    for (ns, thread, text) in &bd.median_rpc {
        println!("  {ns:>10.0} ns  {thread:<14} {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ns: f64, thread: &str, event: &'static str, arg: u64) -> TraceEvent {
        TraceEvent {
            ns,
            mono_ns: ns as u64,
            thread: thread.into(),
            event,
            args: [arg, 0, 0, 0],
        }
    }

    /// One synthetic null RPC starting at `t0`, steps of 10 ns (the
    /// network legs 100 ns), with noise from other threads; the response
    /// received by `rx`.
    fn one_rpc(t0: f64, i: u64, rx: &str, out: &mut Vec<TraceEvent>) {
        one_rpc_legs(t0, i, rx, [100.0, 100.0], out);
    }

    /// One null call whose two network legs take `legs` ns, every other
    /// step 10 ns.
    fn one_rpc_legs(t0: f64, i: u64, rx: &str, legs: [f64; 2], out: &mut Vec<TraceEvent>) {
        let plan = null_plan();
        let mut t = t0;
        let mut leg = legs.iter();
        for (k, bd) in plan.iter().enumerate() {
            if k > 0 {
                t += if bd.side == "net" {
                    *leg.next().expect("two legs")
                } else {
                    10.0
                };
            }
            let thread = match bd.who {
                Who::Client => "main",
                Who::Server => SERVER_THREAD,
                Who::Backend => BACKEND_THREAD,
                Who::NotServer | Who::NotBackend => rx,
                Who::NotClient => SERVER_THREAD,
                Who::NotClientServer => BACKEND_THREAD,
            };
            let arg = if k == 0 || k == plan.len() - 1 { i } else { 0 };
            out.push(ev(t, thread, bd.event, arg));
            // Noise: an event on another thread that is no boundary, and
            // a boundary's name on the wrong thread.
            out.push(ev(t + 1.0, "homa-bg-1", "drive done", 0));
            if bd.event == "recvmmsg got" && bd.who == Who::NotClient {
                out.push(ev(t - 50.0, "main", "recvmmsg got", 0));
            }
        }
    }

    #[test]
    fn steps_are_medians_between_boundaries() {
        let mut events = Vec::new();
        one_rpc(0.0, 1, "main", &mut events);
        one_rpc(10_000.0, 2, "main", &mut events);
        one_rpc(20_000.0, 3, "homa-bg-9", &mut events);
        // A window whose server never answered.
        events.push(ev(30_000.0, "main", START, 4));
        events.push(ev(30_010.0, "main", "rpc call start {}", 0));
        events.push(ev(30_500.0, "main", END, 4));
        events.sort_by(|a, b| a.ns.total_cmp(&b.ns));
        let bd = compute(&events, &null_plan());
        assert_eq!(bd.rpcs, 3);
        assert_eq!(bd.incomplete, 1);
        assert_eq!(bd.steps.len(), null_plan().len() - 1);
        for s in &bd.steps {
            let want = if s.side == "net" { 100.0 } else { 10.0 };
            assert_eq!(s.median_ns, want, "{}", s.step);
        }
        assert_eq!(bd.sum_ns(), bd.traced_median_ns);
        assert_eq!(bd.handoffs.len(), 2);
        assert_eq!(bd.handoffs[0].polled_itself, 3);
        assert_eq!(bd.handoffs[1].polled_itself, 2);
        assert_eq!(bd.handoffs[1].handed_off, 1);
        assert_eq!(bd.handoffs[1].by.as_deref(), Some("homa-bg-9"));
        assert_eq!(bd.median_rpc.first().map(|e| e.0), Some(0.0));
    }

    /// Two RPCs slow on the way out, two slow on the way back, one in
    /// between: over all five, the legs' medians (3,000 and 3,200 ns) add
    /// up to more than any RPC took; over the RPCs around the median
    /// round trip they are one such RPC's legs.
    #[test]
    fn bimodal_steps_add_up_around_the_median() {
        let mut events = Vec::new();
        let legs = [
            [100.0, 6000.0],
            [100.0, 6000.0],
            [6000.0, 100.0],
            [6000.0, 100.0],
            [3000.0, 3200.0],
        ];
        for (i, l) in legs.iter().enumerate() {
            one_rpc_legs(i as f64 * 100_000.0, i as u64 + 1, "main", *l, &mut events);
        }
        events.sort_by(|a, b| a.ns.total_cmp(&b.ns));
        let bd = compute(&events, &null_plan());
        assert_eq!((bd.rpcs, bd.band), (5, 1));
        assert_eq!(bd.sum_ns(), bd.traced_median_ns);
        let net: Vec<f64> = bd
            .steps
            .iter()
            .filter(|s| s.side == "net")
            .map(|s| s.median_ns)
            .collect();
        assert_eq!(net.iter().sum::<f64>(), 6100.0, "{net:?}");
    }

    #[test]
    fn the_nested_plan_nests_a_whole_call_in_the_handler() {
        let plan = nested_plan();
        let handler_start = plan
            .iter()
            .position(|x| x.event == "rpc handler start")
            .unwrap();
        assert_eq!(plan[handler_start + 1].event, "rpc call start {}");
        assert_eq!(plan[handler_start + 1].who, Who::Server);
        assert!(plan.iter().any(|x| x.who == Who::Backend));
        assert_eq!(plan.iter().filter(|x| x.waiter.is_some()).count(), 4);
    }
}
