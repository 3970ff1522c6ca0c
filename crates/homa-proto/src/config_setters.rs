//! The `with_*` setters of [`Config`], one per field, each naming its default.
//! `Config` is `#[non_exhaustive]`, so code outside this crate builds one as
//! `Config::default().with_link_bps(..).with_rtt_ns(..)`; the fields stay
//! public to read. Kept apart from `config.rs` so that new fields there and
//! their setters here merge independently.

use crate::config::{Config, CongestionSignal, GrantPolicy, PadWindow, WindowPolicy};
use crate::wire::MAX_PRIORITIES;

/// Generates `with_<field>` setters whose doc ends in "Default: `<expr>`.",
/// and a test that `Config::default()` has exactly those values, so the
/// documented defaults cannot drift from the real ones. `opt` fields take
/// `impl Into<Option<T>>`: `with_x(5)` and `with_x(None)` both work.
macro_rules! setters {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident $with:ident ( $field:ident : $ty:ty ) = $default:expr;
    )*) => {
        impl Config {
            $( setters!(@one $kind, [$($doc)*], $with, $field, $ty, $default); )*
        }

        #[cfg(test)]
        #[test]
        fn setters_document_the_real_defaults() {
            let d = Config::default();
            $( assert_eq!(d.$field, $default, stringify!($field)); )*
        }

        #[cfg(test)]
        #[test]
        fn every_field_has_a_setter() {
            // No `..`: a field added to `Config` without a setter here
            // fails to compile.
            let Config { $($field: _,)* } = Config::default();
            let d = Config::default();
            $( assert_eq!(Config::default().$with(d.$field.clone()), d, stringify!($with)); )*
        }
    };
    (@one plain, [$($doc:literal)*], $with:ident, $field:ident, $ty:ty, $default:expr) => {
        $(#[doc = $doc])*
        ///
        #[doc = concat!("Default: `", stringify!($default), "`.")]
        #[must_use]
        pub fn $with(mut self, value: $ty) -> Config {
            self.$field = value;
            self
        }
    };
    (@one opt, [$($doc:literal)*], $with:ident, $field:ident, $ty:ty, $default:expr) => {
        $(#[doc = $doc])*
        ///
        #[doc = concat!("Default: `", stringify!($default), "`.")]
        #[must_use]
        pub fn $with(mut self, value: impl Into<$ty>) -> Config {
            self.$field = value.into();
            self
        }
    };
}

setters! {
    /// Rate of this host's link, bits per second.
    plain with_link_bps(link_bps: u64) = 25_000_000_000;
    /// Round-trip time (ns) for a small packet, software included.
    plain with_rtt_ns(rtt_ns: u64) = 20_000;
    /// Largest datagram the engine emits (UDP payload bytes, headers
    /// included). The UDP runtime sets it from its MTU.
    plain with_max_packet_size(max_packet_size: usize) = 1472;
    /// Bytes each datagram costs on the wire beyond its UDP payload
    /// (IPv4 + UDP + Ethernet + preamble and gap).
    plain with_packet_overhead_bytes(packet_overhead_bytes: u32) = 66;
    /// Leading bytes of each message sent without a grant; `None`: one RTT's
    /// worth of bytes at `link_bps`.
    opt with_unsched_bytes(unsched_bytes: Option<u32>) = None;
    /// Bytes a scheduled message may have in flight beyond what was
    /// received; `None`: one RTT's worth.
    opt with_grant_window(grant_window: Option<u32>) = None;
    /// Priority levels in use (1..=8).
    plain with_priority_levels(priority_levels: u8) = 8;
    /// How many of the highest levels carry unscheduled packets.
    plain with_unsched_priorities(unsched_priorities: u8) = 4;
    /// Message-length cutoffs of the unscheduled levels, ascending.
    plain with_unsched_cutoffs(unsched_cutoffs: [u32; MAX_PRIORITIES]) =
        [1_000, 10_000, 100_000, u32::MAX, u32::MAX, u32::MAX, u32::MAX, u32::MAX];
    /// Version of `unsched_cutoffs` (change it whenever they change; not 0).
    plain with_cutoff_version(cutoff_version: u16) = 1;
    /// Messages the receiver grants to at once (controlled overcommitment).
    plain with_max_overcommit(max_overcommit: usize) = 8;
    /// Which incoming messages get grants: SRPT with controlled
    /// overcommitment, or every message (RAMCloud's BasicTransport).
    plain with_grant_policy(grant_policy: GrantPolicy) = GrantPolicy::Srpt;
    /// Scheduled levels counted from the top (SRPT rank 0 always gets the
    /// highest scheduled level); false: from the bottom (the paper's rule).
    plain with_sched_levels_from_top(sched_levels_from_top: bool) = true;
    /// Keep the highest scheduled level for messages' last grant window
    /// (SRPT ranks start one level below it).
    plain with_sched_tail_level(sched_tail_level: bool) = true;
    /// Packets of window beyond the grant window for each receiver's
    /// top-ranked message.
    plain with_lead_window_packets(lead_window_packets: u32) = 2;
    /// Grants of a message with fewer bytes than this still to grant carry
    /// at least the unscheduled level of that size; `None`: the grant
    /// window; `Some(0)`: off (the default, measured better).
    opt with_boost_tail_bytes(boost_tail_bytes: Option<u32>) = Some(0);
    /// Cap on granted but not yet received bytes; `None`:
    /// `max_overcommit × grant_window`.
    opt with_max_incoming(max_incoming: Option<u64>) = None;
    /// Per-mille of granted bytes that go to the oldest message.
    plain with_grant_fifo_permille(grant_fifo_permille: u32) = 50;
    /// Per-mille of transmitted bytes that go to the oldest outgoing message.
    plain with_pacer_fifo_permille(pacer_fifo_permille: u32) = 50;
    /// A message with at most the unscheduled window left goes before
    /// pending retransmissions.
    plain with_short_before_retransmit(short_before_retransmit: bool) = true;
    /// Most ns of queued transmission in the NIC when a packet is released;
    /// `None`: one full packet's time. (The UDP runtime's default is 20 µs.)
    opt with_max_nic_queue_ns(max_nic_queue_ns: Option<u64>) = None;
    /// Messages up to this many bytes skip the NIC queue limit.
    plain with_pacer_bypass_bytes(pacer_bypass_bytes: u32) = 1_000;
    /// Silence (ns) after which a receiver asks for missing bytes again.
    opt with_resend_interval_ns(resend_interval_ns: Option<u64>) = None;
    /// Silence (ns) from a peer after which an RPC is abandoned.
    opt with_rpc_timeout_ns(rpc_timeout_ns: Option<u64>) = None;
    /// How long (ns) a server remembers an acknowledged RPC's id.
    opt with_tombstone_ns(tombstone_ns: Option<u64>) = None;
    /// A peer with no RPCs is forgotten after this long (ns).
    plain with_peer_idle_ns(peer_idle_ns: u64) = 10_000_000_000;
    /// Largest message accepted or sent, bytes.
    plain with_max_message_length(max_message_length: u32) = 1_000_000;
    /// Most concurrent server RPCs from one peer.
    plain with_max_server_rpcs_per_peer(max_server_rpcs_per_peer: usize) = 10_000;
    /// Most concurrent server RPCs, all peers together.
    plain with_max_server_rpcs(max_server_rpcs: usize) = 100_000;
    /// Most concurrent client RPCs.
    plain with_max_client_rpcs(max_client_rpcs: usize) = 100_000;
    /// Most peers tracked at once.
    plain with_max_peers(max_peers: usize) = 10_000;
    /// Deliver requests of at least this many bytes incrementally
    /// (`u32::MAX`: never).
    plain with_partial_delivery_bytes(partial_delivery_bytes: u32) = u32::MAX;
    /// A stream's receive window (credit beyond what the reader has read).
    plain with_stream_window_bytes(stream_window_bytes: u32) = 1 << 20;
    /// A stream's credit window while short messages arrive (`None`:
    /// derived, a quarter RTT of whole packets; 0: never yield).
    opt with_stream_yield_bytes(stream_yield_bytes: Option<u32>) = None;
    /// Most streams open at once.
    plain with_max_streams(max_streams: usize) = 65_536;
    /// The least share (per mille) of packets for streams behind shorter messages.
    plain with_stream_share_permille(stream_share_permille: u32) = 100;
    /// Receive pool size in bytes.
    plain with_pool_bytes(pool_bytes: usize) = 64 << 20;
    /// Compute a CRC-32C for every packet sent (received checksums are
    /// always verified). The UDP runtime turns it off.
    plain with_checksum(checksum: bool) = true;
    /// Also drop received packets that carry no checksum.
    plain with_require_checksum(require_checksum: bool) = false;
    /// Simulation only: track pool space but do not copy payloads.
    plain with_discard_payload(discard_payload: bool) = false;
    /// Defer acknowledgement processing to `Endpoint::run_deferred`. The
    /// UDP runtime turns it on.
    plain with_defer_acks(defer_acks: bool) = false;
    /// Zero padding of short DATA datagrams to IPv4 peers (off:
    /// `PadWindow { from: 0, to: 0 }`).
    plain with_pad_v4(pad_v4: PadWindow) = PadWindow::default();
    /// The same for IPv6 peers.
    plain with_pad_v6(pad_v6: PadWindow) = PadWindow::default();
    /// Seed of this endpoint's first RPC id (must differ across restarts).
    plain with_rpc_id_seed(rpc_id_seed: u64) = 1;
    /// Static windows for every peer, or per-peer windows from each peer's
    /// measured RTT (seed 003, `docs/congestion.md`).
    plain with_window_policy(window_policy: WindowPolicy) = WindowPolicy::Static;
    /// Echo a peer's timestamp for at most this long (ns) after it arrived:
    /// the two clocks' rate difference times the hold spoils the sample.
    plain with_max_echo_hold_ns(max_echo_hold_ns: u64) = 1_000_000;
    /// Measure each peer's RTT and detect congestion even with static
    /// windows (adaptive windows always do).
    plain with_measure_rtt(measure_rtt: bool) = false;
    /// Length (ns) of the sliding window of a peer's `rtt_min` (BBR's 10 s).
    plain with_rtt_min_window_ns(rtt_min_window_ns: u64) = 10_000_000_000;
    /// A peer is congested while its latest RTT exceeds this × `rtt_min`.
    plain with_rtt_high_factor(rtt_high_factor: u32) = 8;
    /// Which RTT signals congestion: the latest sample (seed 003) or the
    /// smoothed one against its own factor (seed 003's proposal: 3).
    plain with_congestion_signal(congestion_signal: CongestionSignal) = CongestionSignal::Latest;
    /// Adaptive grant window: this × `rtt_min` of bytes at `link_bps`.
    plain with_rtt_grant_factor(rtt_grant_factor: u32) = 3;
    /// Adaptive unscheduled window: halved when the unscheduled share of
    /// the bytes sent to a peer is below this per-mille while messages wait
    /// for grants.
    plain with_unsched_ratio_permille(unsched_ratio_permille: u32) = 400;
    /// Adaptive grant window: also cover the RTT's queueing beyond
    /// `rtt_min` that the receiver's own granted bytes do not explain.
    plain with_grant_covers_foreign_queue(grant_covers_foreign_queue: bool) = false;
    /// Adaptive windows: the receiver's budget for bytes queued at its
    /// downlink; `None`: 30 µs of the link; `Some(0)`: off.
    opt with_downlink_budget(downlink_budget: Option<u32>) = None;
    /// Adaptive windows with a budget: a sender halves a peer's
    /// unscheduled window when a message waited for its first grant more
    /// than two smoothed RTTs.
    plain with_unsched_cut_when_rationed(unsched_cut_when_rationed: bool) = true;
    /// On-Ramp: hold a destination's DATA while the queueing delay it
    /// reports exceeds the threshold (`docs/onramp.md`).
    plain with_onramp(onramp: bool) = false;
    /// On-Ramp's threshold T (ns); `None`: one RTT.
    opt with_onramp_threshold_ns(onramp_threshold_ns: Option<u64>) = None;
    /// The longest single On-Ramp hold (ns); `None`: 8 × T.
    opt with_onramp_max_hold_ns(onramp_max_hold_ns: Option<u64>) = None;
    /// Each of the two buckets of the minimum one-way delay (ns).
    plain with_onramp_owd_window_ns(onramp_owd_window_ns: u64) = 10_000_000;
    /// After a hold, the destination stays open at least the hold's length
    /// × this / 1000 before another; `None`: 1000, or 750 where the
    /// receiver holds its grants too.
    opt with_onramp_open_permille(onramp_open_permille: Option<u32>) = None;
    /// Holds start only on reports about packets sent after the previous
    /// hold ended.
    plain with_onramp_fresh_reports(onramp_fresh_reports: bool) = false;
    /// A receiver also holds its grants while its own downlink shows a
    /// queue above T.
    plain with_onramp_hold_grants(onramp_hold_grants: bool) = true;
}
