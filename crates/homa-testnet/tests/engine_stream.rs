//! Streams (`docs/streams.md` §2) on the deterministic test network: every
//! message of a stream arrives exactly once and in order, also under loss,
//! duplication, reordering and corruption; a reader that stops bounds the
//! memory of both ends; a cancel from either side frees both ends; a
//! crashed peer fails the stream with a typed error.

use bytes::{Bytes, BytesMut};
use homa_proto::{Config, Endpoint, Event, ResetReason, StreamError, StreamId, StreamRead};
use homa_testnet::{pattern, App, EngineNet, Fabric, FaultConfig, HostCtx};
use std::collections::{BTreeMap, VecDeque};

const MS: u64 = 1_000_000;

/// What one side of one stream did.
#[derive(Default)]
struct Side {
    /// Messages still to write, and whether to finish after them.
    to_send: VecDeque<Bytes>,
    finish: bool,
    finished: bool,
    /// Whole messages read, in order.
    got: Vec<Bytes>,
    partial: BytesMut,
    /// Pieces read (a long message comes in several).
    reads: usize,
    ended: bool,
    error: Option<StreamError>,
}

/// Opens streams, writes scripted messages, reads everything; the
/// acceptor echoes each whole message back (when `echo`) and finishes
/// after the opener's end.
struct StreamApp {
    echo: bool,
    /// While false, nothing is read (a stalled reader).
    reading: bool,
    sides: BTreeMap<StreamId, Side>,
}

impl StreamApp {
    fn new(echo: bool) -> StreamApp {
        StreamApp {
            echo,
            reading: true,
            sides: BTreeMap::new(),
        }
    }

    fn pump(&mut self, ctx: &mut HostCtx<'_>, sid: StreamId) {
        let now = ctx.now();
        let Some(ep) = ctx.endpoint() else { return };
        let echo = self.echo && !sid.opener;
        let side = self.sides.entry(sid).or_default();
        while self.reading && !side.ended && side.error.is_none() {
            match ep.stream_recv(now, sid) {
                Ok(StreamRead::Data {
                    bytes,
                    end_of_message,
                }) => {
                    side.reads += 1;
                    side.partial.extend_from_slice(&bytes);
                    if end_of_message {
                        let m = side.partial.split().freeze();
                        if echo {
                            side.to_send.push_back(m.clone());
                        }
                        side.got.push(m);
                    }
                }
                Ok(StreamRead::Pending) => break,
                Ok(StreamRead::End) => {
                    side.ended = true;
                    if echo {
                        side.finish = true;
                    }
                }
                Err(e) => side.error = Some(e),
            }
        }
        write(ep, now, sid, side);
    }
}

fn write(ep: &mut Endpoint, now: u64, sid: StreamId, side: &mut Side) {
    while let Some(m) = side.to_send.front() {
        match ep.stream_send(now, sid, m.clone()) {
            Ok(()) => {
                side.to_send.pop_front();
            }
            Err(StreamError::Full) => return,
            Err(e) => {
                side.error = Some(e);
                return;
            }
        }
    }
    if side.finish && !side.finished {
        side.finished = true;
        if let Err(e) = ep.stream_finish(now, sid) {
            side.error = Some(e);
        }
    }
}

impl App for StreamApp {
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        match event {
            Event::StreamOpened { stream }
            | Event::StreamReadable { stream }
            | Event::StreamWritable { stream } => self.pump(ctx, stream),
            other => panic!("unexpected event {other:?}"),
        }
    }
}

fn net(n: usize, seed: u64, echo: bool, cfg: Config) -> EngineNet<StreamApp> {
    let fabric = Fabric::star(n, 25_000_000_000, 1_000, 250).with_seed(seed);
    EngineNet::uniform(fabric, cfg, |_| StreamApp::new(echo)).unwrap()
}

fn config() -> Config {
    Config::default()
        .with_resend_interval_ns(MS / 2)
        .with_rpc_timeout_ns(20 * MS)
        .with_stream_window_bytes(256 * 1024)
}

/// Host `c` opens a stream to host `to` and writes `msgs` (then finishes,
/// if `finish`).
fn open(
    net: &mut EngineNet<StreamApp>,
    c: usize,
    to: usize,
    msgs: &[Bytes],
    finish: bool,
) -> StreamId {
    let peer = net.addr(to);
    net.with_host(c, |app, ctx| {
        let now = ctx.now();
        let ep = ctx.endpoint().unwrap();
        let sid = ep.open_stream(now, peer).unwrap();
        let side = app.sides.entry(sid).or_default();
        side.to_send = msgs.iter().cloned().collect();
        side.finish = finish;
        write(ep, now, sid, side);
        // Reads too (finding nothing yet), so that it hears when there is.
        app.pump(ctx, sid);
        sid
    })
}

