//! Property tests of the wire format: encode/decode round trips, robustness of
//! the decoder against arbitrary and mutated input, checksum coverage, and the
//! splitting of GRO-coalesced datagrams by the packets' declared lengths.

use homa_proto::wire::{
    self, Body, CommonHeader, Cutoffs, DataHeader, Decoded, Grant, Packet, Resend, ResetReason,
    StreamCredit, StreamDataHeader, COMMON_HEADER_LEN, MAX_ACKS_PER_PACKET, MAX_PRIORITIES,
    MAX_STREAM_OFFSET,
};
use proptest::prelude::*;
use proptest::sample::Index;

/// Payload bytes in a full DATA packet of a 1472-byte datagram.
const MAX_PAYLOAD: u32 = 1472 - wire::DATA_PACKET_OVERHEAD as u32;

/// An owned [`Body`], so that strategies can produce it.
#[derive(Clone, Debug)]
enum OwnedBody {
    Data(DataHeader, Vec<u8>),
    Grant(Grant),
    Resend(Resend),
    RpcUnknown,
    Busy,
    Cutoffs(Cutoffs),
    NeedAck,
    Ack(Vec<u64>),
    StreamData(StreamDataHeader, Vec<u32>, Vec<u8>),
    StreamCredit(StreamCredit),
    StreamReset(ResetReason),
}

impl OwnedBody {
    fn as_body(&self) -> Body<'_> {
        match self {
            OwnedBody::Data(header, payload) => Body::Data {
                header: *header,
                payload,
            },
            OwnedBody::Grant(g) => Body::Grant(*g),
            OwnedBody::Resend(r) => Body::Resend(*r),
            OwnedBody::RpcUnknown => Body::RpcUnknown,
            OwnedBody::Busy => Body::Busy,
            OwnedBody::Cutoffs(c) => Body::Cutoffs(*c),
            OwnedBody::NeedAck => Body::NeedAck,
            OwnedBody::Ack(ids) => Body::Ack(ids),
            OwnedBody::StreamData(header, ends, payload) => Body::StreamData {
                header: *header,
                ends,
                payload,
            },
            OwnedBody::StreamCredit(c) => Body::StreamCredit(*c),
            OwnedBody::StreamReset(r) => Body::StreamReset(*r),
        }
    }

    /// True when `packet` carries exactly this body.
    fn matches(&self, packet: &Packet<'_>) -> bool {
        match (self, packet) {
            (OwnedBody::Data(h, p), Packet::Data { header, payload }) => {
                h == header && p == payload
            }
            (OwnedBody::Grant(a), Packet::Grant(b)) => a == b,
            (OwnedBody::Resend(a), Packet::Resend(b)) => a == b,
            (OwnedBody::Cutoffs(a), Packet::Cutoffs(b)) => a == b,
            (OwnedBody::Ack(a), Packet::Ack(b)) => a.iter().copied().eq(b.iter()),
            (
                OwnedBody::StreamData(h, e, p),
                Packet::StreamData {
                    header,
                    ends,
                    payload,
                },
            ) => h == header && p == payload && e.iter().copied().eq(ends.iter()),
            (OwnedBody::StreamCredit(a), Packet::StreamCredit(b)) => a == b,
            (OwnedBody::StreamReset(a), Packet::StreamReset(b)) => a == b,
            (OwnedBody::RpcUnknown, Packet::RpcUnknown)
            | (OwnedBody::Busy, Packet::Busy)
            | (OwnedBody::NeedAck, Packet::NeedAck) => true,
            _ => false,
        }
    }
}

fn common() -> impl Strategy<Value = CommonHeader> {
    (
        any::<bool>(),
        any::<bool>(),
        1..=u64::MAX,
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(from_client, retransmit, rpc_id, send_time, echo_time)| CommonHeader {
                from_client,
                retransmit,
                rpc_id,
                send_time,
                echo_time,
            },
        )
}

/// A message length biased towards both small and huge values.
fn message_length() -> impl Strategy<Value = u32> {
    prop_oneof![1..=5000u32, 1..=u32::MAX, Just(u32::MAX)]
}

