//! Engine configuration: the parameters of one endpoint, and
//! [`Config::for_network`], which derives every network-dependent one from a
//! [`NetworkProfile`] so that no driver re-derives them. Every default and
//! every formula is explained in `docs/protocol.md` §8.

use crate::onramp::OnRampParams;
use crate::priorities::{MessageSizes, PriorityPlan};
use crate::rtt::Threshold;
use crate::window::WindowParams;
use crate::wire::{DATA_PACKET_OVERHEAD, MAX_PRIORITIES};
use thiserror::Error;

/// The largest packet (UDP payload) the engine makes: a DATA packet's
/// payload length is 16 bits on the wire, and 65,000 leaves room for the
/// IPv4/IPv6 and UDP headers under 65,535.
pub const MAX_PACKET_SIZE: usize = 65_000;

/// Parameters of one endpoint. Drivers build it with [`Config::for_network`]
/// (then set their own resource limits and switches, e.g. `pool_bytes`,
/// `checksum`). `Config::default()` holds the base values that derivation
/// starts from; on its own it suits a 25 Gbps datacenter network with a
/// round trip of about 20 µs, similar to the Linux module's defaults, and is
/// what the engine's unit tests and `proto_bench` use.
///
/// `#[non_exhaustive]`: outside this crate, change settings with the
/// `with_*` setters (each names its default), e.g.
/// `Config::default().with_link_bps(10_000_000_000).with_rtt_ns(10_000)`.
/// The fields are public to read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Rate of this host's link, bits per second. Drives the NIC queue model and
    /// the default window sizes.
    pub link_bps: u64,
    /// Round-trip time (ns) for a small packet, including software on both ends.
    pub rtt_ns: u64,
    /// Largest datagram the engine emits (UDP payload bytes, headers included).
    pub max_packet_size: usize,
    /// Bytes each datagram costs on the wire beyond its UDP payload, for the
    /// NIC queue model: IPv4 (20) + UDP (8) + Ethernet header and FCS (18) +
    /// preamble and inter-frame gap (20) = 66.
    pub packet_overhead_bytes: u32,
    /// Leading bytes of each message sent without a grant. `None`: one RTT's worth
    /// of bytes at `link_bps` (rtt_bytes).
    pub unsched_bytes: Option<u32>,
    /// Bytes the receiver lets a scheduled message have in flight beyond what it
    /// has received. `None`: rtt_bytes.
    pub grant_window: Option<u32>,
    /// Number of priority levels in use (1..=8). Level `n-1` is the highest.
    pub priority_levels: u8,
    /// How many of the highest levels are reserved for unscheduled packets
    /// (1..=priority_levels). When equal to `priority_levels`, scheduled packets
    /// share level 0.
    pub unsched_priorities: u8,
    /// Unscheduled priority cutoffs announced to senders: a message of length L
    /// uses the highest unscheduled level `i` (counting down from the top) with
    /// `L <= unsched_cutoffs[i]`. Must be ascending; the last entry should be
    /// `u32::MAX`. Only the first `unsched_priorities` entries are used.
    pub unsched_cutoffs: [u32; MAX_PRIORITIES],
    /// Version of `unsched_cutoffs`; change it whenever they change.
    pub cutoff_version: u16,
    /// Messages the receiver grants to at once (controlled overcommitment).
    pub max_overcommit: usize,
    /// How the receiver decides which incoming messages get grants:
    /// Homa's SRPT with controlled overcommitment, or RAMCloud
    /// BasicTransport's grant to every message (`docs/protocol.md` §4.3).
    pub grant_policy: GrantPolicy,
    /// Scheduled levels counted from the top: the message of SRPT rank 0
    /// always gets the highest scheduled level, rank 1 the next, ... When
    /// false, the levels are counted from the bottom: with fewer granted
    /// messages than scheduled levels they use the lowest ones (the paper's
    /// rule, which lets a larger newcomer's packets overtake an older,
    /// shorter message's; `docs/protocol.md` §4.3).
    pub sched_levels_from_top: bool,
    /// Keep the highest scheduled level for messages' last window: a grant
    /// that leaves at most one grant window of a message to grant goes at
    /// that level, and SRPT ranks take the levels below it (rank 0 the
    /// second highest). A message that becomes a receiver's shortest
    /// otherwise sends its last packets at the level where the previous
    /// shortest still has a window in flight, in the same switch queues,
    /// and waits behind them (issue #17's W5 deciles 2-6,
    /// `docs/simulation.md`). Applies only with at least four scheduled
    /// levels, so that three remain for ranks.
    pub sched_tail_level: bool,
    /// Packets of window beyond `grant_window` for each receiver's
    /// top-ranked (shortest) message. Under load a packet's round trip is
    /// longer than the unloaded one the window covers (at 80% load in the
    /// paper's network, DATA transit 7.5 µs instead of 5.3 and GRANT 3.5
    /// instead of 2.5), so a message granted one window at a time stalls
    /// every round trip; the one message the receiver wants at line rate
    /// gets the slack. Only that one: more window for every message puts
    /// more bytes at the levels of shorter ones (`docs/simulation.md`).
    /// Static windows only: adaptive ones are three measured round trips.
    pub lead_window_packets: u32,
    /// Boost the tail: once fewer than this many bytes of a message remain
    /// to be granted, its grants carry the higher of its level by rank and
    /// the unscheduled level of a message of that remaining size. `None`:
    /// the grant window (HomaSimulation's rule); `Some(0)`: off, the
    /// default: with levels counted from the top it measured worse (W3's
    /// and W4's small messages 1-7% at p99, docs/simulation.md).
    pub boost_tail_bytes: Option<u32>,
    /// Cap on bytes granted but not yet received, across all incoming messages.
    /// `None`: `max_overcommit × grant_window`.
    pub max_incoming: Option<u64>,
    /// Per-mille of granted bytes given to the oldest message instead of the
    /// shortest, so that large messages cannot starve.
    pub grant_fifo_permille: u32,
    /// Per-mille of transmitted bytes given to the oldest outgoing message
    /// instead of the shortest.
    pub pacer_fifo_permille: u32,
    /// A message with at most the unscheduled window left to send (it
    /// needs no grant) goes before pending retransmissions, which otherwise
    /// go first (`docs/protocol.md` §3.2): a RESEND asks for up to a window
    /// of packets, and a short message behind them waits that many packet
    /// times.
    pub short_before_retransmit: bool,
    /// The NIC queue estimate may be at most this many ns when a packet is
    /// released. `None`: the transmission time of one full-size packet.
    pub max_nic_queue_ns: Option<u64>,
    /// Messages no longer than this skip the queue limit (they are sent at once).
    pub pacer_bypass_bytes: u32,
    /// Silence (ns) after which a receiver asks for missing bytes again.
    /// `None`: derived from the link, max(1 ms, 100 full packets' wire
    /// time) ([`Self::effective_resend_interval_ns`]).
    pub resend_interval_ns: Option<u64>,
    /// Silence (ns) from a peer after which an RPC is abandoned (client: fails
    /// with [`crate::RpcError::Timeout`]). `None`: derived from the link,
    /// max(2 s, 100 wire times of the largest message)
    /// ([`Self::effective_rpc_timeout_ns`]).
    pub rpc_timeout_ns: Option<u64>,
    /// A server keeps the id of an acknowledged RPC this long (ns) so that
    /// delayed duplicates of its request are not executed again. `None`:
    /// 20 resend intervals ([`Self::effective_tombstone_ns`]).
    pub tombstone_ns: Option<u64>,
    /// A peer with no RPCs is forgotten after this long (ns).
    pub peer_idle_ns: u64,
    /// Largest message accepted or sent.
    pub max_message_length: u32,
    /// Requests at least this long are delivered incrementally: the
    /// application gets an [`crate::Event::PartialRequest`] when the first
    /// bytes are in the pool and reads the rest as it arrives
    /// ([`crate::PartialMessage`]). `u32::MAX` (the default): every request
    /// is delivered whole.
    pub partial_delivery_bytes: u32,
    /// A stream's receive window: the reader lets the writer send this
    /// many bytes beyond what it has read (credit), so a stream holds at
    /// most this much at the reader, and at the writer this much plus the
    /// message being written (`docs/streams.md` §2.3).
    pub stream_window_bytes: u32,
    /// A stream's credit beyond what its reader consumed while short
    /// messages (sent whole unscheduled) arrive at this endpoint, in the
    /// [`crate::stream::STREAM_YIELD_NS`] after each: they share the
    /// receiver's socket with the stream's bytes and land behind every
    /// byte already credited (`docs/streams.md` §2.2). `None`: derived, a
    /// quarter of an RTT of whole packets, at least one packet
    /// ([`Self::effective_stream_yield_bytes`]); 0: streams never yield.
    pub stream_yield_bytes: Option<u32>,
    /// Most streams open at once (opened here or by peers; closed streams
    /// linger a tombstone time and count).
    pub max_streams: usize,
    /// The least share (per mille) of the sender's packets that streams
    /// with bytes to send get while shorter messages are sendable: a
    /// stream that waited behind messages for that many bytes goes next.
    pub stream_share_permille: u32,
    /// Most concurrent server RPCs from one peer.
    pub max_server_rpcs_per_peer: usize,
    /// Most concurrent server RPCs of this endpoint, from all peers.
    pub max_server_rpcs: usize,
    /// Most concurrent client RPCs of this endpoint.
    pub max_client_rpcs: usize,
    /// Most peers tracked at once.
    pub max_peers: usize,
    /// Receive pool size in bytes.
    pub pool_bytes: usize,
    /// Compute a checksum (CRC-32C) for every packet we send. Independent of
    /// it, a received packet that carries a checksum is always verified, so
    /// endpoints with different settings still talk to each other.
    pub checksum: bool,
    /// Also drop received packets that carry no checksum (field 0). Off by
    /// default: a peer that does not compute checksums is still heard. Tests
    /// that inject corruption set it, so that no corrupted packet gets by.
    pub require_checksum: bool,
    /// Simulation only: reserve pool space and track every byte as usual, but
    /// do not copy payloads into the pool, so delivered messages have the
    /// right length and unspecified contents. Spares a simulator of thousands
    /// of hosts the memory and page faults of data nobody reads.
    pub discard_payload: bool,
    /// Hold back acknowledgements that clients piggyback on requests, and
    /// the freeing of client RPCs whose response has been delivered, and
    /// apply them in [`crate::Endpoint::run_deferred`], which a driver calls
    /// once it has sent what the engine had ready (or at the next
    /// `handle_datagram(s)`/`handle_timeout`, or when a limit needs the room
    /// they free). Freeing the acknowledged RPC cost a server ~100 ns between
    /// a request's arrival and its reply, and freeing a completed RPC cost a
    /// client ~20 ns between a response and its next request. Protocol-wise
    /// the same as an acknowledgement that arrives a little later; a
    /// completed RPC is invisible meanwhile. Off by default, so that drivers
    /// that never call `run_deferred` see every state change at once; the
    /// UDP runtime turns it on.
    pub defer_acks: bool,
    /// Zero padding for short DATA datagrams sent to IPv4 peers (see
    /// [`PadWindow`]). Off by default.
    pub pad_v4: PadWindow,
    /// The same for IPv6 peers.
    pub pad_v6: PadWindow,
    /// Seed for this endpoint's first RPC id. Ids must not repeat across
    /// restarts of an endpoint at the same address, so drivers pass something
    /// that differs per incarnation (time, random).
    pub rpc_id_seed: u64,
    /// Where each peer's unscheduled bytes and grant window come from: the
    /// static `unsched_bytes` and `grant_window`, or each peer's measured
    /// RTT (seed 003; `docs/congestion.md`). Static by default until the
    /// adaptive policy is measured against it.
    pub window_policy: WindowPolicy,
    /// A timestamp received from a peer is echoed back to it (advanced by
    /// the time held, wire format version 4) for at most this long (ns);
    /// after that, packets echo nothing until the peer sends a new one. The
    /// hold is measured on our clock and subtracted from a time on the
    /// peer's, so the sample is off by the hold times the clocks' rate
    /// difference: 1 ms at 100 ppm (crystal tolerance, NTP slewing) is
    /// 100 ns, small against a datacenter RTT; an echo held across an idle
    /// second could be off by 100 µs.
    pub max_echo_hold_ns: u64,
    /// Measure each peer's RTT (windowed minimum, latest, smoothed) and
    /// detect congestion even under [`WindowPolicy::Static`], for
    /// [`crate::Endpoint::peer_rtt`] and the metrics. Adaptive windows
    /// measure anyway. Off by default: it touches one more cache line per
    /// packet that carries an echo.
    pub measure_rtt: bool,
    /// Length (ns) of the sliding window over which a peer's `rtt_min` is
    /// the smallest sample, so that a route change is followed within one
    /// to two windows. Long against a congestion episode (the minimum must
    /// outlive one, or congestion would become the new normal) and short
    /// against route changes: BBR's 10 s.
    pub rtt_min_window_ns: u64,
    /// A peer is congested while its latest RTT sample exceeds this many
    /// times its `rtt_min` (seed 003's `rtt_high = 8 × rtt_min`), under
    /// [`CongestionSignal::Latest`].
    pub rtt_high_factor: u32,
    /// Which RTT says a peer is congested: the latest sample (seed 003's
    /// rule, the default) or the smoothed one (its proposed refinement).
    pub congestion_signal: CongestionSignal,
    /// Under [`WindowPolicy::Adaptive`], a peer's grant window is this many
    /// of its `rtt_min` at `link_bps` (seed 003's `rtt_grant = 3 × rtt_min`).
    pub rtt_grant_factor: u32,
    /// Under [`WindowPolicy::Adaptive`], a sender halves a peer's
    /// unscheduled window when, over its last RTT, the unscheduled bytes of
    /// the messages it started to that peer were less than this per-mille
    /// of their length while a message to it waited for grants (seed 003:
    /// 40%).
    pub unsched_ratio_permille: u32,
    /// Under [`WindowPolicy::Adaptive`], a peer's grant window also covers
    /// a standing queue of other traffic on its path (such as TCP's in a
    /// switch queue Homa shares with it): the window becomes
    /// `max(rtt_grant_factor × rtt_min, rtt_min + foreign queue)` at
    /// `link_bps`, where the foreign queue is `srtt − rtt_min` times the
    /// share of the link that this receiver's own DATA left idle over the
    /// last RTT (its own incast keeps its link busy and so counts for
    /// nothing). Without it a message gets a window sized for the empty
    /// path and moves at window / (RTT + queue), a share of the link that
    /// shrinks as the other traffic's queue grows (docs/congestion.md §8).
    /// Off by default: on the testbed it doubles Homa's throughput next to
    /// TCP but does not shorten its short messages' tail, and in the
    /// simulator's 500 KB incast it triples the drops (losses idle the
    /// link, which then looks foreign).
    pub grant_covers_foreign_queue: bool,
    /// Under [`WindowPolicy::Adaptive`], the receiver's budget (bytes) for
    /// what will queue at its own downlink: a grant pass keeps the bytes
    /// still to arrive at this receiver (granted or unscheduled, of every
    /// message it knows) within this budget plus the bandwidth-delay
    /// product its top messages fill on their paths, rather than within
    /// `max_overcommit` × the widest window (docs/congestion.md §9).
    /// `None`: [`Self::effective_downlink_budget`] derives it from
    /// `link_bps`. `Some(0)`: no budget (seed 003's cap).
    pub downlink_budget: Option<u32>,
    /// Under [`WindowPolicy::Adaptive`] with a downlink budget, a sender
    /// also halves a peer's unscheduled window (at most once per smoothed
    /// RTT) when a message to it waited for its first grant more than two
    /// smoothed RTTs after its unscheduled bytes: the receiver was
    /// rationing its downlink among other messages, so unscheduled bytes
    /// sent to it only queue there (an incast). The window then grows
    /// back only while new messages start to the peer. The RTT cannot say
    /// this: the echo leaves out the time the receiver held the message,
    /// and a shallow buffer's queue stays far below 8 × a far peer's
    /// `rtt_min` (docs/congestion.md §9).
    pub unsched_cut_when_rationed: bool,
    /// On-Ramp (issue #22, `docs/onramp.md`): hold a destination's DATA at
    /// this sender while the one-way queueing delay it reports exceeds
    /// [`Self::effective_onramp_threshold_ns`]. Off by default until a
    /// measurement says it helps.
    pub onramp: bool,
    /// On-Ramp's threshold T (ns) on the reported queueing delay; `None`:
    /// [`Self::effective_onramp_threshold_ns`] derives it from the link.
    pub onramp_threshold_ns: Option<u64>,
    /// The longest single On-Ramp hold (ns), so that a forged or stale
    /// report cannot stall a destination; `None`:
    /// [`Self::effective_onramp_max_hold_ns`].
    pub onramp_max_hold_ns: Option<u64>,
    /// Length (ns) of each of the two buckets over which the minimum
    /// one-way delay to a peer is kept. The clock offset between two hosts
    /// cancels in `owd − min`, but drift does not: the minimum may be up to
    /// two windows old, so at a 50 ppm rate difference the queueing delay is
    /// off by up to 2 × 10 ms × 50 ppm = 1 µs. Long against an incast (so
    /// its queue does not become the minimum), short against drift.
    pub onramp_owd_window_ns: u64,
    /// After an On-Ramp hold of length h, no new hold of that destination
    /// (or of this receiver's grants) starts before it has been open h ×
    /// this / 1000: it is held at most 1000 / (1000 + this) of the time,
    /// whatever its reports say (forged or stale), so a transfer takes at
    /// most (1000 + this) / this times as long. `None`:
    /// [`Self::effective_onramp_open_permille`].
    pub onramp_open_permille: Option<u32>,
    /// On-Ramp starts a hold only on a report about a packet sent after
    /// the destination's previous hold ended (its `echo_time`, our clock,
    /// is not earlier): a report about a packet sent before the hold
    /// describes the queue the hold was already for.
    pub onramp_fresh_reports: bool,
    /// With On-Ramp on, a receiver also holds its grants, by the same rule
    /// and bounds, while its own downlink's queueing delay exceeds T: the
    /// one-way delay of each arriving DATA packet (our arrival minus its
    /// send time, minus that sender's windowed minimum) shows the queue
    /// behind it at once, from every sender, where a sender learns of it
    /// only from the packets sent back to it. Grants are the scheduled
    /// bytes' permission to leave their senders, so withholding them keeps
    /// those bytes at the edge, which is On-Ramp's aim (docs/onramp.md
    /// §2.1; measured in §6.9). Under SRPT grants (`GrantPolicy::Srpt`) on a
    /// network with one priority level only (granting every message, or
    /// several levels, keep the sender's holds alone). No effect with
    /// On-Ramp off.
    pub onramp_hold_grants: bool,
}