fn the_acceptor_side(net: &EngineNet<StreamApp>, h: usize, sid: StreamId) -> &Side {
    let key = StreamId {
        peer: net.addr(sid_host(net, sid)),
        id: sid.id,
        opener: false,
    };
    &net.app(h).sides[&key]
}

/// The host that opened `sid` (an opener's id names its peer, not itself):
/// found by looking for the opener's entry.
fn sid_host(net: &EngineNet<StreamApp>, sid: StreamId) -> usize {
    (0..net.n_hosts())
        .find(|&h| net.app(h).sides.contains_key(&sid))
        .unwrap()
}

fn sizes() -> Vec<usize> {
    vec![
        1,
        100,
        1_400,
        1_500,
        20_000,
        64 * 1024,
        1_000_000,
        3_000_000,
        7,
    ]
}

#[test]
fn messages_of_any_size_echo_exactly_once_and_in_order() {
    let mut net = net(2, 1, true, config());
    let msgs: Vec<Bytes> = sizes()
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u64 + 1))
        .collect();
    let sid = open(&mut net, 1, 0, &msgs, true);
    assert!(net.run_until_cond(2_000 * MS, |n| n.app(1).sides[&sid].ended));
    let back = &net.app(1).sides[&sid];
    assert_eq!(back.error, None);
    assert_eq!(back.got, msgs);
    // The 3 MB message was read in many pieces, as it arrived.
    assert!(back.reads > msgs.len() + 20, "{} reads", back.reads);
    let there = the_acceptor_side(&net, 0, sid);
    assert_eq!(there.got, msgs);
    assert!(there.ended);
    // Both sides ended: closing lets the state linger, then go.
    net.run_for(5 * MS);
    for h in [0, 1] {
        net.with_host(h, |app, ctx| {
            let now = ctx.now();
            let ep = ctx.endpoint().unwrap();
            for &s in app.sides.keys() {
                assert!(ep.stream_is_done(s), "host {h}");
                ep.stream_close(now, s);
            }
        });
    }
    net.run_for(1_000 * MS);
    for h in [0, 1] {
        let st = net.endpoint(h).stats();
        assert_eq!(st.streams, 0, "host {h}");
        assert_eq!(st.stream_bytes_held, 0, "host {h}");
    }
}

#[test]
fn streams_survive_loss_duplication_reordering_and_corruption() {
    let seeds: u64 = std::env::var("STREAM_SEEDS").map_or(3, |v| v.parse().unwrap());
    for seed in 1..=seeds {
        let mut net = net(4, seed, true, config());
        net.fabric_mut().set_faults(FaultConfig {
            loss: 0.03,
            duplicate: 0.03,
            reorder: 0.05,
            reorder_max_ns: 20_000,
            corrupt: 0.02,
        });
        let mut all = Vec::new();
        for c in 1..4 {
            for k in 0..2 {
                let msgs: Vec<Bytes> = [300usize, 1, 70_000, 5_000, 400_000, 2]
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| pattern(n, seed * 1000 + (c * 100 + k * 10 + i) as u64))
                    .collect();
                let sid = open(&mut net, c, 0, &msgs, true);
                all.push((c, sid, msgs));
            }
        }
        let done = net.run_until_cond(5_000 * MS, |n| {
            all.iter().all(|(c, sid, _)| n.app(*c).sides[sid].ended)
        });
        for (c, sid, _) in &all {
            if net.app(*c).sides[sid].error.is_some() || !done {
                let key = StreamId {
                    peer: net.addr(*c),
                    id: sid.id,
                    opener: false,
                };
                eprintln!(
                    "seed {seed} host {c}: {:?}\n opener {}\n acceptor {}",
                    net.app(*c).sides[sid].error,
                    net.endpoint(*c).stream_describe(*sid),
                    net.endpoint(0).stream_describe(key)
                );
            }
        }
        for (c, sid, msgs) in &all {
            let side = &net.app(*c).sides[sid];
            assert_eq!(side.error, None, "seed {seed}");
            assert_eq!(side.got.len(), msgs.len(), "seed {seed} host {c}");
            assert!(side.got == *msgs, "seed {seed}: bytes differ");
        }
        assert!(done, "seed {seed}");
        let m = net.endpoint(0).metrics();
        assert!(
            m.retransmitted_packets > 0,
            "seed {seed}: no loss recovered"
        );
    }
}

