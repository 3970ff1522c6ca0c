//! Control packets waiting to be sent (`docs/protocol.md` §3.2): GRANT,
//! RESEND, RPC_UNKNOWN, BUSY, CUTOFFS, NEED_ACK and ACK, in the order they
//! were queued, ahead of any DATA. The queue is bounded, so that a driver
//! that stops polling cannot make the endpoint grow without limit.

use crate::rpc::RpcKey;
use crate::time::Time;
use crate::wire::{self, Body, CommonHeader, PacketType, MAX_PRIORITIES};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Most control packets queued for transmission; beyond this they are
/// dropped (and counted).
pub(crate) const MAX_CONTROL_QUEUE: usize = 1 << 16;

/// A control packet waiting to be sent.
pub(crate) struct Control {
    pub dest: SocketAddr,
    pub rpc_id: u64,
    /// Whether we are the RPC's client.
    pub from_client: bool,
    pub body: ControlBody,
}

pub(crate) enum ControlBody {
    /// The current grant of RPC `key`'s incoming message, resolved when
    /// sent (into a [`ControlBody::Grant`]).
    GrantFor(RpcKey),
    Grant {
        offset: u32,
        priority: u8,
    },
    Resend {
        offset: u32,
        length: u32,
        priority: u8,
    },
    RpcUnknown,
    Busy,
    Cutoffs,
    NeedAck,
    Ack(Vec<u64>),
    /// The current STREAM_CREDIT of the stream this control names (its
    /// `dest`, `rpc_id` and `from_client`), resolved when sent.
    StreamCreditFor {
        probe: bool,
        ask: bool,
    },
    StreamCredit(wire::StreamCredit),
    StreamReset(wire::ResetReason),
}

impl ControlBody {
    pub fn packet_type(&self) -> PacketType {
        match self {
            ControlBody::Grant { .. } | ControlBody::GrantFor(_) => PacketType::Grant,
            ControlBody::Resend { .. } => PacketType::Resend,
            ControlBody::RpcUnknown => PacketType::RpcUnknown,
            ControlBody::Busy => PacketType::Busy,
            ControlBody::Cutoffs => PacketType::Cutoffs,
            ControlBody::NeedAck => PacketType::NeedAck,
            ControlBody::Ack(_) => PacketType::Ack,
            ControlBody::StreamCreditFor { .. } | ControlBody::StreamCredit(_) => {
                PacketType::StreamCredit
            }
            ControlBody::StreamReset(_) => PacketType::StreamReset,
        }
    }
}

/// What a control packet's encoding needs from the endpoint.
pub(crate) struct Stamp<'a> {
    pub now: Time,
    /// The destination's latest send time, echoed (0: unknown peer).
    pub echo_time: u64,
    /// Our cutoffs and their version, for a CUTOFFS packet.
    pub cutoff_version: u16,
    pub cutoffs: &'a [u32; MAX_PRIORITIES],
    pub checksum: bool,
}

impl Control {
    /// Encodes the packet into `buf` (a [`ControlBody::GrantFor`] must have
    /// been resolved first); returns its type.
    pub fn encode(&self, s: &Stamp<'_>, buf: &mut Vec<u8>) -> PacketType {
        let common = CommonHeader {
            from_client: self.from_client,
            retransmit: false,
            rpc_id: self.rpc_id,
            send_time: s.now.max(1),
            echo_time: s.echo_time,
        };
        let cut;
        let body = match &self.body {
            ControlBody::Grant { offset, priority } => Body::Grant(wire::Grant {
                offset: *offset,
                priority: *priority,
            }),
            ControlBody::GrantFor(_) => unreachable!("grants are resolved before encoding"),
            ControlBody::Resend {
                offset,
                length,
                priority,
            } => Body::Resend(wire::Resend {
                offset: *offset,
                length: *length,
                priority: *priority,
            }),
            ControlBody::RpcUnknown => Body::RpcUnknown,
            ControlBody::Busy => Body::Busy,
            ControlBody::Cutoffs => {
                cut = wire::Cutoffs {
                    version: s.cutoff_version,
                    cutoffs: *s.cutoffs,
                };
                Body::Cutoffs(cut)
            }
            ControlBody::NeedAck => Body::NeedAck,
            ControlBody::Ack(ids) => Body::Ack(ids),
            ControlBody::StreamCreditFor { .. } => {
                unreachable!("stream credits are resolved before encoding")
            }
            ControlBody::StreamCredit(c) => Body::StreamCredit(*c),
            ControlBody::StreamReset(r) => Body::StreamReset(*r),
        };
        wire::encode(buf, &common, &body, s.checksum);
        self.body.packet_type()
    }
}

