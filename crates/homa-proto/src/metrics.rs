//! Counters kept by an endpoint. Plain integers: the engine is single-threaded.

use crate::wire::PacketType;

/// Why an incoming packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Did not decode (truncated, bad version, unknown type, bad fields).
    Malformed,
    /// Checksum mismatch or missing.
    BadChecksum,
    /// Message length above `max_message_length`.
    MessageTooLong,
    /// The packet's message length disagrees with the RPC's.
    InconsistentLength,
    /// No RPC with this id (and the packet needs none to be answered).
    UnknownRpc,
    /// Would exceed `max_peers`.
    TooManyPeers,
    /// Would exceed the per-peer or total RPC limit.
    TooManyRpcs,
    /// DATA for bytes already received.
    Duplicate,
    /// DATA that would add a received range to a message whose range list
    /// is full (`MAX_RANGES`); DATA filling existing gaps is still taken.
    Unexpected,
    /// DATA for a message that waits for pool space.
    PoolExhausted,
    /// DATA for an RPC this server already finished (a delayed duplicate).
    Tombstone,
    /// The packet does not make sense in the RPC's state (e.g. GRANT to a server
    /// that has not started its response).
    WrongState,
}

impl DropReason {
    /// Every reason, in the order of [`Metrics::drops`]' slots.
    pub const ALL: [DropReason; 12] = [
        DropReason::Malformed,
        DropReason::BadChecksum,
        DropReason::MessageTooLong,
        DropReason::InconsistentLength,
        DropReason::UnknownRpc,
        DropReason::TooManyPeers,
        DropReason::TooManyRpcs,
        DropReason::Duplicate,
        DropReason::Unexpected,
        DropReason::PoolExhausted,
        DropReason::Tombstone,
        DropReason::WrongState,
    ];
    /// Snake-case name, for metrics output (`drop_<name>` in [`Metrics::iter`]).
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadChecksum => "bad_checksum",
            DropReason::MessageTooLong => "message_too_long",
            DropReason::InconsistentLength => "inconsistent_length",
            DropReason::UnknownRpc => "unknown_rpc",
            DropReason::TooManyPeers => "too_many_peers",
            DropReason::TooManyRpcs => "too_many_rpcs",
            DropReason::Duplicate => "duplicate",
            DropReason::Unexpected => "unexpected",
            DropReason::PoolExhausted => "pool_exhausted",
            DropReason::Tombstone => "tombstone",
            DropReason::WrongState => "wrong_state",
        }
    }
    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap()
    }
}

/// Endpoint counters.
// `repr(C)`, line-aligned: the counters moved for every packet received
// (with the DATA and GRANT slots of the per-type counts) share the first
// line, those moved for every packet sent the third. In a simulator of
// many hosts each packet finds its endpoint cold, and scattered over the
// struct these cost a cache miss each (W1, 30,000 messages, cachegrind).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Metrics {
    /// Datagram bytes received, including those of dropped datagrams.
    pub bytes_received: u64,
    /// Payload bytes received that were new to their message (duplicates
    /// not counted).
    pub data_bytes_received: u64,
    /// [`crate::Event::Request`]s produced.
    pub requests_delivered: u64,
    /// [`crate::Event::Response`]s produced.
    pub responses_delivered: u64,
    /// Packets received that decoded, per type (indexed by
    /// [`PacketType::index`]; read with [`Self::received`]).
    pub packets_received: [u64; PacketType::COUNT],
    /// DATA packets sent again in answer to RESEND.
    pub retransmitted_packets: u64,
    /// Datagram bytes (UDP payload, headers and padding included) handed to
    /// the driver.
    pub bytes_sent: u64,
    /// Payload bytes of DATA packets sent.
    pub data_bytes_sent: u64,
    /// GRANT packets sent (one GRANT may carry several grant decisions).
    pub grants_sent: u64,
    /// Bytes newly granted, counted when the grant is decided.
    pub granted_bytes: u64,
    /// Packets sent, per type (indexed by [`PacketType::index`]; read with
    /// [`Self::sent`]).
    pub packets_sent: [u64; PacketType::COUNT],
    /// Payload bytes of those retransmitted packets.
    pub retransmitted_bytes: u64,
    /// RESENDs that asked only for bytes sent within the resend guard
    /// (likely still in flight): nothing was sent again.
    pub resend_in_flight: u64,
    /// RESEND packets sent because of silence.
    pub resends_sent: u64,
    /// Client RPCs restarted after RPC_UNKNOWN.
    pub restarts: u64,
    /// RPCs, client or server, abandoned after `rpc_timeout_ns` of silence.
    pub timeouts: u64,
    /// Dropped packets per [`DropReason`] (indexed by position in
    /// [`DropReason::ALL`]; read with [`Self::drops`]).
    pub drops: [u64; 12],
    /// [`crate::Event::Failed`]s produced (every failed client RPC).
    pub rpcs_failed: u64,
    /// Messages that had to wait for pool space.
    pub pool_waits: u64,
    /// Client RPCs failed because their response waited for pool space
    /// longer than `rpc_timeout_ns` (`RpcError::PoolExhausted`).
    pub pool_timeouts: u64,
    /// Server RPCs discarded after an ACK.
    pub acks_processed: u64,
    /// Control packets dropped because the transmit queue was full.
    pub control_dropped: u64,
    /// RTT samples taken (only while measuring: `Config::measure_rtt` or
    /// adaptive windows).
    pub rtt_samples: u64,
    /// Times a peer became congested (its latest RTT sample, or its
    /// smoothed RTT, went above the factor × its `rtt_min`;
    /// `Config::congestion_signal`).
    pub congestion_onsets: u64,
    /// Adaptive windows: times a peer's unscheduled window was halved.
    pub unsched_window_cuts: u64,
    /// RTT samples after which their peer was congested (under the
    /// default signal: samples above `rtt_high_factor` × `rtt_min`). With
    /// [`Self::rtt_samples_above_mid`], says how far queues behind other
    /// traffic (TCP's) push the samples: the coexistence experiment's
    /// evidence (docs/congestion.md §8).
    pub rtt_samples_congested: u64,
    /// RTT samples above seed 003's `rtt_mid`, 3 × the peer's `rtt_min`.
    pub rtt_samples_above_mid: u64,
    /// On-Ramp: holds started (a destination's DATA kept at the edge
    /// because its reported queueing delay exceeded T).
    pub onramp_holds: u64,
    /// On-Ramp: the holds' lengths, summed (ns), as decided when each
    /// started (a hold is never extended or cut short).
    pub onramp_held_ns: u64,
    /// On-Ramp: messages parked outside the send queue because their
    /// destination was held (a message parked by two holds counts twice).
    pub onramp_parked: u64,
    /// On-Ramp: holds of this receiver's grants started (its downlink's
    /// queueing delay, seen on arriving DATA, exceeded T).
    pub onramp_grant_holds: u64,
    /// On-Ramp: those holds' lengths, summed (ns).
    pub onramp_grants_held_ns: u64,
    /// Streams opened here or by peers.
    pub streams_opened: u64,
    /// Streams that ended early (reset, timeout, shutdown).
    pub streams_failed: u64,
    /// Stream payload bytes sent (retransmissions included).
    pub stream_bytes_sent: u64,
    /// Stream payload bytes received that were new.
    pub stream_bytes_received: u64,
}