fn data() -> impl Strategy<Value = OwnedBody> {
    let nonempty = message_length()
        .prop_flat_map(|ml| (Just(ml), 0..ml))
        .prop_flat_map(|(ml, offset)| {
            let max_len = (ml - offset).min(MAX_PAYLOAD) as usize;
            (
                Just(ml),
                Just(offset),
                prop::collection::vec(any::<u8>(), 1..=max_len),
                0..=ml,
            )
        });
    // A zero-length message: one DATA packet, offset 0, empty payload.
    let empty = Just((0u32, 0u32, Vec::new(), 0u32));
    (
        prop_oneof![9 => nonempty, 1 => empty],
        any::<u16>(),
        prop_oneof![Just(0u64), any::<u64>()],
    )
        .prop_map(
            |((message_length, offset, payload, unsched_bytes), cutoff_version, ack)| {
                OwnedBody::Data(
                    DataHeader {
                        message_length,
                        offset,
                        unsched_bytes,
                        cutoff_version,
                        ack,
                    },
                    payload,
                )
            },
        )
}

fn priority() -> impl Strategy<Value = u8> {
    0..MAX_PRIORITIES as u8
}

fn grant() -> impl Strategy<Value = OwnedBody> {
    (any::<u32>(), priority())
        .prop_map(|(offset, priority)| OwnedBody::Grant(Grant { offset, priority }))
}

fn resend() -> impl Strategy<Value = OwnedBody> {
    (any::<u32>(), any::<u32>(), priority()).prop_map(|(offset, length, priority)| {
        OwnedBody::Resend(Resend {
            offset,
            length,
            priority,
        })
    })
}

fn cutoffs() -> impl Strategy<Value = OwnedBody> {
    (any::<u16>(), prop::array::uniform8(any::<u32>()))
        .prop_map(|(version, cutoffs)| OwnedBody::Cutoffs(Cutoffs { version, cutoffs }))
}

/// A stream offset, biased towards small values and the limit.
fn stream_offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..100_000u64,
        0..MAX_STREAM_OFFSET / 2,
        Just(MAX_STREAM_OFFSET / 2)
    ]
}

fn stream_data() -> impl Strategy<Value = OwnedBody> {
    (
        stream_offset(),
        stream_offset(),
        stream_offset(),
        prop::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD as usize),
        prop::collection::btree_set(1..=MAX_PAYLOAD, 0..20),
        any::<bool>(),
    )
        .prop_map(|(offset, rev_credit, rev_received, payload, ends, fin)| {
            // An empty packet is a FIN alone; ends lie within the payload.
            let fin = fin || payload.is_empty();
            let ends: Vec<u32> = ends
                .into_iter()
                .filter(|&e| e as usize <= payload.len())
                .collect();
            OwnedBody::StreamData(
                StreamDataHeader {
                    offset,
                    rev_credit,
                    rev_received,
                    fin,
                },
                ends,
                payload,
            )
        })
}

fn stream_credit() -> impl Strategy<Value = OwnedBody> {
    (
        stream_offset(),
        stream_offset(),
        prop_oneof![Just(0u64), 1..1_000_000u64],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(credit, received, gap, probe, fin_received)| {
            OwnedBody::StreamCredit(StreamCredit {
                credit,
                received,
                resend_end: if gap == 0 { 0 } else { received + gap },
                probe,
                fin_received,
            })
        })
}

fn body() -> impl Strategy<Value = OwnedBody> {
    prop_oneof![
        data(),
        grant(),
        resend(),
        Just(OwnedBody::RpcUnknown),
        Just(OwnedBody::Busy),
        cutoffs(),
        Just(OwnedBody::NeedAck),
        prop::collection::vec(any::<u64>(), 0..=MAX_ACKS_PER_PACKET).prop_map(OwnedBody::Ack),
        stream_data(),
        stream_credit(),
        prop::sample::select(vec![
            ResetReason::Cancelled,
            ResetReason::Unknown,
            ResetReason::Refused,
            ResetReason::Shutdown,
            ResetReason::Stuck,
        ])
        .prop_map(OwnedBody::StreamReset),
    ]
}

fn encoded(c: &CommonHeader, b: &OwnedBody, checksum: bool) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode(&mut out, c, &b.as_body(), checksum);
    out
}

