//! A ready-made application for protocol tests: it records everything its
//! endpoint reports and answers requests according to a policy.

use crate::driver::{App, HostCtx};
use crate::net::HostId;
use crate::sched::Time;
use bytes::Bytes;
use homa_proto::{Event, PartialMessage, PartialState, RpcError, RpcId, ServerRpc};

/// How a [`TestApp`] answers requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Send the request's bytes back.
    Echo,
    /// Send this many bytes (a deterministic pattern).
    Fixed(usize),
    /// Don't answer; requests are kept in [`TestApp::unanswered`].
    Manual,
}

/// One thing a [`TestApp`] observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Request {
        rpc: ServerRpc,
        from: Option<HostId>,
        data: Vec<u8>,
    },
    Response {
        id: RpcId,
        data: Vec<u8>,
    },
    Failed {
        id: RpcId,
        error: RpcError,
    },
    /// A partial message (request or response) stopped after `received`
    /// of its bytes.
    PartialFailed {
        serial: u64,
        received: usize,
    },
    Crashed,
    Restarted,
}

/// A message delivered incrementally that a [`TestApp`] is reading: at
/// every `PartialProgress` it copies out the newly readable bytes, checking
/// that the readable prefix never shrinks.
#[derive(Debug)]
pub struct Reading {
    /// The server RPC of a request, `None` for a response.
    pub rpc: Option<ServerRpc>,
    /// The client RPC of a response.
    pub id: Option<RpcId>,
    pub message: PartialMessage,
    /// The bytes read so far, in order.
    pub data: Vec<u8>,
    /// Times new bytes were read before the message was complete.
    pub early_reads: usize,
}

/// Records events with their time and answers requests per [`Reply`].
#[derive(Debug)]
pub struct TestApp {
    pub reply: Reply,
    /// Everything observed, in order, with the time. A message delivered
    /// incrementally is logged as a `Request` or `Response` when complete.
    pub log: Vec<(Time, Record)>,
    /// Messages delivered incrementally, still arriving.
    pub reading: Vec<Reading>,
    /// For each partial message that completed: (serial, early reads).
    pub partials_done: Vec<(u64, usize)>,
    /// Requests received under [`Reply::Manual`] (or whose answer was refused).
    pub unanswered: Vec<ServerRpc>,
}

/// `len` bytes of a deterministic pattern that depends on `seed` (so that
/// misdelivered bytes are detected).
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

impl TestApp {
    pub fn new(reply: Reply) -> TestApp {
        TestApp {
            reply,
            log: Vec::new(),
            reading: Vec::new(),
            partials_done: Vec::new(),
            unanswered: Vec::new(),
        }
    }

    /// The response data received for `id`, if any.
    pub fn response(&self, id: RpcId) -> Option<&[u8]> {
        self.log.iter().find_map(|(_, r)| match r {
            Record::Response { id: i, data } if *i == id => Some(&data[..]),
            _ => None,
        })
    }

    /// The failure reported for `id`, if any.
    pub fn failure(&self, id: RpcId) -> Option<RpcError> {
        self.log.iter().find_map(|(_, r)| match r {
            Record::Failed { id: i, error } if *i == id => Some(*error),
            _ => None,
        })
    }

    /// Whether `id` finished (response or failure), and when.
    pub fn finished_at(&self, id: RpcId) -> Option<Time> {
        self.log.iter().find_map(|(t, r)| match r {
            Record::Response { id: i, .. } | Record::Failed { id: i, .. } if *i == id => Some(*t),
            _ => None,
        })
    }

    pub fn requests(&self) -> impl Iterator<Item = (&ServerRpc, &[u8])> + '_ {
        self.log.iter().filter_map(|(_, r)| match r {
            Record::Request { rpc, data, .. } => Some((rpc, &data[..])),
            _ => None,
        })
    }

    pub fn responses(&self) -> usize {
        self.log
            .iter()
            .filter(|(_, r)| matches!(r, Record::Response { .. }))
            .count()
    }

    pub fn failures(&self) -> usize {
        self.log
            .iter()
            .filter(|(_, r)| matches!(r, Record::Failed { .. }))
            .count()
    }
}

