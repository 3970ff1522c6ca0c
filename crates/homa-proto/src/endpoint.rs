//! The endpoint: one Homa socket's worth of protocol state.

use crate::config::{Config, ConfigError, Derived};
pub(crate) use crate::control::{Control, ControlBody};
use crate::control::{ControlQueue, Stamp};
use crate::deferred::Deferred;
use crate::grants::Grants;
use crate::incoming::DataPayload;
use crate::metrics::{DropReason, Metrics};
use crate::outgoing::Split;
use crate::pacer::Pacer;
use crate::partial::PartialMessage;
use crate::peer::{PeerKey, Peers, ServerKey};
use crate::pool::{Message, Pool};
use crate::rpc::{OutMsg, RpcKey, RpcState};
use crate::rpc_table::{Removed, RpcTable};
use crate::rtt::PeerRtt;
use crate::send_queue::SendQueue;
use crate::sendbuf::{Outgoing, Payload, SendBuf};
pub(crate) use crate::servers::ServerEntry;
use crate::servers::ServerTable;
use crate::time::Time;
use crate::timer::Ticker;
use crate::tombstones::{Tombstones, EXPIRY_BATCH, MAX_TICK_EXPIRY};
use crate::waiters::PoolWaiters;
use crate::window::WindowChange;
use crate::wire::{self, CommonHeader, Packet, MAX_ACKS_PER_PACKET};
use std::collections::VecDeque;
use std::net::SocketAddr;
use thiserror::Error;

/// Seed 003's `rtt_mid`: 3 × `rtt_min`, the level its deviation-based
/// detector compares the average with; counted in
/// `Metrics::rtt_samples_above_mid`.
const RTT_MID_FACTOR: u64 = 3;

/// Client-side identifier of an RPC (unique per client endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RpcId(pub u64);

/// A request received by a server, to be answered with [`Endpoint::send_response`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerRpc {
    /// The client's address: where the request came from and the response goes.
    pub peer: SocketAddr,
    /// The RPC id the client chose; unique only together with `peer`, since
    /// every client picks its own ids.
    pub id: u64,
}

/// What `poll_transmit` wrote into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Address to send the datagram to.
    pub dest: SocketAddr,
    /// Priority level 0..8 (7 highest), to be carried in DSCP / a switch queue.
    pub priority: u8,
    /// Bytes written to the buffer.
    pub len: usize,
}

/// Something the application must hear about.
#[derive(Debug)]
pub enum Event {
    /// A complete request arrived; answer it with `send_response`.
    Request {
        /// Handle to pass to `send_response` or `abandon`.
        rpc: ServerRpc,
        /// The request's bytes, in the receive pool until dropped.
        message: Message,
    },
    /// The response to one of our requests arrived; the RPC is finished.
    Response {
        /// The id `send_request` returned.
        id: RpcId,
        /// The response's bytes, in the receive pool until dropped.
        message: Message,
    },
    /// The first bytes of a request of at least
    /// [`Config::partial_delivery_bytes`] are in: read it as it arrives. Once
    /// it is complete (see [`PartialMessage::state`]) answer it with
    /// `send_response`; no [`Event::Request`] follows. If the client goes
    /// away first, the message fails ([`crate::PartialState::Failed`]).
    PartialRequest {
        /// Handle to pass to `send_response` or `abandon`.
        rpc: ServerRpc,
        /// The request, readable as it arrives.
        message: PartialMessage,
    },
    /// The first bytes of the response to an RPC for which
    /// [`Endpoint::deliver_response_partially`] was called are in (or all of
    /// it, if it came in one packet). The RPC ends when the message is
    /// complete or fails; no [`Event::Response`] follows, and a failure is
    /// also reported by [`Event::Failed`].
    PartialResponse {
        /// The id `send_request` returned.
        id: RpcId,
        /// The response, readable as it arrives.
        message: PartialMessage,
    },
    /// More of the partial message with this serial
    /// ([`PartialMessage::serial`]) is readable, or it is complete, or it
    /// failed: whoever reads it may go on.
    PartialProgress {
        /// The message's [`PartialMessage::serial`].
        serial: u64,
    },
    /// A peer opened a stream to us (its first bytes are in): read it with
    /// [`Endpoint::stream_recv`], write with [`Endpoint::stream_send`],
    /// and [`Endpoint::stream_close`] it when done.
    StreamOpened {
        /// The new stream.
        stream: crate::StreamId,
    },
    /// A stream that [`Endpoint::stream_recv`] found
    /// [`crate::StreamRead::Pending`] has something to read (or ended, or
    /// failed).
    StreamReadable {
        /// The stream.
        stream: crate::StreamId,
    },
    /// A stream whose [`Endpoint::stream_send`] was refused as
    /// [`crate::StreamError::Full`] takes bytes again (or failed).
    StreamWritable {
        /// The stream.
        stream: crate::StreamId,
    },
    /// One of our RPCs failed; it is finished.
    Failed {
        /// The id `send_request` returned.
        id: RpcId,
        /// Why it failed.
        error: RpcError,
    },
}

/// Why an RPC failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum RpcError {
    /// Nothing was heard from the server for the RPC timeout
    /// ([`Config::effective_rpc_timeout_ns`]) while this client waited for
    /// it (RPC_UNKNOWN answers do not count).
    #[error("the peer did not answer within the RPC timeout")]
    Timeout,
    /// The response declared a length above `Config::max_message_length`.
    #[error("the response is longer than the maximum message length")]
    ResponseTooLong,
    /// [`Endpoint::shutdown`] was called while the RPC was in progress.
    #[error("the endpoint was shut down")]
    Shutdown,
    /// The response could not be received: the receive pool stayed full
    /// (the application holds received messages) for the RPC timeout.
    #[error("the response waited for receive-pool space longer than the RPC timeout")]
    PoolExhausted,
}

/// Why a send was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SendError {
    /// The message is longer than `Config::max_message_length`.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    MessageTooLong {
        /// The refused message's length in bytes.
        len: usize,
        /// `Config::max_message_length`.
        max: u32,
    },
    /// `Config::max_client_rpcs` client RPCs are already in progress (the
    /// value is that limit).
    #[error("too many RPCs in progress (limit {0})")]
    TooManyRpcs(usize),
    /// The destination is a new peer and the peer table is full of peers
    /// that still have RPCs or tombstones (the value is `Config::max_peers`).
    #[error("too many peers (limit {0})")]
    TooManyPeers(usize),
    /// The [`ServerRpc`] is not waiting for a response: already answered,
    /// abandoned, or dropped.
    #[error(
        "no such server RPC awaiting a response (already answered, or abandoned by the client)"
    )]
    UnknownRpc,
    /// The request of this [`ServerRpc`] is still arriving (it was
    /// delivered incrementally, [`Event::PartialRequest`]): answer it once
    /// it is complete.
    #[error("the request is still arriving; answer it once it is complete")]
    RequestIncomplete,
    /// [`Endpoint::shutdown`] has been called.
    #[error("the endpoint is shut down")]
    Shutdown,
    /// The [`SendBuf`] is still held by an earlier send or by packet runs the
    /// driver has not yet sent ([`SendBuf::in_flight`]).
    #[error("the send buffer is still in flight (an earlier send has not finished with it)")]
    BufferInFlight,
    /// The [`SendBuf`]'s segment size is not this endpoint's payload per
    /// packet; [`Endpoint::new_send_buf`] makes one that fits.
    #[error("the send buffer has {segment}-byte segments; this endpoint sends {expected} bytes per packet")]
    BufferLayout {
        /// The buffer's payload bytes per packet.
        segment: usize,
        /// This endpoint's payload bytes per full DATA packet.
        expected: usize,
    },
}

