//! Code shared by the fuzz targets, kept in a library so that `cargo test` runs
//! the committed seeds through exactly what the fuzzer runs, and so that the
//! seed files are produced by the same code that reads them.

use bytes::Bytes;
use homa_proto::driver::FastPath as _;
use homa_proto::wire::{
    self, Body, CommonHeader, Cutoffs, DataHeader, Decoded, Grant, Packet, Resend,
    COMMON_HEADER_LEN, MAX_ACKS_PER_PACKET, MAX_PRIORITIES,
};
use homa_proto::{
    Config, Endpoint, Event, Message, Outgoing, PartialMessage, PartialState, RpcId, SendBuf,
    SendError, ServerRpc, BPAGE_SIZE,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

// ---------------------------------------------------------------- decode target

/// Re-encodes a decoded packet (the decoder keeps every field, so this is exact).
pub fn reencode(d: &Decoded<'_>, out: &mut Vec<u8>, checksum: bool) {
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
    wire::encode_padded(out, &d.common, &body, checksum, d.pad);
}

/// The `decode` target: no input may panic the decoder or the checksum check;
/// every accepted packet is canonical (re-encoding gives the same bytes, the
/// checksum field aside) and exactly as long as it declares; a stored
/// checksum verifies exactly when it is the one the encoder would write. The
/// input is also split as a GRO datagram (see [`check_split`]).
pub fn check_decode(data: &[u8]) {
    check_split(data);
    check_data_head(data);
    let required = wire::verify_checksum(data, true);
    let optional = wire::verify_checksum(data, false);
    assert!(
        !required || optional,
        "a checksum that passes when required passes always"
    );
    // Datagrams shorter than a header fail every check.
    let stored = (data.len() >= COMMON_HEADER_LEN)
        .then(|| u32::from_le_bytes(data[4..8].try_into().unwrap()));
    match stored {
        None => assert!(!optional, "{}-byte datagram passed", data.len()),
        Some(0) => assert!(optional && !required, "absent checksum"),
        Some(_) => {}
    }
    let Ok(d) = wire::decode(data) else { return };
    assert_eq!(wire::packet_len(data), Some(data.len()));
    assert_eq!(wire::coalesced_segment(data), data.len());
    let mut out = Vec::new();
    reencode(&d, &mut out, false);
    assert_eq!(out.len(), data.len());
    assert_eq!(out[..4], data[..4]);
    assert_eq!(out[8..], data[8..]);
    assert_eq!(out[4..8], [0; 4]);
    out.clear();
    reencode(&d, &mut out, true);
    assert!(wire::verify_checksum(&out, true));
    assert_eq!(wire::decode(&out), Ok(d));
    if stored != Some(0) {
        assert_eq!(
            required,
            out == data,
            "checksum verdict disagrees with the encoder"
        );
    }
}

/// `wire::decode_data_head` (a landing driver's view: the first 56 bytes and
/// the datagram's length) never panics, and accepts exactly the DATA
/// packets without padding or checksum that `wire::decode` accepts, with the
/// same headers and payload length.
pub fn check_data_head(data: &[u8]) {
    let head = &data[..data.len().min(wire::DATA_PACKET_OVERHEAD)];
    let landed = wire::decode_data_head(head, data.len());
    // Any claimed length, too: nothing panics.
    let _ = wire::decode_data_head(head, data.len().wrapping_mul(7) % 70_000);
    let whole = wire::decode(data);
    let landable = data.len() >= wire::DATA_PACKET_OVERHEAD && data[3] == 0 && data[4..8] == [0; 4];
    match (&whole, landed) {
        (Ok(d), Ok((c, h, n))) => match &d.packet {
            wire::Packet::Data { header, payload } => {
                assert_eq!((d.common, *header, payload.len()), (c, h, n));
            }
            other => panic!("decode_data_head accepted a {:?}", other.packet_type()),
        },
        (Ok(d), Err(_)) => assert!(
            d.packet.packet_type() != wire::PacketType::Data || !landable,
            "a landable DATA packet refused: {d:?}"
        ),
        (Err(_), Ok(_)) => {
            // Only the payload's own bytes can make decode refuse what the
            // headers allow, and without padding there are none to check.
            panic!("decode_data_head accepted what decode refuses: {whole:?}")
        }
        (Err(_), Err(_)) => {}
    }
}

/// Splits `data` as a receiver that lacks the kernel's GRO segment size would
/// (`wire::coalesced_segment`): the segment is within 1..=len (1 when empty)
/// and, when it cuts, is the first packet's declared length; no piece panics
/// the decoder, and an accepted piece is exactly as long as it declares.
pub fn check_split(data: &[u8]) {
    let seg = wire::coalesced_segment(data);
    assert!(
        (1..=data.len().max(1)).contains(&seg),
        "segment {seg} of a {}-byte datagram",
        data.len()
    );
    if seg < data.len() {
        assert_eq!(wire::packet_len(data), Some(seg));
    }
    for piece in data.chunks(seg) {
        if wire::decode(piece).is_ok() {
            assert_eq!(wire::packet_len(piece), Some(piece.len()));
        }
    }
}

/// GRO-coalesced datagrams (packets of one length, a shorter last), so that
/// the fuzzer starts with inputs that `check_split` cuts into valid packets.
pub fn decode_gro_seeds() -> Vec<(String, Vec<u8>)> {
    let c = CommonHeader {
        from_client: true,
        retransmit: false,
        rpc_id: 0x1234,
        send_time: 1_000_000,
        echo_time: 999_000,
    };
    let message: Vec<u8> = (0..2932u32).map(|i| (i % 251) as u8).collect();
    let data = |offset: usize, len: usize| Body::Data {
        header: DataHeader {
            message_length: message.len() as u32,
            offset: offset as u32,
            unsched_bytes: message.len() as u32,
            cutoff_version: 1,
            ack: 0,
        },
        payload: &message[offset..offset + len],
    };
    let ids: Vec<u64> = (1..=9).collect();
    let grant = |offset| {
        Body::Grant(Grant {
            offset,
            priority: 2,
        })
    };
    let batches: Vec<(&str, Vec<Body<'_>>)> = vec![
        (
            "gro-data",
            vec![data(0, 1416), data(1416, 1416), data(2832, 100)],
        ),
        (
            "gro-ack",
            vec![
                Body::Ack(&ids[..4]),
                Body::Ack(&ids[4..8]),
                Body::Ack(&ids[8..]),
            ],
        ),
        (
            "gro-grant",
            vec![grant(10_000), grant(20_000), grant(30_000)],
        ),
    ];
    let mut seeds = Vec::new();
    for (name, bodies) in batches {
        let mut out = Vec::new();
        for body in &bodies {
            wire::encode(&mut out, &c, body, true);
        }
        seeds.push((format!("seed-{name}"), out));
    }
    seeds
}

/// One encoded packet of every type and flag variant: the `decode` seeds.
pub fn decode_seeds() -> Vec<(String, Vec<u8>)> {
    let c = |from_client, retransmit| CommonHeader {
        from_client,
        retransmit,
        rpc_id: 0x1234,
        send_time: 1_000_000,
        echo_time: 999_000,
    };
    let data = |ack| DataHeader {
        message_length: 3000,
        offset: 1416,
        unsched_bytes: 2832,
        cutoff_version: 1,
        ack,
    };
    let empty = DataHeader {
        message_length: 0,
        offset: 0,
        unsched_bytes: 0,
        ..data(0)
    };
    let payload: Vec<u8> = (0..1416u32).map(|i| i as u8).collect();
    let ids: Vec<u64> = (1..=MAX_ACKS_PER_PACKET as u64)
        .map(|i| 0x1000 + 2 * i)
        .collect();
    let cutoffs = Cutoffs {
        version: 1,
        cutoffs: [1_000, 10_000, 100_000, u32::MAX, 0, 0, 0, 0],
    };
    let cases: Vec<(&str, CommonHeader, Body<'_>)> = vec![
        (
            "data",
            c(true, false),
            Body::Data {
                header: data(0),
                payload: &payload[..100],
            },
        ),
        (
            "data-ack",
            c(true, false),
            Body::Data {
                header: data(0x1232),
                payload: &payload[..100],
            },
        ),
        (
            "data-full",
            c(false, false),
            Body::Data {
                header: data(0),
                payload: &payload,
            },
        ),
        (
            "data-empty-message",
            c(true, false),
            Body::Data {
                header: empty,
                payload: &[],
            },
        ),
        (
            "data-retransmit",
            c(false, true),
            Body::Data {
                header: data(0),
                payload: &payload[..1],
            },
        ),
        (
            "grant",
            c(false, false),
            Body::Grant(Grant {
                offset: 10_000,
                priority: 3,
            }),
        ),
        (
            "resend",
            c(true, false),
            Body::Resend(Resend {
                offset: 0,
                length: 1416,
                priority: 7,
            }),
        ),
        ("rpc-unknown", c(false, false), Body::RpcUnknown),
        ("busy", c(false, false), Body::Busy),
        ("cutoffs", c(false, false), Body::Cutoffs(cutoffs)),
        ("need-ack", c(false, false), Body::NeedAck),
        ("ack-0", c(true, false), Body::Ack(&[])),
        ("ack-1", c(true, false), Body::Ack(&ids[..1])),
        ("ack-32", c(true, false), Body::Ack(&ids)),
        (
            "stream-data",
            c(true, false),
            Body::StreamData {
                header: wire::StreamDataHeader {
                    offset: 0,
                    rev_credit: 1 << 20,
                    rev_received: 0,
                    fin: false,
                },
                ends: &[10, 40, 100],
                payload: &payload[..100],
            },
        ),
        (
            "stream-data-fin",
            c(false, true),
            Body::StreamData {
                header: wire::StreamDataHeader {
                    offset: 70_000,
                    rev_credit: 5 << 20,
                    rev_received: 3_000,
                    fin: true,
                },
                ends: &[],
                payload: &[],
            },
        ),
        (
            "stream-credit",
            c(false, false),
            Body::StreamCredit(wire::StreamCredit {
                credit: 1 << 20,
                received: 4_000,
                resend_end: 9_000,
                probe: true,
                fin_received: false,
            }),
        ),
        (
            "stream-reset",
            c(true, false),
            Body::StreamReset(wire::ResetReason::Cancelled),
        ),
    ];
    let mut seeds = Vec::new();
    for (name, common, body) in cases {
        for checksum in [false, true] {
            let mut out = Vec::new();
            wire::encode(&mut out, &common, &body, checksum);
            let suffix = if checksum { "-csum" } else { "" };
            seeds.push((format!("seed-{name}{suffix}"), out));
        }
    }
    // A short DATA packet padded as the UDP runtime pads 100-byte messages.
    for checksum in [false, true] {
        let mut out = Vec::new();
        let body = Body::Data {
            header: data(0),
            payload: &payload[..100],
        };
        wire::encode_padded(&mut out, &c(true, false), &body, checksum, 42);
        let suffix = if checksum { "-csum" } else { "" };
        seeds.push((format!("seed-data-padded{suffix}"), out));
    }
    seeds
}

// ---------------------------------------------------------------- engine target

/// Which RPC id a scripted packet carries: one the harness has seen (from
/// `send_request`, a delivered request or a transmitted packet), so that
/// scripts reach existing RPCs, or a literal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdSel {
    Known(u8),
    Raw(u64),
}