/// Which RTT value signals congestion (`docs/congestion.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CongestionSignal {
    /// The latest sample above `rtt_high_factor` × `rtt_min` (seed 003):
    /// seen at the first late packet, and gone at the first prompt one.
    #[default]
    Latest,
    /// The smoothed RTT (RFC 6298's SRTT, which moves an eighth of the way
    /// to each sample) above `factor` × `rtt_min`: seed 003's proposed
    /// "deviation of the average RTT from rtt_mid = 3 × rtt_min". Not
    /// fooled by one delayed packet; sees a sustained rise a few samples
    /// later.
    Smoothed {
        /// Seed 003 proposes 3.
        factor: u32,
    },
}

/// Where the windows a peer gets come from (`docs/congestion.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WindowPolicy {
    /// Every peer gets `unsched_bytes` and `grant_window` (derived from the
    /// configured `rtt_ns`), as the Linux module does.
    #[default]
    Static,
    /// Seed 003's per-peer windows from each peer's measured RTT: the grant
    /// window is `rtt_grant_factor × rtt_min` of bytes at `link_bps`, and
    /// `max_incoming` (when unset) `max_overcommit` of the largest window
    /// being granted; the unscheduled window starts at the peer's
    /// bandwidth-delay product (`rtt_min` at `link_bps`), is halved (at most
    /// once per smoothed RTT) when the peer is congested or its unscheduled
    /// ratio is low while messages wait for grants, and otherwise grows by a
    /// packet per smoothed RTT up to that product. Until a peer has a
    /// sample, it gets the static values.
    Adaptive,
}

