//! Streams (`docs/streams.md` §2): a long-lived pair of ordered, reliable
//! byte sequences between two endpoints, each cut into messages of any
//! size, with receiver-driven flow control. One [`Stream`] entry holds a
//! stream's whole life; nothing is created or reclaimed per message.
//!
//! * **Opening** costs no round trip: the opener's first STREAM_DATA
//!   creates the acceptor's entry ([`Event::StreamOpened`]). Until it hears
//!   credit, a writer may send the unscheduled bytes (`Config::unsched_bytes`
//!   derived), as a message's first bytes go without a grant.
//! * **Credit is what the reader can take**: the reader lets the writer
//!   send up to `consumed + window` (`Config::stream_window_bytes`), so a
//!   reader that stops reading stops the writer after one window and
//!   neither end holds more than a window (plus the message being written)
//!   of a stream's bytes. Credit and the acknowledgement of what arrived
//!   travel in STREAM_CREDIT, and on every STREAM_DATA of the other
//!   direction.
//! * **Loss recovery** stays with the receiver where it can see a gap (a
//!   STREAM_CREDIT asking for the missing range); a writer whose bytes are
//!   unacknowledged for a resend interval probes (STREAM_CREDIT with
//!   `probe`), and the answer's `received` says what to send again. The
//!   opener probes an idle stream every keep-alive interval; a stream that
//!   hears nothing for the RPC timeout fails at both ends.
//! * **Scheduling** (`outgoing.rs`): a stream's next packet competes with
//!   the sender's SRPT head as a message of the bytes it can send now
//!   (queued and within credit, at most a window), and takes the
//!   unscheduled priority of a message of that length while that is at
//!   most the unscheduled bytes, the lowest level beyond; while a stream
//!   waits behind shorter messages it accrues a share
//!   (`Config::stream_share_permille`), so neither starves the other.

use crate::endpoint::{Control, ControlBody, Endpoint, Event};
use crate::metrics::DropReason;
use crate::time::Time;
use crate::wire::{self, CommonHeader, ResetReason, StreamDataHeader};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use thiserror::Error;

/// One stream, as this endpoint names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// The other end.
    pub peer: SocketAddr,
    /// The id the opener chose (unique among the opener's streams).
    pub id: u64,
    /// Whether this endpoint opened the stream.
    pub opener: bool,
}

/// Why a stream operation failed, or why a stream ended early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum StreamError {
    /// The peer reset the stream (cancelled it, did not know it, refused
    /// it, or shut down).
    #[error("the peer reset the stream ({0:?})")]
    Reset(ResetReason),
    /// Nothing was heard from the peer for the RPC timeout.
    #[error("the peer did not answer within the RPC timeout")]
    Timeout,
    /// This endpoint shut down.
    #[error("the endpoint was shut down")]
    Shutdown,
    /// No such stream here (never opened, or already closed).
    #[error("no such stream")]
    Unknown,
    /// This side already finished writing ([`Endpoint::stream_finish`]).
    #[error("the stream's sending side is already finished")]
    Finished,
    /// Stream messages have at least one byte.
    #[error("a stream message must not be empty")]
    EmptyMessage,
    /// The send buffer holds a window of unacknowledged bytes: wait for
    /// [`Event::StreamWritable`].
    #[error("the stream's send buffer is full; wait until it is writable")]
    Full,
    /// `Config::max_streams` streams are open.
    #[error("too many open streams (limit {0})")]
    TooManyStreams(usize),
}

/// What [`Endpoint::stream_recv`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamRead {
    /// The next bytes, in order, within one message.
    Data {
        /// The bytes (never empty).
        bytes: Bytes,
        /// They end a message.
        end_of_message: bool,
    },
    /// Nothing readable now; [`Event::StreamReadable`] says when.
    Pending,
    /// The peer finished its side and every byte has been read.
    End,
}

/// A message being sent: bytes `[start, start + bytes.len())` of the
/// direction.
struct TxMsg {
    start: u64,
    bytes: Bytes,
}

/// The sending side of a stream.
#[derive(Default)]
struct Tx {
    /// Messages written and not yet acknowledged in full, in order.
    queue: VecDeque<TxMsg>,
    /// Every byte below this arrived at the peer (and was freed here).
    acked: u64,
    /// The next byte sent for the first time.
    next: u64,
    /// Bytes written in all.
    end: u64,
    /// The peer lets us send below this.
    credit: u64,
    /// A range to send again, `[start, end)`.
    retx: Option<(u64, u64)>,
    /// The application finished writing: FIN goes after `end`.
    fin_queued: bool,
    fin_sent: bool,
    fin_acked: bool,
    /// When `acked` last moved or a first transmission went.
    last_progress: Time,
    /// The application was told `Full` and waits for `StreamWritable`.
    blocked: bool,
    /// When bytes were last queued to go again (at most once per half
    /// resend interval: the answers to one loss must not each start a
    /// retransmission of their own).
    last_rewind: Option<Time>,
    /// Ends of the first transmissions not yet acknowledged, oldest first:
    /// at most [`MAX_PACKETS_IN_FLIGHT`].
    in_flight: VecDeque<u64>,
}

/// Most unacknowledged packets a stream's writer has out (new data). Short
/// messages written one by one would otherwise go one per packet, a
/// window's worth of them (10,000 packets of 100 bytes for 1 MB), far more
/// than a socket's receive buffer holds (each small datagram costs the
/// kernel about a kilobyte): with the cap, messages written meanwhile wait
/// and leave together, many per packet.
pub(crate) const MAX_PACKETS_IN_FLIGHT: usize = 128;

/// A reader acknowledges what arrived at least every this many packets,
/// so that a writer held by [`MAX_PACKETS_IN_FLIGHT`] goes on.
const ACK_EVERY_PACKETS: u32 = (MAX_PACKETS_IN_FLIGHT / 4) as u32;

/// Most probes (and first packets sent again) one stream tick sends; the
/// rest wait in [`Streams::probe_queue`] for the next ticks, oldest first.
/// Every probe draws an answer, and a tick's answers arrive together at
/// one socket: without a bound, a host with many streams whose peer (or
/// whose own receive buffer) fell behind probed all of them every resend
/// interval, the answers overflowed the receive buffer, and the lost
/// answers were probed for again: 30,000 streams opened at once on
/// loopback took 10-14 s and 10 million packets to open, or never
/// finished. At one tick per half resend interval this is 128 probes per
/// millisecond at the default interval.
const STREAM_PROBES_PER_TICK: usize = 64;

/// Most doublings of the wait between unanswered probes of one stream
/// (16 resend intervals). Failure is decided by silence
/// (`last_heard` against the RPC timeout), not by the probes, so the
/// backoff delays only recovery, never the verdict.
const MAX_PROBE_BACKOFF: u8 = 4;

impl Tx {
    /// Whether the peer owes us an acknowledgement.
    fn outstanding(&self) -> bool {
        self.acked < self.next || (self.fin_sent && !self.fin_acked)
    }

    /// Whether this side waits on the peer: for an acknowledgement, or for
    /// credit to send what is written (the credit may have been lost).
    fn waiting(&self) -> bool {
        self.outstanding() || (self.next < self.end && self.next >= self.credit)
    }

    /// Whether a packet could go now.
    fn sendable(&self) -> bool {
        self.retx.is_some()
            || (self.next < self.end
                && self.next < self.credit
                && self.in_flight.len() < MAX_PACKETS_IN_FLIGHT)
            || (self.fin_queued && !self.fin_sent && self.next == self.end)
    }

    /// The bytes this side could send now: its rank in the sender's SRPT.
    fn rank(&self) -> u64 {
        match self.retx {
            Some((s, e)) => e - s,
            None => self.end.min(self.credit).saturating_sub(self.next),
        }
    }

    /// The index of the message holding byte `offset` (in `[acked, end)`).
    fn msg_at(&self, offset: u64) -> usize {
        self.queue
            .partition_point(|m| m.start + m.bytes.len() as u64 <= offset)
    }

    /// The packet that starts at `offset` and ends by `limit`: as many
    /// messages (or parts) as fit `room` payload bytes with 4 more for each
    /// message end it lists. Returns the pieces and the ends (positions in
    /// the payload).
    ///
    /// A piece that does not end its message still leaves room for one end
    /// (4 bytes): a packet then carries at most `room - 4` bytes of a long
    /// message, so a message of that many bytes (or a multiple), such as a
    /// piece a reader took from such packets and writes back, goes out in
    /// whole packets of its own. Without the reserve its last byte went
    /// into the next packet with the next message's first bytes, and a
    /// packet of several pieces is copied into one buffer where a packet
    /// of one piece is sent from the message's own memory.
    fn packet_at(
        &self,
        offset: u64,
        limit: u64,
        room: usize,
        pieces: &mut Vec<Bytes>,
        ends: &mut Vec<u32>,
    ) {
        let mut len = 0usize;
        let mut at = offset;
        let mut i = self.msg_at(offset);
        while at < limit && i < self.queue.len() && ends.len() < wire::MAX_STREAM_ENDS {
            let m = &self.queue[i];
            let m_end = m.start + m.bytes.len() as u64;
            let space = room.saturating_sub(len + 4 * ends.len());
            let avail = (m_end.min(limit) - at) as usize;
            let whole = at + avail as u64 == m_end;
            let take = if whole && avail + 4 <= space {
                avail
            } else if whole {
                // Its end would not fit: leave at least its last byte to
                // the next packet, which lists the end.
                (avail - 1).min(space.saturating_sub(4))
            } else {
                avail.min(space.saturating_sub(4))
            };
            if take == 0 {
                break;
            }
            let a = (at - m.start) as usize;
            pieces.push(m.bytes.slice(a..a + take));
            len += take;
            at += take as u64;
            if at == m_end {
                ends.push(len as u32);
                i += 1;
            } else {
                break;
            }
        }
    }

