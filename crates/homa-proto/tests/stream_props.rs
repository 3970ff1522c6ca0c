//! Streams under random interleavings of writes, reads, finishes, cancels
//! and time, between two engines over a lossy, reordering link (issue #21's
//! proptest): each side only ever reads a prefix of what the other wrote,
//! with the same message boundaries, exactly once and in order; without a
//! cancel everything arrives; after a cancel both ends free the stream.

use bytes::{Bytes, BytesMut};
use homa_proto::{Config, Endpoint, Event, StreamError, StreamId, StreamRead};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::net::SocketAddr;

#[derive(Debug, Clone)]
enum Op {
    Send(usize, usize),
    Read(usize, u8),
    Finish(usize),
    Cancel(usize),
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..2, prop_oneof![1usize..300, 1usize..5_000, 1usize..200_000])
            .prop_map(|(s, n)| Op::Send(s, n)),
        4 => (0usize..2, 1u8..20).prop_map(|(s, n)| Op::Read(s, n)),
        1 => (0usize..2).prop_map(Op::Finish),
        1 => (0usize..2).prop_map(Op::Cancel),
        3 => (1u32..3_000_000).prop_map(Op::Advance),
    ]
}

/// One end: its engine, its stream, what it wrote and what it read.
struct Side {
    ep: Endpoint,
    addr: SocketAddr,
    sid: Option<StreamId>,
    written: Vec<u8>,
    /// Message ends in `written` (offsets).
    write_ends: Vec<usize>,
    read: BytesMut,
    read_ends: Vec<usize>,
    ended: bool,
    error: Option<StreamError>,
    finished: bool,
    cancelled: bool,
}

struct Pair {
    sides: [Side; 2],
    /// Datagrams in flight: (deliver at, to side, bytes).
    wire: VecDeque<(u64, usize, Vec<u8>)>,
    now: u64,
    rng: u64,
    loss_permille: u64,
}