/// Which incoming messages a receiver grants to (`docs/protocol.md` §4.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GrantPolicy {
    /// Homa: the `max_overcommit` messages with the fewest remaining bytes,
    /// a window each, under the `max_incoming` cap, plus the FIFO share.
    #[default]
    Srpt,
    /// RAMCloud's BasicTransport: on every DATA packet of a message that
    /// needs grants, if its grant is below `bytes_received + grant_window`,
    /// it becomes `bytes_received + grant_window + increment_bytes` (at most
    /// the message's length). Every message, independently: no ranking, no
    /// overcommitment limit, no cap, no FIFO share. O(1) per packet.
    EveryMessage {
        /// Bytes granted beyond the window at each grant (BasicTransport: 5
        /// full packets), so that a GRANT goes out every few packets.
        increment_bytes: u32,
    },
}

/// Ns to transmit a datagram of `bytes` (UDP payload) at `link_bps`,
/// including `overhead_bytes` of per-packet overhead (at least 1): the one
/// formula behind [`Config::wire_time_ns`] and the pacer's copy of it.
pub(crate) fn wire_time_ns(bytes: usize, overhead_bytes: u32, link_bps: u64) -> u64 {
    let bps = link_bps.max(1);
    // Once per packet: 64-bit division when the product fits (always,
    // for real packet sizes), the exact 128-bit one otherwise.
    let bits_ns = (bytes as u64)
        .checked_add(overhead_bytes as u64)
        .and_then(|w| w.checked_mul(8_000_000_000));
    match bits_ns {
        Some(b) => (b / bps).max(1),
        None => {
            let wire = bytes as u128 + overhead_bytes as u128;
            ((wire * 8_000_000_000) / bps as u128).max(1) as u64
        }
    }
}

/// DATA datagrams of `from..to` bytes (UDP payload) go out padded with zeros
/// to `to` bytes; the header declares the padding and receivers skip it.
/// Some kernels handle datagrams of some sizes markedly slower than slightly
/// larger ones (see the UDP runtime's defaults); padding moves short messages
/// out of such a range. `to` of 0 (the default) turns padding off; `to - from`
/// is at most 255.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PadWindow {
    /// Shortest datagram (UDP payload bytes) that gets padded.
    pub from: u16,
    /// Length padded datagrams are sent at, and the window's exclusive upper
    /// end; 0 turns padding off.
    pub to: u16,
}

impl PadWindow {
    /// Padding bytes for a datagram of `len` bytes.
    #[inline]
    pub fn pad(&self, len: usize) -> u8 {
        if len >= self.from as usize && len < self.to as usize {
            (self.to as usize - len) as u8
        } else {
            0
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            link_bps: 25_000_000_000,
            rtt_ns: 20_000,
            max_packet_size: 1472,
            packet_overhead_bytes: 66,
            unsched_bytes: None,
            grant_window: None,
            priority_levels: 8,
            unsched_priorities: 4,
            unsched_cutoffs: [
                1_000,
                10_000,
                100_000,
                u32::MAX,
                u32::MAX,
                u32::MAX,
                u32::MAX,
                u32::MAX,
            ],
            cutoff_version: 1,
            max_overcommit: 8,
            grant_policy: GrantPolicy::Srpt,
            sched_levels_from_top: true,
            sched_tail_level: true,
            lead_window_packets: 2,
            boost_tail_bytes: Some(0),
            max_incoming: None,
            grant_fifo_permille: 50,
            pacer_fifo_permille: 50,
            short_before_retransmit: true,
            max_nic_queue_ns: None,
            pacer_bypass_bytes: 1_000,
            resend_interval_ns: None,
            rpc_timeout_ns: None,
            tombstone_ns: None,
            peer_idle_ns: 10_000_000_000,
            max_message_length: 1_000_000,
            partial_delivery_bytes: u32::MAX,
            stream_window_bytes: 1 << 20,
            stream_yield_bytes: None,
            max_streams: 65_536,
            stream_share_permille: 100,
            max_server_rpcs_per_peer: 10_000,
            max_server_rpcs: 100_000,
            max_client_rpcs: 100_000,
            max_peers: 10_000,
            pool_bytes: 64 << 20,
            checksum: true,
            require_checksum: false,
            discard_payload: false,
            defer_acks: false,
            pad_v4: PadWindow::default(),
            pad_v6: PadWindow::default(),
            rpc_id_seed: 1,
            window_policy: WindowPolicy::Static,
            max_echo_hold_ns: 1_000_000,
            measure_rtt: false,
            rtt_min_window_ns: 10_000_000_000,
            rtt_high_factor: 8,
            congestion_signal: CongestionSignal::Latest,
            rtt_grant_factor: 3,
            unsched_ratio_permille: 400,
            grant_covers_foreign_queue: false,
            downlink_budget: None,
            unsched_cut_when_rationed: true,
            onramp: false,
            onramp_threshold_ns: None,
            onramp_max_hold_ns: None,
            onramp_owd_window_ns: 10_000_000,
            onramp_open_permille: None,
            onramp_fresh_reports: false,
            onramp_hold_grants: true,
        }
    }
}