/// Sizes of an endpoint's tables, for tests and memory reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Client RPCs in progress (completed ones awaiting a deferred free
    /// excluded).
    pub client_rpcs: usize,
    /// Live server RPCs: receiving, in service or responding.
    pub server_rpcs: usize,
    /// Entries in the peer table.
    pub peers: usize,
    /// Ids of finished server RPCs kept to refuse delayed duplicates.
    pub tombstones: usize,
    /// Receive-pool bpages ([`crate::BPAGE_SIZE`] bytes each) held by
    /// allocations or messages.
    pub pool_bpages_in_use: usize,
    /// True when no allocation or message holds any receive-pool space.
    pub pool_empty: bool,
    /// Messages still being granted to (not yet granted in full) that have
    /// granted scheduled bytes outstanding: at most `max_overcommit`, plus one
    /// FIFO grant. Fully granted messages still count in `incoming_bytes`.
    pub granted_messages: usize,
    /// Scheduled bytes granted but not yet received (bounded by `max_incoming`).
    pub incoming_bytes: u64,
    /// Incoming messages waiting for pool space.
    pub pool_waiters: usize,
    /// Outgoing messages with bytes to send.
    pub sendable_messages: usize,
    /// Streams in the table (open, failed and not yet closed, or lingering
    /// after a close).
    pub streams: usize,
    /// Bytes the streams hold: received and unread (in order or beyond a
    /// gap), and written but not yet acknowledged.
    pub stream_bytes_held: u64,
}

/// One Homa endpoint (the Linux module's socket): every RPC it is client or
/// server of, the peers it talks to, its receive pool and its transmit queues.
///
/// Each concern is a struct of its own that keeps its own invariants (see
/// each one's docs); the endpoint wires them together, and the files of
/// its `impl` (this one, `incoming.rs`, `landing.rs`, `outgoing.rs`,
/// `timer.rs`) call their methods rather than reach into their state.
#[repr(C, align(64))]
pub struct Endpoint {
    // Laid out by use (`repr(C)`, line-aligned, hottest first): in a
    // simulator of many hosts each packet finds its endpoint cold, so the
    // fields that the calls after every input read (`poll_event`,
    // `poll_nothing_to_send`, `poll_timeout`) share the first three cache
    // lines, and those every packet, poll and send touches follow them,
    // before the tables, the configuration and the counters.
    /// The latest time passed in by the driver (for calls that take none);
    /// it only moves forward ([`Self::note_time`]).
    last_now: Time,
    /// The periodic timer's next tick.
    pub(crate) ticker: Ticker,
    pub(crate) events: VecDeque<Event>,
    /// The peer of the latest datagram that came from a known peer: the next
    /// one usually comes from it too, and checking that (a slot and an
    /// address compared) costs less than hashing the address to find it.
    /// Checked, never trusted: a stale key (peer evicted, slot reused) only
    /// fails the check.
    pub(crate) last_rx_peer: Option<PeerKey>,
    /// Control packets waiting to be sent (ahead of DATA).
    pub(crate) control: ControlQueue,
    /// The NIC queue estimate (when it drains; whether DATA may go).
    pub(crate) pacer: Pacer,
    /// Pending retransmissions, messages with new bytes to send (SRPT
    /// order, by age), the FIFO share's credit, the burst being built.
    pub(crate) sends: SendQueue,
    shut_down: bool,
    /// Inside `poll_transmit_split`: DATA payloads are handed back, not copied.
    pub(crate) split: Split,
    // The two concerns below are idle in most runs but read on every poll
    // (`OnRamp::next_release`, `Streams::has_ready` and `next_tick`, each
    // its struct's first fields): kept here, next to the send queue, rather
    // than after the tables (W1, 30,000 messages, cachegrind: 3.8% fewer L1
    // data misses than at the end). On-Ramp's first fields share the line
    // that the split's payload (taken on every poll) ends on.
    /// On-Ramp's held peers and parked messages (empty when it is off).
    pub(crate) onramp: crate::onramp::OnRamp,
    /// Streams (`stream.rs`).
    pub(crate) streams: crate::stream::Streams,
    /// Values derived from `config` at creation (packet payload size,
    /// unscheduled bytes, our cutoffs...).
    pub(crate) derived: Derived,
    /// Every live RPC, client and server; client ids; birth order.
    pub(crate) rpcs: RpcTable,
    /// The receiver's grants: the messages that need them (SRPT order and
    /// by age) and the budget (granted bytes in flight, cap, window, FIFO
    /// credit, pass state).
    pub(crate) grants: Grants,
    /// Bookkeeping put off until the driver has a moment (piggybacked
    /// acknowledgements, completed client RPCs).
    deferred: Deferred,
    /// Incoming messages waiting for pool space.
    pub(crate) pool_waiters: PoolWaiters,
    // Hash tables: looked up on every packet. Nothing iterates them in a
    // way that reaches an output, so their iteration order cannot make the
    // engine non-deterministic.
    /// Server RPCs, live or finished (tombstones) in one table, so that the
    /// lookup a request's DATA packet needs anyway also finds its tombstone,
    /// and finishing an RPC rewrites its entry in place.
    pub(crate) server_ids: ServerTable,
    pub(crate) peers: Peers,
    pub(crate) pool: Pool,
    pub(crate) config: Config,
    pub(crate) metrics: Metrics,
    /// Tombstones' expiry queue and count (the ids are in `server_ids`).
    pub(crate) tombstones: Tombstones,
    /// Adaptive windows: the rate at which this endpoint received DATA over
    /// about the last RTT, which tells its own queue from a foreign one.
    pub(crate) rx_rate: crate::window::RxRate,
    /// The serial of the next [`PartialMessage`].
    pub(crate) next_partial_serial: u64,
}

// The fields the calls after every input read (`poll_event`,
// `poll_nothing_to_send`, `poll_timeout`: the events, the control queue, the
// timer, the pacer, and the send queue's first line) stay in the first
// three cache lines. On the simulator (W2, 5,000 messages, cachegrind) this
// order has as few L1 data misses as before the concerns became structs;
// the fields in their first order after the change had 1.5% more.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(Endpoint, events) + size_of::<VecDeque<Event>>() <= 64);
    assert!(offset_of!(Endpoint, pacer) + size_of::<Pacer>() <= 128);
    assert!(offset_of!(Endpoint, sends) == 128);
    // `split` (read and written by every `poll_transmit_split`) ends on the
    // line with On-Ramp's per-poll and per-grant-pass fields.
    let split_end = offset_of!(Endpoint, split) + size_of::<Split>();
    let onramp_hot_end = offset_of!(Endpoint, onramp) + crate::onramp::OnRamp::HOT_BYTES;
    assert!((split_end - 1) / 64 == (onramp_hot_end - 1) / 64);
};