impl Pair {
    fn new(seed: u64, loss_permille: u64) -> Pair {
        let cfg = |s: u64| {
            Config::default()
                .with_rpc_id_seed(s)
                .with_resend_interval_ns(200_000)
                .with_rpc_timeout_ns(50_000_000)
                .with_stream_window_bytes(128 * 1024)
        };
        let side = |i: u64| Side {
            ep: Endpoint::new(cfg(seed * 2 + i), 0).unwrap(),
            addr: SocketAddr::from(([10, 0, 0, i as u8 + 1], 4000)),
            sid: None,
            written: Vec::new(),
            write_ends: Vec::new(),
            read: BytesMut::new(),
            read_ends: Vec::new(),
            ended: false,
            error: None,
            finished: false,
            cancelled: false,
        };
        let mut p = Pair {
            sides: [side(0), side(1)],
            wire: VecDeque::new(),
            now: 0,
            rng: seed | 1,
            loss_permille,
        };
        let peer = p.sides[1].addr;
        p.sides[0].sid = Some(p.sides[0].ep.open_stream(0, peer).unwrap());
        p
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Moves every datagram the engines have to send onto the wire (some
    /// lost, some late), and events to the sides.
    fn pump(&mut self) {
        let mut buf = Vec::new();
        for i in 0..2 {
            while let Some(t) = self.sides[i].ep.poll_transmit(self.now, &mut buf) {
                let to = if t.dest == self.sides[0].addr { 0 } else { 1 };
                let r = self.rand();
                if r % 1000 < self.loss_permille {
                    continue;
                }
                // 0-20 µs of delay: packets may overtake each other.
                let at = self.now + 1_000 + (r >> 10) % 20_000;
                self.wire.push_back((at, to, buf[..t.len].to_vec()));
            }
            while let Some(ev) = self.sides[i].ep.poll_event() {
                if let Event::StreamOpened { stream } = ev {
                    assert!(self.sides[i].sid.is_none(), "a second stream");
                    self.sides[i].sid = Some(stream);
                }
            }
        }
    }

    fn advance(&mut self, d: u64) {
        let end = self.now + d;
        loop {
            self.pump();
            let next_pkt = self.wire.iter().map(|w| w.0).min();
            let next_timer = (0..2).filter_map(|i| self.sides[i].ep.poll_timeout()).min();
            let next = match (next_pkt, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(u64::MAX),
            };
            if next > end {
                break;
            }
            self.now = self.now.max(next);
            let mut k = 0;
            while k < self.wire.len() {
                if self.wire[k].0 <= self.now {
                    let (_, to, bytes) = self.wire.remove(k).unwrap();
                    let from = self.sides[1 - to].addr;
                    self.sides[to].ep.handle_datagram(self.now, from, &bytes);
                } else {
                    k += 1;
                }
            }
            for i in 0..2 {
                if self.sides[i]
                    .ep
                    .poll_timeout()
                    .is_some_and(|t| t <= self.now)
                {
                    self.sides[i].ep.handle_timeout(self.now);
                }
            }
        }
        self.now = end;
        self.pump();
    }

    fn read(&mut self, i: usize, pieces: u8) {
        let now = self.now;
        let s = &mut self.sides[i];
        let Some(sid) = s.sid else { return };
        if s.cancelled {
            return;
        }
        for _ in 0..pieces {
            match s.ep.stream_recv(now, sid) {
                Ok(StreamRead::Data {
                    bytes,
                    end_of_message,
                }) => {
                    assert!(!bytes.is_empty());
                    s.read.extend_from_slice(&bytes);
                    if end_of_message {
                        s.read_ends.push(s.read.len());
                    }
                }
                Ok(StreamRead::Pending) => break,
                Ok(StreamRead::End) => {
                    s.ended = true;
                    break;
                }
                Err(e) => {
                    s.error = Some(e);
                    break;
                }
            }
        }
        self.pump();
    }

    /// What a side read is a prefix of what the other wrote, with the same
    /// message ends.
    fn check(&self) {
        for i in 0..2 {
            let (r, w) = (&self.sides[i], &self.sides[1 - i]);
            assert!(r.read.len() <= w.written.len());
            assert!(
                r.read[..] == w.written[..r.read.len()],
                "side {i} read bytes not written"
            );
            let ends: Vec<usize> = w
                .write_ends
                .iter()
                .copied()
                .filter(|&e| e <= r.read.len())
                .collect();
            assert_eq!(r.read_ends, ends, "side {i}: message ends differ");
            if r.ended {
                assert!(w.finished);
                assert_eq!(r.read.len(), w.written.len());
            }
        }
    }
}

fn run(ops: &[Op], seed: u64, loss: u64) {
    let mut p = Pair::new(seed, loss);
    let mut counter = 0u8;
    for op in ops {
        match *op {
            Op::Send(i, n) => {
                let s = &mut p.sides[i];
                let (Some(sid), false, false) = (s.sid, s.finished, s.cancelled) else {
                    continue;
                };
                counter = counter.wrapping_add(1);
                let msg: Vec<u8> = (0..n)
                    .map(|k| (k as u8).wrapping_mul(31) ^ counter)
                    .collect();
                match s.ep.stream_send(p.now, sid, Bytes::from(msg.clone())) {
                    Ok(()) => {
                        s.written.extend_from_slice(&msg);
                        s.write_ends.push(s.written.len());
                    }
                    Err(StreamError::Full) => {}
                    Err(e) => s.error = s.error.or(Some(e)),
                }
                p.pump();
            }
            Op::Read(i, k) => p.read(i, k),
            Op::Finish(i) => {
                let s = &mut p.sides[i];
                if let (Some(sid), false) = (s.sid, s.cancelled) {
                    if s.ep.stream_finish(p.now, sid).is_ok() {
                        s.finished = true;
                    }
                }
                p.pump();
            }
            // Half the cases never cancel, so that they end with every
            // byte delivered.
            Op::Cancel(_) if seed.is_multiple_of(2) => {}
            Op::Cancel(i) => {
                let s = &mut p.sides[i];
                if let (Some(sid), false) = (s.sid, s.cancelled) {
                    s.ep.stream_close(p.now, sid);
                    s.cancelled = true;
                }
                p.pump();
            }
            Op::Advance(d) => p.advance(d as u64),
        }
        p.check();
    }
    // The end: both sides read everything, time passes (with loss still).
    for _ in 0..400 {
        p.read(0, 200);
        p.read(1, 200);
        p.advance(1_000_000);
        p.check();
    }
    let cancelled = p.sides.iter().any(|s| s.cancelled);
    for i in 0..2 {
        let (r, w) = (&p.sides[i], &p.sides[1 - i]);
        if !cancelled && r.sid.is_some() {
            assert_eq!(r.error, None, "side {i}");
            assert_eq!(r.read.len(), w.written.len(), "side {i}: bytes lost");
            assert_eq!(r.ended, w.finished, "side {i}");
        }
    }
    // Closing both frees everything (after a tombstone time).
    for i in 0..2 {
        if let (Some(sid), false) = (p.sides[i].sid, p.sides[i].cancelled) {
            let now = p.now;
            p.sides[i].ep.stream_close(now, sid);
        }
    }
    p.advance(200_000_000);
    for i in 0..2 {
        let st = p.sides[i].ep.stats();
        assert_eq!(
            (st.streams, st.stream_bytes_held),
            (0, 0),
            "side {i}: {st:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn interleavings_keep_every_stream_byte_in_order_exactly_once(
        ops in proptest::collection::vec(op(), 1..60),
        seed in 1u64..1_000_000,
        loss in prop_oneof![Just(0u64), 1u64..50],
    ) {
        run(&ops, seed, loss);
    }
}