/// A configuration value is out of range.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// What a driver knows about the network an endpoint runs on (and the
/// traffic it expects): the input of [`Config::for_network`]. Only facts go
/// in; every parameter that follows from them is derived in the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkProfile {
    /// Rate the engine paces to, bits per second: the host link, or the part
    /// of it a shaper leaves for UDP payload.
    pub link_bps: u64,
    /// Round-trip time (ns) for a small packet, including software on both ends.
    pub rtt_ns: u64,
    /// Largest datagram (UDP payload bytes, headers included): the path MTU
    /// minus IP and UDP headers.
    pub max_packet_size: usize,
    /// Wire bytes per datagram beyond its UDP payload (see
    /// [`Config::packet_overhead_bytes`]).
    pub packet_overhead_bytes: u32,
    /// Largest message the application sends or accepts.
    pub max_message_length: u32,
    /// Priority levels the network honours (1..=8).
    pub priority_levels: u8,
    /// The expected message sizes, if known: the unscheduled priority plan
    /// (levels and cutoffs) is computed from them. `None` keeps the
    /// workload-agnostic decade cutoffs.
    pub message_sizes: Option<MessageSizes>,
    /// How many full packets the driver may let the NIC queue hold when the
    /// pacer releases one: 0 for a driver that is called exactly when the
    /// NIC finishes a packet and models a NIC fed one packet at a time (the
    /// paper's simulator: the next packet is chosen when the previous one
    /// has left, so a new short message waits for at most one packet);
    /// 1 for a driver called at every packet time; more for one that is
    /// woken late or hands the NIC batches (a user-space thread on a shared
    /// machine: 2).
    pub nic_queue_packets: u32,
    /// Experiment override of the unscheduled bytes per message (`None`:
    /// derived, one RTT of whole packets).
    pub unsched_bytes: Option<u32>,
    /// Experiment override of the number of unscheduled levels (`None`:
    /// derived from the message sizes, or half the levels without them).
    pub unsched_priorities: Option<u8>,
}

impl Default for NetworkProfile {
    /// The network of `Config::default()`: 25 Gbps, 20 µs, 1500-byte MTU
    /// over IPv4, 1 MB messages, 8 levels, sizes unknown, one packet of NIC
    /// queue.
    fn default() -> Self {
        let c = Config::default();
        NetworkProfile {
            link_bps: c.link_bps,
            rtt_ns: c.rtt_ns,
            max_packet_size: c.max_packet_size,
            packet_overhead_bytes: c.packet_overhead_bytes,
            max_message_length: c.max_message_length,
            priority_levels: c.priority_levels,
            message_sizes: None,
            nic_queue_packets: 1,
            unsched_bytes: None,
            unsched_priorities: None,
        }
    }
}

/// Wire times of this many full packets at least separate RESENDs
/// (`docs/protocol.md` §8).
pub const RESEND_PACKET_TIMES: u64 = 100;
/// Wire times of this many largest messages at least pass before an RPC
/// times out.
pub const TIMEOUT_MESSAGE_TIMES: u64 = 100;
/// Resend intervals a tombstone lives.
pub const TOMBSTONE_RESEND_INTERVALS: u64 = 20;
/// The shortest derived resend interval (ns): on a fast link, 100 packet
/// times are less than the scheduling noise of a host.
pub const MIN_RESEND_INTERVAL_NS: u64 = 1_000_000;
/// The shortest derived RPC timeout (ns).
pub const MIN_RPC_TIMEOUT_NS: u64 = 2_000_000_000;
/// The default downlink budget (`Config::effective_downlink_budget`), in
/// time at the link rate: 30 µs is 94 KB at 25 Gbit/s, about a third of a
/// shallow switch buffer's share per port (256 KB, 82 µs there), the rest
/// left for the unscheduled bytes of messages the receiver does not know
/// yet (docs/congestion.md §9).
pub const DOWNLINK_BUDGET_NS: u64 = 30_000;
/// The default longest On-Ramp hold, in thresholds
/// (`Config::effective_onramp_max_hold_ns`).
pub const ONRAMP_MAX_HOLD_THRESHOLDS: u64 = 8;

/// On-Ramp's open time after a hold, per mille of the hold, where the
/// receiver holds its grants too (SRPT grants, one priority level): held
/// at most 1000 / 1750 of the time, so a forged report makes a transfer at
/// most 2.33 times as long (against 2 with 1000, the default elsewhere).
/// Chosen on the simulator's On-Ramp experiment (docs/onramp.md §6.10):
/// with 1000 the short messages' p99 gained 1.48-1.49× in four cells of
/// twenty rows, with 750 at least 1.51× in every cell, the incast no slower.
pub const ONRAMP_OPEN_PERMILLE_ONE_LEVEL: u32 = 750;

impl NetworkProfile {
    /// Bytes in one RTT at the link rate, rounded up to whole full packets'
    /// payload: the grant window and the default unscheduled bytes. A
    /// window that ends mid-packet costs a short packet's overhead and, with
    /// grants issued a packet at a time, stalls the sender.
    pub fn rtt_packet_bytes(&self) -> u32 {
        self.base().rtt_packet_bytes()
    }

    /// Leading bytes of each message sent unscheduled.
    pub fn unsched_bytes(&self) -> u32 {
        self.unsched_bytes
            .unwrap_or_else(|| self.rtt_packet_bytes())
    }

    /// The unscheduled priority plan for these message sizes (`None` when
    /// they are unknown).
    pub fn priority_plan(&self) -> Option<PriorityPlan> {
        self.message_sizes.as_ref().map(|sizes| {
            PriorityPlan::compute_with(
                sizes,
                self.unsched_bytes(),
                self.priority_levels,
                self.unsched_priorities,
            )
        })
    }

    /// `Config::default()` with this network's facts, nothing derived yet.
    fn base(&self) -> Config {
        Config {
            link_bps: self.link_bps,
            rtt_ns: self.rtt_ns,
            max_packet_size: self.max_packet_size,
            packet_overhead_bytes: self.packet_overhead_bytes,
            max_message_length: self.max_message_length,
            ..Config::default()
        }
    }
}

impl Config {
    /// The configuration for an endpoint on `network`: the base values of
    /// `Config::default()` with every network-dependent parameter derived
    /// (formulas in `docs/protocol.md` §8):
    ///
    /// * `grant_window` = one RTT of bytes rounded up to whole packets
    ///   ([`NetworkProfile::rtt_packet_bytes`]); `unsched_bytes` the same
    ///   unless overridden;
    /// * `resend_interval_ns`, `rpc_timeout_ns`, `tombstone_ns` unset, so
    ///   that the engine derives them from the link and packet size it is
    ///   finally given ([`Self::effective_resend_interval_ns`] and
    ///   neighbours);
    /// * `max_nic_queue_ns` = `nic_queue_packets` full packets' wire time
    ///   (`None`, which the engine reads as one packet, for 1; 0 for 0:
    ///   DATA only into an idle NIC);
    /// * levels, unscheduled levels and cutoffs from the message sizes
    ///   ([`PriorityPlan`]), or the decade cutoffs over half the levels
    ///   without them; `cutoff_version` moves on when the announced cutoffs
    ///   differ from the base ones.
    ///
    /// Drivers then set what is theirs alone (pool size, table limits,
    /// checksums, deferral, padding, the RPC id seed) and may still override
    /// any field for an experiment.
    pub fn for_network(network: &NetworkProfile) -> Config {
        let mut c = Config::default();
        c.apply_network(network);
        c
    }

    /// Sets the network's facts and derives every network-dependent field
    /// as [`Self::for_network`] does, leaving the rest (the driver's own
    /// switches and limits) as they are: for a driver whose defaults differ
    /// from `Config::default()`, such as the UDP runtime's. Idempotent.
    pub fn apply_network(&mut self, network: &NetworkProfile) {
        let base = Config::default();
        let c = self;
        c.link_bps = network.link_bps;
        c.rtt_ns = network.rtt_ns;
        c.max_packet_size = network.max_packet_size;
        c.packet_overhead_bytes = network.packet_overhead_bytes;
        c.max_message_length = network.max_message_length;
        c.grant_window = Some(network.rtt_packet_bytes());
        c.unsched_bytes = Some(network.unsched_bytes());
        // Derived from the facts just set, whenever the engine reads them.
        c.resend_interval_ns = None;
        c.rpc_timeout_ns = None;
        c.tombstone_ns = None;
        let packet_ns = c.wire_time_ns(c.max_packet_size);
        // `None` already means one full packet's wire time.
        c.max_nic_queue_ns = match network.nic_queue_packets {
            1 => None,
            n => Some(packet_ns.saturating_mul(n as u64)),
        };
        match network.priority_plan() {
            Some(plan) => plan.apply(c),
            None => {
                let before = c.cutoff_table();
                let levels = network.priority_levels.clamp(1, MAX_PRIORITIES as u8);
                c.priority_levels = levels;
                c.unsched_priorities = network
                    .unsched_priorities
                    .unwrap_or(levels.div_ceil(2))
                    .clamp(1, levels);
                c.unsched_cutoffs = base.unsched_cutoffs;
                if c.cutoff_table() != before {
                    c.cutoff_version = crate::priorities::next_cutoff_version(c.cutoff_version);
                }
            }
        }
    }

    /// The cutoffs table this endpoint announces in CUTOFFS packets, indexed
    /// by priority level: for `j < unsched_priorities`, level
    /// `priority_levels − 1 − j` gets `unsched_cutoffs[j]`; the lowest
    /// unscheduled level takes every length the higher ones do not
    /// (`u32::MAX`); scheduled levels are 0. Expects a valid level count.
    pub fn cutoff_table(&self) -> [u32; MAX_PRIORITIES] {
        let levels = (self.priority_levels as usize).clamp(1, MAX_PRIORITIES);
        let unsched = (self.unsched_priorities as usize).clamp(1, levels);
        let mut t = [0u32; MAX_PRIORITIES];
        for j in 0..unsched {
            t[levels - 1 - j] = self.unsched_cutoffs[j];
        }
        t[levels - unsched] = u32::MAX;
        t
    }