fn reencode(d: &Decoded<'_>) -> Vec<u8> {
    let acks: Vec<u64>;
    let stream_ends: Vec<u32>;
    let body = match d.packet {
        Packet::Data { header, payload } => Body::Data { header, payload },
        Packet::Grant(g) => Body::Grant(g),
        Packet::Resend(r) => Body::Resend(r),
        Packet::RpcUnknown => Body::RpcUnknown,
        Packet::Busy => Body::Busy,
        Packet::Cutoffs(c) => Body::Cutoffs(c),
        Packet::NeedAck => Body::NeedAck,
        Packet::Ack(list) => {
            acks = list.iter().collect();
            Body::Ack(&acks)
        }
        Packet::StreamData {
            header,
            ends,
            payload,
        } => {
            stream_ends = ends.iter().collect();
            Body::StreamData {
                header,
                ends: &stream_ends,
                payload,
            }
        }
        Packet::StreamCredit(c) => Body::StreamCredit(c),
        Packet::StreamReset(r) => Body::StreamReset(r),
    };
    let mut out = Vec::new();
    wire::encode(&mut out, &d.common, &body, false);
    out
}

/// Whatever the input, decoding and checking it must not panic, and anything
/// accepted must be canonical: its re-encoding is the same bytes, apart from
/// the checksum field (4..8), which the re-encoding leaves zero. An accepted
/// packet's declared length is its length.
fn check_any_input(bytes: &[u8]) -> Result<(), TestCaseError> {
    let optional = wire::verify_checksum(bytes, false);
    let required = wire::verify_checksum(bytes, true);
    prop_assert!(!required || optional);
    let seg = wire::coalesced_segment(bytes);
    prop_assert!(seg >= 1 && seg <= bytes.len().max(1));
    if let Ok(d) = wire::decode(bytes) {
        prop_assert_eq!(wire::packet_len(bytes), Some(bytes.len()));
        prop_assert_eq!(seg, bytes.len());
        let again = reencode(&d);
        prop_assert_eq!(again.len(), bytes.len());
        prop_assert_eq!(&again[..4], &bytes[..4]);
        prop_assert_eq!(&again[4..8], &[0u8; 4][..]);
        prop_assert_eq!(&again[8..], &bytes[8..]);
    }
    Ok(())
}

/// An edit of an encoded packet.
#[derive(Clone, Debug)]
enum Mutation {
    Set(Index, u8),
    Truncate(Index),
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..20).prop_map(Mutation::Append),
    ]
}

/// Most packets in one generated GRO batch.
const MAX_BATCH: usize = 8;

/// Packet bodies as GRO would coalesce them: `n` of one encoded length, then
/// possibly one shorter. DATA packets are consecutive pieces of one message.
fn gro_batch() -> impl Strategy<Value = Vec<OwnedBody>> {
    let data = (
        1..=MAX_PAYLOAD as usize,
        1..MAX_BATCH,
        any::<Index>(),
        any::<bool>(),
        any::<u8>(),
        any::<Index>(),
        any::<u16>(),
        any::<u64>(),
    )
        .prop_map(|(per, n, short, has_short, seed, unsched, version, ack)| {
            // The last piece, if any, is 1..per bytes (none when per is 1).
            let tail = if has_short && per > 1 {
                1 + short.index(per - 1)
            } else {
                0
            };
            let len = n * per + tail;
            let message: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
            let header = |offset: usize| DataHeader {
                message_length: len as u32,
                offset: offset as u32,
                unsched_bytes: unsched.index(len + 1) as u32,
                cutoff_version: version,
                ack,
            };
            message
                .chunks(per)
                .enumerate()
                .map(|(i, piece)| OwnedBody::Data(header(i * per), piece.to_vec()))
                .collect()
        });
    let ids = || prop::collection::vec(any::<u64>(), 0..=MAX_ACKS_PER_PACKET);
    let acks = (
        0..=MAX_ACKS_PER_PACKET,
        prop::collection::vec(ids(), 1..MAX_BATCH),
        prop::option::of(ids()),
    )
        .prop_map(|(k, lists, last)| {
            let mut out: Vec<OwnedBody> = lists
                .into_iter()
                .map(|mut l| {
                    l.resize(k, 7);
                    OwnedBody::Ack(l)
                })
                .collect();
            if let Some(mut l) = last.filter(|_| k > 0) {
                l.truncate(k - 1);
                out.push(OwnedBody::Ack(l));
            }
            out
        });
    // Fixed-size types: any number of one type.
    let n = || 1..MAX_BATCH;
    let fixed = prop_oneof![
        prop::collection::vec(grant(), n()),
        prop::collection::vec(resend(), n()),
        prop::collection::vec(cutoffs(), n()),
        n().prop_map(|n| vec![OwnedBody::RpcUnknown; n]),
        n().prop_map(|n| vec![OwnedBody::Busy; n]),
        n().prop_map(|n| vec![OwnedBody::NeedAck; n]),
    ];
    prop_oneof![2 => data, 1 => acks, 1 => fixed]
}