    /// Frees what the peer says arrived; true if `acked` moved.
    fn ack(&mut self, received: u64) -> bool {
        let received = received.min(self.next);
        if received <= self.acked {
            return false;
        }
        self.acked = received;
        while self.in_flight.front().is_some_and(|&e| e <= received) {
            self.in_flight.pop_front();
        }
        while let Some(m) = self.queue.front() {
            if m.start + m.bytes.len() as u64 <= received {
                self.queue.pop_front();
            } else {
                break;
            }
        }
        if let Some((s, e)) = self.retx {
            self.retx = (e > received).then_some((s.max(received), e));
        }
        true
    }
}

/// The receiving side of a stream.
#[derive(Default)]
struct Rx {
    /// Bytes `[consumed, received)`, in order, not yet read: first the
    /// pieces (payloads the driver received straight into the receive
    /// pool, and earlier tails of `ready` frozen in front of them), then
    /// `ready`.
    pieces: VecDeque<Bytes>,
    /// The last unread bytes, after `pieces`: payloads copied in, or
    /// received into its spare capacity when the pool is short.
    ready: BytesMut,
    /// Ends of messages in `(consumed, received]`, in order.
    ends: VecDeque<u64>,
    consumed: u64,
    received: u64,
    /// Bytes beyond a gap, by offset, with the message ends among them
    /// (stream offsets).
    ooo: BTreeMap<u64, (Bytes, Vec<u64>)>,
    ooo_bytes: usize,
    /// Where the peer's FIN is, once known.
    fin_at: Option<u64>,
    /// The credit last told the peer.
    credit_sent: u64,
    /// A STREAM_CREDIT for this side is queued (resolved when sent).
    credit_queued: bool,
    /// When `received` last moved.
    last_progress: Time,
    /// Packets taken in since the writer was last told what arrived.
    unacked_packets: u32,
    /// The application was told `Pending` and waits for `StreamReadable`.
    waiting: bool,
}

impl Rx {
    fn finished(&self) -> bool {
        self.fin_at == Some(self.received)
    }

    /// Whether `stream_recv` has something other than `Pending` to say.
    fn readable(&self) -> bool {
        self.consumed < self.received || self.finished()
    }

    /// Takes in bytes `[offset, offset + payload.len())` with the message
    /// ends `ends` (stream offsets, ascending); refused if they reach
    /// beyond `limit`.
    fn land(&mut self, offset: u64, payload: &[u8], ends: &[u64], limit: u64) -> Landed {
        let end = offset + payload.len() as u64;
        if end <= self.received {
            return Landed::Duplicate;
        }
        if end > limit {
            return Landed::BeyondCredit;
        }
        if offset > self.received {
            if let Some((b, _)) = self.ooo.get(&offset) {
                if b.len() >= payload.len() {
                    return Landed::Duplicate;
                }
            }
            let old = self
                .ooo
                .insert(offset, (Bytes::copy_from_slice(payload), ends.to_vec()));
            self.ooo_bytes += payload.len();
            if let Some((b, _)) = old {
                self.ooo_bytes -= b.len();
            }
            return Landed::Gap;
        }
        self.append(offset, payload, ends);
        while let Some((&s, _)) = self.ooo.first_key_value() {
            if s > self.received {
                break;
            }
            let (b, ends) = self.ooo.remove(&s).expect("first key");
            self.ooo_bytes -= b.len();
            if s + b.len() as u64 > self.received {
                self.append(s, &b, &ends);
            }
        }
        Landed::InOrder
    }

    /// Appends the part of `[offset, ...)` beyond `received` (`offset` is
    /// at or below it) and the message ends beyond it.
    fn append(&mut self, offset: u64, payload: &[u8], ends: &[u64]) {
        let before = self.received;
        let skip = (before - offset) as usize;
        self.ready.extend_from_slice(&payload[skip..]);
        self.received = offset + payload.len() as u64;
        for &e in ends {
            if e > before && self.ends.back().is_none_or(|&b| b < e) {
                self.ends.push_back(e);
            }
        }
    }

    /// The next readable piece, if any: up to the next message end, and
    /// not beyond one of `pieces` (a message received into several pool
    /// pieces is read piece by piece, without a copy).
    fn take(&mut self) -> Option<(Bytes, bool)> {
        if self.consumed == self.received {
            return None;
        }
        let (n, at_end) = match self.ends.front() {
            Some(&e) => ((e - self.consumed) as usize, true),
            None => ((self.received - self.consumed) as usize, false),
        };
        let (bytes, eom) = match self.pieces.front_mut() {
            Some(front) => {
                let b = if front.len() > n {
                    front.split_to(n)
                } else {
                    self.pieces.pop_front().expect("a front piece")
                };
                let whole = b.len() == n;
                (b, at_end && whole)
            }
            None => (self.ready.split_to(n).freeze(), at_end),
        };
        if eom {
            self.ends.pop_front();
        }
        self.consumed += bytes.len() as u64;
        Some((bytes, eom))
    }

    /// Appends a payload the driver received into the pool (`piece`),
    /// behind every byte already unread.
    fn push_piece(&mut self, piece: Bytes) {
        if !self.ready.is_empty() {
            self.pieces.push_back(self.ready.split().freeze());
        }
        self.received += piece.len() as u64;
        self.pieces.push_back(piece);
    }
}

/// A payload received into the receive pool (one contiguous slice of a
/// bpage, [`Endpoint::stream_landing_site`]) as `Bytes` that hold its space
/// until the reader drops them.
fn pool_piece(m: crate::pool::Message) -> Bytes {
    struct Piece(crate::pool::Message);
    impl AsRef<[u8]> for Piece {
        fn as_ref(&self) -> &[u8] {
            self.0.contiguous().unwrap_or_default()
        }
    }
    debug_assert!(m.contiguous().is_some());
    Bytes::from_owner(Piece(m))
}

/// A STREAM_DATA payload: in the datagram, or already landed at the end
/// of the stream's unread bytes (`stream_landing_site`).
#[derive(Clone, Copy)]
pub(crate) enum StreamPayload<'a> {
    Bytes(&'a [u8]),
    Landed(usize),
}

impl StreamPayload<'_> {
    fn len(&self) -> usize {
        match self {
            StreamPayload::Bytes(b) => b.len(),
            StreamPayload::Landed(n) => *n,
        }
    }
}

enum Landed {
    InOrder,
    Gap,
    Duplicate,
    BeyondCredit,
}

/// Where a stream is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Live,
    /// Ended early; the application has not closed it yet.
    Failed(StreamError),
    /// Closed by the application after both sides ended; kept until
    /// `until` to answer a peer that missed our last acknowledgement.
    Lingering {
        until: Time,
    },
}

/// One stream's state.
struct Stream {
    tx: Tx,
    rx: Rx,
    phase: Phase,
    /// When anything was last heard from the peer about this stream.
    last_heard: Time,
    /// When we last probed the peer.
    last_probe: Time,
    /// In the send rotation.
    ready: bool,
    /// Something has been heard from the peer about this stream (an
    /// opener that has not heard anything may have lost its first
    /// packets, which alone can open the stream: it sends them again
    /// instead of probing).
    heard: bool,
    /// In [`Streams::probe_queue`].
    probe_queued: bool,
    /// Probes in a row that went unanswered: each doubles the wait before
    /// the next (at most [`MAX_PROBE_BACKOFF`] doublings).
    probe_backoff: u8,
}

impl Stream {
    fn new(now: Time, credit: u64) -> Stream {
        Stream {
            tx: Tx {
                credit,
                last_progress: now,
                ..Tx::default()
            },
            rx: Rx {
                last_progress: now,
                ..Rx::default()
            },
            phase: Phase::Live,
            last_heard: now,
            last_probe: now,
            ready: false,
            heard: false,
            probe_queued: false,
            probe_backoff: 0,
        }
    }

    /// Whether both sides ended: everything sent was acknowledged with our
    /// FIN, and the peer's FIN arrived.
    fn done(&self) -> bool {
        self.tx.fin_acked && self.rx.finished()
    }
}

/// Every stream of the endpoint and the send rotation.
#[repr(C, align(64))]
pub(crate) struct Streams {
    // The fields every poll reads (`has_ready`, `Endpoint::poll_timeout`)
    // and every short message writes (`short_seen`) share the first line,
    // the rest after them.
    /// The next timer run (`Time::MAX`: none).
    pub next_tick: Time,
    /// Streams with a packet to send, in turn.
    rotation: VecDeque<StreamId>,
    /// When a packet of a short message (one sent whole unscheduled) last
    /// arrived here: while that is recent, streams are credited less
    /// ([`Endpoint::stream_credit_window`]). Written for every short
    /// message that arrives, so on the line the polls read anyway.
    short_seen: Option<Time>,
    /// By id; ordered so that timers visit streams in the same order every
    /// run (simulations are deterministic).
    table: BTreeMap<StreamId, Stream>,
    /// Streams owed a timer check each tick: bytes unacknowledged, or a gap.
    active: BTreeSet<StreamId>,
    /// Streams due a probe (or their first packets again), oldest first;
    /// each tick sends at most [`STREAM_PROBES_PER_TICK`] of them.
    probe_queue: VecDeque<StreamId>,
    /// `send_stream_packet`'s lists of a packet's pieces and message ends,
    /// kept for their capacity.
    scratch_pieces: Vec<Bytes>,
    scratch_ends: Vec<u32>,
    /// `handle_stream_data`'s list of a packet's message ends (offsets).
    scratch_ends_at: Vec<u64>,
    /// Bytes of messages sent while a stream waited (its share, see
    /// `Config::stream_share_permille`).
    debt: u64,
    next_seq: u64,
    /// The next keep-alive scan of every stream.
    next_scan: Time,
    /// The pool bytes of the landing site last given for a stream's
    /// datagram ([`Endpoint::stream_landing_site`]), until the driver
    /// reports the datagram; replaced (so returned to the pool) by the
    /// next site if the receive failed.
    landing: Option<(StreamId, crate::pool::Allocation)>,
}