    /// Bytes in one RTT at the link rate.
    pub fn rtt_bytes(&self) -> u32 {
        let b = (self.link_bps as u128 * self.rtt_ns as u128 / 8_000_000_000) as u64;
        b.clamp(self.max_data_per_packet() as u64, u32::MAX as u64) as u32
    }
    /// Payload bytes in a full DATA packet.
    pub fn max_data_per_packet(&self) -> usize {
        self.max_packet_size.saturating_sub(DATA_PACKET_OVERHEAD)
    }
    /// [`Self::rtt_bytes`] rounded up to whole full packets' payload: the
    /// grant window and the unscheduled bytes when they are not set (see
    /// [`NetworkProfile::rtt_packet_bytes`], which is this for its network).
    pub fn rtt_packet_bytes(&self) -> u32 {
        let dpp = self.max_data_per_packet().max(1) as u32;
        self.rtt_bytes().div_ceil(dpp).saturating_mul(dpp)
    }
    /// Leading bytes of each message sent unscheduled: `unsched_bytes`, or
    /// one RTT of whole packets ([`Self::rtt_packet_bytes`]) when unset.
    pub fn effective_unsched_bytes(&self) -> u32 {
        self.unsched_bytes
            .unwrap_or_else(|| self.rtt_packet_bytes())
    }
    /// [`Self::stream_yield_bytes`], or, unset, a quarter of one RTT of
    /// bytes rounded up to whole full packets, at least one packet: enough
    /// to keep a stream moving at a quarter of the link while short
    /// messages come first (0: never yield).
    pub fn effective_stream_yield_bytes(&self) -> u32 {
        self.stream_yield_bytes.unwrap_or_else(|| {
            let dpp = self.max_data_per_packet().max(1) as u32;
            (self.rtt_bytes() / 4)
                .div_ceil(dpp)
                .max(1)
                .saturating_mul(dpp)
        })
    }
    /// Scheduled bytes granted ahead of what arrived: `grant_window`, or one
    /// RTT of whole packets when unset; at least one packet.
    pub fn effective_grant_window(&self) -> u32 {
        self.grant_window
            .unwrap_or_else(|| self.rtt_packet_bytes())
            .max(self.max_data_per_packet() as u32)
    }
    /// Bytes still to grant below which a message's grants are boosted to
    /// the unscheduled level of that size: `boost_tail_bytes`, or
    /// [`Self::effective_grant_window`] when unset; 0: no boost.
    pub fn effective_boost_tail_bytes(&self) -> u32 {
        self.boost_tail_bytes
            .unwrap_or_else(|| self.effective_grant_window())
    }
    /// Cap on granted but not yet received bytes: `max_incoming`, or
    /// `max_overcommit` × [`Self::effective_grant_window`] when unset.
    pub fn effective_max_incoming(&self) -> u64 {
        self.max_incoming
            .unwrap_or(self.max_overcommit as u64 * self.effective_grant_window() as u64)
    }
    /// The receiver's budget for bytes queued at its downlink under
    /// adaptive windows: `downlink_budget`, or [`DOWNLINK_BUDGET_NS`] of
    /// the link when unset, in whole packets, at least one; 0: off.
    pub fn effective_downlink_budget(&self) -> u32 {
        self.downlink_budget.unwrap_or_else(|| {
            let dpp = self.max_data_per_packet().max(1) as u64;
            let b = (self.link_bps as u128 * DOWNLINK_BUDGET_NS as u128 / 8_000_000_000) as u64;
            b.div_ceil(dpp)
                .max(1)
                .saturating_mul(dpp)
                .min(u32::MAX as u64) as u32
        })
    }
    /// Ns to transmit a datagram of `bytes` (UDP payload) at the link rate,
    /// including `packet_overhead_bytes` (at least 1).
    pub fn wire_time_ns(&self, bytes: usize) -> u64 {
        wire_time_ns(bytes, self.packet_overhead_bytes, self.link_bps)
    }
    /// This configuration with its windows (`unsched_bytes`,
    /// `grant_window`) and timers (`resend_interval_ns`, `rpc_timeout_ns`,
    /// `tombstone_ns`) written in as the engine derives them when they are
    /// unset: the values an endpoint made from it runs with, for reports.
    pub fn resolved(&self) -> Config {
        Config {
            unsched_bytes: Some(self.effective_unsched_bytes()),
            grant_window: Some(self.effective_grant_window()),
            boost_tail_bytes: Some(self.effective_boost_tail_bytes()),
            resend_interval_ns: Some(self.effective_resend_interval_ns()),
            rpc_timeout_ns: Some(self.effective_rpc_timeout_ns()),
            tombstone_ns: Some(self.effective_tombstone_ns()),
            ..self.clone()
        }
    }

    /// Silence after which a receiver asks for missing bytes again:
    /// `resend_interval_ns`, or max(1 ms, [`RESEND_PACKET_TIMES`] full
    /// packets' wire time) when unset.
    pub fn effective_resend_interval_ns(&self) -> u64 {
        self.resend_interval_ns.unwrap_or_else(|| {
            MIN_RESEND_INTERVAL_NS
                .max(RESEND_PACKET_TIMES.saturating_mul(self.wire_time_ns(self.max_packet_size)))
        })
    }
    /// Silence after which an RPC is abandoned: `rpc_timeout_ns`, or
    /// max(2 s, [`TIMEOUT_MESSAGE_TIMES`] wire times of the largest message)
    /// when unset.
    pub fn effective_rpc_timeout_ns(&self) -> u64 {
        self.rpc_timeout_ns.unwrap_or_else(|| {
            let message_ns = self.wire_time_ns(self.max_message_length as usize);
            MIN_RPC_TIMEOUT_NS.max(TIMEOUT_MESSAGE_TIMES.saturating_mul(message_ns))
        })
    }
    /// How long a tombstone lives: `tombstone_ns`, or
    /// [`TOMBSTONE_RESEND_INTERVALS`] resend intervals when unset.
    pub fn effective_tombstone_ns(&self) -> u64 {
        self.tombstone_ns.unwrap_or_else(|| {
            TOMBSTONE_RESEND_INTERVALS.saturating_mul(self.effective_resend_interval_ns())
        })
    }
    /// Most ns the NIC queue estimate may hold when a packet is released:
    /// `max_nic_queue_ns`, or one full-size datagram's wire time when unset.
    pub fn effective_max_nic_queue_ns(&self) -> u64 {
        self.max_nic_queue_ns
            .unwrap_or_else(|| self.wire_time_ns(self.max_packet_size))
    }

    /// On-Ramp's threshold T: `onramp_threshold_ns`, or when unset one RTT
    /// (`rtt_ns`, the time to drain `rtt_bytes` at the link rate, at least
    /// one full packet's wire time). Homa lets every sender put one RTT of
    /// unscheduled bytes in flight, so one RTT of queue at a receiver's
    /// downlink is what one new message makes on its own; more than that is
    /// several senders at once, the transient On-Ramp is for.
    pub fn effective_onramp_threshold_ns(&self) -> u64 {
        self.onramp_threshold_ns
            .unwrap_or_else(|| self.rtt_ns.max(self.wire_time_ns(self.max_packet_size)))
    }
    /// The longest single On-Ramp hold: `onramp_max_hold_ns`, or when unset
    /// [`ONRAMP_MAX_HOLD_THRESHOLDS`] × the threshold (an incast of that
    /// many RTTs' worth of queue is drained by one hold; beyond it, the
    /// next report decides again).
    pub fn effective_onramp_max_hold_ns(&self) -> u64 {
        self.onramp_max_hold_ns.unwrap_or_else(|| {
            ONRAMP_MAX_HOLD_THRESHOLDS.saturating_mul(self.effective_onramp_threshold_ns())
        })
    }

    /// Whether a receiver holds its grants as On-Ramp's sender holds its
    /// packets (`onramp_hold_grants`): only under SRPT grants on a network
    /// with one priority level (docs/onramp.md §2.1).
    pub fn onramp_grant_holds_apply(&self) -> bool {
        self.onramp_hold_grants
            && self.grant_policy == GrantPolicy::Srpt
            && self.priority_levels <= 1
    }

    /// `onramp_open_permille`, or when unset: 1000 (open at least as long
    /// as held, so held at most half of the time and a transfer at most
    /// twice as long), but [`ONRAMP_OPEN_PERMILLE_ONE_LEVEL`] where the
    /// receiver holds its grants too ([`Self::onramp_grant_holds_apply`]):
    /// without priorities the short messages have no protection but the
    /// holds (measured: docs/onramp.md §6.10).
    pub fn effective_onramp_open_permille(&self) -> u32 {
        self.onramp_open_permille
            .unwrap_or(if self.onramp_grant_holds_apply() {
                ONRAMP_OPEN_PERMILLE_ONE_LEVEL
            } else {
                1000
            })
    }