/// SplitMix64's finalizer: a cheap, well-mixed, deterministic hash step.
/// The one copy in the workspace: RPC id seeds here, the runtime's fresh
/// seeds, and the test network's and simulator's seed derivation
/// (`homa_testnet::net::mix`) all use it.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Endpoint {
    /// A new endpoint; `now` is the driver's current time.
    pub fn new(config: Config, now: Time) -> Result<Endpoint, ConfigError> {
        config.validate()?;
        let derived = Derived::new(&config);
        let max_keys = config
            .max_client_rpcs
            .saturating_add(config.max_server_rpcs);
        let ep = Endpoint {
            grants: Grants::new(&config),
            rx_rate: crate::window::RxRate::default(),
            pacer: Pacer::new(&config, now),
            ticker: Ticker::new(&config),
            derived,
            rpcs: RpcTable::new(max_keys, config.rpc_id_seed),
            last_rx_peer: None,
            shut_down: false,
            deferred: Deferred::default(),
            split: Split::default(),
            events: VecDeque::new(),
            next_partial_serial: 1,
            streams: crate::stream::Streams::new(config.rpc_id_seed),
            control: ControlQueue::default(),
            sends: SendQueue::new(
                derived.data_per_packet(),
                config.pacer_fifo_permille,
                derived.unsched_bytes(),
                if config.short_before_retransmit {
                    derived.unsched_bytes()
                } else {
                    0
                },
            ),
            server_ids: ServerTable::default(),
            peers: Peers::default(),
            pool: Pool::new(config.pool_bytes),
            tombstones: Tombstones::default(),
            pool_waiters: PoolWaiters::default(),
            last_now: now,
            metrics: Metrics::default(),
            onramp: crate::onramp::OnRamp::default(),
            config,
        };
        Ok(ep)
    }

    /// See [`crate::driver::FastPath::prefetch_dest`].
    #[inline]
    pub(crate) fn prefetch_dest(&self, dest: SocketAddr) {
        self.peers.prefetch_find(&dest);
        self.rpcs.prefetch_header();
    }

    /// See [`crate::driver::FastPath::prefetch_send`].
    #[inline]
    pub(crate) fn prefetch_send(&self, dest: SocketAddr) {
        if let Some(pk) = self.peers.find(dest) {
            self.peers.prefetch_peer(pk);
        }
        self.rpcs.prefetch_next_whole();
    }

    /// Whether [`Self::shutdown`] has been called.
    #[inline]
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down
    }

    /// Notes the time a driver passed in.
    #[inline(always)]
    pub(crate) fn note_time(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
    }

    /// The configuration the endpoint was created with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The endpoint's counters since creation.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Current sizes of the endpoint's tables. Walks every RPC: for tests
    /// and reports, not per-packet use.
    pub fn stats(&self) -> EndpointStats {
        debug_assert_eq!(
            self.server_ids.len(),
            self.rpcs.servers() + self.tombstones.count()
        );
        EndpointStats {
            client_rpcs: self.rpcs.clients() - self.deferred.frees(),
            server_rpcs: self.rpcs.servers(),
            peers: self.peers.len(),
            tombstones: self.tombstones.count(),
            pool_bpages_in_use: self.pool.bpages_in_use(),
            pool_empty: self.pool.is_empty(),
            granted_messages: self
                .rpcs
                .iter()
                .filter_map(|r| r.inc.as_ref())
                .filter(|m| m.outstanding() > 0 && m.grant_key.is_some())
                .count(),
            incoming_bytes: self.grants.incoming(),
            pool_waiters: self.pool_waiters.len(),
            sendable_messages: self.sends.len(),
            streams: self.streams.len(),
            stream_bytes_held: self.streams.held_bytes(),
        }
    }

    /// Smallest round-trip time measured to `peer` over the last
    /// `Config::rtt_min_window_ns`, if any: only when the endpoint measures
    /// RTT (`Config::measure_rtt` or adaptive windows; [`Self::peer_rtt`]
    /// has the rest).
    pub fn peer_rtt_min(&self, peer: SocketAddr) -> Option<u64> {
        let key = self.peers.find(peer)?;
        self.peers.path(key).rtt.min().map(u64::from)
    }

    /// What the endpoint measured of the path to `peer` and the windows it
    /// gives it (`None`: unknown peer). The RTT fields stay empty unless the
    /// endpoint measures RTT (`Config::measure_rtt` or adaptive windows).
    pub fn peer_rtt(&self, peer: SocketAddr) -> Option<PeerRtt> {
        let key = self.peers.find(peer)?;
        let path = self.peers.path(key);
        let r = &path.rtt;
        Some(PeerRtt {
            samples: r.samples(),
            rtt_min: r.min(),
            rtt_recent: r.recent(),
            srtt: r.srtt(),
            rttvar: r.rttvar(),
            congested: r.congested(),
            grant_window: self.grant_window_of(key),
            unsched_window: if self.derived.adaptive() {
                path.unsched.get(self.derived.windows())
            } else {
                self.derived.unsched_bytes()
            },
        })
    }

    /// Takes an RTT sample of peer `pk` (the endpoint measures RTT): the
    /// estimator, the congestion count and, with adaptive windows, the
    /// peer's windows.
    pub(crate) fn rtt_sample(&mut self, now: Time, pk: PeerKey, rtt: u32) {
        self.metrics.rtt_samples += 1;
        let window = self.config.rtt_min_window_ns;
        let threshold = self.derived.congestion();
        let path = self.peers.path_mut(pk);
        let o = path.rtt.sample(now, rtt, window, threshold);
        if o.onset {
            self.metrics.congestion_onsets += 1;
        }
        if path.rtt.congested() {
            self.metrics.rtt_samples_congested += 1;
        }
        if let Some(min) = path.rtt.min() {
            if rtt as u64 > RTT_MID_FACTOR * min as u64 {
                self.metrics.rtt_samples_above_mid += 1;
            }
        }
        if !self.derived.adaptive() {
            return;
        }
        let params = self.derived.windows();
        let path = self.peers.path_mut(pk);
        let rx_bps = self.rx_rate.update(
            now,
            self.metrics.data_bytes_received,
            path.rtt.srtt().max(path.rtt.min().unwrap_or(0)) as u64,
        );
        let queue_ns = params.foreign_queue_ns(&path.rtt, rx_bps);
        if o.min_changed || queue_ns > 0 || path.covers_queue {
            let w = params.grant_window_over_queue(path.rtt.min(), queue_ns);
            path.covers_queue = queue_ns > 0;
            if w != path.grant_window {
                path.grant_window = w;
                // A grant pass may now grant more, or less.
                self.grants.unsettle();
            }
        }
        if let Some(
            WindowChange::CutCongested
            | WindowChange::CutRatio
            | WindowChange::CutLoss
            | WindowChange::CutRationed,
        ) = path.unsched.update(now, &path.rtt, params)
        {
            self.metrics.unsched_window_cuts += 1;
        }
    }

    /// The grant window of peer `pk`'s messages: its own under adaptive
    /// windows once it has a sample, else the static one.
    #[inline]
    pub(crate) fn grant_window_of(&self, pk: PeerKey) -> u32 {
        let w = if self.derived.adaptive() {
            self.peers.path(pk).grant_window
        } else {
            0
        };
        if w == 0 {
            self.derived.windows().static_grant()
        } else {
            w
        }
    }

    /// The unscheduled bytes of a new message of `len` bytes to peer `pk`
    /// (counted towards the peer's unscheduled ratio under adaptive
    /// windows).
    #[inline]
    fn unsched_for(&mut self, pk: PeerKey, len: usize) -> u32 {
        if !self.derived.adaptive() {
            return self.derived.unsched_bytes();
        }
        let w = &mut self.peers.path_mut(pk).unsched;
        let unsched = w.get(self.derived.windows());
        let len = len.min(u32::MAX as usize) as u32;
        w.on_message(len, unsched.min(len));
        unsched
    }

    /// True when the endpoint has no RPCs and nothing to transmit.
    pub fn is_idle(&self) -> bool {
        self.rpcs.clients() == self.deferred.frees()
            && self.rpcs.servers() == 0
            && self.control.is_empty()
            && self.events.is_empty()
    }

    /// See [`crate::driver::FastPath::poll_nothing_to_send`].
    #[inline]
    pub(crate) fn poll_nothing_to_send(&mut self, now: Time) -> bool {
        if !self.control.is_empty() || !self.sends.is_empty() || self.streams.has_ready() {
            return false;
        }
        self.note_time(now);
        true
    }

    /// Whether an event waits for [`Self::poll_event`]. A driver that takes
    /// in one large packet at a time (landing) hands what one packet made
    /// readable to its application before receiving the next.
    #[inline]
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The oldest event the application has not yet taken, if any. Drivers
    /// drain it after every input.
    #[inline]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Starts an RPC.
    pub fn send_request(
        &mut self,
        now: Time,
        dest: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<RpcId, SendError> {
        self.note_time(now);
        if self.shut_down {
            return Err(SendError::Shutdown);
        }
        if self.derived.client_rpcs_full(self.rpcs.clients()) {
            // Completed RPCs not yet freed hold no room.
            self.run_deferred(now);
            if self.derived.client_rpcs_full(self.rpcs.clients()) {
                return Err(SendError::TooManyRpcs(self.config.max_client_rpcs));
            }
        }
        let request = self.payload(request.into())?;
        crate::trace_point!("engine: request taken");
        // Start loading the destination's index slot and the slab slot the
        // RPC will take, so that their misses overlap.
        self.peers.prefetch_find(&dest);
        self.rpcs.prefetch_next();
        let Some(pk) = self.ensure_peer(now, dest) else {
            return Err(SendError::TooManyPeers(self.config.max_peers));
        };
        let unsched_priority = self.peers.unsched_priority(pk, request.len() as u32);
        let key = self.insert_rpc(now, true, 0, dest, pk, RpcState::ClientActive);
        crate::trace_point!("engine: client rpc inserted");
        let unsched = self.unsched_for(pk, request.len());
        let rpc = &mut self.rpcs[key];
        rpc.out = Some(OutMsg::new(request, unsched, unsched_priority));
        let id = rpc.id;
        self.requeue_out(key);
        Ok(RpcId(id))
    }

    /// A send buffer of `len` bytes laid out for this endpoint's packets, so
    /// that sending it needs no gather copy (see [`SendBuf`]).
    pub fn new_send_buf(&self, len: usize) -> SendBuf {
        SendBuf::new(len, self.derived.data_per_packet() as usize)
    }

    /// Checks an application's message and takes it for sending.
    fn payload(&self, msg: Outgoing) -> Result<Payload, SendError> {
        let max = self.derived.max_message_length();
        let dpp = self.derived.data_per_packet() as usize;
        if msg.len() > max as usize {
            return Err(SendError::MessageTooLong {
                len: msg.len(),
                max,
            });
        }
        match msg {
            Outgoing::Bytes(b) => Ok(Payload::Bytes(b)),
            Outgoing::Buf(b) => {
                if b.segment() != dpp {
                    return Err(SendError::BufferLayout {
                        segment: b.segment(),
                        expected: dpp,
                    });
                }
                b.lease()
                    .map(Payload::Buf)
                    .map_err(|_| SendError::BufferInFlight)
            }
        }
    }

    /// Answers a request delivered by [`Event::Request`].
    pub fn send_response(
        &mut self,
        now: Time,
        rpc: ServerRpc,
        response: impl Into<Outgoing>,
    ) -> Result<(), SendError> {
        self.note_time(now);
        if self.shut_down {
            return Err(SendError::Shutdown);
        }
        let Some(key) = self.server_rpc(rpc) else {
            return Err(SendError::UnknownRpc);
        };
        // Checked before the message is taken, so that a refused send
        // leaves a send buffer free.
        let (state, pk) = {
            let r = &self.rpcs[key];
            (r.state, r.peer_key)
        };
        if state != RpcState::ServerInService {
            return Err(if state == RpcState::ServerReceiving {
                SendError::RequestIncomplete
            } else {
                SendError::UnknownRpc
            });
        }
        let response = self.payload(response.into())?;
        let unsched_priority = self.peers.unsched_priority(pk, response.len() as u32);
        let unsched = self.unsched_for(pk, response.len());
        let r = &mut self.rpcs[key];
        r.state = RpcState::ServerResponding;
        r.out = Some(OutMsg::new(response, unsched, unsched_priority));
        r.last_heard = now;
        r.last_prod = now;
        self.requeue_out(key);
        Ok(())
    }

    /// Drops a request delivered by [`Event::Request`] (or, also before its
    /// end, by [`Event::PartialRequest`]) without answering it
    /// (one-way messages, or a server shedding load). Its state is freed at
    /// once; should the client ask for the response, it learns the RPC is
    /// unknown (and, if it restarts it, the request is refused for
    /// `tombstone_ns`). Unknown or already answered RPCs are ignored.
    pub fn abandon(&mut self, rpc: ServerRpc) {
        if let Some(key) = self.server_rpc(rpc) {
            let r = &self.rpcs[key];
            // A request being delivered incrementally is the application's
            // from its first bytes: it may give up on it before the end.
            let partial = r.state == RpcState::ServerReceiving
                && r.inc.as_ref().is_some_and(|i| i.partial.is_some());
            if partial {
                // Refused like an executed request from now on (a
                // tombstone), not received again from its next packet.
                self.rpcs[key].state = RpcState::ServerInService;
            }
            if self.rpcs[key].state == RpcState::ServerInService {
                self.free_rpc(self.last_now, key);
            }
        }
    }

    /// The live server RPC an application handle stands for.
    fn server_rpc(&self, rpc: ServerRpc) -> Option<RpcKey> {
        // One live server RPC per (address, id): if the latest request's
        // slot still holds that identity, it is the one the tables name.
        if let Some(key) = self.rpcs.latest_request(&rpc.peer, rpc.id) {
            debug_assert_eq!(self.server_rpc_lookup(rpc), Some(key));
            return Some(key);
        }
        self.server_rpc_lookup(rpc)
    }

    /// [`Self::server_rpc`] through the peer and server tables.
    fn server_rpc_lookup(&self, rpc: ServerRpc) -> Option<RpcKey> {
        let peer = self.peers.find(rpc.peer)?;
        match self.server_ids.get(ServerKey { peer, id: rpc.id })? {
            ServerEntry::Live(k) => Some(k),
            ServerEntry::Tomb(_) => None,
        }
    }

    /// Delivers the response of client RPC `id` incrementally: an
    /// [`Event::PartialResponse`] when its first bytes are in the pool
    /// (now, if some already are), then [`Event::PartialProgress`] as more
    /// arrive, instead of one [`Event::Response`] at the end. Call it before
    /// the response is complete (right after `send_request`); a response
    /// already delivered is not delivered again.
    pub fn deliver_response_partially(&mut self, id: RpcId) -> Result<(), SendError> {
        let Some(key) = self.rpcs.client_key(id.0) else {
            return Err(SendError::UnknownRpc);
        };
        self.rpcs[key].partial_response = true;
        if self.rpcs[key]
            .inc
            .as_ref()
            .is_some_and(|i| i.alloc.is_some())
        {
            self.start_partial(key);
        }
        Ok(())
    }

    /// Abandons a client RPC (no event is generated for it). Unknown ids are ignored.
    pub fn cancel(&mut self, id: RpcId) {
        if let Some(key) = self.rpcs.client_key(id.0) {
            self.free_rpc(self.last_now, key);
        }
    }

    /// Fails every client RPC with [`RpcError::Shutdown`], forgets every server
    /// RPC and refuses new work. Queued control packets may still be polled.
    pub fn shutdown(&mut self) {
        if self.shut_down {
            return;
        }
        // Completed client RPCs are freed, not failed.
        self.apply_deferred_frees(self.last_now);
        self.shutdown_streams();
        self.shut_down = true;
        self.deferred.clear_acks();
        for key in self.rpcs.live_keys() {
            let rpc = &self.rpcs[key];
            if rpc.is_client {
                self.events.push_back(Event::Failed {
                    id: RpcId(rpc.id),
                    error: RpcError::Shutdown,
                });
                self.metrics.rpcs_failed += 1;
            }
            self.free_rpc(self.last_now, key);
        }
        self.ticker.stop();
    }

    /// Feeds one received datagram (UDP payload) from `from`.
    #[inline]
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        self.run_deferred(now);
        let hint = self.last_rx_peer;
        self.last_rx_peer = self.receive_one(now, from, datagram, hint).or(hint);
        self.check_pool_waiters(now);
    }

    /// Feeds several packets from `from` that arrived together, as a UDP GRO
    /// receive returns them: `data` is cut into `segment`-byte packets (the
    /// last may be shorter). The same as [`Self::handle_datagram`] on each
    /// packet in order, except that the peer is looked up once and the
    /// decisions that depend on all incoming messages (grants, pool waiters)
    /// are made once, after the last packet, as if they had all arrived at
    /// the same instant, which they did.
    pub fn handle_datagrams(&mut self, now: Time, from: SocketAddr, data: &[u8], segment: usize) {
        if segment == 0 || data.len() <= segment {
            return self.handle_datagram(now, from, data);
        }
        self.run_deferred(now);
        self.grants.begin_batch();
        let mut hint = self.last_rx_peer;
        for packet in data.chunks(segment) {
            hint = self.receive_one(now, from, packet, hint).or(hint);
        }
        self.last_rx_peer = hint;
        if self.grants.end_batch() && self.grants.any_grantable() {
            self.update_grants(now);
        }
        self.check_pool_waiters(now);
    }

    /// One packet; returns the peer's key if it was known before the packet
    /// (a hint for the next packet from the same address).
    fn receive_one(
        &mut self,
        now: Time,
        from: SocketAddr,
        datagram: &[u8],
        hint: Option<PeerKey>,
    ) -> Option<PeerKey> {
        self.note_time(now);
        self.metrics.bytes_received += datagram.len() as u64;
        if self.shut_down {
            return None;
        }
        // The sender's index slot is known before the datagram is read: start
        // loading it so that its miss overlaps the datagram's (unless a GRO
        // batch already knows the peer).
        if hint.is_none() {
            self.peers.prefetch_find(&from);
        }
        // A checksum that is present is always checked; an absent one is
        // refused only if we require checksums (see `Config::checksum`).
        if !wire::verify_checksum(datagram, self.derived.require_checksum()) {
            self.metrics.drop(DropReason::BadChecksum);
            return hint;
        }
        let decoded = match wire::decode(datagram) {
            Ok(d) => d,
            Err(_) => {
                self.metrics.drop(DropReason::Malformed);
                return hint;
            }
        };
        crate::trace_point!("engine: decoded");
        let c = decoded.common;
        let pk = self.packet_peer(now, from, &c, decoded.packet.packet_type(), hint);
        match decoded.packet {
            Packet::Data { header, payload } => {
                self.handle_data(now, from, pk, &c, &header, DataPayload::Bytes(payload))
            }
            Packet::Grant(g) => self.handle_grant(now, pk, &c, g),
            Packet::Resend(r) => self.handle_resend(now, from, pk, &c, r),
            Packet::RpcUnknown => self.handle_rpc_unknown(now, pk, &c),
            Packet::Busy => match self.lookup(pk, &c) {
                Some(key) => {
                    let rpc = &mut self.rpcs[key];
                    rpc.last_heard = now;
                    rpc.peer_busy = true;
                }
                None => self.metrics.drop(DropReason::UnknownRpc),
            },
            Packet::Cutoffs(cut) => match pk {
                Some(pk) => {
                    let peer = &mut self.peers[pk];
                    // Versions only move forward (modulo wrap-around), so a
                    // reordered older CUTOFFS cannot undo a newer one.
                    if peer.cutoff_version == 0
                        || (cut.version.wrapping_sub(peer.cutoff_version) as i16) > 0
                    {
                        peer.cutoff_version = cut.version;
                        self.peers.set_cutoffs(pk, cut.cutoffs);
                    }
                }
                None => self.metrics.drop(DropReason::UnknownRpc),
            },
            Packet::StreamData {
                header,
                ends,
                payload,
            } => self.handle_stream_data(
                now,
                from,
                &c,
                &header,
                ends,
                crate::stream::StreamPayload::Bytes(payload),
            ),
            Packet::StreamCredit(k) => self.handle_stream_credit(now, from, &c, &k),
            Packet::StreamReset(r) => self.handle_stream_reset(from, &c, r),
            Packet::NeedAck => self.handle_need_ack(now, from, pk, &c),
            Packet::Ack(ids) => {
                if !c.from_client {
                    self.metrics.drop(DropReason::WrongState);
                    return pk;
                }
                if let Some(pk) = pk {
                    for id in ids.iter() {
                        self.handle_ack_id(now, pk, id);
                    }
                }
            }
        }
        pk
    }

    /// The key of a packet's sender (the one address lookup per packet;
    /// everything after uses the key), with the packet counted and the
    /// peer's timestamps observed. `hint`: the sender of the packet before.
    #[inline]
    pub(crate) fn packet_peer(
        &mut self,
        now: Time,
        from: SocketAddr,
        c: &CommonHeader,
        ptype: wire::PacketType,
        hint: Option<PeerKey>,
    ) -> Option<PeerKey> {
        self.metrics.packets_received[ptype.index()] += 1;
        let pk = match hint {
            // Same address as the packet before (no eviction can happen in
            // between: only a packet from an unknown address evicts).
            Some(k) if self.peers.is_live(k) && self.peers.info(k).addr == from => Some(k),
            _ => self.peers.find(from),
        };
        if let Some(pk) = pk {
            // Start loading the RPC's entry before the peer's line is read.
            if c.from_client {
                self.server_ids.prefetch(ServerKey {
                    peer: pk,
                    id: c.rpc_id,
                });
            } else {
                self.rpcs.prefetch_client(c.rpc_id);
            }
            let sample = self.peers[pk].observe(now, c.send_time, c.echo_time);
            if let Some(rtt) = sample.filter(|_| self.derived.measure_rtt()) {
                self.rtt_sample(now, pk, rtt);
            }
            if self.derived.onramp().is_some() {
                self.onramp_report(now, pk, c.send_time, c.echo_time);
                if ptype == wire::PacketType::Data {
                    self.onramp_inbound(now, pk, c.send_time);
                }
            }
        }
        pk
    }

    /// Applies the bookkeeping the engine put off to keep it off the path
    /// from a request to its reply (acknowledgements piggybacked on
    /// requests: freeing the acknowledged RPCs) and from a response to the
    /// next request (freeing the completed client RPC). A driver calls it
    /// when it has sent what the engine had ready and has a moment, e.g.
    /// right after transmitting a reply or a request. Otherwise it happens
    /// at the start of the next `handle_datagram(s)` or `handle_timeout`,
    /// before anything else, and whenever it would change a decision (an
    /// RPC limit).
    #[inline]
    pub fn run_deferred(&mut self, now: Time) {
        if self.deferred.has_frees() {
            self.apply_deferred_frees(now);
        }
        if self.deferred.has_acks() {
            self.apply_deferred_acks(now);
        }
    }

    /// Whether [`Self::run_deferred`] has anything to do.
    #[inline]
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty()
    }

    #[cold]
    fn apply_deferred_frees(&mut self, now: Time) {
        while let Some(key) = self.deferred.pop_free() {
            self.free_rpc(now, key);
        }
    }

    /// Frees completed client RPC `key` later (see [`Deferred`]). Its
    /// response has been delivered: nothing of it is queued for sending and
    /// no incoming message is left.
    pub(crate) fn defer_free(&mut self, now: Time, key: RpcKey) {
        if self.deferred.frees_full() {
            self.apply_deferred_frees(now);
        }
        let rpc = &mut self.rpcs[key];
        debug_assert!(rpc.is_client && rpc.inc.is_none());
        debug_assert!(rpc
            .out
            .as_ref()
            .is_none_or(|o| o.queued.is_none() && o.retx.is_none()));
        rpc.id = 0;
        self.deferred.push_free(key);
        // A grant pass may be owed to other messages now that this one is
        // complete; the free would have made it.
        if !self.grants.is_settled() && self.grants.any_grantable() {
            self.update_grants(now);
        }
    }

    #[cold]
    fn apply_deferred_acks(&mut self, now: Time) {
        let acks = self.deferred.take_acks();
        for &(from, id) in &acks {
            // Looked up again: the peer entry may have changed meanwhile.
            if let Some(pk) = self.peers.find(from) {
                self.handle_ack_id(now, pk, id);
            }
        }
        self.deferred.return_acks(acks);
    }

    /// Queues an acknowledgement piggybacked on a request (see
    /// [`Deferred`]).
    pub(crate) fn defer_ack(&mut self, now: Time, from: SocketAddr, id: u64) {
        if self.deferred.acks_full() {
            self.apply_deferred_acks(now);
        }
        self.deferred.push_ack(from, id);
    }

    /// When `handle_timeout` should next be called, if ever.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Time> {
        let tick = self.ticker.deadline();
        let t = match self.pacer_deadline() {
            Some(p) => tick.min(p),
            None => tick,
        }
        .min(self.onramp.next_release)
        .min(self.streams.next_tick);
        (t != Time::MAX).then_some(t)
    }

    /// The part of [`Self::poll_timeout`] that is the pacer's: when the NIC
    /// queue will have drained enough for a packet that waits for it, if
    /// one waits. A driver that sleeps can tell from it an urgent wake-up
    /// (packets to send within µs) from an ordinary protocol timer, which
    /// may run somewhat late.
    #[inline]
    pub fn pacer_deadline(&self) -> Option<Time> {
        if self.sends.is_empty() && !self.streams.has_ready() {
            return None;
        }
        self.pacer.opens_at()
    }

    /// The RPC a packet from peer `pk` refers to, by direction (a sender we
    /// have no peer entry for has no RPCs here).
    pub(crate) fn lookup(&self, pk: Option<PeerKey>, c: &CommonHeader) -> Option<RpcKey> {
        let pk = pk?;
        if c.from_client {
            match self.server_ids.get(ServerKey {
                peer: pk,
                id: c.rpc_id,
            })? {
                ServerEntry::Live(k) => Some(k),
                ServerEntry::Tomb(_) => None,
            }
        } else {
            let key = self.rpcs.client_key(c.rpc_id)?;
            (self.rpcs[key].peer_key == pk).then_some(key)
        }
    }

    /// See [`crate::driver::FastPath::client_rpc_index`].
    #[inline]
    pub(crate) fn client_rpc_index(&self, id: RpcId) -> usize {
        self.rpcs.client_slot(id.0)
    }

    /// Makes sure a peer entry exists, evicting an idle one if the table is
    /// full; returns its key. None if no room can be made.
    pub(crate) fn ensure_peer(&mut self, now: Time, addr: SocketAddr) -> Option<PeerKey> {
        if let Some(pk) = self.peers.find(addr) {
            return Some(pk);
        }
        if self.peers.len() >= self.config.max_peers {
            // Evict the least recently active idle peers, an eighth of the
            // table at a time, so that a flood of new addresses costs one scan
            // per many insertions rather than one per packet. A peer with
            // tombstones is not idle: they must outlive it.
            let mut idle: Vec<(Time, SocketAddr, PeerKey)> = self
                .peers
                .iter()
                .filter(|(_, p)| p.unreferenced())
                .map(|(k, p)| (p.last_active, self.peers.info(k).addr, k))
                .collect();
            if idle.is_empty() {
                return None;
            }
            let batch = (self.config.max_peers / 8).clamp(1, idle.len());
            idle.select_nth_unstable(batch - 1);
            for &(_, _, k) in &idle[..batch] {
                self.peers.remove(k);
            }
        }
        Some(self.peers.insert(addr, *self.derived.cutoffs(), now))
    }

    /// Adds an RPC; `id` is the client's id for a server RPC, and ignored for
    /// a client RPC (which is given its id by the table).
    pub(crate) fn insert_rpc(
        &mut self,
        now: Time,
        is_client: bool,
        id: u64,
        peer: SocketAddr,
        peer_key: PeerKey,
        state: RpcState,
    ) -> RpcKey {
        let key = self.rpcs.insert(now, is_client, id, peer, peer_key, state);
        let p = &mut self.peers[peer_key];
        p.rpcs += 1;
        p.last_active = now;
        if !is_client {
            p.server_rpcs += 1;
        }
        self.ticker.arm(now);
        key
    }

    /// Forgets an RPC entirely, returning its pool space.
    pub(crate) fn free_rpc(&mut self, now: Time, key: RpcKey) {
        self.unqueue_out(key);
        self.remove_incoming(key);
        let Removed {
            is_client,
            id,
            peer_key: pk,
            state,
        } = self.rpcs.remove(key);
        if !is_client {
            let sk = ServerKey { peer: pk, id };
            // Only an executed request needs protection from being run again.
            if state == RpcState::ServerReceiving || !self.tombstones_on() {
                self.server_ids.remove(sk);
            } else {
                self.set_tombstone(now, sk);
            }
        }
        let p = &mut self.peers[pk];
        p.rpcs -= 1;
        if !is_client {
            p.server_rpcs -= 1;
        }
        p.last_active = now;
        // The grant pass is for room or rank freed by the message removed
        // above (which unsettles it), or for a grant an earlier pass could
        // not yet give; if neither, it would do nothing.
        if !self.grants.is_settled() {
            self.update_grants(now);
        }
    }

    fn tombstones_on(&self) -> bool {
        !self.shut_down && self.derived.tombstone_ns() > 0
    }

    /// Makes `sk` a tombstone expiring `tombstone_ns` from now: a server RPC
    /// just finished (its entry is `Live`), or a tombstone was hit again.
    /// Also removes a batch of expired tombstones if one is due, so expiry
    /// keeps pace with creation instead of piling up for the timer tick.
    fn set_tombstone(&mut self, now: Time, sk: ServerKey) {
        while self.tombstones.is_full() {
            self.expire_batch(Time::MAX);
        }
        let expiry = now.saturating_add(self.derived.tombstone_ns());
        let n = self.tombstones.next_number();
        // Refreshing a tombstone leaves its older queue entry behind; that
        // entry's number no longer matches and it is skipped when it comes up.
        if !matches!(
            self.server_ids.set(sk, ServerEntry::Tomb(n)),
            Some(ServerEntry::Tomb(_))
        ) {
            self.tombstones.made();
            self.peers[sk.peer].tombstones += 1;
        }
        self.tombstones.push(expiry, sk, n);
        if self.tombstones.batch_due(now) {
            self.expire_batch(now);
        }
    }

    /// Takes up to [`EXPIRY_BATCH`] entries expiring at or before `now` off
    /// the tombstone queue and drops their tombstones (unless refreshed since);
    /// returns how many entries it took.
    fn expire_batch(&mut self, now: Time) -> usize {
        let mut batch = [None; EXPIRY_BATCH];
        let server_ids = &self.server_ids;
        let len = self
            .tombstones
            .take_due(now, &mut batch, |sk| server_ids.prefetch(sk));
        for t in batch.into_iter().flatten() {
            let sk = t.key();
            if self.server_ids.remove_if(sk, Some(ServerEntry::Tomb(t.n))) {
                self.tombstones.removed();
                self.peers[sk.peer].tombstones -= 1;
            }
        }
        len
    }

    /// Whether `(peer, id)` is a finished server RPC; if so its tombstone
    /// lives on, so that a client that keeps asking (e.g. after `abandon`)
    /// keeps being refused rather than having the request run again.
    pub(crate) fn hit_tombstone(&mut self, now: Time, peer: Option<PeerKey>, id: u64) -> bool {
        let Some(peer) = peer else {
            return false;
        };
        let sk = ServerKey { peer, id };
        if !matches!(self.server_ids.get(sk), Some(ServerEntry::Tomb(_))) {
            return false;
        }
        if self.tombstones_on() {
            self.set_tombstone(now, sk);
        }
        true
    }

    /// Timer work: drops tombstones that have expired by `now`, at most
    /// [`MAX_TICK_EXPIRY`] queue entries per call (the rest wait for the
    /// next tick or the next new tombstone; late expiry is always safe).
    pub(crate) fn expire_tombstones(&mut self, now: Time) {
        let mut done = 0;
        while done < MAX_TICK_EXPIRY {
            match self.expire_batch(now) {
                0 => break,
                n => done += n,
            }
        }
    }

    pub(crate) fn queue_control(&mut self, c: Control) {
        if !self.control.push(c) {
            self.metrics.control_dropped += 1;
        }
    }

    /// Queues a control packet about RPC `key`.
    pub(crate) fn control_for(&mut self, key: RpcKey, body: ControlBody) {
        let rpc = &self.rpcs[key];
        let c = Control {
            dest: rpc.peer,
            rpc_id: rpc.id,
            from_client: rpc.is_client,
            body,
        };
        self.queue_control(c);
    }

    fn handle_rpc_unknown(&mut self, now: Time, pk: Option<PeerKey>, c: &CommonHeader) {
        let Some(key) = self.lookup(pk, c) else {
            self.metrics.drop(DropReason::UnknownRpc);
            return;
        };
        if c.from_client {
            // The client has forgotten this RPC: nothing more to do for it.
            self.free_rpc(now, key);
            return;
        }
        // The server has no record of our request: it never got it (or lost its
        // state). Start the request over.
        // Not a sign of progress: `last_heard` stays, so a server that keeps
        // refusing the request (limits) lets the RPC time out.
        self.remove_incoming(key);
        let rpc = &mut self.rpcs[key];
        rpc.last_prod = now;
        rpc.restarts = rpc.restarts.saturating_add(1);
        if let Some(out) = rpc.out.as_mut() {
            out.restart();
        }
        self.metrics.restarts += 1;
        self.requeue_out(key);
    }

    fn handle_need_ack(
        &mut self,
        now: Time,
        from: SocketAddr,
        pk: Option<PeerKey>,
        c: &CommonHeader,
    ) {
        if c.from_client {
            self.metrics.drop(DropReason::WrongState);
            return;
        }
        if self.lookup(pk, c).is_some() {
            // Still receiving the response; our RESENDs will sort it out.
            return;
        }
        let mut ids = vec![c.rpc_id];
        if let Some(pk) = pk {
            let peer = &mut self.peers[pk];
            while ids.len() < MAX_ACKS_PER_PACKET {
                match peer.pending_acks.pop() {
                    Some(id) if id != c.rpc_id => ids.push(id),
                    Some(_) => {}
                    None => break,
                }
            }
            peer.last_active = now;
        }
        self.queue_control(Control {
            dest: from,
            rpc_id: c.rpc_id,
            from_client: true,
            body: ControlBody::Ack(ids),
        });
    }

    /// The client acknowledged RPC `id`: drop its server state.
    pub(crate) fn handle_ack_id(&mut self, now: Time, pk: PeerKey, id: u64) {
        if let Some(ServerEntry::Live(key)) = self.server_ids.get(ServerKey { peer: pk, id }) {
            if self.rpcs[key].state == RpcState::ServerResponding {
                self.metrics.acks_processed += 1;
                self.free_rpc(now, key);
            }
        }
    }

    /// Encodes a control packet into `buf`; `pk` is the destination's peer
    /// key if known (else it is looked up, for the echoed timestamp).
    pub(crate) fn encode_control(
        &self,
        now: Time,
        c: &Control,
        pk: Option<PeerKey>,
        buf: &mut Vec<u8>,
    ) -> wire::PacketType {
        let pk = pk.or_else(|| self.peers.find(c.dest));
        let stamp = Stamp {
            now,
            echo_time: pk.map_or(0, |k| self.peers[k].echo(now, self.derived.echo_hold())),
            cutoff_version: self.derived.cutoff_version(),
            cutoffs: self.derived.cutoffs(),
            checksum: self.derived.checksum(),
        };
        c.encode(&stamp, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// `poll_nothing_to_send` answers true only when `poll_transmit` would
    /// find nothing, through a request long enough to need grants (so the
    /// receiver queues control packets) and its response, between two
    /// endpoints polled after every packet, and both answers occur.
    #[test]
    fn poll_nothing_to_send_agrees_with_poll_transmit() {
        let addrs: [SocketAddr; 2] = [
            "10.0.0.1:4000".parse().unwrap(),
            "10.0.0.2:4000".parse().unwrap(),
        ];
        let mut eps: Vec<Endpoint> = (0..2)
            .map(|i| {
                let cfg = Config {
                    rpc_id_seed: 7 + i,
                    ..Config::default()
                };
                Endpoint::new(cfg, 0).unwrap()
            })
            .collect();
        let request = Bytes::from(vec![5u8; 300_000]);
        let id = eps[0].send_request(0, addrs[1], request).unwrap();
        let mut flight: VecDeque<(usize, Vec<u8>)> = VecDeque::new();
        let (mut now, mut yes, mut no) = (0, 0u32, 0u32);
        let mut buf = Vec::new();
        let mut done = false;
        for _ in 0..100_000 {
            now += 100;
            for (i, ep) in eps.iter_mut().enumerate() {
                loop {
                    let before = ep.last_now;
                    if ep.poll_nothing_to_send(now) {
                        yes += 1;
                        assert_eq!(ep.last_now, before.max(now));
                        ep.last_now = before;
                        assert!(ep.poll_transmit(now, &mut buf).is_none());
                        assert_eq!(ep.last_now, before.max(now));
                        break;
                    }
                    no += 1;
                    assert_eq!(ep.last_now, before, "false must change nothing");
                    match ep.poll_transmit(now, &mut buf) {
                        Some(t) => flight.push_back((1 - i, buf[..t.len].to_vec())),
                        None => break,
                    }
                }
            }
            while let Some((to, d)) = flight.pop_front() {
                eps[to].handle_datagram(now, addrs[1 - to], &d);
            }
            while let Some(ev) = eps[1].poll_event() {
                if let Event::Request { rpc, .. } = ev {
                    eps[1]
                        .send_response(now, rpc, Bytes::from_static(b"ok"))
                        .unwrap();
                }
            }
            if let Some(Event::Response { id: got, .. }) = eps[0].poll_event() {
                assert_eq!(got, id);
                done = true;
                break;
            }
        }
        assert!(done, "the RPC completes");
        assert!(yes > 10 && no > 200, "yes {yes} no {no}");
    }

    /// Hands every packet endpoint `from` has to send to its destination.
    fn deliver(eps: &mut [Endpoint], addrs: &[SocketAddr], from: usize, now: Time) {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        while let Some(t) = eps[from].poll_transmit(now, &mut buf) {
            let to = addrs.iter().position(|a| *a == t.dest).unwrap();
            out.push((to, buf[..t.len].to_vec()));
        }
        for (to, d) in out {
            eps[to].handle_datagram(now, addrs[from], &d);
        }
    }

    /// `abandon` and `send_response` find the right server RPC whether or
    /// not it is the latest request's (whose slot `server_rpc` tries first),
    /// also when two clients use the same RPC id.
    #[test]
    fn server_rpc_handles_resolve_to_their_own_rpc() {
        let addrs: Vec<SocketAddr> = (1..=3)
            .map(|i| format!("10.0.0.{i}:4000").parse().unwrap())
            .collect();
        // Clients 1 and 2 share an id seed: their first RPCs have one id.
        let mut eps: Vec<Endpoint> = [1u64, 9, 9]
            .iter()
            .map(|&seed| {
                let cfg = Config {
                    rpc_id_seed: seed,
                    ..Config::default()
                };
                Endpoint::new(cfg, 0).unwrap()
            })
            .collect();
        let a = eps[1]
            .send_request(0, addrs[0], Bytes::from_static(b"a"))
            .unwrap();
        let b = eps[2]
            .send_request(0, addrs[0], Bytes::from_static(b"b"))
            .unwrap();
        assert_eq!(a, b, "same id from both clients");
        deliver(&mut eps, &addrs, 1, 10);
        deliver(&mut eps, &addrs, 2, 20);
        let mut handles = Vec::new();
        while let Some(ev) = eps[0].poll_event() {
            if let Event::Request { rpc, message } = ev {
                handles.push((rpc, message.to_vec()));
            }
        }
        assert_eq!(handles.len(), 2);
        assert_eq!(handles[1].1, b"b", "client 2's request is the latest");
        assert_eq!(eps[0].rpcs.servers(), 2);
        // Client 1's handle (same id as the latest, another peer) must not
        // free client 2's RPC.
        eps[0].abandon(handles[0].0);
        assert_eq!(eps[0].rpcs.servers(), 1);
        eps[0].abandon(handles[0].0);
        assert_eq!(eps[0].rpcs.servers(), 1, "an abandoned handle is unknown");
        assert_eq!(
            eps[0].send_response(30, handles[0].0, Bytes::from_static(b"x")),
            Err(SendError::UnknownRpc)
        );
        eps[0]
            .send_response(30, handles[1].0, Bytes::from_static(b"to 2"))
            .unwrap();
        deliver(&mut eps, &addrs, 0, 40);
        match eps[2].poll_event() {
            Some(Event::Response { id, message }) => {
                assert_eq!(id, b);
                assert_eq!(message.to_vec(), b"to 2");
            }
            other => panic!("client 2 expected its response, got {other:?}"),
        }
        // An answered request is not abandoned (it waits for the client's ACK).
        assert_eq!(eps[0].rpcs.servers(), 1);
        eps[0].abandon(handles[1].0);
        assert_eq!(eps[0].rpcs.servers(), 1);
        // The latest request's slot, once freed, is not mistaken for a live RPC.
        eps[1]
            .send_request(50, addrs[0], Bytes::from_static(b"c"))
            .unwrap();
        deliver(&mut eps, &addrs, 1, 60);
        let Some(Event::Request { rpc: c, .. }) = eps[0].poll_event() else {
            panic!("a request");
        };
        assert_eq!(eps[0].rpcs.servers(), 2);
        eps[0].abandon(c);
        assert_eq!(eps[0].rpcs.servers(), 1);
        eps[0].abandon(c);
        assert_eq!(eps[0].rpcs.servers(), 1);
        assert_eq!(
            eps[0].send_response(70, c, Bytes::from_static(b"x")),
            Err(SendError::UnknownRpc)
        );
    }
}
