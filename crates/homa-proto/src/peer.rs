//! What an endpoint remembers about each peer it talks to.

use crate::endpoint::Time;
use crate::wire::MAX_PRIORITIES;

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