    /// Checks every field; the engine refuses an invalid configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError(m));
        if self.link_bps < 1_000_000 {
            return bad(format!("link_bps {} is below 1 Mbps", self.link_bps));
        }
        if self.max_packet_size < DATA_PACKET_OVERHEAD + 64
            || self.max_packet_size > MAX_PACKET_SIZE
        {
            return bad(format!(
                "max_packet_size {} must be in {}..={MAX_PACKET_SIZE}",
                self.max_packet_size,
                DATA_PACKET_OVERHEAD + 64
            ));
        }
        if self.priority_levels == 0 || self.priority_levels as usize > MAX_PRIORITIES {
            return bad(format!(
                "priority_levels {} must be 1..=8",
                self.priority_levels
            ));
        }
        if self.unsched_priorities == 0 || self.unsched_priorities > self.priority_levels {
            return bad(format!(
                "unsched_priorities {} must be 1..=priority_levels",
                self.unsched_priorities
            ));
        }
        let used = &self.unsched_cutoffs[..self.unsched_priorities as usize];
        if used.windows(2).any(|w| w[0] > w[1]) {
            return bad("unsched_cutoffs must be ascending".into());
        }
        if self.stream_window_bytes == 0 {
            return bad("stream_window_bytes must be at least 1".into());
        }
        if self.stream_share_permille == 0 || self.stream_share_permille > 1000 {
            return bad(format!(
                "stream_share_permille {} must be 1..=1000",
                self.stream_share_permille
            ));
        }
        if self.unsched_bytes == Some(0) {
            return bad(
                "unsched_bytes must be at least 1 (a message's first packet needs no grant)".into(),
            );
        }
        if self.effective_max_incoming() < self.max_data_per_packet() as u64 {
            return bad(format!(
                "max_incoming {} is below one packet's payload ({}): nothing could ever be granted",
                self.effective_max_incoming(),
                self.max_data_per_packet()
            ));
        }
        if self.cutoff_version == 0 {
            return bad("cutoff_version 0 means \"unknown\" on the wire; start at 1".into());
        }
        if self.max_overcommit == 0 {
            return bad("max_overcommit must be at least 1".into());
        }
        if let GrantPolicy::EveryMessage { increment_bytes } = self.grant_policy {
            if increment_bytes as u64 + self.effective_grant_window() as u64 > u32::MAX as u64 / 2 {
                return bad(format!(
                    "grant increment {increment_bytes} plus the grant window must be below 2^31"
                ));
            }
        }
        if self.lead_window_packets > 1024 {
            return bad(format!(
                "lead_window_packets {} is more than 1024 packets",
                self.lead_window_packets
            ));
        }
        if self.boost_tail_bytes.is_some_and(|b| b > i32::MAX as u32) {
            return bad("boost_tail_bytes must be below 2^31 (0 turns it off)".into());
        }
        if self.rtt_high_factor == 0
            || self.rtt_grant_factor == 0
            || self.congestion_signal == (CongestionSignal::Smoothed { factor: 0 })
        {
            return bad(
                "rtt_high_factor, rtt_grant_factor and a smoothed congestion factor must be at least 1"
                    .into(),
            );
        }
        if self.rtt_min_window_ns == 0 {
            return bad("rtt_min_window_ns must be positive".into());
        }
        if self.onramp
            && (self.effective_onramp_threshold_ns() == 0
                || self.effective_onramp_max_hold_ns() == 0
                || self.onramp_owd_window_ns == 0
                || self.effective_onramp_open_permille() == 0)
        {
            return bad(
                "onramp threshold, max hold, window and open permille must be positive".into(),
            );
        }
        if self.grant_fifo_permille > 1000
            || self.pacer_fifo_permille > 1000
            || self.unsched_ratio_permille > 1000
        {
            return bad(
                "fifo fractions and unsched_ratio_permille are per-mille (0..=1000)".into(),
            );
        }
        if self.effective_resend_interval_ns() == 0
            || self.effective_rpc_timeout_ns() < self.effective_resend_interval_ns()
        {
            return bad("need 0 < resend_interval_ns <= rpc_timeout_ns".into());
        }
        for (name, w) in [("pad_v4", self.pad_v4), ("pad_v6", self.pad_v6)] {
            if w.to != 0
                && (w.from > w.to
                    || (w.to - w.from) as usize > crate::wire::MAX_DATA_PAD
                    || w.to as usize > self.max_packet_size)
            {
                return bad(format!(
                    "{name} {}..{} must have from <= to <= max_packet_size and pad at most {} bytes",
                    w.from,
                    w.to,
                    crate::wire::MAX_DATA_PAD
                ));
            }
        }
        const DAY_NS: u64 = 86_400_000_000_000;
        for (name, v) in [
            ("resend_interval_ns", self.effective_resend_interval_ns()),
            ("rpc_timeout_ns", self.effective_rpc_timeout_ns()),
            ("tombstone_ns", self.effective_tombstone_ns()),
            ("peer_idle_ns", self.peer_idle_ns),
            ("rtt_ns", self.rtt_ns),
            ("max_nic_queue_ns", self.max_nic_queue_ns.unwrap_or(0)),
            ("rtt_min_window_ns", self.rtt_min_window_ns),
            ("max_echo_hold_ns", self.max_echo_hold_ns),
            ("onramp_threshold_ns", self.onramp_threshold_ns.unwrap_or(0)),
            ("onramp_max_hold_ns", self.onramp_max_hold_ns.unwrap_or(0)),
            ("onramp_owd_window_ns", self.onramp_owd_window_ns),
        ] {
            if v > DAY_NS {
                return bad(format!("{name} {v} is over a day"));
            }
        }
        if self.max_message_length == 0 {
            return bad("max_message_length must be positive".into());
        }
        if self.pool_bytes < self.max_message_length as usize {
            return bad(format!(
                "pool_bytes {} cannot hold one message of max_message_length {}",
                self.pool_bytes, self.max_message_length
            ));
        }
        if self.max_peers == 0
            || self.max_server_rpcs_per_peer == 0
            || self.max_server_rpcs == 0
            || self.max_client_rpcs == 0
        {
            return bad("limits must be positive".into());
        }
        Ok(())
    }
}

/// What an endpoint derives from its [`Config`] once, at creation, and then
/// only reads: kept apart from the `Config` so that the per-packet paths
/// read a few words instead of recomputing them.
// `repr(C)`, line-aligned: every value read per packet or per message
// sits in the first cache line (the per-packet paths read it anyway), the
// timers after it, the cutoffs (read per message and per CUTOFFS) last. In
// a simulator of many hosts each packet finds its endpoint cold, and the
// `Config` fields these copy sat on five lines of their own (W1, 30,000
// messages, cachegrind: about 0.1 L1 miss per event each).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct Derived {
    /// `Config::link_bps`, for the pacer's wire times.
    link_bps: u64,
    data_per_packet: u32,
    unsched_bytes: u32,
    /// `Config::max_echo_hold_ns` in echo ticks.
    echo_hold: u32,
    /// `Config::pacer_bypass_bytes` (read for every packet sent while the
    /// NIC queue is full).
    pacer_bypass_bytes: u32,
    /// `Config::max_message_length`.
    max_message_length: u32,
    /// `Config::packet_overhead_bytes`, for the pacer's wire times.
    packet_overhead_bytes: u32,
    /// `Config::max_client_rpcs` and `max_server_rpcs`, at most `u32::MAX`
    /// (more live RPCs than that cannot fit in memory: a larger limit is
    /// none either way).
    max_client_rpcs: u32,
    max_server_rpcs: u32,
    /// `Config::max_server_rpcs_per_peer`, likewise.
    max_server_rpcs_per_peer: u32,
    /// `Config::pad_v4`, `Config::pad_v6`.
    pad_v4: PadWindow,
    pad_v6: PadWindow,
    /// `Config::cutoff_version`.
    cutoff_version: u16,
    top_priority: u8,
    /// `Config::measure_rtt`, or adaptive windows.
    measure_rtt: bool,
    /// `Config::window_policy` is adaptive.
    adaptive: bool,
    /// `Config::require_checksum` (read for every datagram received).
    require_checksum: bool,
    /// A RESEND for each gap of a silent message (Homa, as the Linux
    /// module), or for its first only (`GrantPolicy::EveryMessage`, as
    /// RAMCloud's BasicTransport).
    resend_every_gap: bool,
    /// `Config::checksum` (read for every packet sent).
    checksum: bool,
    /// `Config::discard_payload` (read for every DATA packet received).
    discard_payload: bool,
    /// `Config::effective_stream_yield_bytes`.
    stream_yield_bytes: u32,
    keepalive_ns: u64,
    resend_interval_ns: u64,
    /// Bytes one timer tick asks for again, over all RPCs: the receiver's
    /// cap on granted bytes in flight (`Config::effective_max_incoming`;
    /// none when every message is granted).
    resend_budget: u64,
    rpc_timeout_ns: u64,
    tombstone_ns: u64,
    cutoffs: [u32; MAX_PRIORITIES],
    /// When a peer is congested (`Config::congestion_signal`).
    congestion: Threshold,
    /// What adaptive windows are computed from.
    windows: WindowParams,
    /// On-Ramp's parameters (`None`: off).
    onramp: Option<OnRampParams>,
}

