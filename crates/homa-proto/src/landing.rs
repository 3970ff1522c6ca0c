//! Landing: a long message's DATA payload received straight into its place
//! in the receive pool, so that the receiver copies each byte once (the
//! kernel's copy) as a TCP receiver does, instead of twice (the kernel into
//! the driver's buffer, the engine into the pool).
//!
//! It pays for large packets only: the driver first peeks at a datagram's
//! headers (one more system call per datagram), then asks
//! [`Endpoint::landing_site`] where its payload belongs and receives it
//! there with a scatter read (headers into a small buffer, payload into at
//! most two pool slices), then reports it with [`Endpoint::handle_landed`].
//! The engine hands out only pool bytes of a message it is receiving that no
//! packet has filled yet, so a datagram that turns out different from its
//! peeked headers overwrites nothing that was received; the driver checks
//! that the headers it read are the ones it peeked before reporting.

use crate::endpoint::Endpoint;
use crate::incoming::DataPayload;
use crate::metrics::DropReason;
use crate::time::Time;
use crate::wire::{self, PacketType, DATA_PACKET_OVERHEAD};
use smallvec::SmallVec;
use std::net::SocketAddr;

/// Where a DATA datagram's bytes go: its first [`Self::header_len`] bytes
/// (the headers) into the driver's own buffer, the rest into
/// [`Self::payload`]'s slices in order.
#[derive(Debug)]
pub struct LandingSite<'a> {
    /// Bytes of headers in front of the payload.
    pub header_len: usize,
    /// The pool bytes the payload fills, in order (one slice per receive
    /// pool page it touches: one or two for a packet of up to 64 KB).
    pub payload: SmallVec<[&'a mut [u8]; 2]>,
}

