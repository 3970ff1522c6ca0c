//! What an endpoint remembers about each peer it talks to.

use crate::endpoint::Time;
use crate::wire::MAX_PRIORITIES;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

pub(crate) struct Peer {
    /// The peer's unscheduled cutoffs (what we use when sending to it).
    pub cutoffs: [u32; MAX_PRIORITIES],
    /// Version of `cutoffs`, echoed in our DATA packets so that the peer can
    /// tell us when it has newer ones.
    pub cutoff_version: u16,
    /// When we last sent this peer a CUTOFFS packet (rate limit).
    pub cutoffs_sent_at: Option<Time>,
    /// The latest `send_time` received from the peer, echoed back to it.
    pub echo_time: u64,
    /// Smallest and latest round-trip times measured from echoed timestamps.
    pub rtt_min: Option<u64>,
    pub rtt_recent: Option<u64>,
    /// Completed client RPCs whose server state the peer may drop.
    pub pending_acks: Vec<u64>,
    /// RPCs (client and server) that refer to this peer.
    pub rpcs: usize,
    /// Server RPCs from this peer.
    pub server_rpcs: usize,
    /// Last time the peer had an RPC or sent us a packet.
    pub last_active: Time,
}

impl Peer {
    /// `cutoffs` are our own, assumed until the peer tells us its own; version
    /// 0 means "not heard yet", so the peer's first DATA from us triggers a
    /// CUTOFFS reply.
    pub fn new(cutoffs: [u32; MAX_PRIORITIES], now: Time) -> Peer {
        Peer {
            cutoffs,
            cutoff_version: 0,
            cutoffs_sent_at: None,
            echo_time: 0,
            rtt_min: None,
            rtt_recent: None,
            pending_acks: Vec::new(),
            rpcs: 0,
            server_rpcs: 0,
            last_active: now,
        }
    }

    /// Unscheduled priority for a message of `len` bytes sent to this peer: the
    /// highest level whose cutoff admits it.
    pub fn unsched_priority(&self, len: u32) -> u8 {
        (0..MAX_PRIORITIES)
            .rev()
            .find(|&i| self.cutoffs[i] >= len && self.cutoffs[i] != 0)
            .unwrap_or(0) as u8
    }

    /// Records a packet's timestamps.
    pub fn observe(&mut self, now: Time, send_time: u64, echo_time: u64) {
        self.echo_time = send_time;
        self.last_active = now;
        if echo_time != 0 && echo_time <= now {
            let rtt = now - echo_time;
            self.rtt_recent = Some(rtt);
            self.rtt_min = Some(self.rtt_min.map_or(rtt, |m| m.min(rtt)));
        }
    }
}

/// A peer's address as a hash-map key. Hashing a `SocketAddr` field by field
/// costs several hasher calls per lookup, and lookups happen several times per
/// packet; this hashes two machine words. Equality ignores the IPv6 flow label,
/// which does not identify a socket.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerAddr(pub SocketAddr);

impl PeerAddr {
    fn words(&self) -> (u128, u64) {
        match self.0 {
            SocketAddr::V4(a) => (u32::from(*a.ip()) as u128, a.port() as u64),
            SocketAddr::V6(a) => (
                u128::from(*a.ip()),
                a.port() as u64 | 1 << 16 | (a.scope_id() as u64) << 32,
            ),
        }
    }
}

impl PartialEq for PeerAddr {
    fn eq(&self, other: &Self) -> bool {
        self.words() == other.words()
    }
}

impl Eq for PeerAddr {}

impl Hash for PeerAddr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // One word: the hasher's per-call cost dominates for keys this small.
        // Equal addresses give equal words; collisions only cost a compare.
        let (ip, rest) = self.words();
        state.write_u64((ip as u64) ^ ((ip >> 64) as u64).rotate_left(29) ^ rest.rotate_left(48));
    }
}