const _: () = assert!(std::mem::offset_of!(Derived, discard_payload) < 64);

impl Derived {
    pub fn new(config: &Config) -> Derived {
        let at_most_u32 = |n: usize| n.min(u32::MAX as usize) as u32;
        Derived {
            link_bps: config.link_bps,
            data_per_packet: config.max_data_per_packet() as u32,
            unsched_bytes: config.effective_unsched_bytes(),
            stream_yield_bytes: config.effective_stream_yield_bytes(),
            echo_hold: crate::peer::echo_ticks(config.max_echo_hold_ns),
            pacer_bypass_bytes: config.pacer_bypass_bytes,
            max_message_length: config.max_message_length,
            packet_overhead_bytes: config.packet_overhead_bytes,
            max_client_rpcs: at_most_u32(config.max_client_rpcs),
            max_server_rpcs: at_most_u32(config.max_server_rpcs),
            max_server_rpcs_per_peer: at_most_u32(config.max_server_rpcs_per_peer),
            pad_v4: config.pad_v4,
            pad_v6: config.pad_v6,
            cutoff_version: config.cutoff_version,
            top_priority: config.priority_levels - 1,
            measure_rtt: config.measure_rtt || config.window_policy == WindowPolicy::Adaptive,
            adaptive: config.window_policy == WindowPolicy::Adaptive,
            require_checksum: config.require_checksum,
            // Granting every message (`basic`, RAMCloud's BasicTransport)
            // puts no cap on bytes in flight, nor on bytes asked for again,
            // and asks for a message's first gap only.
            resend_every_gap: config.grant_policy == GrantPolicy::Srpt,
            checksum: config.checksum,
            discard_payload: config.discard_payload,
            keepalive_ns: (config.effective_rpc_timeout_ns() / 4)
                .max(config.effective_resend_interval_ns()),
            resend_interval_ns: config.effective_resend_interval_ns(),
            resend_budget: match config.grant_policy {
                GrantPolicy::Srpt => config.effective_max_incoming().max(1),
                GrantPolicy::EveryMessage { .. } => u64::MAX,
            },
            rpc_timeout_ns: config.effective_rpc_timeout_ns(),
            tombstone_ns: config.effective_tombstone_ns(),
            cutoffs: config.cutoff_table(),
            congestion: Threshold::new(config),
            windows: WindowParams::new(config),
            onramp: OnRampParams::new(config),
        }
    }

    /// Ns to transmit a datagram of `bytes` at the link rate
    /// ([`Config::wire_time_ns`]).
    #[inline]
    pub fn wire_time_ns(&self, bytes: usize) -> u64 {
        wire_time_ns(bytes, self.packet_overhead_bytes, self.link_bps)
    }

    /// Padding for a DATA datagram of `len` bytes to an IPv4 (`v4`) or
    /// IPv6 destination (`Config::pad_v4`, `Config::pad_v6`).
    #[inline]
    pub fn pad(&self, v4: bool, len: usize) -> u8 {
        if v4 {
            self.pad_v4.pad(len)
        } else {
            self.pad_v6.pad(len)
        }
    }

    /// `Config::cutoff_version`: the version of our cutoffs that packets
    /// carry and CUTOFFS announces.
    #[inline]
    pub fn cutoff_version(&self) -> u16 {
        self.cutoff_version
    }

    /// Whether packets we send carry a checksum (`Config::checksum`).
    #[inline]
    pub fn checksum(&self) -> bool {
        self.checksum
    }

    /// Whether received payload is dropped after accounting
    /// (`Config::discard_payload`).
    #[inline]
    pub fn discard_payload(&self) -> bool {
        self.discard_payload
    }

    /// `Config::max_message_length`.
    #[inline]
    pub fn max_message_length(&self) -> u32 {
        self.max_message_length
    }

    /// Whether `live` client RPCs are as many as `Config::max_client_rpcs`.
    #[inline]
    pub fn client_rpcs_full(&self, live: usize) -> bool {
        live >= self.max_client_rpcs as usize
    }

    /// Whether `live` server RPCs are as many as `Config::max_server_rpcs`.
    #[inline]
    pub fn server_rpcs_full(&self, live: usize) -> bool {
        live >= self.max_server_rpcs as usize
    }

    /// Whether a peer's `live` server RPCs are as many as
    /// `Config::max_server_rpcs_per_peer`.
    #[inline]
    pub fn peer_server_rpcs_full(&self, live: usize) -> bool {
        live >= self.max_server_rpcs_per_peer as usize
    }

    /// On-Ramp's parameters, if it is on.
    #[inline(always)]
    pub fn onramp(&self) -> Option<&OnRampParams> {
        self.onramp.as_ref()
    }

    /// When a peer is congested.
    #[inline]
    pub fn congestion(&self) -> Threshold {
        self.congestion
    }

    /// Whether the endpoint measures its peers' RTT.
    #[inline(always)]
    pub fn measure_rtt(&self) -> bool {
        self.measure_rtt
    }

    /// The longest hold of an echoed timestamp, in echo ticks
    /// (`Config::max_echo_hold_ns`).
    #[inline(always)]
    pub fn echo_hold(&self) -> u32 {
        self.echo_hold
    }

    /// Whether windows are per peer ([`WindowPolicy::Adaptive`]).
    #[inline(always)]
    pub fn adaptive(&self) -> bool {
        self.adaptive
    }

    #[inline]
    pub fn require_checksum(&self) -> bool {
        self.require_checksum
    }

    #[inline]
    pub fn pacer_bypass_bytes(&self) -> u32 {
        self.pacer_bypass_bytes
    }

    /// What adaptive windows are computed from.
    #[inline]
    pub fn windows(&self) -> &WindowParams {
        &self.windows
    }

    /// Payload bytes of a full DATA packet (`Config::max_data_per_packet`).
    #[inline(always)]
    pub fn data_per_packet(&self) -> u32 {
        self.data_per_packet
    }

    /// Bytes of a message sent before any grant
    /// (`Config::effective_unsched_bytes`).
    #[inline(always)]
    pub fn unsched_bytes(&self) -> u32 {
        self.unsched_bytes
    }

    /// A stream's credit window while short messages arrive
    /// (`Config::effective_stream_yield_bytes`; 0: streams never yield).
    #[inline(always)]
    pub fn stream_yield_bytes(&self) -> u32 {
        self.stream_yield_bytes
    }

    /// The highest priority level: control packets, and RESENDs of a
    /// request's unscheduled bytes.
    #[inline]
    pub fn top_priority(&self) -> u8 {
        self.top_priority
    }

    /// Silence after which we tell a peer waiting on us that we are alive
    /// (BUSY): a quarter of the RPC timeout, at least a resend interval.
    #[inline]
    pub fn keepalive_ns(&self) -> u64 {
        self.keepalive_ns
    }

    /// Silence after which a receiver asks for missing bytes again
    /// (`Config::effective_resend_interval_ns`).
    #[inline]
    pub fn resend_interval_ns(&self) -> u64 {
        self.resend_interval_ns
    }

    /// Bytes one timer tick asks for again over all RPCs (at least the
    /// first RESEND goes): the retransmissions they bring arrive together,
    /// and no more than the receiver lets its grants put in flight.
    #[inline]
    pub fn resend_budget(&self) -> u64 {
        self.resend_budget
    }

    /// Whether a silent message's RESENDs cover every gap (else the first).
    #[inline]
    pub fn resend_every_gap(&self) -> bool {
        self.resend_every_gap
    }

    /// How recently sent bytes may still be in flight when a RESEND for
    /// them arrives: half the resend interval. A receiver asks after a
    /// silence of one interval; a sender that paused about that long and
    /// just resumed would otherwise resend the packets crossing the
    /// RESEND (duplicates, and under adaptive windows a false loss).
    #[inline]
    pub fn resend_guard_ns(&self) -> u64 {
        self.resend_interval_ns / 2
    }

    /// Silence after which an RPC is abandoned
    /// (`Config::effective_rpc_timeout_ns`).
    #[inline]
    pub fn rpc_timeout_ns(&self) -> u64 {
        self.rpc_timeout_ns
    }

    /// How long a tombstone lives (`Config::effective_tombstone_ns`).
    #[inline]
    pub fn tombstone_ns(&self) -> u64 {
        self.tombstone_ns
    }