const _: () = {
    use std::mem::offset_of;
    // DATA's and GRANT's slots (indices 0 and 1) on the line of their side.
    assert!(offset_of!(Metrics, packets_received) + 16 <= 64);
    assert!(offset_of!(Metrics, bytes_sent) == 128);
    assert!(offset_of!(Metrics, packets_sent) + 16 <= 192);
};

impl Metrics {
    /// Packets dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }
    /// Packets dropped for any reason.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }
    pub(crate) fn drop(&mut self, reason: DropReason) {
        self.drops[reason.index()] += 1;
    }
    /// Packets of type `t` sent.
    pub fn sent(&self, t: PacketType) -> u64 {
        self.packets_sent[t.index()]
    }
    /// Packets of type `t` received (and decoded).
    pub fn received(&self, t: PacketType) -> u64 {
        self.packets_received[t.index()]
    }
    /// (name, value) pairs of every counter, for printing and JSON.
    pub fn iter(&self) -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for t in PacketType::ALL {
            v.push((format!("{}_sent", t.name()), self.sent(t)));
            v.push((format!("{}_received", t.name()), self.received(t)));
        }
        for r in DropReason::ALL {
            v.push((format!("drop_{}", r.name()), self.drops(r)));
        }
        let plain = [
            ("bytes_sent", self.bytes_sent),
            ("bytes_received", self.bytes_received),
            ("data_bytes_sent", self.data_bytes_sent),
            ("data_bytes_received", self.data_bytes_received),
            ("retransmitted_packets", self.retransmitted_packets),
            ("retransmitted_bytes", self.retransmitted_bytes),
            ("resend_in_flight", self.resend_in_flight),
            ("resends_sent", self.resends_sent),
            ("restarts", self.restarts),
            ("grants_sent", self.grants_sent),
            ("granted_bytes", self.granted_bytes),
            ("timeouts", self.timeouts),
            ("requests_delivered", self.requests_delivered),
            ("responses_delivered", self.responses_delivered),
            ("rpcs_failed", self.rpcs_failed),
            ("pool_waits", self.pool_waits),
            ("pool_timeouts", self.pool_timeouts),
            ("acks_processed", self.acks_processed),
            ("control_dropped", self.control_dropped),
            ("rtt_samples", self.rtt_samples),
            ("congestion_onsets", self.congestion_onsets),
            ("unsched_window_cuts", self.unsched_window_cuts),
            ("rtt_samples_congested", self.rtt_samples_congested),
            ("rtt_samples_above_mid", self.rtt_samples_above_mid),
            ("onramp_holds", self.onramp_holds),
            ("onramp_held_ns", self.onramp_held_ns),
            ("onramp_parked", self.onramp_parked),
            ("onramp_grant_holds", self.onramp_grant_holds),
            ("onramp_grants_held_ns", self.onramp_grants_held_ns),
            ("streams_opened", self.streams_opened),
            ("streams_failed", self.streams_failed),
            ("stream_bytes_sent", self.stream_bytes_sent),
            ("stream_bytes_received", self.stream_bytes_received),
        ];
        v.extend(plain.iter().map(|(n, x)| (n.to_string(), *x)));
        v
    }
}