impl Endpoint {
    /// Where the payload of the DATA datagram of `datagram_len` bytes from
    /// `from`, whose first bytes are `head` (at least
    /// [`wire::DATA_PACKET_OVERHEAD`]), can be received directly: `None`
    /// unless it is a packet of a message this endpoint is already receiving
    /// into the pool, carrying only bytes not yet received (and without
    /// padding or a checksum, which need the payload's bytes). A `None` is
    /// no verdict on the packet: the driver then receives it as usual.
    ///
    /// The driver must call no other engine method before
    /// [`Self::handle_landed`] for the same datagram (or, if the receive
    /// failed, before dropping the site: the bytes it wrote are unclaimed).
    pub fn landing_site(
        &mut self,
        from: SocketAddr,
        head: &[u8],
        datagram_len: usize,
    ) -> Option<LandingSite<'_>> {
        if self.is_shut_down() || self.derived.require_checksum() || self.derived.discard_payload()
        {
            return None;
        }
        if head.get(1) == Some(&(PacketType::StreamData as u8)) {
            return self.stream_landing_site(from, head, datagram_len);
        }
        let (c, h, len) = wire::decode_data_head(head, datagram_len).ok()?;
        let key = self.lookup(self.peers.find(from), &c)?;
        let rpc = self.rpcs.get(key)?;
        let inc = rpc.inc.as_ref()?;
        let alloc = inc.alloc.as_ref()?;
        if inc.len != h.message_length
            || len == 0
            || !inc.received.is_missing(h.offset, h.offset + len as u32)
        {
            return None;
        }
        let payload = self.pool.spans_mut(alloc, h.offset as usize, len);
        Some(LandingSite {
            header_len: DATA_PACKET_OVERHEAD,
            payload,
        })
    }

    /// Feeds a DATA datagram of `datagram_len` bytes from `from` whose
    /// payload the driver received into the [`LandingSite`] that
    /// [`Self::landing_site`] gave for it; `head` holds its headers as
    /// received. Otherwise the same as [`Self::handle_datagram`].
    pub fn handle_landed(&mut self, now: Time, from: SocketAddr, head: &[u8], datagram_len: usize) {
        self.run_deferred(now);
        self.note_time(now);
        self.metrics.bytes_received += datagram_len as u64;
        if self.is_shut_down() {
            return;
        }
        if head.get(1) == Some(&(PacketType::StreamData as u8)) {
            return self.handle_stream_landed(now, from, head, datagram_len);
        }
        let Ok((c, h, len)) = wire::decode_data_head(head, datagram_len) else {
            self.metrics.drop(DropReason::Malformed);
            return;
        };
        let hint = self.last_rx_peer;
        let pk = self.packet_peer(now, from, &c, PacketType::Data, hint);
        self.last_rx_peer = pk.or(hint);
        self.handle_data(now, from, pk, &c, &h, DataPayload::Landed(len));
        self.check_pool_waiters(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::endpoint::Event;
    use crate::wire::{Body, CommonHeader, DataHeader};

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn packet(id: u64, len: u32, offset: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        wire::encode(
            &mut out,
            &CommonHeader {
                from_client: true,
                retransmit: false,
                rpc_id: id,
                send_time: 1,
                echo_time: 0,
            },
            &Body::Data {
                header: DataHeader {
                    message_length: len,
                    offset,
                    unsched_bytes: len,
                    cutoff_version: 0,
                    ack: 0,
                },
                payload,
            },
            false,
        );
        out
    }

    fn server() -> Endpoint {
        let cfg = Config::default()
            .with_max_packet_size(20_000)
            .with_unsched_bytes(Some(200_000));
        Endpoint::new(cfg, 0).unwrap()
    }

    /// The kernel's part, done by hand: headers to `head`, payload to the site.
    fn land(ep: &mut Endpoint, from: SocketAddr, pkt: &[u8]) -> bool {
        let Some(mut site) = ep.landing_site(from, pkt, pkt.len()) else {
            return false;
        };
        let mut rest = &pkt[site.header_len..];
        for span in site.payload.iter_mut() {
            let (now, later) = rest.split_at(span.len());
            span.copy_from_slice(now);
            rest = later;
        }
        assert!(rest.is_empty(), "the site holds the whole payload");
        drop(site);
        let head = pkt[..DATA_PACKET_OVERHEAD].to_vec();
        ep.handle_landed(10, from, &head, pkt.len());
        true
    }

    fn message(ep: &mut Endpoint) -> Vec<u8> {
        while let Some(ev) = ep.poll_event() {
            if let Event::Request { message, .. } = ev {
                return message.to_vec();
            }
        }
        panic!("no request delivered");
    }

    #[test]
    fn later_packets_of_a_message_land_in_the_pool() {
        let mut ep = server();
        let body: Vec<u8> = (0..150_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let from = addr(1);
        // The first packet creates the RPC and its pool space: no site yet.
        let first = packet(2, 150_000, 0, &body[..19_000]);
        assert!(ep.landing_site(from, &first, first.len()).is_none());
        ep.handle_datagram(1, from, &first);
        // The rest lands, including a packet that straddles two pool pages.
        let mut off = 19_000;
        while off < body.len() {
            let end = (off + 19_000).min(body.len());
            let pkt = packet(2, 150_000, off as u32, &body[off..end]);
            assert!(land(&mut ep, from, &pkt), "packet at {off} lands");
            off = end;
        }
        assert_eq!(message(&mut ep), body);
    }

    #[test]
    fn received_bytes_unknown_rpcs_and_bad_headers_get_no_site() {
        let mut ep = server();
        let from = addr(1);
        let body = vec![5u8; 60_000];
        ep.handle_datagram(1, from, &packet(2, 60_000, 0, &body[..19_000]));
        // Bytes already received (a duplicate, or an overlap).
        let dup = packet(2, 60_000, 0, &body[..19_000]);
        assert!(ep.landing_site(from, &dup, dup.len()).is_none());
        let overlap = packet(2, 60_000, 18_000, &body[..19_000]);
        assert!(ep.landing_site(from, &overlap, overlap.len()).is_none());
        // Another RPC, another sender, a wrong length, a cut datagram.
        let other = packet(4, 60_000, 19_000, &body[..19_000]);
        assert!(ep.landing_site(from, &other, other.len()).is_none());
        let good = packet(2, 60_000, 19_000, &body[..19_000]);
        assert!(ep.landing_site(addr(2), &good, good.len()).is_none());
        let lying = packet(2, 70_000, 19_000, &body[..19_000]);
        assert!(ep.landing_site(from, &lying, lying.len()).is_none());
        assert!(ep.landing_site(from, &good, good.len() - 1).is_none());
        assert!(ep.landing_site(from, &good, good.len() + 1).is_none());
        // The good one lands; nothing was delivered or dropped on the way.
        assert!(land(&mut ep, from, &good));
        assert_eq!(ep.metrics().total_drops(), 0);
    }

    #[test]
    fn a_landed_report_with_bad_headers_is_dropped_as_malformed() {
        let mut ep = server();
        let mut head = packet(2, 60_000, 19_000, &[1u8; 100]);
        head[0] = 0xee;
        ep.handle_landed(1, addr(1), &head[..DATA_PACKET_OVERHEAD], head.len());
        assert_eq!(ep.metrics().drops(DropReason::Malformed), 1);
    }
}