    /// Our unscheduled cutoffs (`Config::cutoff_table`), as CUTOFFS
    /// announces them.
    #[inline]
    pub fn cutoffs(&self) -> &[u32; MAX_PRIORITIES] {
        &self.cutoffs
    }

    /// Our own unscheduled priority for an incoming message of `len` bytes
    /// (used when asking for its unscheduled bytes again): the highest
    /// level whose cutoff admits it.
    pub fn unsched_level(&self, len: u32) -> u8 {
        (0..self.cutoffs.len())
            .rev()
            .find(|&i| self.cutoffs[i] >= len && self.cutoffs[i] != 0)
            .unwrap_or(0) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoints_derived_values_follow_its_config() {
        let c = Config {
            priority_levels: 4,
            unsched_priorities: 2,
            unsched_cutoffs: [1_000, 10_000, 0, 0, 0, 0, 0, 0],
            rpc_timeout_ns: Some(100_000_000),
            resend_interval_ns: Some(1_000_000),
            ..Config::default()
        };
        let d = Derived::new(&c);
        assert_eq!(d.data_per_packet(), 1416);
        // One RTT (62,500 bytes) of whole packets: 45 x 1,416.
        assert_eq!(d.unsched_bytes(), 63_720);
        assert_eq!(d.top_priority(), 3);
        assert_eq!(d.keepalive_ns(), 25_000_000);
        // Levels 3 and 2 unscheduled: up to 1,000 bytes at 3, the rest at 2.
        assert_eq!(d.cutoffs(), &[0, 0, u32::MAX, 1_000, 0, 0, 0, 0]);
        assert_eq!(d.unsched_level(1), 3);
        assert_eq!(d.unsched_level(1_000), 3);
        assert_eq!(d.unsched_level(1_001), 2);
        assert_eq!(d.unsched_level(u32::MAX), 2);
        // A short RPC timeout: keep-alives every resend interval.
        let c = Config {
            rpc_timeout_ns: Some(2_000_000),
            ..c
        };
        assert_eq!(Derived::new(&c).keepalive_ns(), 1_000_000);
    }

    #[test]
    fn defaults_are_valid_and_derived_values_match_the_docs() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.rtt_bytes(), 62_500);
        assert_eq!(c.max_data_per_packet(), 1416);
        // Windows are whole packets: 45 x 1,416 bytes.
        assert_eq!(c.rtt_packet_bytes(), 63_720);
        assert_eq!(c.effective_unsched_bytes(), 63_720);
        assert_eq!(c.effective_grant_window(), 63_720);
        assert_eq!(c.effective_max_incoming(), 8 * 63_720);
        // One full packet on the wire (1472 + 66 bytes) at 25 Gbps.
        assert_eq!(c.effective_max_nic_queue_ns(), 492);
    }

    #[test]
    fn wire_time_matches_the_exact_formula() {
        let exact = |c: &Config, bytes: usize| {
            let wire = bytes as u128 + c.packet_overhead_bytes as u128;
            ((wire * 8_000_000_000) / c.link_bps.max(1) as u128).max(1) as u64
        };
        for link_bps in [
            1_000_000,
            10_000_000_000,
            25_000_000_000,
            400_000_000_000,
            u64::MAX,
        ] {
            let c = Config {
                link_bps,
                ..Config::default()
            };
            for bytes in [0, 1, 100, 1472, 65_000, 1 << 40, usize::MAX / 2, usize::MAX] {
                assert_eq!(
                    c.wire_time_ns(bytes),
                    exact(&c, bytes),
                    "{link_bps} {bytes}"
                );
            }
        }
    }

    #[test]
    fn settings_that_could_never_make_progress_are_refused() {
        let bad = [
            Config {
                unsched_bytes: Some(0),
                ..Config::default()
            },
            Config {
                max_incoming: Some(100),
                ..Config::default()
            },
            Config {
                cutoff_version: 0,
                ..Config::default()
            },
            Config {
                max_overcommit: 0,
                ..Config::default()
            },
            Config {
                priority_levels: 9,
                ..Config::default()
            },
            Config {
                unsched_priorities: 0,
                ..Config::default()
            },
            Config {
                max_packet_size: 60,
                ..Config::default()
            },
            Config {
                pool_bytes: 1000,
                ..Config::default()
            },
            Config {
                resend_interval_ns: Some(0),
                ..Config::default()
            },
            Config {
                grant_fifo_permille: 1001,
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?} accepted");
        }
    }

    #[test]
    fn for_network_derives_windows_timers_and_queue_from_the_link() {
        // The default network: 62,500 B of RTT rounds up to 45 packets.
        let c = Config::for_network(&NetworkProfile::default());
        c.validate().unwrap();
        assert_eq!(c.grant_window, Some(45 * 1416));
        assert_eq!(c.unsched_bytes, Some(45 * 1416));
        assert_eq!(c.effective_max_incoming(), 8 * 45 * 1416);
        assert_eq!(c.effective_resend_interval_ns(), 1_000_000);
        assert_eq!(c.effective_rpc_timeout_ns(), 2_000_000_000);
        assert_eq!(c.effective_tombstone_ns(), 20_000_000);
        assert_eq!(c.max_nic_queue_ns, None);
        assert_eq!(c.effective_max_nic_queue_ns(), 492);
        // No sizes: the base cutoffs and version.
        assert_eq!(
            (
                c.priority_levels,
                c.unsched_priorities,
                c.unsched_cutoffs,
                c.cutoff_version
            ),
            (8, 4, Config::default().unsched_cutoffs, 1)
        );
        // A slow link: timers scale with its wire times, the queue with
        // the driver's packets.
        let slow = NetworkProfile {
            link_bps: 100_000_000,
            rtt_ns: 250_000,
            nic_queue_packets: 2,
            ..NetworkProfile::default()
        };
        let c = Config::for_network(&slow);
        c.validate().unwrap();
        let packet_ns = c.wire_time_ns(1472);
        assert_eq!(packet_ns, 123_040);
        assert_eq!(c.effective_resend_interval_ns(), 100 * packet_ns);
        assert_eq!(
            c.effective_rpc_timeout_ns(),
            100 * c.wire_time_ns(1_000_000)
        );
        assert_eq!(c.effective_tombstone_ns(), 20 * 100 * packet_ns);
        assert_eq!(c.max_nic_queue_ns, Some(2 * packet_ns));
        // 3,125 B of RTT: three packets.
        assert_eq!(c.grant_window, Some(3 * 1416));
    }

    #[test]
    fn for_network_applies_the_plan_of_the_sizes_and_overrides() {
        let sizes = MessageSizes::from_weights([(100, 4.0), (200, 2.0), (400, 1.0)]).unwrap();
        let net = NetworkProfile {
            priority_levels: 3,
            message_sizes: Some(sizes),
            unsched_bytes: Some(1_000),
            ..NetworkProfile::default()
        };
        let c = Config::for_network(&net);
        c.validate().unwrap();
        let plan = net.priority_plan().unwrap();
        assert_eq!(c.unsched_bytes, Some(1_000));
        assert_eq!(c.grant_window, Some(45 * 1416));
        assert_eq!((c.priority_levels, c.unsched_priorities), (3, 3));
        assert_eq!(c.unsched_cutoffs[..3], [100, 200, u32::MAX]);
        assert_eq!(plan.cutoffs, c.unsched_cutoffs);
        assert_eq!(c.cutoff_version, 2, "cutoffs differ from the base ones");
        // Deriving again changes nothing, the version included.
        let mut again = c.clone();
        again.apply_network(&net);
        assert_eq!(again, c);
        // Fewer levels without sizes: half of them unscheduled, a new table.
        let c = Config::for_network(&NetworkProfile {
            priority_levels: 4,
            ..NetworkProfile::default()
        });
        c.validate().unwrap();
        assert_eq!((c.unsched_priorities, c.cutoff_version), (2, 2));
    }

    #[test]
    fn apply_network_keeps_the_drivers_own_settings() {
        let mut c = Config {
            checksum: false,
            defer_acks: true,
            pool_bytes: 1 << 30,
            max_overcommit: 3,
            ..Config::default()
        };
        c.apply_network(&NetworkProfile::default());
        assert!(!c.checksum && c.defer_acks);
        assert_eq!((c.pool_bytes, c.max_overcommit), (1 << 30, 3));
    }

    #[test]
    fn the_cutoff_table_puts_unscheduled_levels_on_top() {
        let c = Config::default();
        assert_eq!(
            c.cutoff_table(),
            [0, 0, 0, 0, u32::MAX, 100_000, 10_000, 1_000]
        );
        let one = Config {
            priority_levels: 1,
            unsched_priorities: 1,
            ..Config::default()
        };
        assert_eq!(one.cutoff_table(), [u32::MAX, 0, 0, 0, 0, 0, 0, 0]);
    }
}