#[test]
fn a_stalled_reader_bounds_memory_at_both_ends() {
    let window = 256 * 1024u64;
    let mut net = net(2, 4, false, config());
    net.app_mut(0).reading = false;
    let msgs: Vec<Bytes> = (0..40).map(|i| pattern(100_000, i)).collect();
    let sid = open(&mut net, 1, 0, &msgs, true);
    net.run_for(200 * MS);
    let rx = net.endpoint(0).stats().stream_bytes_held;
    let tx = net.endpoint(1).stats().stream_bytes_held;
    assert!(rx <= window, "reader holds {rx}");
    assert!(rx >= window / 2, "reader holds only {rx}");
    assert!(tx <= window + 100_000, "writer holds {tx}");
    // The writer was stopped: most messages still wait in the app.
    assert!(net.app(1).sides[&sid].to_send.len() > 30);
    // The reader goes on: everything arrives, in order.
    net.app_mut(0).reading = true;
    let key = StreamId {
        peer: net.addr(1),
        id: sid.id,
        opener: false,
    };
    net.with_host(0, |app, ctx| app.pump(ctx, key));
    assert!(net.run_until_cond(2_000 * MS, |n| n.app(0).sides[&key].ended));
    assert_eq!(net.app(0).sides[&key].got, msgs);
}

fn cancel_from(opener_cancels: bool) {
    let mut net = net(2, 5, false, config());
    net.app_mut(0).reading = false;
    let msgs: Vec<Bytes> = (0..10).map(|i| pattern(100_000, i)).collect();
    let sid = open(&mut net, 1, 0, &msgs, false);
    net.run_for(20 * MS);
    let key = StreamId {
        peer: net.addr(1),
        id: sid.id,
        opener: false,
    };
    let (h, s, other, other_sid) = if opener_cancels {
        (1, sid, 0, key)
    } else {
        (0, key, 1, sid)
    };
    net.with_host(h, |_, ctx| {
        let now = ctx.now();
        ctx.endpoint().unwrap().stream_close(now, s);
    });
    net.run_for(5 * MS);
    assert_eq!(net.endpoint(h).stats().streams, 0);
    // The other side learns it, keeps its state only until it closes too.
    net.app_mut(other).reading = true;
    net.with_host(other, |app, ctx| app.pump(ctx, other_sid));
    let side = &net.app(other).sides[&other_sid];
    assert_eq!(
        side.error,
        Some(StreamError::Reset(ResetReason::Cancelled)),
        "opener cancels: {opener_cancels}"
    );
    net.with_host(other, |_, ctx| {
        let now = ctx.now();
        ctx.endpoint().unwrap().stream_close(now, other_sid);
    });
    for h in [0, 1] {
        let st = net.endpoint(h).stats();
        assert_eq!((st.streams, st.stream_bytes_held), (0, 0), "host {h}");
    }
}

#[test]
fn a_cancel_by_the_opener_frees_both_ends() {
    cancel_from(true);
}

#[test]
fn a_cancel_by_the_acceptor_frees_both_ends() {
    cancel_from(false);
}

#[test]
fn a_crashed_peer_fails_the_stream_within_the_timeout() {
    for busy in [true, false] {
        let mut net = net(2, 6, true, config());
        let msgs = vec![pattern(1_000, 1)];
        let sid = open(&mut net, 1, 0, &msgs, false);
        assert!(net.run_until_cond(10 * MS, |n| n.app(1).sides[&sid].got.len() == 1));
        let crash_at = net.now();
        net.crash(0, None);
        if busy {
            net.with_host(1, |app, ctx| {
                let now = ctx.now();
                let side = app.sides.get_mut(&sid).unwrap();
                side.to_send.push_back(pattern(500_000, 2));
                write(ctx.endpoint().unwrap(), now, sid, side);
            });
        }
        // The opener is waiting to read: the failure wakes it.
        net.with_host(1, |app, ctx| app.pump(ctx, sid));
        assert!(net.run_until_cond(200 * MS, |n| n.app(1).sides[&sid].error.is_some()));
        let waited = net.now() - crash_at;
        assert_eq!(net.app(1).sides[&sid].error, Some(StreamError::Timeout));
        // Busy: the timeout counts from the last packet heard; idle: the
        // keep-alive scan runs every quarter timeout, so up to 1.25×.
        assert!(waited <= 26 * MS, "busy {busy}: failed after {waited} ns");
        // The one message echoed before the crash is still there.
        assert_eq!(net.app(1).sides[&sid].got.len(), 1);
    }
}