const _: () = assert!(std::mem::offset_of!(Streams, short_seen) + 16 <= 64);

impl Streams {
    pub fn new(seed: u64) -> Streams {
        Streams {
            table: BTreeMap::new(),
            rotation: VecDeque::new(),
            active: BTreeSet::new(),
            probe_queue: VecDeque::new(),
            scratch_pieces: Vec::new(),
            scratch_ends: Vec::new(),
            scratch_ends_at: Vec::new(),
            debt: 0,
            short_seen: None,
            next_seq: crate::splitmix64(seed ^ 0x5354_5245_414d).max(1),
            next_tick: Time::MAX,
            next_scan: Time::MAX,
            landing: None,
        }
    }

    /// Whether a stream has a packet to send.
    #[inline]
    pub fn has_ready(&self) -> bool {
        !self.rotation.is_empty()
    }

    /// Streams in the table (lingering ones included).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Bytes held for streams: unread received bytes, bytes beyond gaps,
    /// and written bytes not yet acknowledged.
    pub fn held_bytes(&self) -> u64 {
        self.table
            .values()
            .map(|s| {
                let pieces: usize = s.rx.pieces.iter().map(Bytes::len).sum();
                (pieces + s.rx.ready.len() + s.rx.ooo_bytes) as u64 + (s.tx.end - s.tx.acked)
            })
            .sum()
    }

    /// Notes that a message packet of `len` bytes went while streams waited.
    #[inline]
    pub fn owe(&mut self, len: usize) {
        if !self.rotation.is_empty() {
            self.debt += len as u64;
        }
    }
}

/// How a STREAM_CREDIT for the stream reads now; `ask`: it asks for the
/// bytes missing before the first range beyond a gap (only the timer
/// asks, once per resend interval: an answer to a duplicate that asked
/// would draw the same bytes again, and so on).
fn credit_body(s: &Stream, window: u64, probe: bool, ask: bool) -> wire::StreamCredit {
    let r = &s.rx;
    wire::StreamCredit {
        credit: r.consumed + window,
        received: r.received,
        resend_end: match r.ooo.first_key_value() {
            Some((&start, _)) if ask => start.max(r.received + 1),
            _ => 0,
        },
        probe,
        fin_received: r.finished(),
    }
}

/// How long after a short message arrived the streams arriving here stay
/// on the smaller credit window ([`Endpoint::stream_credit_window`]).
pub const STREAM_YIELD_NS: Time = 1_000_000;

impl Endpoint {
    fn stream_window(&self) -> u64 {
        self.config.stream_window_bytes as u64
    }

    /// Notes a packet of a message of `len` bytes arriving (any RPC's
    /// DATA): a short one makes the streams here yield.
    pub(crate) fn note_message_arrival(&mut self, now: Time, len: u32) {
        if len <= self.derived.unsched_bytes() {
            self.streams.short_seen = Some(now);
        }
    }

    /// The credit this endpoint gives a stream it reads, beyond what its
    /// reader consumed. A stream's bytes and the short messages that
    /// arrive here share one socket, in arrival order: a request lands
    /// behind every stream byte already credited (on loopback a 1 MiB
    /// window held 100 B requests for milliseconds, docs/streams.md §2.2).
    /// So while a short message has arrived in the last
    /// [`STREAM_YIELD_NS`], each stream is credited at most
    /// `Config::effective_stream_yield_bytes` beyond what was read, and
    /// the whole window otherwise. Credit already given stands.
    fn stream_credit_window(&self, now: Time) -> u64 {
        let window = self.stream_window();
        let yield_bytes = self.derived.stream_yield_bytes() as u64;
        match self.streams.short_seen {
            Some(t) if yield_bytes > 0 && now < t.saturating_add(STREAM_YIELD_NS) => {
                window.min(yield_bytes)
            }
            _ => window,
        }
    }

    /// Opens a stream to `peer`. Nothing is sent until the first
    /// [`Self::stream_send`]: the stream is opened by its first data.
    pub fn open_stream(&mut self, now: Time, peer: SocketAddr) -> Result<StreamId, StreamError> {
        self.note_time(now);
        if self.is_shut_down() {
            return Err(StreamError::Shutdown);
        }
        if self.streams.table.len() >= self.config.max_streams {
            return Err(StreamError::TooManyStreams(self.config.max_streams));
        }
        let mut id;
        loop {
            id = self.streams.next_seq;
            self.streams.next_seq = self.streams.next_seq.wrapping_add(1).max(1);
            let sid = StreamId {
                peer,
                id,
                opener: true,
            };
            if !self.streams.table.contains_key(&sid) {
                break;
            }
        }
        let sid = StreamId {
            peer,
            id,
            opener: true,
        };
        let credit = self.derived.unsched_bytes() as u64;
        self.streams.table.insert(sid, Stream::new(now, credit));
        self.arm_stream_scan(now);
        self.metrics.streams_opened += 1;
        Ok(sid)
    }

    /// Writes one message of `message.len()` (≥ 1) bytes to the stream.
    /// Refused with [`StreamError::Full`] while a window of written bytes
    /// waits for acknowledgement (one message may always be queued beyond
    /// it, whatever its size).
    pub fn stream_send(
        &mut self,
        now: Time,
        sid: StreamId,
        message: Bytes,
    ) -> Result<(), StreamError> {
        self.note_time(now);
        let window = self.stream_window();
        let s = self
            .streams
            .table
            .get_mut(&sid)
            .ok_or(StreamError::Unknown)?;
        match s.phase {
            Phase::Live => {}
            Phase::Failed(e) => return Err(e),
            Phase::Lingering { .. } => return Err(StreamError::Unknown),
        }
        if s.tx.fin_queued {
            return Err(StreamError::Finished);
        }
        if message.is_empty() {
            return Err(StreamError::EmptyMessage);
        }
        if s.tx.end - s.tx.acked >= window {
            s.tx.blocked = true;
            return Err(StreamError::Full);
        }
        let len = message.len() as u64;
        s.tx.queue.push_back(TxMsg {
            start: s.tx.end,
            bytes: message,
        });
        s.tx.end += len;
        if s.tx.waiting() {
            self.stream_activate(now, sid);
        }
        self.stream_schedule(sid);
        Ok(())
    }

    /// How many more bytes [`Self::stream_send`] takes now without
    /// [`StreamError::Full`] (0: wait for [`Event::StreamWritable`]).
    pub fn stream_send_space(&self, sid: StreamId) -> usize {
        self.streams.table.get(&sid).map_or(0, |s| {
            self.stream_window()
                .saturating_sub(s.tx.end - s.tx.acked)
                .min(usize::MAX as u64) as usize
        })
    }

    /// Ends this side of the stream after the messages written so far.
    pub fn stream_finish(&mut self, now: Time, sid: StreamId) -> Result<(), StreamError> {
        self.note_time(now);
        let s = self
            .streams
            .table
            .get_mut(&sid)
            .ok_or(StreamError::Unknown)?;
        if let Phase::Failed(e) = s.phase {
            return Err(e);
        }
        if s.tx.fin_queued {
            return Ok(());
        }
        s.tx.fin_queued = true;
        self.stream_schedule(sid);
        Ok(())
    }

    /// The next bytes of the stream, in order: at most the rest of the
    /// current message, as one piece of what has arrived. Bytes that
    /// arrived before a failure are read first; then the failure is
    /// returned.
    pub fn stream_recv(&mut self, now: Time, sid: StreamId) -> Result<StreamRead, StreamError> {
        self.note_time(now);
        let window = self.stream_credit_window(now);
        let s = self
            .streams
            .table
            .get_mut(&sid)
            .ok_or(StreamError::Unknown)?;
        if let Some((bytes, end_of_message)) = s.rx.take() {
            // A read that leaves nothing readable counts as one told
            // `Pending`: the next bytes (or the end, or a failure) bring
            // `StreamReadable`, so a reader that checks
            // `stream_readable` need not call again only to hear `Pending`.
            if !s.rx.readable() {
                s.rx.waiting = true;
            }
            // Credit as the reader frees room: a quarter window at a time,
            // or at once when the writer may be stopped by it.
            let credit = s.rx.consumed + window;
            if s.phase == Phase::Live
                && !s.rx.credit_queued
                && s.rx.fin_at.is_none()
                && credit.saturating_sub(s.rx.credit_sent) >= window / 4
            {
                s.rx.credit_queued = true;
                self.queue_stream_credit(sid);
            }
            return Ok(StreamRead::Data {
                bytes,
                end_of_message,
            });
        }
        if let Phase::Failed(e) = s.phase {
            return Err(e);
        }
        if s.rx.finished() {
            return Ok(StreamRead::End);
        }
        s.rx.waiting = true;
        Ok(StreamRead::Pending)
    }

    /// Whether [`Self::stream_recv`] has something other than `Pending` to
    /// say now (bytes, the end, or a failure). After a read that leaves
    /// nothing readable, [`Event::StreamReadable`] comes when that changes.
    pub fn stream_readable(&self, sid: StreamId) -> bool {
        self.streams
            .table
            .get(&sid)
            .is_none_or(|s| s.rx.readable() || matches!(s.phase, Phase::Failed(_)))
    }

    /// Bytes of the peer's direction read so far, and received in order so
    /// far (after a failure: the prefix that arrived).
    pub fn stream_received(&self, sid: StreamId) -> Option<(u64, u64)> {
        let s = self.streams.table.get(&sid)?;
        Some((s.rx.consumed, s.rx.received))
    }