impl TestApp {
    fn on_request(&mut self, ctx: &mut HostCtx<'_>, rpc: ServerRpc, data: Vec<u8>) {
        let answer = match self.reply {
            Reply::Echo => Some(Bytes::from(data.clone())),
            Reply::Fixed(n) => Some(pattern(n, rpc.id)),
            Reply::Manual => None,
        };
        let from = ctx.host_of(rpc.peer);
        self.log
            .push((ctx.now(), Record::Request { rpc, from, data }));
        let sent = answer.is_some_and(|a| ctx.send_response(rpc, a).is_ok());
        if !sent {
            self.unanswered.push(rpc);
        }
    }

    /// Reads what partial message `i` has newly made readable; finishes
    /// it if it ended.
    fn read_partial(&mut self, ctx: &mut HostCtx<'_>, i: usize) {
        let r = &mut self.reading[i];
        let state = r.message.state();
        let readable = r.message.readable();
        assert!(readable >= r.data.len(), "the readable prefix shrank");
        if readable > r.data.len() {
            let from = r.data.len();
            for piece in r.message.fragments(from, readable) {
                r.data.extend_from_slice(piece);
            }
            if state == PartialState::Receiving {
                r.early_reads += 1;
            }
        }
        match state {
            PartialState::Receiving => {}
            PartialState::Complete => {
                let r = self.reading.swap_remove(i);
                assert_eq!(r.data.len(), r.message.len());
                self.partials_done.push((r.message.serial(), r.early_reads));
                match (r.rpc, r.id) {
                    (Some(rpc), _) => self.on_request(ctx, rpc, r.data),
                    (None, Some(id)) => self
                        .log
                        .push((ctx.now(), Record::Response { id, data: r.data })),
                    (None, None) => unreachable!(),
                }
            }
            PartialState::Failed => {
                let r = self.reading.swap_remove(i);
                self.log.push((
                    ctx.now(),
                    Record::PartialFailed {
                        serial: r.message.serial(),
                        received: r.data.len(),
                    },
                ));
            }
        }
    }

    fn start_reading(&mut self, ctx: &mut HostCtx<'_>, reading: Reading) {
        self.reading.push(reading);
        self.read_partial(ctx, self.reading.len() - 1);
    }
}

impl App for TestApp {
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        let now = ctx.now();
        match event {
            Event::Request { rpc, message } => {
                // Copy out and release the pool space before answering.
                let data = message.to_vec();
                drop(message);
                self.on_request(ctx, rpc, data);
            }
            Event::PartialRequest { rpc, message } => {
                let reading = Reading {
                    rpc: Some(rpc),
                    id: None,
                    message,
                    data: Vec::new(),
                    early_reads: 0,
                };
                self.start_reading(ctx, reading);
            }
            Event::PartialResponse { id, message } => {
                let reading = Reading {
                    rpc: None,
                    id: Some(id),
                    message,
                    data: Vec::new(),
                    early_reads: 0,
                };
                self.start_reading(ctx, reading);
            }
            // This application opens no streams; a peer's is refused.
            Event::StreamOpened { stream } => {
                if let Some(ep) = ctx.endpoint() {
                    ep.stream_close(now, stream);
                }
            }
            Event::StreamReadable { .. } | Event::StreamWritable { .. } => {}
            Event::PartialProgress { serial } => {
                if let Some(i) = self
                    .reading
                    .iter()
                    .position(|r| r.message.serial() == serial)
                {
                    self.read_partial(ctx, i);
                }
            }
            Event::Response { id, message } => {
                self.log.push((
                    now,
                    Record::Response {
                        id,
                        data: message.to_vec(),
                    },
                ));
            }
            Event::Failed { id, error } => self.log.push((now, Record::Failed { id, error })),
        }
    }

    fn on_crash(&mut self, _host: HostId, now: Time) {
        self.unanswered.clear();
        self.reading.clear();
        self.log.push((now, Record::Crashed));
    }

    fn on_restart(&mut self, ctx: &mut HostCtx<'_>) {
        self.log.push((ctx.now(), Record::Restarted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_deterministic_and_seed_dependent() {
        assert_eq!(pattern(100, 3), pattern(100, 3));
        assert_ne!(pattern(100, 3), pattern(100, 4));
        assert_eq!(pattern(7, 1).len(), 7);
    }
}