#[test]
fn a_stream_to_a_host_that_never_had_it_is_reset() {
    let mut net = net(2, 7, false, config());
    let sid = open(&mut net, 1, 0, &[pattern(100, 1)], false);
    assert!(net.run_until_cond(10 * MS, |n| n.endpoint(0).stats().streams == 1));
    // The acceptor restarts: its state is gone; the opener's next bytes
    // (beyond its first window) meet a stranger, which resets them.
    net.crash(0, Some(MS));
    net.run_for(2 * MS);
    net.with_host(1, |app, ctx| {
        let now = ctx.now();
        let side = app.sides.get_mut(&sid).unwrap();
        side.to_send.push_back(pattern(2_000_000, 2));
        write(ctx.endpoint().unwrap(), now, sid, side);
    });
    net.with_host(1, |app, ctx| app.pump(ctx, sid));
    assert!(net.run_until_cond(100 * MS, |n| n.app(1).sides[&sid].error.is_some()));
    assert_eq!(
        net.app(1).sides[&sid].error,
        Some(StreamError::Reset(ResetReason::Unknown))
    );
}

#[test]
fn a_reader_waiting_for_more_hears_the_end() {
    let mut net = net(2, 8, false, config());
    let sid = open(&mut net, 1, 0, &[pattern(100, 1)], false);
    let key = StreamId {
        peer: net.addr(1),
        id: sid.id,
        opener: false,
    };
    assert!(net.run_until_cond(10 * MS, |n| n
        .app(0)
        .sides
        .get(&key)
        .is_some_and(|s| s.got.len() == 1)));
    // The reader found nothing more and waits; the end alone arrives.
    net.run_for(MS);
    net.with_host(1, |_, ctx| {
        let now = ctx.now();
        ctx.endpoint().unwrap().stream_finish(now, sid).unwrap();
    });
    assert!(net.run_until_cond(10 * MS, |n| n.app(0).sides[&key].ended));
}

#[test]
fn many_small_messages_flow_without_stalls() {
    let mut net = net(2, 9, false, config());
    let msgs: Vec<Bytes> = (0..30_000).map(|i| pattern(100, i)).collect();
    let start = net.now();
    let sid = open(&mut net, 1, 0, &msgs, true);
    let key = StreamId {
        peer: net.addr(1),
        id: sid.id,
        opener: false,
    };
    assert!(net.run_until_cond(2_000 * MS, |n| n
        .app(0)
        .sides
        .get(&key)
        .is_some_and(|s| s.ended)));
    let took = net.now() - start;
    assert_eq!(net.app(0).sides[&key].got.len(), msgs.len());
    // 3 MB of payload (about 5 MB on the wire) at 25 Gbit/s is under 2 ms:
    // no stall on a timer (a resend interval is 0.5 ms here).
    assert!(took < 5 * MS, "took {took} ns");
}

#[test]
fn a_stream_opened_but_not_yet_written_stays_quiet_and_open() {
    let mut net = net(2, 10, false, config());
    let peer = net.addr(0);
    let sid = net.with_host(1, |_, ctx| {
        let now = ctx.now();
        ctx.endpoint().unwrap().open_stream(now, peer).unwrap()
    });
    // Several keep-alive intervals and RPC timeouts (20 ms) later it is
    // still open (the peer does not know it: nothing to probe or time out).
    net.run_for(100 * MS);
    assert_eq!(
        net.endpoint(1)
            .metrics()
            .sent(homa_proto::wire::PacketType::StreamCredit),
        0
    );
    net.with_host(1, |app, ctx| {
        let now = ctx.now();
        let side = app.sides.entry(sid).or_default();
        side.to_send.push_back(pattern(10, 1));
        write(ctx.endpoint().unwrap(), now, sid, side);
    });
    let key = StreamId {
        peer: net.addr(1),
        id: sid.id,
        opener: false,
    };
    let limit = net.now() + 10 * MS;
    let ok = net.run_until_cond(limit, |n| {
        n.app(0).sides.get(&key).is_some_and(|s| s.got.len() == 1)
    });
    assert!(ok, "{}", net.endpoint(1).stream_describe(sid));
    assert_eq!(net.app(1).sides[&sid].error, None);
}
