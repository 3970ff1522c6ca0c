//! The driver's fast path: entry points that a driver chasing nanoseconds
//! uses beside the front door ([`Endpoint::poll_transmit`],
//! [`Endpoint::handle_datagram`], [`Endpoint::poll_timeout`]...), which alone
//! suffice to run the protocol. Bring the trait into scope to use them:
//! `use homa_proto::driver::FastPath;`. The UDP runtime sends with
//! [`FastPath::poll_transmit_burst`] (one GSO send per call) and indexes its
//! per-RPC data with [`FastPath::client_rpc_index`]; the simulator prefetches
//! with [`FastPath::prefetch_dest`] / [`FastPath::prefetch_send`]; the test
//! network skips empty polls with [`FastPath::poll_nothing_to_send`].

use crate::endpoint::{Endpoint, RpcId, Transmit};
use crate::outgoing::Burst;
use crate::time::Time;
use std::net::SocketAddr;

/// Performance hooks of [`Endpoint`] for drivers (see the module docs).
/// Each behaves as the front-door call it stands for; none changes what the
/// protocol does.
pub trait FastPath {
    /// Like [`Endpoint::poll_transmit`], but a DATA packet's payload is not
    /// copied: `buf` receives the headers only, and the payload comes back
    /// as a slice of the message's `Bytes`, to be sent right after them (one
    /// `sendmsg` with two iovecs). `Transmit::len` is the whole datagram's
    /// length, including any padding (`Config::pad_v4`): the driver appends
    /// `len - headers - payload` zero bytes after the payload. The payload
    /// is empty for control packets. A first transmission from a
    /// [`crate::SendBuf`] leaves `buf` empty and returns the whole packet,
    /// its header written in place, as the payload. The last packet of a
    /// message with at most `WHOLE_MAX_PAYLOAD` (512) bytes of payload is
    /// written whole into `buf` (padding included) and comes with an empty
    /// payload: every short request and response leaves as one buffer.
    fn poll_transmit_split(
        &mut self,
        now: Time,
        buf: &mut Vec<u8>,
    ) -> Option<(Transmit, bytes::Bytes)>;

    /// Like [`Self::poll_transmit_split`], but when the next packet is new
    /// DATA, goes on with the same message's following packets (up to
    /// `max_packets` in all) for as long as [`Endpoint::poll_transmit`]
    /// would have chosen them one by one: the same packets, in the same
    /// order, with the same pacing, for one SRPT decision and one payload
    /// handle instead of one per packet. `buf` receives the packets' headers
    /// back to back, `header_len` bytes each; the payload of packet `i` is
    /// `payload[i * segment..]`, `segment` bytes except for the last packet.
    /// A control packet or a retransmission comes alone (`count` 1,
    /// `header_len` its whole encoding, plus its payload if it is DATA).
    /// Drivers use it to fill one UDP GSO send per call.
    fn poll_transmit_burst(
        &mut self,
        now: Time,
        max_packets: usize,
        buf: &mut Vec<u8>,
    ) -> Option<Burst>;

    /// Whether [`Endpoint::poll_transmit`] may have a packet now; `false`
    /// means it (and every other form of polling) surely returns `None`. A
    /// few loads: drivers ask it before setting up a transmit pass, which
    /// after every receive and every send finds nothing more to send (~30 ns
    /// a time through `poll_transmit_burst`, four times per short round
    /// trip).
    fn may_transmit(&self) -> bool;

    /// Does what [`Endpoint::poll_transmit`]`(now, _)` would do if that finds
    /// nothing queued to send (no control packet, retransmission or sendable
    /// message): notes the time and returns true. Otherwise returns false
    /// and changes nothing. A driver that polls after every input (most of
    /// which queue nothing) saves preparing a buffer for a poll that yields
    /// nothing.
    fn poll_nothing_to_send(&mut self, now: Time) -> bool;

    /// First of two hints for a driver that knows some time ahead that a
    /// `send_request` to `dest` is coming (a simulator draws its arrivals
    /// ahead): starts loading the destination's slot of the address index.
    /// Changes nothing.
    fn prefetch_dest(&self, dest: SocketAddr);

    /// Second hint, shortly before the `send_request` (after
    /// [`Self::prefetch_dest`], whose load it uses): starts loading the
    /// destination's peer entry and the slab slot the new RPC will take.
    /// Changes nothing.
    fn prefetch_send(&self, dest: SocketAddr);

    /// A dense index for client RPC `id`: its slot in the engine's RPC
    /// table (the id's low bits), which no other live RPC shares. Slots are
    /// reused most-recently-freed first, so they stay as small as the
    /// number of RPCs in progress, and a driver can keep its own per-RPC
    /// data in a vector indexed by it instead of a hash map (the runtime's
    /// map lookup cost ~100 ns per response, a cache miss on the fast
    /// path). Any id maps to some index below `2^32`; only those of live
    /// client RPCs are below the table's length. Compare the stored id.
    fn client_rpc_index(&self, id: RpcId) -> usize;
}

// Each forwards to the engine's crate-internal method of the same name
// (inherent methods take precedence inside the crate, and are invisible
// outside it, where these are found instead).
impl FastPath for Endpoint {
    #[inline(always)]
    fn poll_transmit_split(
        &mut self,
        now: Time,
        buf: &mut Vec<u8>,
    ) -> Option<(Transmit, bytes::Bytes)> {
        Endpoint::poll_transmit_split(self, now, buf)
    }
    #[inline(always)]
    fn poll_transmit_burst(
        &mut self,
        now: Time,
        max_packets: usize,
        buf: &mut Vec<u8>,
    ) -> Option<Burst> {
        Endpoint::poll_transmit_burst(self, now, max_packets, buf)
    }
    #[inline(always)]
    fn may_transmit(&self) -> bool {
        Endpoint::may_transmit(self)
    }
    #[inline(always)]
    fn poll_nothing_to_send(&mut self, now: Time) -> bool {
        Endpoint::poll_nothing_to_send(self, now)
    }
    #[inline(always)]
    fn prefetch_dest(&self, dest: SocketAddr) {
        Endpoint::prefetch_dest(self, dest)
    }
    #[inline(always)]
    fn prefetch_send(&self, dest: SocketAddr) {
        Endpoint::prefetch_send(self, dest)
    }
    #[inline(always)]
    fn client_rpc_index(&self, id: RpcId) -> usize {
        Endpoint::client_rpc_index(self, id)
    }
}