/// A well-formed packet for the script; the harness clamps its DATA fields so
/// that it always decodes (malformed input comes from [`Op::Raw`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptPacket {
    pub id: IdSel,
    pub from_client: bool,
    pub retransmit: bool,
    pub checksum: bool,
    pub send_time: u64,
    pub echo_time: u64,
    pub body: ScriptBody,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScriptBody {
    Data {
        message_length: u32,
        offset: u32,
        len: u16,
        unsched_bytes: u32,
        cutoff_version: u16,
        ack: IdSel,
    },
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
    Cutoffs {
        version: u16,
        cutoffs: [u32; MAX_PRIORITIES],
    },
    NeedAck,
    Ack(Vec<IdSel>),
}

/// One step of an engine script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Arbitrary bytes from source address `src % ADDRS`.
    Raw {
        src: u8,
        bytes: Vec<u8>,
    },
    /// An encoded [`ScriptPacket`] from `src`.
    Packet {
        src: u8,
        packet: ScriptPacket,
    },
    /// The clock moves on by `mantissa << (shift % 40)` ns.
    Advance {
        mantissa: u16,
        shift: u8,
    },
    /// The clock jumps to the engine's timer deadline (if later) and timers run.
    Timeout,
    /// Up to `max + 1` calls of `poll_transmit` (or its burst or split form).
    Transmit {
        max: u8,
        mode: TxMode,
    },
    /// Drains `poll_event`, keeping requests to answer and a few messages.
    Events,
    /// Answers a pending request with `len` bytes.
    Respond {
        pick: u8,
        len: u32,
        src: Source,
    },
    /// Starts an RPC of `len` bytes to `dest`.
    Request {
        dest: u8,
        len: u32,
        src: Source,
    },
    /// Cancels a client RPC.
    Cancel {
        pick: u8,
    },
    /// Drops the messages kept by `Events`, returning their pool space.
    ReleaseHeld,
    Shutdown,
}

const OP_KINDS: u8 = 11;

/// How [`Op::Transmit`] polls the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxMode {
    /// `poll_transmit`: whole datagrams in the harness's buffer.
    Single,
    /// `poll_transmit_burst` with `max_packets = 1 << exp` (`exp` < 8).
    Burst { exp: u8 },
    /// `poll_transmit_split`: headers in the buffer, payload as `Bytes`.
    Split,
}

/// What [`Op::Request`] and [`Op::Respond`] send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A fresh `Bytes` message.
    Bytes,
    /// A send buffer kept in harness slot `slot` (< 4): a new one of the
    /// step's length, or (`reuse`) the one already there, whatever its length
    /// and even while it is still in flight.
    Buf { slot: u8, reuse: bool },
    /// A send buffer whose segment size is not the endpoint's (always refused).
    BadLayout,
}

/// Send buffer slots of the harness.
const BUF_SLOTS: usize = 4;

/// The opcode byte is `kind + OP_KINDS * variant`; the variant (0 for the
/// plain form, so scripts written before variants existed mean what they
/// meant) selects [`TxMode`] and [`Source`].
fn tx_mode(variant: u8) -> TxMode {
    match variant % 3 {
        0 => TxMode::Single,
        1 => TxMode::Burst {
            exp: (variant / 3) % 8,
        },
        _ => TxMode::Split,
    }
}

fn tx_variant(mode: TxMode) -> u8 {
    match mode {
        TxMode::Single => 0,
        TxMode::Burst { exp } => {
            assert!(exp < 8, "burst exponent {exp}");
            1 + 3 * exp
        }
        TxMode::Split => 2,
    }
}

/// Variant bits: 0 = a send buffer, 1-2 = its slot, 3-4 = 0 new, 1 reuse,
/// 2 (or 3) wrong layout.
fn source(variant: u8) -> Source {
    if variant & 1 == 0 {
        return Source::Bytes;
    }
    let slot = (variant >> 1) & 3;
    match variant >> 3 {
        0 => Source::Buf { slot, reuse: false },
        1 => Source::Buf { slot, reuse: true },
        _ => Source::BadLayout,
    }
}

fn source_variant(src: Source) -> u8 {
    match src {
        Source::Bytes => 0,
        Source::Buf { slot, reuse } => {
            assert!((slot as usize) < BUF_SLOTS, "slot {slot}");
            1 | slot << 1 | (reuse as u8) << 3
        }
        Source::BadLayout => 1 | 2 << 3,
    }
}

fn opcode(kind: u8, variant: u8) -> u8 {
    let b = kind as u32 + OP_KINDS as u32 * variant as u32;
    u8::try_from(b).expect("variant fits the opcode byte")
}

/// Source addresses of scripted datagrams (more than `max_peers`).
pub fn addrs() -> [SocketAddr; 5] {
    [
        SocketAddr::from(([10, 0, 0, 1], 4000)),
        SocketAddr::from(([10, 0, 0, 2], 4000)),
        SocketAddr::from(([10, 0, 0, 2], 4001)),
        SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 1], 4000)),
        SocketAddr::from(([10, 0, 0, 3], 4000)),
    ]
}

/// Small limits, so that a short script can hit every one of them, and short
/// timers, so that a few `Advance` steps reach them. Checksums off: the fuzzer
/// could not produce a valid CRC, and `wire` is fuzzed separately.
pub fn engine_config() -> Config {
    Config::default()
        .with_max_message_length(200_000)
        .with_pool_bytes(4 * BPAGE_SIZE)
        .with_max_peers(3)
        .with_max_server_rpcs_per_peer(4)
        .with_max_client_rpcs(4)
        .with_resend_interval_ns(100_000)
        .with_rpc_timeout_ns(5_000_000)
        .with_tombstone_ns(2_000_000)
        .with_peer_idle_ns(10_000_000)
        .with_checksum(false)
        // As the UDP runtime pads short DATA datagrams.
        .with_pad_v4(homa_proto::PadWindow { from: 129, to: 198 })
        .with_pad_v6(homa_proto::PadWindow { from: 129, to: 188 })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2)
            .map(|b| u16::from_le_bytes(b.try_into().unwrap()))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
    fn id(&mut self) -> Option<IdSel> {
        match self.u8()? {
            b if b < 0xf0 => Some(IdSel::Known(b)),
            _ => self.u64().map(IdSel::Raw),
        }
    }
}