    /// Bytes of our direction written, and acknowledged by the peer.
    pub fn stream_acked(&self, sid: StreamId) -> Option<(u64, u64)> {
        let s = self.streams.table.get(&sid)?;
        Some((s.tx.end, s.tx.acked))
    }

    /// A one-line description of the stream's state, for diagnostics.
    pub fn stream_describe(&self, sid: StreamId) -> String {
        match self.streams.table.get(&sid) {
            None => "gone".into(),
            Some(s) => format!(
                "{:?} heard {} last_heard {} tx[acked {} next {} end {} credit {} retx {:?} fin q{} s{} a{} progress {}] rx[consumed {} received {} ooo {} fin {:?} credit_sent {} progress {}] active {} ready {}",
                s.phase, s.heard, s.last_heard, s.tx.acked, s.tx.next, s.tx.end, s.tx.credit, s.tx.retx,
                s.tx.fin_queued, s.tx.fin_sent, s.tx.fin_acked, s.tx.last_progress,
                s.rx.consumed, s.rx.received, s.rx.ooo.len(), s.rx.fin_at, s.rx.credit_sent, s.rx.last_progress,
                self.streams.active.contains(&sid), s.ready
            ) + &format!(
                " in rotation {} packets in flight {}",
                self.streams.rotation.contains(&sid),
                s.tx.in_flight.len()
            ),
        }
    }

    /// Whether both sides of the stream ended normally (each FIN sent,
    /// acknowledged, and received).
    pub fn stream_is_done(&self, sid: StreamId) -> bool {
        self.streams.table.get(&sid).is_some_and(|s| s.done())
    }