/// Control packets in the order queued. Invariant: at most
/// [`MAX_CONTROL_QUEUE`] of them.
#[derive(Default)]
pub(crate) struct ControlQueue {
    queue: VecDeque<Control>,
}

impl ControlQueue {
    /// Queues `c`, unless the queue is full: then returns false (the
    /// caller counts the drop).
    #[inline]
    pub fn push(&mut self, c: Control) -> bool {
        if !self.has_room() {
            return false;
        }
        self.queue.push_back(c);
        true
    }

    /// Whether [`Self::push`] would take another packet.
    #[inline]
    pub fn has_room(&self) -> bool {
        self.queue.len() < MAX_CONTROL_QUEUE
    }

    #[inline]
    pub fn pop(&mut self) -> Option<Control> {
        self.queue.pop_front()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control(id: u64, body: ControlBody) -> Control {
        Control {
            dest: SocketAddr::from(([10, 0, 0, 1], 4000)),
            rpc_id: id,
            from_client: id.is_multiple_of(2),
            body,
        }
    }

    #[test]
    fn the_queue_keeps_order_and_drops_beyond_its_bound() {
        let mut q = ControlQueue::default();
        assert!(q.is_empty() && q.pop().is_none());
        for id in 0..MAX_CONTROL_QUEUE as u64 {
            assert!(q.push(control(id, ControlBody::Busy)));
        }
        assert!(!q.has_room());
        assert!(!q.push(control(u64::MAX, ControlBody::Busy)), "full");
        for id in 0..MAX_CONTROL_QUEUE as u64 {
            assert_eq!(q.pop().map(|c| c.rpc_id), Some(id));
        }
        assert!(q.is_empty() && q.has_room());
    }

    #[test]
    fn every_body_encodes_as_its_packet() {
        let cutoffs = [100, 200, 0, 0, 0, 0, 0, 0];
        let stamp = Stamp {
            now: 0,
            echo_time: 77,
            cutoff_version: 3,
            cutoffs: &cutoffs,
            checksum: true,
        };
        let bodies = [
            ControlBody::Grant {
                offset: 5_000,
                priority: 2,
            },
            ControlBody::Resend {
                offset: 10,
                length: 20,
                priority: 1,
            },
            ControlBody::RpcUnknown,
            ControlBody::Busy,
            ControlBody::Cutoffs,
            ControlBody::NeedAck,
            ControlBody::Ack(vec![4, 6]),
        ];
        let mut buf = Vec::new();
        for (i, body) in bodies.into_iter().enumerate() {
            let c = control(i as u64 + 10, body);
            buf.clear();
            let t = c.encode(&stamp, &mut buf);
            assert!(wire::verify_checksum(&buf, true));
            let d = wire::decode(&buf).unwrap();
            assert_eq!(d.packet.packet_type(), t);
            assert_eq!(d.common.rpc_id, c.rpc_id);
            assert_eq!(d.common.from_client, c.from_client);
            assert_eq!(d.common.echo_time, 77);
            assert_eq!(d.common.send_time, 1, "time 0 is sent as 1");
            match (&c.body, d.packet) {
                (ControlBody::Grant { offset, priority }, wire::Packet::Grant(g)) => {
                    assert_eq!((g.offset, g.priority), (*offset, *priority))
                }
                (
                    ControlBody::Resend {
                        offset,
                        length,
                        priority,
                    },
                    wire::Packet::Resend(r),
                ) => assert_eq!(
                    (r.offset, r.length, r.priority),
                    (*offset, *length, *priority)
                ),
                (ControlBody::Cutoffs, wire::Packet::Cutoffs(cut)) => {
                    assert_eq!((cut.version, cut.cutoffs), (3, cutoffs))
                }
                (ControlBody::Ack(ids), wire::Packet::Ack(got)) => {
                    assert_eq!(got.iter().collect::<Vec<_>>(), *ids)
                }
                (ControlBody::RpcUnknown, wire::Packet::RpcUnknown)
                | (ControlBody::Busy, wire::Packet::Busy)
                | (ControlBody::NeedAck, wire::Packet::NeedAck) => {}
                (_, p) => panic!("body {i} decoded as {:?}", p.packet_type()),
            }
        }
    }
}