fn put_id(out: &mut Vec<u8>, id: IdSel) {
    match id {
        IdSel::Known(b) => {
            assert!(b < 0xf0, "Known index {b} is not encodable");
            out.push(b);
        }
        IdSel::Raw(v) => {
            out.push(0xf0);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

impl ScriptPacket {
    fn parse(r: &mut Reader<'_>) -> Option<ScriptPacket> {
        let id = r.id()?;
        let flags = r.u8()?;
        let send_time = r.u64()?;
        let echo_time = r.u64()?;
        let body = match r.u8()? % 8 {
            0 => ScriptBody::Data {
                message_length: r.u32()?,
                offset: r.u32()?,
                len: r.u16()?,
                unsched_bytes: r.u32()?,
                cutoff_version: r.u16()?,
                ack: r.id()?,
            },
            1 => ScriptBody::Grant {
                offset: r.u32()?,
                priority: r.u8()?,
            },
            2 => ScriptBody::Resend {
                offset: r.u32()?,
                length: r.u32()?,
                priority: r.u8()?,
            },
            3 => ScriptBody::RpcUnknown,
            4 => ScriptBody::Busy,
            5 => {
                let version = r.u16()?;
                let mut cutoffs = [0; MAX_PRIORITIES];
                for c in cutoffs.iter_mut() {
                    *c = r.u32()?;
                }
                ScriptBody::Cutoffs { version, cutoffs }
            }
            6 => ScriptBody::NeedAck,
            _ => {
                let n = r.u8()? as usize % (MAX_ACKS_PER_PACKET + 1);
                ScriptBody::Ack((0..n).map(|_| r.id()).collect::<Option<_>>()?)
            }
        };
        Some(ScriptPacket {
            id,
            from_client: flags & 1 != 0,
            retransmit: flags & 2 != 0,
            checksum: flags & 4 != 0,
            send_time,
            echo_time,
            body,
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        put_id(out, self.id);
        out.push(
            self.from_client as u8 | (self.retransmit as u8) << 1 | (self.checksum as u8) << 2,
        );
        out.extend_from_slice(&self.send_time.to_le_bytes());
        out.extend_from_slice(&self.echo_time.to_le_bytes());
        match &self.body {
            ScriptBody::Data {
                message_length,
                offset,
                len,
                unsched_bytes,
                cutoff_version,
                ack,
            } => {
                out.push(0);
                out.extend_from_slice(&message_length.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&unsched_bytes.to_le_bytes());
                out.extend_from_slice(&cutoff_version.to_le_bytes());
                put_id(out, *ack);
            }
            ScriptBody::Grant { offset, priority } => {
                out.push(1);
                out.extend_from_slice(&offset.to_le_bytes());
                out.push(*priority);
            }
            ScriptBody::Resend {
                offset,
                length,
                priority,
            } => {
                out.push(2);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&length.to_le_bytes());
                out.push(*priority);
            }
            ScriptBody::RpcUnknown => out.push(3),
            ScriptBody::Busy => out.push(4),
            ScriptBody::Cutoffs { version, cutoffs } => {
                out.push(5);
                out.extend_from_slice(&version.to_le_bytes());
                for c in cutoffs {
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            ScriptBody::NeedAck => out.push(6),
            ScriptBody::Ack(ids) => {
                out.push(7);
                assert!(ids.len() <= MAX_ACKS_PER_PACKET);
                out.push(ids.len() as u8);
                for id in ids {
                    put_id(out, *id);
                }
            }
        }
    }
}

/// Reads a script; stops at the first incomplete step.
pub fn parse_script(data: &[u8]) -> Vec<Op> {
    let mut r = Reader(data);
    let mut ops = Vec::new();
    while let Some(op) = parse_op(&mut r) {
        ops.push(op);
    }
    ops
}

fn parse_op(r: &mut Reader<'_>) -> Option<Op> {
    let b = r.u8()?;
    let variant = b / OP_KINDS;
    Some(match b % OP_KINDS {
        0 => {
            let src = r.u8()?;
            let len = r.u16()? as usize;
            Op::Raw {
                src,
                bytes: r.take(len)?.to_vec(),
            }
        }
        1 => Op::Packet {
            src: r.u8()?,
            packet: ScriptPacket::parse(r)?,
        },
        2 => Op::Advance {
            mantissa: r.u16()?,
            shift: r.u8()?,
        },
        3 => Op::Timeout,
        4 => Op::Transmit {
            max: r.u8()?,
            mode: tx_mode(variant),
        },
        5 => Op::Events,
        6 => Op::Respond {
            pick: r.u8()?,
            len: r.u32()?,
            src: source(variant),
        },
        7 => Op::Request {
            dest: r.u8()?,
            len: r.u32()?,
            src: source(variant),
        },
        8 => Op::Cancel { pick: r.u8()? },
        9 => Op::ReleaseHeld,
        _ => Op::Shutdown,
    })
}

/// Writes a script in the form [`parse_script`] reads.
pub fn write_script(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Raw { src, bytes } => {
                out.extend_from_slice(&[0, *src]);
                out.extend_from_slice(&u16::try_from(bytes.len()).unwrap().to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Op::Packet { src, packet } => {
                out.extend_from_slice(&[1, *src]);
                packet.write(&mut out);
            }
            Op::Advance { mantissa, shift } => {
                out.push(2);
                out.extend_from_slice(&mantissa.to_le_bytes());
                out.push(*shift);
            }
            Op::Timeout => out.push(3),
            Op::Transmit { max, mode } => {
                out.extend_from_slice(&[opcode(4, tx_variant(*mode)), *max]);
            }
            Op::Events => out.push(5),
            Op::Respond { pick, len, src } => {
                out.extend_from_slice(&[opcode(6, source_variant(*src)), *pick]);
                out.extend_from_slice(&len.to_le_bytes());
            }
            Op::Request { dest, len, src } => {
                out.extend_from_slice(&[opcode(7, source_variant(*src)), *dest]);
                out.extend_from_slice(&len.to_le_bytes());
            }
            Op::Cancel { pick } => out.extend_from_slice(&[8, *pick]),
            Op::ReleaseHeld => out.push(9),
            Op::Shutdown => out.push(10),
        }
    }
    out
}

/// Drives one endpoint through a script and checks its contract after every step.
struct Harness {
    ep: Endpoint,
    cfg: Config,
    now: u64,
    addrs: [SocketAddr; 5],
    /// Recently seen RPC ids, for [`IdSel::Known`].
    known: Vec<u64>,
    /// Every id `send_request` returned (ids must never repeat).
    issued: BTreeSet<u64>,
    /// Client RPCs that must still end with exactly one Response or Failed.
    outstanding: BTreeSet<u64>,
    /// Cancelled client RPCs: `cancel` promises no event, but one that was
    /// already queued when `cancel` was called is tolerated (once).
    cancelled: BTreeSet<u64>,
    /// Delivered requests not answered yet.
    pending: Vec<ServerRpc>,
    /// Delivered messages kept alive, so that the pool can run out.
    held: Vec<Message>,
    /// Messages delivered incrementally (second run), with every byte read
    /// so far and the client RPC of a response: a readable byte must never
    /// change, the readable prefix never shrink.
    partials: Vec<(PartialMessage, Vec<u8>, Option<u64>)>,
    datagrams_in: usize,
    buf: Vec<u8>,
    /// One datagram reassembled from a split or burst poll.
    dgram: Vec<u8>,
    /// Every message the engine accepted, by (from_client, peer, id): what
    /// its DATA packets must carry.
    messages: BTreeMap<MsgKey, Expect>,
    /// Where each accepted message's next retransmitted packet may start.
    retx: BTreeMap<MsgKey, RetxTrack>,
    /// The message of the last retransmitted packet, for `Counts::retransmitted`.
    last_retx: Option<MsgKey>,
    /// Send buffers the script can reuse, with their content's seed.
    slots: [Option<(SendBuf, u8)>; BUF_SLOTS],
    /// Buffers that left their slot while in flight: they must come back.
    retired: Vec<SendBuf>,
    /// Seed of the next buffer content (1..=250; Bytes messages use 0).
    next_seed: u8,
    /// The endpoint's payload bytes per packet (a send buffer's segment).
    segment: usize,
    counts: Counts,
}

/// A message as its DATA packets name it: (from_client, peer, RPC id).
type MsgKey = (bool, SocketAddr, u64);

/// Where a message's retransmitted packets may start. The engine resends a
/// pending range packet after packet, each starting where the previous one
/// ended (a send buffer's packet may end short, at a segment boundary); only
/// a RESEND starts a range or moves its start (`handle_resend` takes the
/// RESEND's offset, or merges it into a pending range as the lower of the
/// two starts). So a retransmitted packet starts where the message's last
/// one ended or at the offset of a RESEND received since; within one
/// `Transmit` step, where nothing is received, that is contiguity.
#[derive(Debug, Default)]
struct RetxTrack {
    /// End of the message's last retransmitted packet.
    next: Option<usize>,
    /// Offsets of RESENDs for the message's RPC id received since.
    asked: BTreeSet<u32>,
}

/// What a sent message holds: byte `i` is `content_byte(seed, i)`.
#[derive(Clone, Copy, Debug)]
struct Expect {
    len: usize,
    seed: u8,
    /// Sent from a send buffer: its packets never cross a segment boundary.
    buf: bool,
}

fn content_byte(seed: u8, i: usize) -> u8 {
    ((i + seed as usize) % 251) as u8
}

/// A message about to be handed to `send_request` / `send_response`.
struct Prepared {
    out: Outgoing,
    expect: Expect,
    /// The harness's handle on a send buffer, and whether it was in flight.
    buf: Option<(SendBuf, bool)>,
    bad_layout: bool,
}

/// What a script achieved, so that tests can check that seeds reach deep states.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub requests: usize,
    pub responses: usize,
    pub failures: usize,
    pub sent: [usize; 8],
    /// DATA packets of messages sent from send buffers.
    pub buf_data: usize,
    /// Packets that left with their header written into a send buffer.
    pub in_place: usize,
    /// Bursts of more than one packet.
    pub bursts: usize,
    /// Sends refused because the buffer was still in flight.
    pub in_flight_refused: usize,
    /// Byte ranges retransmitted, consecutive packets of one message joined
    /// (the first `MAX_RETX_RUNS` runs).
    pub retransmitted: Vec<(usize, usize)>,
    /// Messages delivered incrementally.
    pub partials: usize,
}

const MAX_KNOWN: usize = 32;
const MAX_HELD: usize = 8;
const MAX_PENDING: usize = 64;
const MAX_RETX_RUNS: usize = 16;
/// A correct engine has at most a few events per RPC; this only stops a buggy
/// one from looping forever.
const MAX_EVENTS_PER_DRAIN: usize = 100_000;

impl Harness {
    fn new(defer_acks: bool) -> Harness {
        // The second run also holds destinations (On-Ramp) on the scripts'
        // timestamps, forged at will: holds must stay bounded and lose
        // nothing.
        let cfg = engine_config()
            .with_defer_acks(defer_acks)
            .with_onramp(defer_acks)
            .with_onramp_threshold_ns(1_000)
            .with_onramp_max_hold_ns(20_000)
            // ...and delivers requests of 2,000 bytes and more, and every
            // response, incrementally.
            .with_partial_delivery_bytes(if defer_acks { 2_000 } else { u32::MAX });
        let ep = Endpoint::new(cfg.clone(), 0).expect("engine_config is valid");
        let segment = ep.new_send_buf(0).segment();
        Harness {
            ep,
            cfg,
            now: 0,
            addrs: addrs(),
            known: Vec::new(),
            issued: BTreeSet::new(),
            outstanding: BTreeSet::new(),
            cancelled: BTreeSet::new(),
            pending: Vec::new(),
            held: Vec::new(),
            partials: Vec::new(),
            datagrams_in: 0,
            buf: Vec::new(),
            dgram: Vec::new(),
            messages: BTreeMap::new(),
            retx: BTreeMap::new(),
            last_retx: None,
            slots: Default::default(),
            retired: Vec::new(),
            next_seed: 1,
            segment,
            counts: Counts::default(),
        }
    }

    fn learn(&mut self, id: u64) {
        if id != 0 && !self.known.contains(&id) {
            if self.known.len() == MAX_KNOWN {
                self.known.remove(0);
            }
            self.known.push(id);
        }
    }

    fn resolve(&self, sel: IdSel) -> u64 {
        resolve(&self.known, sel)
    }

    fn addr(&self, i: u8) -> SocketAddr {
        self.addrs[i as usize % self.addrs.len()]
    }

    fn hold(&mut self, m: Message) {
        assert!(m.len() <= self.cfg.max_message_length as usize);
        if self.held.len() < MAX_HELD {
            self.held.push(m);
        }
    }

    fn deliver(&mut self, src: u8, bytes: &[u8]) {
        let from = self.addr(src);
        self.datagrams_in += 1;
        self.ep.handle_datagram(self.now, from, bytes);
        self.note_resend(bytes);
    }

    /// A RESEND may start or move a retransmission of any message with its
    /// RPC id (whatever its source and direction: a superset is safe).
    fn note_resend(&mut self, datagram: &[u8]) {
        let Ok(Decoded {
            common,
            packet: Packet::Resend(r),
            ..
        }) = wire::decode(datagram)
        else {
            return;
        };
        for (_, t) in self.retx.iter_mut().filter(|(k, _)| k.2 == common.rpc_id) {
            t.asked.insert(r.offset);
        }
    }

    /// Raw bytes starting with 0xFF (never a valid version byte) are a GRO
    /// batch instead: `bytes[1]` picks the segment size, the rest is cut into
    /// segments that go through `handle_datagrams`. Segment byte 0 means the
    /// kernel did not say (a runtime receiving with `recvfrom`): the size is
    /// `wire::coalesced_segment`, the first packet's declared length.
    fn deliver_raw(&mut self, src: u8, bytes: &[u8]) {
        match bytes {
            [0xFF, seg, rest @ ..] => {
                let from = self.addr(src);
                let segment = match *seg {
                    0 => wire::coalesced_segment(rest),
                    s => s as usize * 8 + 1,
                };
                self.datagrams_in += rest.len().div_ceil(segment).max(1);
                self.ep.handle_datagrams(self.now, from, rest, segment);
                for d in rest.chunks(segment) {
                    self.note_resend(d);
                }
            }
            _ => self.deliver(src, bytes),
        }
    }

    fn transmit(&mut self, max: u8, mode: TxMode) {
        let mut buf = std::mem::take(&mut self.buf);
        let mut dgram = std::mem::take(&mut self.dgram);
        for _ in 0..=max {
            // `may_transmit` false promises that no form of polling has a
            // packet (drivers skip the pass on it).
            let may = self.ep.may_transmit();
            match mode {
                TxMode::Single => {
                    let Some(t) = self.ep.poll_transmit(self.now, &mut buf) else {
                        break;
                    };
                    assert!(may, "may_transmit said no, poll_transmit sent {t:?}");
                    assert!(t.len <= buf.len(), "{t:?} beyond the buffer");
                    self.check_datagram(t.dest, t.priority, &buf[..t.len]);
                }
                TxMode::Split => {
                    let Some((t, payload)) = self.ep.poll_transmit_split(self.now, &mut buf) else {
                        break;
                    };
                    assert!(may, "may_transmit said no, poll_transmit_split sent {t:?}");
                    // The rest of the datagram is padding the driver appends.
                    let pad = t
                        .len
                        .checked_sub(buf.len() + payload.len())
                        .unwrap_or_else(|| panic!("{t:?} shorter than its parts"));
                    assert!(pad <= wire::MAX_DATA_PAD, "{t:?}");
                    assert!(pad == 0 || !buf.is_empty(), "padding in place: {t:?}");
                    if buf.is_empty() {
                        // The header was written into a send buffer.
                        self.counts.in_place += 1;
                    }
                    dgram.clear();
                    dgram.extend_from_slice(&buf);
                    dgram.extend_from_slice(&payload);
                    dgram.resize(dgram.len() + pad, 0);
                    self.check_datagram(t.dest, t.priority, &dgram);
                }
                TxMode::Burst { exp } => {
                    let max_packets = 1usize << exp;
                    let Some(b) = self.ep.poll_transmit_burst(self.now, max_packets, &mut buf)
                    else {
                        break;
                    };
                    assert!(may, "may_transmit said no, poll_transmit_burst sent {b:?}");
                    assert!(
                        (1..=max_packets).contains(&b.count),
                        "{b:?} for max {max_packets}"
                    );
                    assert_eq!(buf.len(), b.count * b.header_len, "{b:?}");
                    // Padding only on a lone packet with its header apart.
                    assert!(
                        b.pad == 0 || (b.count == 1 && b.header_len > 0 && b.pad <= 255),
                        "{b:?}"
                    );
                    if b.count > 1 {
                        // GSO: every segment but the last is full.
                        assert!(
                            b.payload.len() > (b.count - 1) * b.segment
                                && b.payload.len() <= b.count * b.segment,
                            "{b:?}"
                        );
                        self.counts.bursts += 1;
                    }
                    let mut prev: Option<(u64, usize)> = None;
                    for i in 0..b.count {
                        dgram.clear();
                        dgram.extend_from_slice(&buf[i * b.header_len..(i + 1) * b.header_len]);
                        dgram.extend_from_slice(b.payload_of(i));
                        if i + 1 == b.count {
                            dgram.resize(dgram.len() + b.pad, 0);
                        }
                        if b.header_len == 0 {
                            self.counts.in_place += 1;
                        }
                        let data = self.check_datagram(b.dest, b.priority, &dgram);
                        if b.count > 1 {
                            // A burst is one message's consecutive packets.
                            let (id, off, len) =
                                data.unwrap_or_else(|| panic!("non-DATA packet in {b:?}"));
                            if let Some((pid, end)) = prev {
                                assert_eq!((id, off), (pid, end), "burst packet {i} of {b:?}");
                            }
                            prev = Some((id, off + len));
                        }
                    }
                }
            }
        }
        self.buf = buf;
        self.dgram = dgram;
    }

    /// Checks one datagram the engine sent; returns (id, offset, payload
    /// length) for DATA.
    fn check_datagram(
        &mut self,
        dest: SocketAddr,
        priority: u8,
        pkt: &[u8],
    ) -> Option<(u64, usize, usize)> {
        assert!(
            pkt.len() <= self.cfg.max_packet_size,
            "{}-byte datagram above max_packet_size",
            pkt.len()
        );
        assert!((priority as usize) < MAX_PRIORITIES, "priority {priority}");
        assert!(
            self.addrs.contains(&dest),
            "datagram to {dest}, an address never involved"
        );
        let d = wire::decode(pkt).unwrap_or_else(|e| panic!("engine sent a malformed packet: {e}"));
        assert!(
            wire::verify_checksum(pkt, false),
            "engine sent a bad checksum"
        );
        self.counts.sent[d.packet.packet_type().index()] += 1;
        let id = d.common.rpc_id;
        self.learn(id);
        let Packet::Data { header, payload } = d.packet else {
            return None;
        };
        assert!(payload.len() <= self.cfg.max_data_per_packet());
        if d.common.from_client {
            assert!(
                self.issued.contains(&id),
                "request DATA for an RPC we never started"
            );
        }
        let key = (d.common.from_client, dest, id);
        let m = *self
            .messages
            .get(&key)
            .unwrap_or_else(|| panic!("DATA for a message never sent: {key:?}"));
        let off = header.offset as usize;
        assert_eq!(header.message_length as usize, m.len, "{key:?}");
        assert!(off + payload.len() <= m.len, "{key:?} {header:?}");
        if let Some(j) = (0..payload.len()).find(|&j| payload[j] != content_byte(m.seed, off + j)) {
            panic!(
                "{key:?}: DATA at offset {off} carries the wrong byte at {}",
                off + j
            );
        }
        if m.buf {
            self.counts.buf_data += 1;
            if !payload.is_empty() {
                assert_eq!(
                    off / self.segment,
                    (off + payload.len() - 1) / self.segment,
                    "{key:?}: DATA {off}+{} crosses a send buffer segment",
                    payload.len()
                );
            }
        }
        if d.common.retransmit {
            self.check_retransmit(key, off, payload.len());
        }
        Some((id, off, payload.len()))
    }

    fn events(&mut self) {
        for _ in 0..MAX_EVENTS_PER_DRAIN {
            let Some(ev) = self.ep.poll_event() else {
                return;
            };
            match ev {
                Event::Request { rpc, message } => {
                    assert!(
                        self.addrs.contains(&rpc.peer),
                        "request from nowhere: {rpc:?}"
                    );
                    self.learn(rpc.id);
                    self.counts.requests += 1;
                    if self.pending.len() < MAX_PENDING {
                        self.pending.push(rpc);
                    }
                    self.hold(message);
                }
                Event::Response { id, message } => {
                    self.counts.responses += 1;
                    self.end(id);
                    self.hold(message);
                }
                Event::Failed { id, error: _ } => {
                    self.counts.failures += 1;
                    self.end(id);
                    // Its partial response, if any, failed with it.
                    self.partials.retain(|p| p.2 != Some(id.0));
                }
                Event::PartialRequest { rpc, message } => {
                    assert!(
                        self.addrs.contains(&rpc.peer),
                        "request from nowhere: {rpc:?}"
                    );
                    assert!(message.len() >= self.cfg.partial_delivery_bytes as usize);
                    self.learn(rpc.id);
                    self.counts.requests += 1;
                    self.counts.partials += 1;
                    if self.pending.len() < MAX_PENDING {
                        self.pending.push(rpc);
                    }
                    self.read_partial(message, None);
                }
                Event::PartialResponse { id, message } => {
                    self.counts.responses += 1;
                    self.counts.partials += 1;
                    assert!(self.outstanding.contains(&id.0) || self.cancelled.contains(&id.0));
                    self.read_partial(message, Some(id.0));
                }
                Event::PartialProgress { serial } => {
                    if let Some(i) = self.partials.iter().position(|p| p.0.serial() == serial) {
                        self.check_partial(i);
                    }
                }
                // Streams: read what is there (forged packets may open
                // them); what a stream holds stays within its window.
                Event::StreamOpened { stream } | Event::StreamReadable { stream } => {
                    let now = self.now;
                    let ep = &mut self.ep;
                    while let Ok(homa_proto::StreamRead::Data { bytes, .. }) =
                        ep.stream_recv(now, stream)
                    {
                        assert!(!bytes.is_empty());
                    }
                    let held = ep.stats().stream_bytes_held;
                    let bound = 2
                        * ep.config()
                            .stream_window_bytes
                            .max(ep.config().max_packet_size as u32)
                            as u64
                        * ep.stats().streams.max(1) as u64;
                    assert!(held <= bound, "streams hold {held} bytes");
                }
                Event::StreamWritable { .. } => {}
            }
        }
        panic!("poll_event never ran dry");
    }

    /// Starts reading a partial message (all are kept until they end:
    /// the RPC limits bound them).
    fn read_partial(&mut self, message: PartialMessage, id: Option<u64>) {
        assert!(message.len() <= self.cfg.max_message_length as usize);
        self.partials.push((message, Vec::new(), id));
        self.check_partial(self.partials.len() - 1);
    }

    /// Partial message `i`: what was read is still there, the prefix did
    /// not shrink; read what is new; let it go once it ended.
    fn check_partial(&mut self, i: usize) {
        let (m, seen, id) = &mut self.partials[i];
        let readable = m.readable();
        assert!(readable >= seen.len(), "the readable prefix shrank");
        assert!(readable <= m.len());
        let now: Vec<u8> = m.fragments(0, readable).flatten().copied().collect();
        assert_eq!(now.len(), readable);
        assert!(now[..seen.len()] == seen[..], "a readable byte changed");
        *seen = now;
        match m.state() {
            PartialState::Receiving => {}
            PartialState::Complete => {
                assert_eq!(readable, m.len());
                let id = *id;
                let (m, _, _) = self.partials.swap_remove(i);
                if let Some(id) = id {
                    self.end(RpcId(id));
                }
                if let Ok(whole) = m.into_message() {
                    self.hold(whole);
                }
            }
            PartialState::Failed => {
                self.partials.swap_remove(i);
            }
        }
    }

    /// Re-checks every partial message (after each step: a packet may have
    /// been written into one without a progress event).
    fn check_partials(&mut self) {
        let mut i = 0;
        while i < self.partials.len() {
            let n = self.partials.len();
            self.check_partial(i);
            if self.partials.len() == n {
                i += 1;
            }
        }
    }

    /// Each client RPC ends once.
    fn end(&mut self, id: RpcId) {
        let ok = self.outstanding.remove(&id.0) || self.cancelled.remove(&id.0);
        assert!(ok, "second or stray end of {id:?}");
    }

    fn step(&mut self, op: &Op) {
        let max_len = self.cfg.max_message_length;
        match op {
            Op::Raw { src, bytes } => self.deliver_raw(*src, bytes),
            Op::Packet { src, packet } => {
                let bytes = encode_packet(&self.cfg, &self.known, packet);
                self.deliver(*src, &bytes);
            }
            Op::Advance { mantissa, shift } => {
                self.now = self.now.saturating_add((*mantissa as u64) << (shift % 40));
            }
            Op::Timeout => {
                if let Some(t) = self.ep.poll_timeout() {
                    self.now = self.now.max(t);
                }
                self.ep.handle_timeout(self.now);
            }
            Op::Transmit { max, mode } => {
                self.transmit(*max, *mode);
                // As the UDP runtime does once it has sent what the engine
                // had ready (a no-op without `defer_acks`).
                self.ep.run_deferred(self.now);
            }
            Op::Events => self.events(),
            Op::Respond { pick, len, src } => {
                if self.pending.is_empty() {
                    return;
                }
                let rpc = self.pending.remove(*pick as usize % self.pending.len());
                let p = self.prepare(*src, len % (max_len + 17));
                let r = self.ep.send_response(self.now, rpc, p.out.clone());
                if self.settle(&p, r.as_ref().err()) {
                    self.accept((false, rpc.peer, rpc.id), p.expect);
                }
            }
            Op::Request { dest, len, src } => {
                let dest = self.addr(*dest);
                let p = self.prepare(*src, len % (max_len + 17));
                let r = self.ep.send_request(self.now, dest, p.out.clone());
                if self.settle(&p, r.as_ref().err()) {
                    let RpcId(id) = r.unwrap();
                    assert!(id != 0, "RPC id 0 is reserved on the wire");
                    assert!(self.issued.insert(id), "RPC id {id} issued twice");
                    self.outstanding.insert(id);
                    self.learn(id);
                    self.accept((true, dest, id), p.expect);
                    if self.cfg.partial_delivery_bytes != u32::MAX {
                        self.ep
                            .deliver_response_partially(RpcId(id))
                            .expect("the RPC just started");
                    }
                }
            }
            Op::Cancel { pick } => {
                let id = if pick % 2 == 0 && !self.outstanding.is_empty() {
                    let i = (*pick as usize / 2) % self.outstanding.len();
                    *self.outstanding.iter().nth(i).unwrap()
                } else {
                    self.resolve(IdSel::Known(*pick % 0xf0))
                };
                self.ep.cancel(RpcId(id));
                if self.outstanding.remove(&id) {
                    self.cancelled.insert(id);
                }
            }
            Op::ReleaseHeld => self.held.clear(),
            Op::Shutdown => self.ep.shutdown(),
        }
        self.check_partials();
        self.check_bounds();
    }

    /// Records a message the engine took (replacing any earlier one of the
    /// same key, which the engine no longer holds).
    fn accept(&mut self, key: MsgKey, expect: Expect) {
        self.messages.insert(key, expect);
        self.retx.insert(key, RetxTrack::default());
    }

    /// A retransmitted DATA packet `[off, off + len)` of `key` starts where
    /// [`RetxTrack`] allows.
    fn check_retransmit(&mut self, key: MsgKey, off: usize, len: usize) {
        let t = self.retx.entry(key).or_default();
        let asked = u32::try_from(off).is_ok_and(|o| t.asked.contains(&o));
        assert!(
            t.next == Some(off) || asked,
            "{key:?}: retransmitted DATA at {off} continues neither the last \
             retransmitted packet (ended at {:?}) nor a RESEND since (at {:?})",
            t.next,
            t.asked
        );
        t.next = Some(off + len);
        t.asked.clear();
        // `last_retx` names the last run's message (None once runs are
        // dropped, so that a dropped run's packets never extend a kept one).
        let runs = &mut self.counts.retransmitted;
        let same = self.last_retx == Some(key);
        let full = runs.len() == MAX_RETX_RUNS;
        self.last_retx = match runs.last_mut() {
            Some(run) if same && run.1 == off => {
                run.1 = off + len;
                Some(key)
            }
            _ if full => None,
            _ => {
                runs.push((off, off + len));
                Some(key)
            }
        };
    }

    /// The message a send step hands the engine.
    fn prepare(&mut self, src: Source, len: u32) -> Prepared {
        let len = len as usize;
        match src {
            Source::Bytes => Prepared {
                out: pattern(len as u32).into(),
                expect: Expect {
                    len,
                    seed: 0,
                    buf: false,
                },
                buf: None,
                bad_layout: false,
            },
            Source::BadLayout => {
                let b = SendBuf::new(len, self.segment / 2 + 1);
                Prepared {
                    out: b.clone().into(),
                    expect: Expect {
                        len,
                        seed: 0,
                        buf: true,
                    },
                    buf: Some((b, false)),
                    bad_layout: true,
                }
            }
            Source::Buf { slot, reuse } => {
                let slot = slot as usize % BUF_SLOTS;
                let seed = self.next_seed;
                self.next_seed = self.next_seed % 250 + 1;
                match &mut self.slots[slot] {
                    Some((b, s)) if reuse => {
                        // Rewrite a buffer the engine is done with, so that
                        // stale bytes would show; one still in flight goes
                        // as it is (and must be refused).
                        if !b.in_flight() {
                            fill(b, seed);
                            *s = seed;
                        }
                    }
                    old => {
                        let mut b = self.ep.new_send_buf(len);
                        fill(&mut b, seed);
                        if let Some((prev, _)) = old.replace((b, seed)) {
                            if prev.in_flight() {
                                self.retired.push(prev);
                            }
                        }
                    }
                }
                let (b, seed) = self.slots[slot].clone().unwrap();
                let in_flight = b.in_flight();
                Prepared {
                    out: b.clone().into(),
                    expect: Expect {
                        len: b.len(),
                        seed,
                        buf: true,
                    },
                    buf: Some((b, in_flight)),
                    bad_layout: false,
                }
            }
        }
    }

    /// Checks the engine's answer to a send; true if it took the message.
    fn settle(&mut self, p: &Prepared, err: Option<&SendError>) -> bool {
        let max_len = self.cfg.max_message_length as usize;
        let was_in_flight = p.buf.as_ref().is_some_and(|b| b.1);
        match err {
            None => {
                assert!(
                    p.expect.len <= max_len,
                    "accepted a {}-byte message",
                    p.expect.len
                );
                assert!(!p.bad_layout, "accepted a send buffer of the wrong layout");
                assert!(!was_in_flight, "accepted a send buffer still in flight");
                if let Some((b, _)) = &p.buf {
                    assert!(b.in_flight(), "an accepted send buffer is not held");
                }
            }
            Some(e) => {
                match e {
                    SendError::MessageTooLong { .. } => assert!(p.expect.len > max_len),
                    SendError::BufferInFlight => {
                        assert!(was_in_flight, "{e}");
                        self.counts.in_flight_refused += 1;
                    }
                    SendError::BufferLayout { .. } => assert!(p.bad_layout, "{e}"),
                    _ => {}
                }
                if let Some((b, _)) = &p.buf {
                    assert!(
                        was_in_flight || !b.in_flight(),
                        "a refused send kept the buffer"
                    );
                }
            }
        }
        // Buffers that came back are dropped from the list (nothing can take
        // them again without a handle, so they stay back).
        self.retired.retain(|b| b.in_flight());
        err.is_none()
    }

    fn check_bounds(&self) {
        let s = self.ep.stats();
        let c = &self.cfg;
        assert!(s.peers <= c.max_peers, "{s:?}");
        assert!(s.client_rpcs <= c.max_client_rpcs, "{s:?}");
        assert!(
            s.server_rpcs <= c.max_server_rpcs_per_peer * c.max_peers,
            "{s:?}"
        );
        assert!(
            s.pool_bpages_in_use <= c.pool_bytes.div_ceil(BPAGE_SIZE),
            "{s:?}"
        );
        // Each tombstone stands for a server RPC, each of which some datagram
        // created: anything more is a leak.
        assert!(s.tombstones <= self.datagrams_in, "{s:?}");
    }
}

/// Resolves an [`IdSel`] against the ids seen so far.
fn resolve(known: &[u64], sel: IdSel) -> u64 {
    match sel {
        IdSel::Raw(v) => v,
        IdSel::Known(i) if known.is_empty() => i as u64 + 1,
        IdSel::Known(i) => known[i as usize % known.len()],
    }
}

/// Encodes a scripted packet, clamping DATA fields into a well-formed packet.
fn encode_packet(cfg: &Config, known: &[u64], p: &ScriptPacket) -> Vec<u8> {
    let common = CommonHeader {
        from_client: p.from_client,
        retransmit: p.retransmit,
        rpc_id: resolve(known, p.id),
        send_time: p.send_time,
        echo_time: p.echo_time,
    };
    let payload: Vec<u8>;
    let acks: Vec<u64>;
    let body = match &p.body {
        ScriptBody::Data {
            message_length,
            offset,
            len,
            unsched_bytes,
            cutoff_version,
            ack,
        } => {
            // Clamp into a well-formed DATA packet (a zero-length message has
            // one, empty, at offset 0).
            let message_length = *message_length;
            let offset = offset.checked_rem(message_length).unwrap_or(0);
            let len = (*len as u32)
                .clamp(1, cfg.max_data_per_packet() as u32)
                .min(message_length - offset);
            payload = (offset..offset + len).map(|i| i as u8).collect();
            Body::Data {
                header: DataHeader {
                    message_length,
                    offset,
                    unsched_bytes: (*unsched_bytes).min(message_length),
                    cutoff_version: *cutoff_version,
                    ack: resolve(known, *ack),
                },
                payload: &payload,
            }
        }
        ScriptBody::Grant { offset, priority } => Body::Grant(Grant {
            offset: *offset,
            priority: priority % MAX_PRIORITIES as u8,
        }),
        ScriptBody::Resend {
            offset,
            length,
            priority,
        } => Body::Resend(Resend {
            offset: *offset,
            length: *length,
            priority: priority % MAX_PRIORITIES as u8,
        }),
        ScriptBody::RpcUnknown => Body::RpcUnknown,
        ScriptBody::Busy => Body::Busy,
        ScriptBody::Cutoffs { version, cutoffs } => Body::Cutoffs(Cutoffs {
            version: *version,
            cutoffs: *cutoffs,
        }),
        ScriptBody::NeedAck => Body::NeedAck,
        ScriptBody::Ack(ids) => {
            acks = ids.iter().map(|s| resolve(known, *s)).collect();
            Body::Ack(&acks)
        }
    };
    let mut out = Vec::new();
    wire::encode(&mut out, &common, &body, p.checksum);
    out
}

/// Writes `content_byte(seed, ..)` over the whole buffer, which must be
/// unique and idle.
fn fill(b: &mut SendBuf, seed: u8) {
    let data: Vec<u8> = (0..b.len()).map(|i| content_byte(seed, i)).collect();
    b.write(0, &data)
        .expect("an idle buffer with one handle is writable");
}

fn pattern(len: u32) -> Bytes {
    Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>())
}

/// The `engine` target: runs a script (see [`Op`]) against a fresh endpoint.
pub fn run_engine(data: &[u8]) -> Counts {
    let counts = run_engine_with(data, false);
    // The same script with piggybacked acks held back (`defer_acks`, as the
    // UDP runtime runs the engine), On-Ramp and incremental delivery on:
    // every check must hold there too.
    run_engine_second(data);
    counts
}

/// The second run of [`run_engine`], alone (tests).
pub fn run_engine_second(data: &[u8]) -> Counts {
    run_engine_with(data, true)
}

fn run_engine_with(data: &[u8], defer_acks: bool) -> Counts {
    let mut h = Harness::new(defer_acks);
    for op in parse_script(data) {
        h.step(&op);
    }
    // Let the endpoint finish what it can: whatever the script did, a bounded
    // number of timer runs must not break the bounds either. Every form of
    // polling gets a turn.
    let modes = [
        TxMode::Single,
        TxMode::Burst { exp: 6 },
        TxMode::Split,
        TxMode::Burst { exp: 1 },
    ];
    for mode in modes {
        h.step(&Op::Transmit { max: 255, mode });
        h.step(&Op::Events);
        h.step(&Op::Timeout);
    }
    // An endpoint gone holds no send buffer.
    drop(h.ep);
    let bufs = h.slots.iter().flatten().map(|(b, _)| b);
    for b in bufs.chain(&h.retired) {
        assert!(
            !b.in_flight(),
            "{b:?} still in flight after the endpoint dropped"
        );
    }
    h.counts
}

/// A raw datagram from source 1 holding a request, which is answered (10
/// bytes) and transmitted.
fn answered_raw(bytes: Vec<u8>) -> Vec<Op> {
    vec![
        Op::Raw { src: 1, bytes },
        Op::Events,
        Op::Respond {
            pick: 0,
            len: 10,
            src: Source::Bytes,
        },
        tx(64),
        Op::Events,
    ]
}

/// Up to `max + 1` plain `poll_transmit` calls.
fn tx(max: u8) -> Op {
    Op::Transmit {
        max,
        mode: TxMode::Single,
    }
}

/// Valid packet sequences for the `engine` target.
pub fn engine_seeds() -> Vec<(String, Vec<Op>)> {
    let pkt = |id, from_client, body| ScriptPacket {
        id,
        from_client,
        retransmit: false,
        checksum: false,
        send_time: 5_000,
        echo_time: 0,
        body,
    };
    let data = |message_length, offset, len| ScriptBody::Data {
        message_length,
        offset,
        len,
        unsched_bytes: message_length,
        cutoff_version: 1,
        ack: IdSel::Raw(0),
    };
    let client_id = IdSel::Raw(101);
    let ours = IdSel::Known(0);
    let tick = Op::Advance {
        mantissa: 20,
        shift: 10,
    }; // about 20 µs
    let drain = [tx(64), Op::Events];
    let mut seeds = Vec::new();

    // A server answers a one-packet request.
    let mut s = vec![Op::Packet {
        src: 0,
        packet: pkt(client_id, true, data(5, 0, 5)),
    }];
    s.extend([
        Op::Events,
        Op::Respond {
            pick: 0,
            len: 5,
            src: Source::Bytes,
        },
        tx(8),
    ]);
    s.extend([tick.clone(), Op::Timeout, tx(8)]);
    seeds.push(("server-small".to_string(), s));

    // A zero-length request (one empty DATA packet) answered with nothing.
    let mut s = vec![Op::Packet {
        src: 3,
        packet: pkt(IdSel::Raw(303), true, data(0, 0, 0)),
    }];
    s.extend([
        Op::Events,
        Op::Respond {
            pick: 0,
            len: 0,
            src: Source::Bytes,
        },
        tx(8),
    ]);
    seeds.push(("server-empty".to_string(), s));

    // A server receives a three-packet request, answers, and the client acks.
    let mut s: Vec<Op> = [0u32, 1416, 2832]
        .iter()
        .map(|&off| Op::Packet {
            src: 1,
            packet: pkt(
                client_id,
                true,
                data(3000, off, (3000 - off).min(1416) as u16),
            ),
        })
        .collect();
    s.extend([
        Op::Events,
        Op::Respond {
            pick: 0,
            len: 2000,
            src: Source::Bytes,
        },
        tx(8),
        tick.clone(),
    ]);
    s.push(Op::Packet {
        src: 1,
        packet: pkt(client_id, true, ScriptBody::Ack(vec![client_id])),
    });
    s.extend([
        Op::Advance {
            mantissa: 1,
            shift: 30,
        },
        Op::Timeout,
        tx(8),
    ]);
    seeds.push(("server-multi-ack".to_string(), s));

    // A client gets a one-packet response.
    let mut s = vec![
        Op::Request {
            dest: 1,
            len: 100,
            src: Source::Bytes,
        },
        tx(4),
        tick.clone(),
    ];
    s.push(Op::Packet {
        src: 1,
        packet: pkt(ours, false, data(50, 0, 50)),
    });
    s.extend(drain.clone());
    seeds.push(("client-small".to_string(), s));

    // A client sends a scheduled request: GRANT, RESEND, BUSY, then the response.
    let mut s = vec![
        Op::Request {
            dest: 2,
            len: 100_000,
            src: Source::Bytes,
        },
        tx(64),
        tick.clone(),
    ];
    let grant = ScriptBody::Grant {
        offset: 100_000,
        priority: 3,
    };
    s.push(Op::Packet {
        src: 2,
        packet: pkt(ours, false, grant),
    });
    s.extend(drain.clone());
    let resend = ScriptBody::Resend {
        offset: 0,
        length: 1416,
        priority: 6,
    };
    s.push(Op::Packet {
        src: 2,
        packet: pkt(ours, false, resend),
    });
    s.push(Op::Packet {
        src: 2,
        packet: pkt(ours, false, ScriptBody::Busy),
    });
    s.extend(drain.clone());
    s.push(Op::Packet {
        src: 2,
        packet: pkt(ours, false, data(10, 0, 10)),
    });
    s.extend(drain.clone());
    seeds.push(("client-scheduled".to_string(), s));

    // Control packets for a live client RPC, then its timeout.
    let mut s = vec![
        Op::Request {
            dest: 0,
            len: 10,
            src: Source::Bytes,
        },
        tx(4),
    ];
    let cutoffs = ScriptBody::Cutoffs {
        version: 2,
        cutoffs: [100, 1_000, 10_000, u32::MAX, 0, 0, 0, 0],
    };
    s.push(Op::Packet {
        src: 0,
        packet: pkt(ours, false, cutoffs),
    });
    s.push(Op::Packet {
        src: 0,
        packet: pkt(ours, false, ScriptBody::NeedAck),
    });
    s.push(Op::Packet {
        src: 0,
        packet: pkt(ours, false, ScriptBody::RpcUnknown),
    });
    s.extend(drain.clone());
    for _ in 0..6 {
        s.extend([
            Op::Advance {
                mantissa: 1,
                shift: 20,
            },
            Op::Timeout,
            tx(8),
            Op::Events,
        ]);
    }
    seeds.push(("client-control-timeout".to_string(), s));

    // Requests from more peers than max_peers, and more RPCs than allowed.
    let mut s = Vec::new();
    for src in 0..5u8 {
        for id in 0..6u64 {
            let id = IdSel::Raw(1000 + 2 * id + 64 * src as u64);
            s.push(Op::Packet {
                src,
                packet: pkt(id, true, data(64, 0, 64)),
            });
        }
    }
    s.extend([
        Op::Events,
        Op::Request {
            dest: 3,
            len: 1,
            src: Source::Bytes,
        },
        Op::Request {
            dest: 4,
            len: 1,
            src: Source::Bytes,
        },
    ]);
    s.extend(drain);
    seeds.push(("limits".to_string(), s));

    // A two-packet request arriving as one GRO batch (raw op 0xFF, segment
    // 13 * 8 + 1 = 105 bytes: 56 of headers and 49 of payload each).
    let cfg = engine_config();
    let mut batch = vec![0xFF, 13];
    for offset in [0, 49] {
        let p = pkt(IdSel::Raw(303), true, data(98, offset, 49));
        batch.extend(encode_packet(&cfg, &[], &p));
    }
    assert_eq!(batch.len(), 2 + 2 * 105);
    let s = answered_raw(batch);
    seeds.push(("gro-batch".to_string(), s));

    // The same without the segment size (segment byte 0: the harness takes
    // `wire::coalesced_segment`), three packets of which the last is short:
    // 49 + 49 + 20 bytes of a 118-byte request.
    let mut batch = vec![0xFF, 0];
    for (offset, len) in [(0, 49), (49, 49), (98, 20)] {
        let p = pkt(IdSel::Raw(304), true, data(118, offset, len));
        batch.extend(encode_packet(&cfg, &[], &p));
    }
    assert_eq!(batch.len(), 2 + 2 * 105 + 76);
    assert_eq!(wire::coalesced_segment(&batch[2..]), 105);
    let s = answered_raw(batch);
    seeds.push(("gro-unsized".to_string(), s));

    // A request from a send buffer, sent in bursts (headers in place); a
    // RESEND off the segment grid (retransmissions capped at segments),
    // served after the rest of the request (which needs no grant, so it goes
    // before retransmissions) once the pacer lets it; the buffer offered
    // again while in flight (refused), then after the response (accepted,
    // rewritten). The RESEND comes later than the resend guard (half the
    // harness's 100 us interval) after the first burst, so that its bytes
    // count as sent, not as in flight.
    let slot0 = |reuse| Source::Buf { slot: 0, reuse };
    let mut s = vec![
        Op::Request {
            dest: 1,
            len: 5000,
            src: slot0(false),
        },
        Op::Transmit {
            max: 2,
            mode: TxMode::Burst { exp: 3 },
        },
        tick.clone(),
        Op::Advance {
            mantissa: 40,
            shift: 10,
        },
    ];
    let resend = ScriptBody::Resend {
        offset: 700,
        length: 3000,
        priority: 5,
    };
    s.push(Op::Packet {
        src: 1,
        packet: pkt(ours, false, resend),
    });
    s.extend([
        Op::Transmit {
            max: 8,
            mode: TxMode::Split,
        },
        tick.clone(),
        Op::Transmit {
            max: 8,
            mode: TxMode::Split,
        },
        Op::Request {
            dest: 0,
            len: 1,
            src: slot0(true),
        },
    ]);
    s.push(Op::Packet {
        src: 1,
        packet: pkt(ours, false, data(10, 0, 10)),
    });
    s.extend([
        Op::Events,
        Op::Request {
            dest: 0,
            len: 1,
            src: slot0(true),
        },
        Op::Transmit {
            max: 8,
            mode: TxMode::Burst { exp: 7 },
        },
    ]);
    seeds.push(("buf-request".to_string(), s));

    // A response from a send buffer, polled split (header in place), a
    // RESEND inside its first packet, then a buffer of the wrong layout.
    let mut s = vec![Op::Packet {
        src: 3,
        packet: pkt(IdSel::Raw(505), true, data(20, 0, 20)),
    }];
    s.extend([
        Op::Events,
        Op::Respond {
            pick: 0,
            len: 4000,
            src: Source::Buf {
                slot: 1,
                reuse: false,
            },
        },
        Op::Transmit {
            max: 8,
            mode: TxMode::Split,
        },
        tick.clone(),
        // Past the resend guard (as in buf-request).
        Op::Advance {
            mantissa: 40,
            shift: 10,
        },
    ]);
    let resend = ScriptBody::Resend {
        offset: 100,
        length: 2000,
        priority: 7,
    };
    s.push(Op::Packet {
        src: 3,
        packet: pkt(IdSel::Raw(505), true, resend),
    });
    s.extend([
        Op::Transmit {
            max: 8,
            mode: TxMode::Burst { exp: 2 },
        },
        Op::Request {
            dest: 2,
            len: 3000,
            src: Source::BadLayout,
        },
    ]);
    seeds.push(("buf-response".to_string(), s));
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;
    use homa_proto::wire::PacketType;
    use std::path::PathBuf;

    fn corpus(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target)
    }

    /// The committed seeds are what the generators produce. Set
    /// `HOMA_FUZZ_WRITE_SEEDS=1` to (re)write them.
    #[test]
    fn committed_seeds_match_generators() {
        let write = std::env::var_os("HOMA_FUZZ_WRITE_SEEDS").is_some();
        let engine = engine_seeds()
            .into_iter()
            .map(|(n, ops)| (format!("seed-{n}"), write_script(&ops)));
        let all = decode_seeds()
            .into_iter()
            .chain(decode_gro_seeds())
            .map(|s| ("decode", s))
            .chain(engine.map(|s| ("engine", s)));
        for (target, (name, bytes)) in all {
            let path = corpus(target).join(&name);
            if write {
                std::fs::create_dir_all(corpus(target)).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            } else {
                let got = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                assert!(
                    got == bytes,
                    "{path:?} is stale: run with HOMA_FUZZ_WRITE_SEEDS=1"
                );
            }
        }
    }

    #[test]
    fn decode_seeds_are_valid_and_pass_the_target() {
        let seeds = decode_seeds();
        let types: BTreeSet<_> = seeds
            .iter()
            .map(|(_, b)| wire::decode(b).unwrap().packet.packet_type())
            .collect();
        assert_eq!(types.len(), PacketType::ALL.len(), "a seed for every type");
        for (name, bytes) in &seeds {
            check_decode(bytes);
            assert_eq!(wire::verify_checksum(bytes, true), name.ends_with("-csum"));
        }
    }

    /// The GRO seeds split into valid packets of the advertised shape (all
    /// of one length but a shorter last), and pass the target.
    #[test]
    fn decode_gro_seeds_split_into_packets() {
        for (name, bytes) in decode_gro_seeds() {
            check_decode(&bytes);
            assert!(wire::decode(&bytes).is_err(), "{name}: several packets");
            let seg = wire::coalesced_segment(&bytes);
            let pieces: Vec<&[u8]> = bytes.chunks(seg).collect();
            assert_eq!(pieces.len(), 3, "{name}");
            assert!(pieces[2].len() <= seg, "{name}");
            for piece in pieces {
                wire::decode(piece).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(wire::verify_checksum(piece, true), "{name}");
            }
        }
    }

    #[test]
    fn decode_target_rejects_nothing_it_should_accept() {
        // Garbage and truncations go through without a panic.
        for (_, bytes) in decode_seeds() {
            for cut in 0..bytes.len() {
                check_decode(&bytes[..cut]);
            }
        }
        check_decode(&[0xff; 100]);
    }

    #[test]
    fn scripts_round_trip() {
        for (name, ops) in engine_seeds() {
            assert_eq!(parse_script(&write_script(&ops)), ops, "{name}");
        }
        // Truncated scripts parse to a prefix.
        let bytes = write_script(&engine_seeds()[1].1);
        for cut in 0..bytes.len() {
            let ops = parse_script(&bytes[..cut]);
            assert!(ops.len() <= engine_seeds()[1].1.len());
        }
    }

    /// Every opcode byte parses to a step that writes back to the same step
    /// (variants included), and variant 0 is the plain step.
    #[test]
    fn opcode_variants_round_trip() {
        let mut modes = BTreeSet::new();
        let mut sources = BTreeSet::new();
        for b in 0..=255u8 {
            let mut script = vec![b, 9, 1, 0, 3, 4];
            script.resize(64, 0);
            let ops = parse_script(&script);
            assert!(!ops.is_empty(), "opcode {b}");
            assert_eq!(parse_script(&write_script(&ops)), ops, "opcode {b}");
            match ops[0] {
                Op::Transmit { mode, .. } => {
                    modes.insert(format!("{mode:?}"));
                }
                Op::Request { src, .. } | Op::Respond { src, .. } => {
                    sources.insert(format!("{src:?}"));
                }
                _ => {}
            }
        }
        // Single, Split and eight burst sizes; Bytes, BadLayout and 4 slots
        // times new/reuse.
        assert_eq!(modes.len(), 10, "{modes:?}");
        assert_eq!(sources.len(), 10, "{sources:?}");
        assert_eq!(write_script(&[tx(3)]), [4, 3]);
        let plain = Op::Request {
            dest: 1,
            len: 2,
            src: Source::Bytes,
        };
        assert_eq!(write_script(&[plain])[0], 7);
    }

    #[test]
    fn scripted_packets_always_decode() {
        let cfg = engine_config();
        for known in [&[][..], &[5u64, 7, 9][..]] {
            for (_, ops) in engine_seeds() {
                for op in ops {
                    if let Op::Packet { packet, .. } = op {
                        wire::decode(&encode_packet(&cfg, known, &packet)).unwrap();
                    }
                }
            }
        }
        // Clamping: absurd DATA fields still give a valid packet.
        for (ml, off, len) in [(0, 0, 0), (1, u32::MAX, u16::MAX), (u32::MAX, u32::MAX, 9)] {
            let p = ScriptPacket {
                id: IdSel::Known(3),
                from_client: true,
                retransmit: true,
                checksum: true,
                send_time: 0,
                echo_time: 0,
                body: ScriptBody::Data {
                    message_length: ml,
                    offset: off,
                    len,
                    unsched_bytes: u32::MAX,
                    cutoff_version: 0,
                    ack: IdSel::Raw(0),
                },
            };
            let bytes = encode_packet(&cfg, &[], &p);
            wire::decode(&bytes).unwrap();
            assert!(wire::verify_checksum(&bytes, true));
        }
    }

    /// Runs the engine seeds through the target, and checks that each gets
    /// the engine where it was meant to (so the fuzzer starts from deep states).
    #[test]
    fn engine_seeds_run_clean_and_reach_their_goal() {
        let data = PacketType::Data.index();
        for (name, ops) in engine_seeds() {
            let c = run_engine(&write_script(&ops));
            let ok = match name.as_str() {
                "server-small" | "server-multi-ack" | "server-empty" | "gro-batch"
                | "gro-unsized" => c.requests == 1 && c.sent[data] >= 1,
                "client-small" | "client-scheduled" => {
                    c.responses == 1 && c.sent[data] >= 1 && c.failures == 0
                }
                "client-control-timeout" => c.responses + c.failures == 1,
                "limits" => c.requests >= 1,
                // The unscheduled packets (2) and the second request's
                // first packets (3) in place; the RESEND 700+3000 is resent
                // up to all that was sent when it came (2832) without a
                // gap, its first packet capped at the segment boundary
                // 1416, after the request's last two packets.
                "buf-request" => {
                    c.responses == 1
                        && c.in_place >= 5
                        && c.bursts >= 1
                        && c.buf_data >= 7
                        && c.in_flight_refused == 1
                        && c.retransmitted == [(700, 2832)]
                }
                // 3 packets in place; the RESEND 100+2000 is resent as
                // 100..1416 and 1416..2832 (whole packets up to its end).
                "buf-response" => {
                    c.requests == 1
                        && c.in_place >= 3
                        && c.buf_data >= 5
                        && c.retransmitted == [(100, 2832)]
                }
                _ => panic!("no goal for seed {name}"),
            };
            assert!(ok, "seed {name}: {c:?}");
        }
    }

    /// Mutants of the seed scripts (a few bytes changed, inserted or
    /// dropped, from a fixed xorshift stream, so the test is the same every
    /// time) through both runs: a cheap stand-in for a fuzzing session on
    /// machines without cargo-fuzz.
    #[test]
    fn mutated_seed_scripts_keep_every_check() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut partials = 0;
        for (_, ops) in engine_seeds() {
            let seed = write_script(&ops);
            for _ in 0..40 {
                let mut data = seed.clone();
                for _ in 0..1 + next() % 4 {
                    let at = (next() as usize) % data.len().max(1);
                    match next() % 3 {
                        0 if !data.is_empty() => data[at] ^= (next() as u8) | 1,
                        1 => data.insert(at, next() as u8),
                        _ if data.len() > 1 => {
                            data.remove(at);
                        }
                        _ => {}
                    }
                }
                run_engine(&data);
                partials += run_engine_second(&data).partials;
            }
        }
        assert!(partials > 0, "no mutant reached incremental delivery");
    }

    /// The second run reads messages incrementally: the seeds with a
    /// request or response of 2,000 bytes or more get there.
    #[test]
    fn engine_seeds_reach_incremental_delivery_in_the_second_run() {
        let mut partials = 0;
        for (name, ops) in engine_seeds() {
            let c = run_engine_second(&write_script(&ops));
            if name == "client-small" || name == "client-scheduled" {
                // Responses are always read incrementally there.
                assert_eq!(c.partials, c.responses, "seed {name}: {c:?}");
            }
            partials += c.partials;
        }
        assert!(partials >= 3, "{partials}");
    }

    /// A harness holding one buffer request (id 77, 5000 bytes) to
    /// `addrs()[1]`, and a retransmitted DATA packet of it.
    fn retx_harness() -> (Harness, impl Fn(usize, usize) -> Vec<u8>) {
        let mut h = Harness::new(false);
        let expect = Expect {
            len: 5000,
            seed: 9,
            buf: true,
        };
        h.issued.insert(77);
        h.accept((true, addrs()[1], 77), expect);
        let data = |off: usize, end: usize| {
            let common = CommonHeader {
                from_client: true,
                retransmit: true,
                rpc_id: 77,
                send_time: 1,
                echo_time: 0,
            };
            let header = DataHeader {
                message_length: 5000,
                offset: off as u32,
                unsched_bytes: 5000,
                cutoff_version: 0,
                ack: 0,
            };
            let payload: Vec<u8> = (off..end).map(|i| content_byte(9, i)).collect();
            let mut out = Vec::new();
            let body = Body::Data {
                header,
                payload: &payload,
            };
            wire::encode(&mut out, &common, &body, false);
            out
        };
        (h, data)
    }

    fn resend_for_77(offset: u32) -> Vec<u8> {
        let common = CommonHeader {
            from_client: false,
            retransmit: false,
            rpc_id: 77,
            send_time: 1,
            echo_time: 0,
        };
        let r = Resend {
            offset,
            length: 3000,
            priority: 0,
        };
        let mut out = Vec::new();
        wire::encode(&mut out, &common, &Body::Resend(r), false);
        out
    }

    /// Retransmissions that start at a RESEND's offset and go on packet by
    /// packet (short packets at segment boundaries included) pass, and are
    /// counted as runs.
    #[test]
    fn contiguous_retransmissions_pass() {
        let (mut h, data) = retx_harness();
        let dest = addrs()[1];
        h.note_resend(&resend_for_77(700));
        for (off, end) in [(700, 1416), (1416, 2832)] {
            h.check_datagram(dest, 0, &data(off, end));
        }
        // A later RESEND lower than the pending start moves it there.
        h.note_resend(&resend_for_77(100));
        h.check_datagram(dest, 0, &data(100, 1416));
        assert_eq!(h.counts.retransmitted, [(700, 2832), (100, 1416)]);
    }

    /// The engine bug fixed in 533cf1f: after a short packet at a segment
    /// boundary, the next one started a whole packet after the first.
    #[test]
    #[should_panic(expected = "continues neither")]
    fn a_gap_in_a_retransmission_fails() {
        let (mut h, data) = retx_harness();
        let dest = addrs()[1];
        h.note_resend(&resend_for_77(700));
        h.check_datagram(dest, 0, &data(700, 1416));
        h.check_datagram(dest, 0, &data(2116, 2832));
    }

    #[test]
    #[should_panic(expected = "continues neither")]
    fn a_retransmission_nobody_asked_for_fails() {
        let (mut h, data) = retx_harness();
        h.check_datagram(addrs()[1], 0, &data(0, 1416));
    }
}