    /// The application is done with the stream. If both sides ended, its
    /// state lingers a tombstone time to answer a peer that missed our last
    /// acknowledgement; otherwise the stream is cancelled: the peer gets a
    /// STREAM_RESET and all state goes at once.
    pub fn stream_close(&mut self, now: Time, sid: StreamId) {
        self.note_time(now);
        let Some(s) = self.streams.table.get_mut(&sid) else {
            return;
        };
        match s.phase {
            Phase::Live if s.done() => {
                s.phase = Phase::Lingering {
                    until: now.saturating_add(self.derived.tombstone_ns()),
                };
                s.tx.queue.clear();
                s.rx.ready = BytesMut::new();
                s.rx.pieces.clear();
                self.streams.active.remove(&sid);
                self.arm_stream_scan(now);
            }
            Phase::Live => {
                self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Cancelled));
                self.stream_forget(sid);
            }
            Phase::Failed(_) | Phase::Lingering { .. } => self.stream_forget(sid),
        }
    }

    fn stream_forget(&mut self, sid: StreamId) {
        self.streams.table.remove(&sid);
        self.streams.active.remove(&sid);
        // A stale rotation entry is skipped when reached.
    }

    /// Fails a live stream: both of the application's sides learn it.
    fn stream_fail(&mut self, sid: StreamId, error: StreamError) {
        let Some(s) = self.streams.table.get_mut(&sid) else {
            return;
        };
        match s.phase {
            Phase::Live => {
                s.phase = Phase::Failed(error);
                s.tx.queue.clear();
                s.tx.retx = None;
                s.rx.ooo.clear();
                s.rx.ooo_bytes = 0;
                self.streams.active.remove(&sid);
                self.metrics.streams_failed += 1;
                self.events.push_back(Event::StreamReadable { stream: sid });
                self.events.push_back(Event::StreamWritable { stream: sid });
            }
            Phase::Lingering { .. } => self.stream_forget(sid),
            Phase::Failed(_) => {}
        }
    }

    /// Puts `sid` in the send rotation if it has a packet to send.
    fn stream_schedule(&mut self, sid: StreamId) {
        if let Some(s) = self.streams.table.get_mut(&sid) {
            if !s.ready && s.phase == Phase::Live && s.tx.sendable() {
                s.ready = true;
                self.streams.rotation.push_back(sid);
            }
        }
    }

    /// Queues a STREAM_CREDIT (filled in when sent) that only tells.
    fn queue_stream_credit(&mut self, sid: StreamId) {
        self.queue_stream_control(
            sid,
            ControlBody::StreamCreditFor {
                probe: false,
                ask: false,
            },
        );
    }

    fn queue_stream_control(&mut self, sid: StreamId, body: ControlBody) {
        self.queue_control(Control {
            dest: sid.peer,
            rpc_id: sid.id,
            from_client: sid.opener,
            body,
        });
    }

    /// Arms the stream timer within half a resend interval.
    fn arm_stream_tick(&mut self, now: Time) {
        let t = now.saturating_add(self.derived.resend_interval_ns() / 2);
        self.streams.next_tick = self.streams.next_tick.min(t);
    }

    /// Arms the keep-alive scan (and so the timer) if it is not armed.
    fn arm_stream_scan(&mut self, now: Time) {
        if self.streams.next_scan == Time::MAX {
            self.streams.next_scan = now.saturating_add(self.derived.keepalive_ns());
            self.streams.next_tick = self.streams.next_tick.min(self.streams.next_scan);
        }
    }

    /// Marks `sid` as owed timer checks.
    fn stream_activate(&mut self, now: Time, sid: StreamId) {
        if self.streams.active.insert(sid) {
            self.arm_stream_tick(now);
        }
    }

    /// Resolves a queued `StreamCreditFor` into the packet it stands for
    /// now (`None`: the stream is gone).
    pub(crate) fn resolve_stream_credit(
        &mut self,
        now: Time,
        c: &Control,
        probe: bool,
        ask: bool,
    ) -> Option<ControlBody> {
        let sid = StreamId {
            peer: c.dest,
            id: c.rpc_id,
            opener: c.from_client,
        };
        let window = self.stream_credit_window(now);
        let s = self.streams.table.get_mut(&sid)?;
        if let Phase::Failed(_) = s.phase {
            return None;
        }
        s.rx.credit_queued = false;
        s.rx.unacked_packets = 0;
        let body = credit_body(s, window, probe, ask);
        s.rx.credit_sent = s.rx.credit_sent.max(body.credit);
        if probe {
            s.last_probe = now;
        }
        Some(ControlBody::StreamCredit(body))
    }

    /// The next stream packet, if a stream's turn has come: when no message
    /// is sendable, when the stream's rank (bytes it can send now) is at
    /// most the SRPT head's remaining bytes, or when it has waited behind
    /// messages for its share. With the pacer closed only a stream whose
    /// rank is short enough to bypass it goes, as for messages.
    pub(crate) fn poll_stream(
        &mut self,
        now: Time,
        pacer_open: bool,
        head_remaining: Option<u64>,
        buf: &mut Vec<u8>,
    ) -> Option<crate::endpoint::Transmit> {
        let share = self.config.stream_share_permille.max(1) as u64;
        let turn_bytes = self.derived.data_per_packet() as u64 * (1000 - share.min(999)) / share;
        for _ in 0..self.streams.rotation.len() {
            let sid = *self.streams.rotation.front()?;
            let Some(s) = self.streams.table.get(&sid) else {
                self.streams.rotation.pop_front();
                continue;
            };
            if s.phase != Phase::Live || !s.tx.sendable() {
                let s = self.streams.table.get_mut(&sid).unwrap();
                s.ready = false;
                self.streams.rotation.pop_front();
                continue;
            }
            let rank = s.tx.rank();
            let goes = head_remaining.is_none_or(|h| rank <= h) || self.streams.debt >= turn_bytes;
            let may = pacer_open || rank <= self.derived.pacer_bypass_bytes() as u64;
            if !goes || !may {
                return None;
            }
            self.streams.rotation.pop_front();
            self.streams.debt = 0;
            let t = self.send_stream_packet(now, sid, rank, buf);
            let s = self.streams.table.get_mut(&sid).unwrap();
            if s.tx.sendable() {
                self.streams.rotation.push_back(sid);
            } else {
                s.ready = false;
            }
            return Some(t);
        }
        None
    }

    /// Builds the next packet of `sid`'s sending side (a retransmission
    /// first), at the unscheduled priority of a message of `rank` bytes
    /// (the lowest level if `rank` exceeds the unscheduled bytes).
    fn send_stream_packet(
        &mut self,
        now: Time,
        sid: StreamId,
        rank: u64,
        buf: &mut Vec<u8>,
    ) -> crate::endpoint::Transmit {
        let room = self.config.max_packet_size - wire::STREAM_DATA_OVERHEAD;
        let window = self.stream_credit_window(now);
        let pk = self.peers.find(sid.peer);
        let rank32 = rank.min(u32::MAX as u64) as u32;
        // A stream is long by what its writer has queued, not by what its
        // credit lets go now: a reader yielding to short messages credits a
        // packet at a time (`stream_credit_window`), and ranked by that the
        // stream's packets took the short messages' level in the switch
        // (`homa bench beside`: RPC p99 3.6-3.8x alone instead of 2.4-2.6x).
        let backlog = self
            .streams
            .table
            .get(&sid)
            .map_or(0, |s| s.tx.end.saturating_sub(s.tx.next));
        let priority = if rank.max(backlog) > self.derived.unsched_bytes() as u64 {
            // More than a round trip's bytes ready: a long message, whose
            // bytes beyond its first round trip a receiver grants at a
            // scheduled level. Streams are not granted, so they take the
            // lowest, below every short message and every granted one;
            // with one unscheduled level (W4's plan) the unscheduled level
            // of the stream's rank put a saturating stream's packets in the
            // same switch queue as 100 B RPCs (`homa bench beside`).
            0
        } else {
            match pk {
                Some(k) => self.peers.unsched_priority(k, rank32),
                None => self.derived.unsched_level(rank32),
            }
        };
        let echo_time = pk.map_or(0, |k| self.peers[k].echo(now, self.derived.echo_hold()));
        // Reused: two allocations per packet were a tenth of a 100-byte
        // echo's engine time.
        let mut pieces = std::mem::take(&mut self.streams.scratch_pieces);
        let mut ends = std::mem::take(&mut self.streams.scratch_ends);
        pieces.clear();
        ends.clear();
        let s = self.streams.table.get_mut(&sid).unwrap();
        let (offset, limit, retransmit) = match s.tx.retx {
            Some((a, b)) => (a, b, true),
            None => (s.tx.next, s.tx.end.min(s.tx.credit), false),
        };
        if offset < s.tx.end && offset < limit {
            s.tx.packet_at(offset, limit, room, &mut pieces, &mut ends);
        }
        let payload = match pieces.len() {
            0 => Bytes::new(),
            1 => pieces.pop().unwrap(),
            _ => {
                let mut b = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
                for p in &pieces {
                    b.extend_from_slice(p);
                }
                b.freeze()
            }
        };
        let end = offset + payload.len() as u64;
        let fin = s.tx.fin_queued && end == s.tx.end;
        if retransmit {
            let (_, b) = s.tx.retx.unwrap();
            s.tx.retx = (end < b && !payload.is_empty()).then_some((end, b));
            self.metrics.retransmitted_packets += 1;
            self.metrics.retransmitted_bytes += payload.len() as u64;
        } else {
            if !s.tx.outstanding() {
                // The silence a probe waits for starts now.
                s.tx.last_progress = now;
            }
            s.tx.next = end;
            if end > offset {
                s.tx.in_flight.push_back(end);
            }
        }
        if fin {
            s.tx.fin_sent = true;
        }
        let credit = s.rx.consumed + window;
        s.rx.credit_sent = s.rx.credit_sent.max(credit);
        s.rx.unacked_packets = 0;
        let header = StreamDataHeader {
            offset,
            rev_credit: credit,
            rev_received: s.rx.received,
            fin,
        };
        let outstanding = s.tx.waiting();
        let common = CommonHeader {
            from_client: sid.opener,
            retransmit,
            rpc_id: sid.id,
            send_time: now.max(1),
            echo_time,
        };
        let body = wire::Body::StreamData {
            header,
            ends: &ends,
            payload: &payload,
        };
        // A payload from one message goes as a handle on its bytes; one
        // gathered from several was copied anyway, and goes whole.
        let one_piece = ends.len() <= 1;
        let len =
            if self.split.on && one_piece && payload.len() > crate::outgoing::WHOLE_MAX_PAYLOAD {
                wire::encode_headers(buf, &common, &body, self.derived.checksum());
                let n = buf.len() + payload.len();
                self.split.payload = Some(payload.clone());
                n
            } else {
                wire::encode(buf, &common, &body, self.derived.checksum());
                buf.len()
            };
        self.metrics.stream_bytes_sent += payload.len() as u64;
        pieces.clear();
        self.streams.scratch_pieces = pieces;
        self.streams.scratch_ends = ends;
        if outstanding {
            self.stream_activate(now, sid);
        }
        self.account(now, wire::PacketType::StreamData, sid.peer, priority, len)
    }

    /// A STREAM_DATA from `from`.
    pub(crate) fn handle_stream_data(
        &mut self,
        now: Time,
        from: SocketAddr,
        c: &CommonHeader,
        h: &StreamDataHeader,
        ends: wire::StreamEnds<'_>,
        payload: StreamPayload<'_>,
    ) {
        let sid = StreamId {
            peer: from,
            id: c.rpc_id,
            opener: !c.from_client,
        };
        let plen = payload.len();
        let window = self.stream_window();
        if !self.streams.table.contains_key(&sid) {
            // Only the opener's first bytes open a stream: a packet from
            // further on belongs to a stream this host lost (it restarted)
            // or to one whose first packet is late. Dropped without an
            // answer: in the first case the opener's probe will meet a
            // stranger and be reset; in the second it sends the first
            // bytes again.
            if !c.from_client {
                self.metrics.drop(DropReason::UnknownRpc);
                self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Unknown));
                return;
            }
            if h.offset != 0 {
                self.metrics.drop(DropReason::UnknownRpc);
                return;
            }
            if self.streams.table.len() >= self.config.max_streams {
                self.metrics.drop(DropReason::TooManyRpcs);
                self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Refused));
                return;
            }
            let credit = if h.rev_credit != 0 {
                h.rev_credit
            } else {
                self.derived.unsched_bytes() as u64
            };
            self.streams.table.insert(sid, Stream::new(now, credit));
            self.arm_stream_scan(now);
            self.metrics.streams_opened += 1;
            self.events.push_back(Event::StreamOpened { stream: sid });
            // The opener may send past its unscheduled bytes at once.
            let s = self.streams.table.get_mut(&sid).unwrap();
            s.rx.credit_queued = true;
            self.queue_stream_credit(sid);
        }
        let s = self.streams.table.get_mut(&sid).unwrap();
        s.last_heard = now;
        s.heard = true;
        match s.phase {
            Phase::Live => {}
            Phase::Failed(_) => {
                self.metrics.drop(DropReason::WrongState);
                return;
            }
            Phase::Lingering { .. } => {
                // The peer missed our last acknowledgement: repeat it.
                self.metrics.drop(DropReason::Duplicate);
                self.queue_stream_credit(sid);
                return;
            }
        }
        // What the packet says about our sending side.
        self.stream_tx_feedback(now, sid, h.rev_credit, h.rev_received, None, false);
        let s = self.streams.table.get_mut(&sid).unwrap();
        let was_readable = s.rx.readable();
        let end = h.offset + plen as u64;
        if h.fin {
            match s.rx.fin_at {
                Some(f) if f != end => {
                    self.metrics.drop(DropReason::InconsistentLength);
                    return;
                }
                _ => s.rx.fin_at = Some(end),
            }
        }
        if s.rx.fin_at.is_some_and(|f| end > f) {
            self.metrics.drop(DropReason::InconsistentLength);
            return;
        }
        let limit = s.rx.consumed + window.max(self.derived.unsched_bytes() as u64);
        // The message ends as stream offsets, in a list kept for its
        // capacity (an allocation per packet otherwise).
        let mut ends_at = std::mem::take(&mut self.streams.scratch_ends_at);
        ends_at.clear();
        ends_at.extend(ends.iter().map(|e| h.offset + e as u64));
        let ends = &ends_at;
        let landed = match payload {
            _ if plen == 0 => Landed::Duplicate,
            StreamPayload::Bytes(p) => s.rx.land(h.offset, p, ends, limit),
            StreamPayload::Landed(n) => {
                // `stream_landing_site` checked that these bytes come next
                // and fit; the driver wrote them into the pool allocation
                // it kept, or else after `ready`'s bytes.
                debug_assert!(h.offset == s.rx.received && s.rx.ooo.is_empty());
                match self.streams.landing.take() {
                    Some((at, alloc)) if at == sid && alloc.len() == n => {
                        let piece = self.pool.into_message(alloc);
                        s.rx.push_piece(pool_piece(piece));
                    }
                    Some(_) => {
                        // Pool bytes of a site for other headers: none of
                        // `ready`'s spare capacity was written (the driver
                        // reports only headers it peeked, so this is a bug
                        // elsewhere): the datagram is dropped, not read.
                        debug_assert!(false, "a landed stream datagram unlike its site's");
                        self.metrics.drop(DropReason::Malformed);
                        return;
                    }
                    None => {
                        // SAFETY: the landing site was `n` bytes of
                        // `ready`'s spare capacity, now written by the
                        // driver's receive (the driver reports a datagram
                        // only when all of it arrived).
                        unsafe { s.rx.ready.set_len(s.rx.ready.len() + n) };
                        s.rx.received += n as u64;
                    }
                }
                for &e in ends {
                    if s.rx.ends.back().is_none_or(|&b| b < e) {
                        s.rx.ends.push_back(e);
                    }
                }
                Landed::InOrder
            }
        };
        self.streams.scratch_ends_at = ends_at;
        let mut reply = c.retransmit;
        match landed {
            Landed::InOrder => {
                s.rx.last_progress = now;
                s.rx.unacked_packets += 1;
                reply |= s.rx.unacked_packets >= ACK_EVERY_PACKETS;
                self.metrics.stream_bytes_received += plen as u64;
            }
            Landed::Gap => {
                self.metrics.stream_bytes_received += plen as u64;
                self.stream_activate(now, sid);
            }
            Landed::Duplicate => {
                if plen > 0 {
                    self.metrics.drop(DropReason::Duplicate);
                    // The writer resent what we have: our acknowledgement
                    // may be lost.
                    reply = true;
                }
            }
            Landed::BeyondCredit => {
                self.metrics.drop(DropReason::Unexpected);
                return;
            }
        }
        let s = self.streams.table.get_mut(&sid).unwrap();
        // The FIN arrived with every byte before it: acknowledge it (the
        // writer waits for that to end its side).
        if s.rx.finished() && h.fin {
            reply = true;
        }
        // A stream with nothing left to check stays in `active` until the
        // next tick drops it: removed here and inserted again by the next
        // send, every round trip of an echo allocated and freed a node of
        // the set.
        let s = self.streams.table.get_mut(&sid).unwrap();
        if reply && !s.rx.credit_queued {
            s.rx.credit_queued = true;
            self.queue_stream_credit(sid);
        }
        let s = self.streams.table.get_mut(&sid).unwrap();
        if !was_readable && s.rx.readable() && s.rx.waiting {
            s.rx.waiting = false;
            self.events.push_back(Event::StreamReadable { stream: sid });
        }
    }

    /// What the peer said about our sending side: its credit, what
    /// arrived, a range to send again, whether our FIN arrived.
    fn stream_tx_feedback(
        &mut self,
        now: Time,
        sid: StreamId,
        credit: u64,
        received: u64,
        resend_end: Option<u64>,
        fin_received: bool,
    ) {
        let window = self.stream_window();
        let Some(s) = self.streams.table.get_mut(&sid) else {
            return;
        };
        let tx = &mut s.tx;
        if credit > tx.credit {
            tx.credit = credit;
        }
        if tx.ack(received) {
            tx.last_progress = now;
        }
        if fin_received && tx.fin_sent && tx.acked == tx.end {
            tx.fin_acked = true;
        }
        let rewind_gap = self.derived.resend_interval_ns() / 2;
        let resend_end = resend_end.filter(|_| {
            tx.last_rewind
                .is_none_or(|t| now.saturating_sub(t) >= rewind_gap)
        });
        if let Some(e) = resend_end {
            tx.last_rewind = Some(now);
            if tx.fin_sent && !tx.fin_acked && !fin_received {
                // The FIN may be what was lost: it goes again with (or
                // after) the last bytes.
                tx.fin_sent = false;
            }
            let e = e.min(tx.next);
            if e > tx.acked {
                tx.retx = Some(match tx.retx {
                    Some((a, b)) => (a.min(tx.acked), b.max(e)),
                    None => (tx.acked, e),
                });
            }
        }
        let writable = tx.blocked && tx.end - tx.acked < window;
        if writable {
            tx.blocked = false;
            self.events.push_back(Event::StreamWritable { stream: sid });
        }
        self.stream_schedule(sid);
    }

    /// Where the payload of a STREAM_DATA datagram (`head` its first bytes,
    /// `datagram_len` its length) can be received directly: at the end of
    /// the stream's unread bytes, if it carries exactly the next bytes of a
    /// live stream, within credit, with at most one message end, no FIN
    /// and no checksum. Saves the copy from the driver's buffer, as landing
    /// DATA in the pool does (`landing.rs`).
    pub(crate) fn stream_landing_site(
        &mut self,
        from: SocketAddr,
        head: &[u8],
        datagram_len: usize,
    ) -> Option<crate::LandingSite<'_>> {
        let (c, h, header_len, plen) = wire::decode_stream_data_head(head, datagram_len).ok()?;
        if plen == 0 || h.fin {
            return None;
        }
        let sid = StreamId {
            peer: from,
            id: c.rpc_id,
            opener: !c.from_client,
        };
        let limit_window = self
            .stream_window()
            .max(self.derived.unsched_bytes() as u64);
        // An earlier site's pool bytes, if its receive failed, go back.
        self.streams.landing = None;
        let s = self.streams.table.get_mut(&sid)?;
        let rx = &mut s.rx;
        if s.phase != Phase::Live
            || h.offset != rx.received
            || !rx.ooo.is_empty()
            || rx.fin_at.is_some()
            || h.offset + plen as u64 > rx.consumed + limit_window
        {
            return None;
        }
        // Into the receive pool, like a message's DATA: its bpages are
        // already resident and come back when the reader drops the piece,
        // where a heap buffer per packet would be allocated and, once freed,
        // often handed back to the kernel and faulted in again (13-19 page
        // faults per 500 KB echo, docs/streams.md). Only while the pool is
        // at least half free, so that streams never take the space messages
        // need (a reader's unread bytes are bounded by its credit window
        // anyway); otherwise into `ready`'s spare capacity.
        if plen <= crate::pool::BPAGE_SIZE
            && self.pool.free_bytes_estimate() >= self.pool.capacity() / 2 + plen
        {
            if let Some(alloc) = self.pool.allocate(plen) {
                let (_, alloc) = self.streams.landing.insert((sid, alloc));
                let payload = self.pool.spans_mut(alloc, 0, plen);
                if payload.len() == 1 {
                    return Some(crate::LandingSite {
                        header_len,
                        payload,
                    });
                }
                drop(payload);
                self.streams.landing = None;
            }
        }
        let rx = &mut self.streams.table.get_mut(&sid)?.rx;
        rx.ready.reserve(plen);
        let spare = &mut rx.ready.spare_capacity_mut()[..plen];
        // SAFETY: `u8` and `MaybeUninit<u8>` have the same layout; the
        // driver only writes the slice (its receive), and the bytes become
        // part of `ready` (`set_len`) only once the whole datagram is in
        // (`handle_stream_landed`).
        let payload = unsafe { &mut *(spare as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
        Some(crate::LandingSite {
            header_len,
            payload: smallvec::smallvec![payload],
        })
    }

    /// [`Endpoint::handle_landed`] for a STREAM_DATA whose payload landed
    /// at the site `stream_landing_site` gave.
    pub(crate) fn handle_stream_landed(
        &mut self,
        now: Time,
        from: SocketAddr,
        head: &[u8],
        datagram_len: usize,
    ) {
        let Ok((c, h, header_len, plen)) = wire::decode_stream_data_head(head, datagram_len) else {
            self.metrics.drop(DropReason::Malformed);
            return;
        };
        let ends = wire::StreamEnds::from_raw(&head[wire::STREAM_DATA_OVERHEAD..header_len]);
        let hint = self.last_rx_peer;
        let pk = self.packet_peer(now, from, &c, wire::PacketType::StreamData, hint);
        self.last_rx_peer = pk.or(hint);
        self.handle_stream_data(now, from, &c, &h, ends, StreamPayload::Landed(plen));
    }

    /// A STREAM_CREDIT from `from`: about our sending side of the stream.
    pub(crate) fn handle_stream_credit(
        &mut self,
        now: Time,
        from: SocketAddr,
        c: &CommonHeader,
        k: &wire::StreamCredit,
    ) {
        let sid = StreamId {
            peer: from,
            id: c.rpc_id,
            opener: !c.from_client,
        };
        let Some(s) = self.streams.table.get_mut(&sid) else {
            self.metrics.drop(DropReason::UnknownRpc);
            self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Unknown));
            return;
        };
        s.last_heard = now;
        s.heard = true;
        match s.phase {
            Phase::Live => {}
            Phase::Failed(_) => return,
            Phase::Lingering { .. } => {
                if k.probe {
                    self.queue_stream_credit(sid);
                }
                return;
            }
        }
        // A probe's `received` tells us what to send again: everything
        // sent after it (the probe came because nothing was acknowledged).
        let was_probe_answer = !k.probe && s.tx.outstanding();
        let resend_end = if k.resend_end != 0 {
            Some(k.resend_end)
        } else if was_probe_answer
            && now.saturating_sub(s.tx.last_progress) >= self.derived.resend_interval_ns()
        {
            Some(s.tx.next)
        } else {
            None
        };
        self.stream_tx_feedback(now, sid, k.credit, k.received, resend_end, k.fin_received);
        let s = self.streams.table.get_mut(&sid).unwrap();
        if k.probe && !s.rx.credit_queued {
            s.rx.credit_queued = true;
            self.queue_stream_credit(sid);
        }
        // (Nothing left to check: the next tick drops it from `active`,
        // as for STREAM_DATA.)
        let s = self.streams.table.get_mut(&sid).unwrap();
        if s.tx.waiting() || !s.rx.ooo.is_empty() {
            self.stream_activate(now, sid);
        }
    }

    /// A STREAM_RESET from `from`.
    pub(crate) fn handle_stream_reset(
        &mut self,
        from: SocketAddr,
        c: &CommonHeader,
        reason: ResetReason,
    ) {
        let sid = StreamId {
            peer: from,
            id: c.rpc_id,
            opener: !c.from_client,
        };
        if !self.streams.table.contains_key(&sid) {
            self.metrics.drop(DropReason::UnknownRpc);
            return;
        }
        self.stream_fail(sid, StreamError::Reset(reason));
    }

    /// The stream timer: probes for unacknowledged bytes, asks for missing
    /// ones, keeps idle streams alive, fails silent ones, and forgets
    /// lingering ones.
    pub(crate) fn stream_timers(&mut self, now: Time) {
        if now < self.streams.next_tick {
            return;
        }
        self.streams.next_tick = Time::MAX;
        let resend = self.derived.resend_interval_ns();
        let timeout = self.derived.rpc_timeout_ns();
        let mut fail = Vec::new();
        let mut stuck = Vec::new();
        let mut probes = Vec::new();
        let mut asks = Vec::new();
        let active: Vec<StreamId> = self.streams.active.iter().copied().collect();
        for sid in active {
            let Some(s) = self.streams.table.get(&sid) else {
                self.streams.active.remove(&sid);
                continue;
            };
            if s.phase != Phase::Live
                || (!s.tx.waiting() && s.rx.ooo.is_empty() && s.last_probe <= s.last_heard)
            {
                self.streams.active.remove(&sid);
                continue;
            }
            if now.saturating_sub(s.last_heard) >= timeout {
                fail.push(sid);
                continue;
            }
            // Heard from, but stuck: nothing acknowledged, or a gap not
            // filled, for the RPC timeout (a peer that lost the stream's
            // state, e.g. restarted, and met a stray first packet).
            if (s.tx.outstanding() && now.saturating_sub(s.tx.last_progress) >= timeout)
                || (!s.rx.ooo.is_empty() && now.saturating_sub(s.rx.last_progress) >= timeout)
            {
                stuck.push(sid);
                continue;
            }
            let unanswered = s.last_probe > s.last_heard;
            if (s.tx.waiting() && now.saturating_sub(s.tx.last_progress) >= resend || unanswered)
                && now.saturating_sub(s.last_probe) >= resend << s.probe_backoff
            {
                probes.push(sid);
            }
            if !s.rx.ooo.is_empty()
                && now.saturating_sub(s.rx.last_progress) >= resend
                && !s.rx.credit_queued
            {
                asks.push(sid);
            }
        }
        if now >= self.streams.next_scan {
            self.streams.next_scan = Time::MAX;
            let keepalive = self.derived.keepalive_ns();
            let mut gone = Vec::new();
            for (&sid, s) in &self.streams.table {
                match s.phase {
                    Phase::Lingering { until } if now >= until => gone.push(sid),
                    // A stream whose both sides ended needs nothing more;
                    // one the peer has not heard of yet (opened, nothing
                    // sent) has nothing to keep alive.
                    Phase::Live if s.done() || (!s.heard && s.tx.next == 0 && !s.tx.fin_sent) => {}
                    Phase::Live if now.saturating_sub(s.last_heard) >= timeout => fail.push(sid),
                    Phase::Live
                        if sid.opener
                            && now.saturating_sub(s.last_heard) >= keepalive
                            && now.saturating_sub(s.last_probe) >= keepalive =>
                    {
                        probes.push(sid)
                    }
                    _ => {}
                }
            }
            for sid in gone {
                self.stream_forget(sid);
            }
            if !self.streams.table.is_empty() {
                self.arm_stream_scan(now);
            }
        }
        for sid in fail {
            self.stream_fail(sid, StreamError::Timeout);
        }
        for sid in stuck {
            self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Stuck));
            self.stream_fail(sid, StreamError::Timeout);
        }
        for sid in probes {
            if let Some(s) = self.streams.table.get_mut(&sid) {
                if !s.probe_queued {
                    s.probe_queued = true;
                    self.streams.probe_queue.push_back(sid);
                }
            }
        }
        let mut sent = 0;
        while sent < STREAM_PROBES_PER_TICK {
            let Some(sid) = self.streams.probe_queue.pop_front() else {
                break;
            };
            let Some(s) = self.streams.table.get_mut(&sid) else {
                continue;
            };
            s.probe_queued = false;
            if s.phase != Phase::Live {
                continue;
            }
            sent += 1;
            s.probe_backoff = if s.last_probe > s.last_heard {
                (s.probe_backoff + 1).min(MAX_PROBE_BACKOFF)
            } else {
                0
            };
            s.last_probe = now;
            self.streams.active.insert(sid);
            if s.heard || !s.tx.outstanding() {
                self.queue_stream_control(
                    sid,
                    ControlBody::StreamCreditFor {
                        probe: true,
                        ask: false,
                    },
                );
            } else {
                // Nothing heard: the packets that open the stream may be
                // lost, and only they can open it. Send them again.
                let tx = &mut s.tx;
                if tx.acked < tx.next {
                    tx.retx = Some((tx.acked, tx.next));
                }
                if tx.fin_sent && !tx.fin_acked {
                    tx.fin_sent = false;
                }
                self.stream_schedule(sid);
            }
        }
        for sid in asks {
            if let Some(s) = self.streams.table.get_mut(&sid) {
                s.rx.credit_queued = true;
                self.queue_stream_control(
                    sid,
                    ControlBody::StreamCreditFor {
                        probe: false,
                        ask: true,
                    },
                );
            }
        }
        if !self.streams.active.is_empty() || !self.streams.probe_queue.is_empty() {
            self.arm_stream_tick(now);
        }
        if self.streams.next_scan != Time::MAX {
            self.streams.next_tick = self.streams.next_tick.min(self.streams.next_scan);
        }
    }

    /// Fails every stream (the endpoint shuts down) and tells each peer.
    pub(crate) fn shutdown_streams(&mut self) {
        let sids: Vec<StreamId> = self.streams.table.keys().copied().collect();
        for sid in sids {
            if self.streams.table[&sid].phase == Phase::Live {
                self.queue_stream_control(sid, ControlBody::StreamReset(ResetReason::Shutdown));
            }
            self.stream_fail(sid, StreamError::Shutdown);
        }
        self.streams.rotation.clear();
        self.streams.next_tick = Time::MAX;
        self.streams.next_scan = Time::MAX;
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Endpoint, Event, StreamRead, Time};
    use bytes::Bytes;
    use std::net::SocketAddr;

    /// A writer at `a` and a reader at `b` (addresses returned first), with
    /// packets of `packet` bytes and `unsched` unscheduled bytes.
    fn writer_and_reader(
        packet: usize,
        unsched: u32,
    ) -> (SocketAddr, SocketAddr, Endpoint, Endpoint) {
        let cfg = Config::default()
            .with_max_packet_size(packet)
            .with_unsched_bytes(Some(unsched))
            .with_checksum(false);
        let a: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let w = Endpoint::new(cfg.clone().with_rpc_id_seed(1), 0).unwrap();
        let r = Endpoint::new(cfg.with_rpc_id_seed(2), 0).unwrap();
        (a, b, w, r)
    }

    /// While short messages arrive, the streams read here are credited
    /// the yield bytes beyond what was read; a long message does not count,
    /// and the full window is back `STREAM_YIELD_NS` after the last short
    /// one.
    #[test]
    fn streams_are_credited_less_while_short_messages_arrive() {
        use super::STREAM_YIELD_NS;
        let (_, _, _, mut r) = writer_and_reader(1_500, 10_000);
        let window = r.config.stream_window_bytes as u64;
        let yield_bytes = r.derived.stream_yield_bytes() as u64;
        assert!(yield_bytes > 0 && yield_bytes < window, "{yield_bytes}");
        assert_eq!(r.stream_credit_window(0), window);
        r.note_message_arrival(1_000, 100);
        assert_eq!(r.stream_credit_window(1_000), yield_bytes);
        assert_eq!(
            r.stream_credit_window(1_000 + STREAM_YIELD_NS - 1),
            yield_bytes
        );
        assert_eq!(r.stream_credit_window(1_000 + STREAM_YIELD_NS), window);
        r.note_message_arrival(5 * STREAM_YIELD_NS, 1_000_000);
        assert_eq!(r.stream_credit_window(5 * STREAM_YIELD_NS), window);
    }

    /// The derived yield bytes: a quarter RTT in whole packets, at least
    /// one; 0 turns yielding off.
    #[test]
    fn the_yield_bytes_are_a_quarter_rtt_of_whole_packets() {
        let c = Config::default();
        let dpp = c.max_data_per_packet() as u32;
        let y = c.effective_stream_yield_bytes();
        assert_eq!(y % dpp, 0);
        assert!(y >= c.rtt_bytes() / 4 && y < c.rtt_bytes() / 4 + dpp, "{y}");
        // Loopback's 64 KB packets: one packet.
        let lo = Config::default()
            .with_max_packet_size(65_000)
            .with_link_bps(100_000_000_000);
        assert_eq!(
            lo.effective_stream_yield_bytes(),
            lo.max_data_per_packet() as u32
        );
        let off = Config::default().with_stream_yield_bytes(Some(0));
        let (_, _, _, mut r) = writer_and_reader(1_500, 10_000);
        r.derived = crate::config::Derived::new(&off);
        r.note_message_arrival(0, 100);
        assert_eq!(
            r.stream_credit_window(0),
            r.config.stream_window_bytes as u64
        );
    }

    /// A stream with more than the unscheduled bytes ready goes at the
    /// lowest level; one with a short message to send at the unscheduled
    /// level of its length, as a short RPC would.
    #[test]
    fn a_streams_priority_is_the_lowest_once_it_is_long() {
        let (a, b, mut w, mut r) = writer_and_reader(1_500, 10_000);
        let short = w.derived.unsched_level(100);
        assert!(short > 0, "the test needs unscheduled levels above 0");
        let sid = w.open_stream(0, b).unwrap();
        w.stream_send(0, sid, Bytes::from(vec![1u8; 100])).unwrap();
        let mut buf = Vec::new();
        let t = w.poll_transmit(0, &mut buf).unwrap();
        assert_eq!(t.priority, short);
        // The reader's credit (its window) lets 200,000 written bytes
        // rank as a long message.
        r.handle_datagram(1, a, &buf[..t.len]);
        assert_eq!(credit_then_write_long(&mut w, &mut r, b, sid), 0);
    }

    /// The reader's answers reach the writer, which then writes 200,000
    /// bytes: the priority of its next packet.
    fn credit_then_write_long(
        w: &mut Endpoint,
        r: &mut Endpoint,
        b: SocketAddr,
        sid: crate::StreamId,
    ) -> u8 {
        let mut buf = Vec::new();
        while let Some(t) = r.poll_transmit(2, &mut buf) {
            w.handle_datagram(3, b, &buf[..t.len]);
        }
        w.stream_send(4, sid, Bytes::from(vec![1u8; 200_000]))
            .unwrap();
        w.poll_transmit(4, &mut buf).unwrap().priority
    }

    /// A stream whose reader yields (credit a packet's worth at a time)
    /// but whose writer has a long backlog still goes at the lowest level:
    /// long by what is queued, not by what the credit lets go now.
    #[test]
    fn a_yielded_stream_with_a_backlog_stays_at_the_lowest_level() {
        let (a, b, mut w, mut r) = writer_and_reader(1_500, 40_000);
        assert!((r.derived.stream_yield_bytes() as u64) < 40_000);
        let sid = w.open_stream(0, b).unwrap();
        w.stream_send(0, sid, Bytes::from(vec![1u8; 100])).unwrap();
        let mut buf = Vec::new();
        let t = w.poll_transmit(0, &mut buf).unwrap();
        // A short request has just arrived at the reader: it yields.
        r.note_message_arrival(1, 100);
        r.handle_datagram(1, a, &buf[..t.len]);
        let rsid = match r.poll_event() {
            Some(Event::StreamOpened { stream }) => stream,
            other => panic!("{other:?}"),
        };
        while let Ok(StreamRead::Data { .. }) = r.stream_recv(2, rsid) {}
        assert_eq!(credit_then_write_long(&mut w, &mut r, b, sid), 0);
    }

    /// A stream packet received straight into the reader's buffer
    /// (`landing_site`, `handle_landed`) reads the same as one handed over
    /// whole; one that is not the next in order gets no site.
    #[test]
    fn a_landed_stream_packet_reads_like_a_whole_one() {
        let msg = pattern(50_000, 0);
        let (a, mut r, packets) = written_packets(std::slice::from_ref(&msg));
        assert!(packets.len() >= 3);
        // The first opened the stream the ordinary way; the third cannot
        // land before the second; the second and third land.
        assert!(r.landing_site(a, &packets[2], packets[2].len()).is_none());
        let mut landed = 0;
        for p in &packets[1..] {
            if land_stream(&mut r, a, p) {
                landed += 1;
            } else {
                r.handle_datagram(1, a, p);
            }
        }
        assert!(landed >= 2);
        assert_eq!(read_opened(&mut r), msg);
    }

    /// Many streams whose peer went silent: each tick probes at most
    /// `STREAM_PROBES_PER_TICK` of them (the first packets again, since
    /// nothing was heard), each stream's unanswered probes back off, and
    /// once the peer answers again every stream opens and none failed.
    #[test]
    fn probes_of_a_silent_peer_are_bounded_per_tick_and_back_off() {
        use super::{MAX_PROBE_BACKOFF, STREAM_PROBES_PER_TICK};
        const STREAMS: usize = 200;
        let (a, b, mut w, mut r) = writer_and_reader(1_500, 10_000);
        let resend = w.derived.resend_interval_ns();
        let mut buf = Vec::new();
        let mut drain = |w: &mut Endpoint, now: Time| {
            let mut out = Vec::new();
            while let Some(t) = w.poll_transmit(now, &mut buf) {
                out.push(buf[..t.len].to_vec());
            }
            out
        };
        for _ in 0..STREAMS {
            let sid = w.open_stream(0, b).unwrap();
            w.stream_send(0, sid, Bytes::from_static(b"x")).unwrap();
        }
        // More streams than a tick may probe: the bound is what is tested.
        const { assert!(STREAM_PROBES_PER_TICK < STREAMS / 2) };
        // Lost, all of them; then silence for 40 resend intervals.
        assert_eq!(drain(&mut w, 0).len(), STREAMS);
        let silent_until = 40 * resend;
        let (mut now, mut total, mut ticks) = (0, 0, 0);
        while let Some(t) = w.poll_timeout().filter(|&t| t < silent_until) {
            now = t.max(now);
            w.handle_timeout(now);
            let n = drain(&mut w, now).len();
            assert!(n <= STREAM_PROBES_PER_TICK, "{n} probes in one tick");
            total += n;
            ticks += 1;
        }
        // Without backoff each stream would be probed every interval
        // (about 40 times each, 8,000 in all, or the budget's 64 a tick);
        // with it, after 1, 3, 7, 15 and 31 intervals (waits of 1, 2, 4, 8,
        // 16), and the budget may put some off by a tick: at most 6 each.
        assert_eq!(MAX_PROBE_BACKOFF, 4, "the count below assumes it");
        let per_stream = 6;
        assert!(
            total <= STREAMS * per_stream,
            "{total} probes in {ticks} ticks"
        );
        assert!(total >= STREAMS * 3, "{total}");
        // The peer is back: everything goes through, both ways.
        let end = silent_until + 40 * resend;
        let mut opened = 0;
        now = silent_until;
        while now < end {
            for p in drain(&mut w, now) {
                r.handle_datagram(now, a, &p);
            }
            for p in drain(&mut r, now) {
                w.handle_datagram(now, b, &p);
            }
            while let Some(e) = r.poll_event() {
                if matches!(e, Event::StreamOpened { .. }) {
                    opened += 1;
                }
            }
            let next = [w.poll_timeout(), r.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            now = next.unwrap_or(end).max(now + 1);
            w.handle_timeout(now);
            r.handle_timeout(now);
        }
        assert_eq!(opened, STREAMS);
        assert_eq!(w.metrics().streams_failed, 0);
        assert!(w.streams.probe_queue.is_empty());
    }

    /// `len` bytes of a pattern that differs with `k`.
    fn pattern(len: usize, k: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + k) as u8).collect()
    }

    /// The writer's packets for `messages` written at once (packets of
    /// 20,000 bytes, a window of 200,000), and the reader with the stream
    /// opened by the first of them.
    fn written_packets(messages: &[Vec<u8>]) -> (SocketAddr, Endpoint, Vec<Vec<u8>>) {
        let (a, b, mut w, mut r) = writer_and_reader(20_000, 200_000);
        let sid = w.open_stream(0, b).unwrap();
        for m in messages {
            w.stream_send(0, sid, Bytes::from(m.clone())).unwrap();
        }
        let mut packets = Vec::new();
        let mut buf = Vec::new();
        for now in 0..100 {
            while let Some(t) = w.poll_transmit(now * 10_000, &mut buf) {
                packets.push(buf[..t.len].to_vec());
            }
        }
        r.handle_datagram(1, a, &packets[0]);
        (a, r, packets)
    }

    /// Every byte readable on the stream the reader's first event opened.
    fn read_opened(r: &mut Endpoint) -> Vec<u8> {
        let rsid = match r.poll_event() {
            Some(Event::StreamOpened { stream }) => stream,
            other => panic!("{other:?}"),
        };
        let mut got = Vec::new();
        while let Ok(StreamRead::Data { bytes, .. }) = r.stream_recv(2, rsid) {
            got.extend_from_slice(&bytes);
        }
        got
    }

    /// The driver's part of landing, by hand: `false` if no site.
    fn land_stream(r: &mut Endpoint, a: SocketAddr, p: &[u8]) -> bool {
        let head_len = crate::wire::MAX_LANDING_HEAD.min(p.len());
        let Some(mut site) = r.landing_site(a, &p[..head_len], p.len()) else {
            return false;
        };
        let h = site.header_len;
        let mut at = h;
        for span in site.payload.iter_mut() {
            span.copy_from_slice(&p[at..at + span.len()]);
            at += span.len();
        }
        drop(site);
        r.handle_landed(1, a, &p[..h], p.len());
        true
    }

    /// Landed payloads go into the receive pool: the reader gets them in
    /// order, one piece per packet and no copy (the end of the message on
    /// the last), and each piece holds its pool bytes until it is dropped.
    #[test]
    fn landed_stream_payloads_hold_pool_bytes_until_read_and_dropped() {
        let msg = pattern(50_000, 0);
        let (a, mut r, packets) = written_packets(std::slice::from_ref(&msg));
        assert_eq!(r.pool.bytes_reserved(), 0);
        for p in &packets[1..] {
            assert!(land_stream(&mut r, a, p));
        }
        let landed = msg.len() - (packets[0].len() - crate::wire::STREAM_DATA_OVERHEAD);
        assert!(
            r.pool.bytes_reserved() >= landed,
            "{}",
            r.pool.bytes_reserved()
        );
        let rsid = match r.poll_event() {
            Some(Event::StreamOpened { stream }) => stream,
            other => panic!("{other:?}"),
        };
        let mut pieces = Vec::new();
        while let Ok(StreamRead::Data {
            bytes,
            end_of_message,
        }) = r.stream_recv(2, rsid)
        {
            pieces.push((bytes, end_of_message));
        }
        assert_eq!(pieces.len(), packets.len(), "one piece per packet");
        let ends: Vec<bool> = pieces.iter().map(|p| p.1).collect();
        assert_eq!(ends.iter().filter(|&&e| e).count(), 1);
        assert!(ends[ends.len() - 1]);
        let got: Vec<u8> = pieces.iter().flat_map(|p| p.0.to_vec()).collect();
        assert_eq!(got, msg);
        assert!(r.pool.bytes_reserved() >= landed);
        drop(pieces);
        assert_eq!(r.pool.bytes_reserved(), 0);
    }

    /// With less than half of the pool free, a stream's payloads land in
    /// its own buffer instead (and read the same): streams never take the
    /// pool space that messages need.
    #[test]
    fn a_pool_less_than_half_free_keeps_stream_payloads_out_of_it() {
        let msg = pattern(50_000, 0);
        let (a, mut r, packets) = written_packets(std::slice::from_ref(&msg));
        let hog = r.pool.allocate(r.pool.capacity() / 2 + 1).unwrap();
        let held = r.pool.bytes_reserved();
        for p in &packets[1..] {
            assert!(land_stream(&mut r, a, p));
        }
        assert_eq!(r.pool.bytes_reserved(), held);
        assert_eq!(read_opened(&mut r), msg);
        drop(hog);
    }

    /// Landed and copied packets interleaved, over messages that start and
    /// end inside packets: the reader gets every byte once, in order, with
    /// each message's end where it was written.
    #[test]
    fn landed_and_copied_packets_interleave_in_order() {
        let sizes = [30_000usize, 5, 41_000, 19_000, 2, 60_000];
        let written: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &n)| pattern(n, k))
            .collect();
        let (a, mut r, packets) = written_packets(&written);
        let mut landed = 0;
        for (i, p) in packets.iter().enumerate().skip(1) {
            if i % 2 == 1 && land_stream(&mut r, a, p) {
                landed += 1;
            } else {
                r.handle_datagram(1, a, p);
            }
        }
        assert!(landed >= 2, "{landed} of {} packets landed", packets.len());
        let rsid = match r.poll_event() {
            Some(Event::StreamOpened { stream }) => stream,
            other => panic!("{other:?}"),
        };
        let mut read = Vec::new();
        let mut current = Vec::new();
        while let Ok(StreamRead::Data {
            bytes,
            end_of_message,
        }) = r.stream_recv(2, rsid)
        {
            current.extend_from_slice(&bytes);
            if end_of_message {
                read.push(std::mem::take(&mut current));
            }
        }
        assert!(current.is_empty());
        assert_eq!(read, written);
        assert_eq!(r.pool.bytes_reserved(), 0, "every piece was dropped");
    }
}