proptest! {
    #[test]
    fn round_trip(c in common(), b in body(), checksum in any::<bool>()) {
        let bytes = encoded(&c, &b, checksum);
        let d = wire::decode(&bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(d.common, c);
        prop_assert!(b.matches(&d.packet), "{:?} decoded as {:?}", b, d.packet);
        prop_assert_eq!(wire::verify_checksum(&bytes, true), checksum);
        prop_assert!(wire::verify_checksum(&bytes, false));
        prop_assert_eq!(reencode(&d)[8..].to_vec(), bytes[8..].to_vec());
        prop_assert_eq!(wire::packet_len(&bytes), Some(bytes.len()));
    }

    /// A GRO-coalesced datagram (packets of one length, the last possibly
    /// shorter) cut at `coalesced_segment` gives back the packets.
    #[test]
    fn coalesced_datagrams_split_into_their_packets(
        batch in gro_batch(),
        commons in prop::collection::vec(common(), MAX_BATCH),
        checksum in any::<bool>(),
    ) {
        let packets: Vec<Vec<u8>> = batch
            .iter()
            .zip(&commons)
            .map(|(b, c)| encoded(c, b, checksum))
            .collect();
        let (full, last) = (packets[0].len(), packets[packets.len() - 1].len());
        prop_assert!(packets[..packets.len() - 1].iter().all(|p| p.len() == full));
        prop_assert!(last <= full);
        let datagram = packets.concat();
        let seg = wire::coalesced_segment(&datagram);
        prop_assert_eq!(seg, if packets.len() == 1 { datagram.len() } else { full });
        let cut: Vec<&[u8]> = datagram.chunks(seg).collect();
        prop_assert_eq!(cut.len(), packets.len());
        for ((got, want), (b, c)) in cut.iter().zip(&packets).zip(batch.iter().zip(&commons)) {
            prop_assert_eq!(*got, want.as_slice());
            let d = wire::decode(got).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(d.common, *c);
            prop_assert!(b.matches(&d.packet));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        check_any_input(&bytes)?;
    }

    /// Random bytes rarely get past the version and type checks, so also start
    /// from valid packets and damage them.
    #[test]
    fn mutated_packets_never_panic_and_stay_canonical(
        c in common(),
        b in body(),
        checksum in any::<bool>(),
        edits in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = encoded(&c, &b, checksum);
        for m in edits {
            match m {
                Mutation::Set(i, v) => {
                    let i = i.index(bytes.len().max(1));
                    if let Some(x) = bytes.get_mut(i) {
                        *x = v;
                    }
                }
                Mutation::Truncate(i) => {
                    let n = i.index(bytes.len() + 1);
                    bytes.truncate(n);
                }
                Mutation::Append(more) => bytes.extend(more),
            }
        }
        check_any_input(&bytes)?;
    }

    #[test]
    fn single_byte_corruption_is_detected(
        c in common(),
        b in body(),
        at in any::<Index>(),
        flip in 1..=255u8,
    ) {
        let mut bytes = encoded(&c, &b, true);
        prop_assert!(wire::verify_checksum(&bytes, true));
        let i = at.index(bytes.len());
        bytes[i] ^= flip;
        prop_assert!(!wire::verify_checksum(&bytes, true), "byte {} ^ {:#x} undetected", i, flip);
        // Outside the checksum field the stored value stays non-zero, so the
        // damage is caught even when checksums are optional.
        if !(4..8).contains(&i) {
            prop_assert!(!wire::verify_checksum(&bytes, false));
        }
    }

    /// Headers alone (every type) and short datagrams are never accepted by
    /// the checksum check unless intact.
    #[test]
    fn truncation_of_checksummed_packet_is_detected(c in common(), b in body(), at in any::<Index>()) {
        let bytes = encoded(&c, &b, true);
        let cut = at.index(bytes.len());
        prop_assert!(!wire::verify_checksum(&bytes[..cut], false));
        if cut < COMMON_HEADER_LEN {
            prop_assert!(wire::decode(&bytes[..cut]).is_err());
        }
    }
}
