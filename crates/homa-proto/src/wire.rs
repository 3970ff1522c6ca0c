//! The Homa wire format (version 1), carried in UDP payloads.
//!
//! Layout and semantics are specified in `docs/wire-format.md`. All integers are
//! little-endian. Decoding borrows from the input buffer (no copies) and every
//! malformed input yields a [`DecodeError`], never a panic.

use thiserror::Error;

/// Wire-format version carried in the first byte of every packet.
pub const VERSION: u8 = 1;
/// Bytes of the header shared by every packet type.
pub const COMMON_HEADER_LEN: usize = 32;
/// Bytes of the DATA-specific header that follows the common header.
pub const DATA_HEADER_LEN: usize = 24;
/// Total header bytes in front of a DATA packet's payload.
pub const DATA_PACKET_OVERHEAD: usize = COMMON_HEADER_LEN + DATA_HEADER_LEN;
/// Number of unscheduled-priority cutoffs carried by a CUTOFFS packet.
pub const MAX_PRIORITIES: usize = 8;
/// Most RPC ids one ACK packet may carry.
pub const MAX_ACKS_PER_PACKET: usize = 32;

const FLAG_FROM_CLIENT: u8 = 0x01;
const FLAG_RETRANSMIT: u8 = 0x02;
const KNOWN_FLAGS: u8 = FLAG_FROM_CLIENT | FLAG_RETRANSMIT;
const CHECKSUM_RANGE: core::ops::Range<usize> = 4..8;

/// Packet types; values as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PacketType {
    Data = 1,
    Grant = 2,
    Resend = 3,
    RpcUnknown = 4,
    Busy = 5,
    Cutoffs = 6,
    NeedAck = 7,
    Ack = 8,
}

impl PacketType {
    /// Every packet type, in wire-value order.
    pub const ALL: [PacketType; 8] = [
        PacketType::Data,
        PacketType::Grant,
        PacketType::Resend,
        PacketType::RpcUnknown,
        PacketType::Busy,
        PacketType::Cutoffs,
        PacketType::NeedAck,
        PacketType::Ack,
    ];

    /// Dense index 0..8, for per-type counters.
    pub fn index(self) -> usize {
        self as usize - 1
    }

    /// Lower-case name, for metrics output.
    pub fn name(self) -> &'static str {
        match self {
            PacketType::Data => "data",
            PacketType::Grant => "grant",
            PacketType::Resend => "resend",
            PacketType::RpcUnknown => "rpc_unknown",
            PacketType::Busy => "busy",
            PacketType::Cutoffs => "cutoffs",
            PacketType::NeedAck => "need_ack",
            PacketType::Ack => "ack",
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get((v as usize).wrapping_sub(1)).copied()
    }
}

/// Fields present in every packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommonHeader {
    /// Set when the sender is the RPC's client (the packet concerns the request,
    /// or is a control packet sent by the client).
    pub from_client: bool,
    /// Set on DATA packets sent again in answer to a RESEND.
    pub retransmit: bool,
    /// Client-assigned RPC id.
    pub rpc_id: u64,
    /// Sender's clock (ns) when the packet was built.
    pub send_time: u64,
    /// The most recent `send_time` the sender has received from this peer, so
    /// that the receiver can compute a round-trip time. Zero if none.
    pub echo_time: u64,
}

/// DATA: a contiguous range of a message's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// Total length of the message.
    pub message_length: u32,
    /// Offset of this packet's payload within the message.
    pub offset: u32,
    /// How many leading bytes of the message the sender sends without grants.
    pub unsched_bytes: u32,
    /// Version of the receiver's unscheduled cutoffs the sender is using.
    pub cutoff_version: u16,
    /// A completed RPC (id) between the same two endpoints whose server state
    /// may be discarded; 0 for none. Only meaningful from a client.
    pub ack: u64,
}

/// GRANT: the sender may transmit the message up to `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub offset: u32,
    pub priority: u8,
}

/// RESEND: please retransmit `[offset, offset+length)` at `priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend {
    pub offset: u32,
    pub length: u32,
    pub priority: u8,
}

/// CUTOFFS: the receiver's unscheduled priority cutoffs. `cutoffs[i]` is the
/// largest message length that uses priority level `i`; 0 means the level is not
/// used for unscheduled packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cutoffs {
    pub version: u16,
    pub cutoffs: [u32; MAX_PRIORITIES],
}

/// Body of a packet to encode.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    Data { header: DataHeader, payload: &'a [u8] },
    Grant(Grant),
    Resend(Resend),
    RpcUnknown,
    Busy,
    Cutoffs(Cutoffs),
    NeedAck,
    /// Ids of completed RPCs; at most [`MAX_ACKS_PER_PACKET`].
    Ack(&'a [u64]),
}

/// A decoded packet body; borrows the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    Data { header: DataHeader, payload: &'a [u8] },
    Grant(Grant),
    Resend(Resend),
    RpcUnknown,
    Busy,
    Cutoffs(Cutoffs),
    NeedAck,
    Ack(AckList<'a>),
}

impl Packet<'_> {
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Data { .. } => PacketType::Data,
            Packet::Grant(_) => PacketType::Grant,
            Packet::Resend(_) => PacketType::Resend,
            Packet::RpcUnknown => PacketType::RpcUnknown,
            Packet::Busy => PacketType::Busy,
            Packet::Cutoffs(_) => PacketType::Cutoffs,
            Packet::NeedAck => PacketType::NeedAck,
            Packet::Ack(_) => PacketType::Ack,
        }
    }
}

/// The RPC ids of an ACK packet, decoded lazily from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckList<'a> {
    raw: &'a [u8],
}

impl<'a> AckList<'a> {
    pub fn len(&self) -> usize {
        self.raw.len() / 8
    }
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
    }
}

/// A decoded packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub common: CommonHeader,
    pub packet: Packet<'a>,
}

/// Why a datagram could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("datagram of {0} bytes is shorter than its header")]
    Truncated(usize),
    #[error("unsupported wire-format version {0}")]
    BadVersion(u8),
    #[error("unknown packet type {0}")]
    UnknownType(u8),
    #[error("unknown flag bits {0:#x}")]
    BadFlags(u8),
    #[error("{0:?} packet has {1} bytes after its header")]
    TrailingBytes(PacketType, usize),
    #[error("DATA range {offset}+{len} exceeds message length {message_length}")]
    DataOutOfRange {
        offset: u32,
        len: usize,
        message_length: u32,
    },
    #[error("DATA packet with an empty payload")]
    EmptyData,
    #[error("unscheduled bytes {0} exceed message length {1}")]
    BadUnsched(u32, u32),
    #[error("priority {0} out of range")]
    BadPriority(u8),
    #[error("ACK list has {0} bytes, not a multiple of 8 up to the limit")]
    BadAckList(usize),
    #[error("RPC id 0 is reserved")]
    ZeroRpcId,
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Decodes one datagram. Does not check the checksum (see [`verify_checksum`]).
pub fn decode(buf: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    if buf.len() < COMMON_HEADER_LEN {
        return Err(DecodeError::Truncated(buf.len()));
    }
    if buf[0] != VERSION {
        return Err(DecodeError::BadVersion(buf[0]));
    }
    let ptype = PacketType::from_u8(buf[1]).ok_or(DecodeError::UnknownType(buf[1]))?;
    let flags = buf[2];
    if flags & !KNOWN_FLAGS != 0 || buf[3] != 0 {
        return Err(DecodeError::BadFlags(flags));
    }
    let common = CommonHeader {
        from_client: flags & FLAG_FROM_CLIENT != 0,
        retransmit: flags & FLAG_RETRANSMIT != 0,
        rpc_id: u64_at(buf, 8),
        send_time: u64_at(buf, 16),
        echo_time: u64_at(buf, 24),
    };
    if common.rpc_id == 0 {
        return Err(DecodeError::ZeroRpcId);
    }
    let body = &buf[COMMON_HEADER_LEN..];
    let exact = |n: usize| -> Result<(), DecodeError> {
        if body.len() < n {
            Err(DecodeError::Truncated(buf.len()))
        } else if body.len() > n {
            Err(DecodeError::TrailingBytes(ptype, body.len() - n))
        } else {
            Ok(())
        }
    };
    let priority = |p: u8| -> Result<u8, DecodeError> {
        if (p as usize) < MAX_PRIORITIES {
            Ok(p)
        } else {
            Err(DecodeError::BadPriority(p))
        }
    };
    let packet = match ptype {
        PacketType::Data => {
            if body.len() < DATA_HEADER_LEN {
                return Err(DecodeError::Truncated(buf.len()));
            }
            if u16_at(body, 14) != 0 {
                return Err(DecodeError::BadFlags(flags));
            }
            let header = DataHeader {
                message_length: u32_at(body, 0),
                offset: u32_at(body, 4),
                unsched_bytes: u32_at(body, 8),
                cutoff_version: u16_at(body, 12),
                ack: u64_at(body, 16),
            };
            let payload = &body[DATA_HEADER_LEN..];
            if payload.is_empty() {
                return Err(DecodeError::EmptyData);
            }
            if header.offset as u64 + payload.len() as u64 > header.message_length as u64 {
                return Err(DecodeError::DataOutOfRange {
                    offset: header.offset,
                    len: payload.len(),
                    message_length: header.message_length,
                });
            }
            if header.unsched_bytes > header.message_length {
                return Err(DecodeError::BadUnsched(
                    header.unsched_bytes,
                    header.message_length,
                ));
            }
            Packet::Data { header, payload }
        }
        PacketType::Grant => {
            exact(8)?;
            if body[5..8] != [0, 0, 0] {
                return Err(DecodeError::BadFlags(flags));
            }
            Packet::Grant(Grant {
                offset: u32_at(body, 0),
                priority: priority(body[4])?,
            })
        }
        PacketType::Resend => {
            exact(12)?;
            if body[9..12] != [0, 0, 0] {
                return Err(DecodeError::BadFlags(flags));
            }
            Packet::Resend(Resend {
                offset: u32_at(body, 0),
                length: u32_at(body, 4),
                priority: priority(body[8])?,
            })
        }
        PacketType::RpcUnknown => {
            exact(0)?;
            Packet::RpcUnknown
        }
        PacketType::Busy => {
            exact(0)?;
            Packet::Busy
        }
        PacketType::NeedAck => {
            exact(0)?;
            Packet::NeedAck
        }
        PacketType::Cutoffs => {
            exact(4 + 4 * MAX_PRIORITIES)?;
            if u16_at(body, 2) != 0 {
                return Err(DecodeError::BadFlags(flags));
            }
            let mut cutoffs = [0u32; MAX_PRIORITIES];
            for (i, c) in cutoffs.iter_mut().enumerate() {
                *c = u32_at(body, 4 + 4 * i);
            }
            Packet::Cutoffs(Cutoffs {
                version: u16_at(body, 0),
                cutoffs,
            })
        }
        PacketType::Ack => {
            if body.len() % 8 != 0 || body.len() > 8 * MAX_ACKS_PER_PACKET {
                return Err(DecodeError::BadAckList(body.len()));
            }
            Packet::Ack(AckList { raw: body })
        }
    };
    Ok(Decoded { common, packet })
}

/// Appends an encoded packet to `out` (which is normally empty) and fills in its
/// checksum if `checksum` is set (otherwise the field is zero).
///
/// Panics only on caller bugs: an ACK list longer than [`MAX_ACKS_PER_PACKET`].
pub fn encode(out: &mut Vec<u8>, common: &CommonHeader, body: &Body<'_>, checksum: bool) {
    let start = out.len();
    let ptype = match body {
        Body::Data { .. } => PacketType::Data,
        Body::Grant(_) => PacketType::Grant,
        Body::Resend(_) => PacketType::Resend,
        Body::RpcUnknown => PacketType::RpcUnknown,
        Body::Busy => PacketType::Busy,
        Body::Cutoffs(_) => PacketType::Cutoffs,
        Body::NeedAck => PacketType::NeedAck,
        Body::Ack(_) => PacketType::Ack,
    };
    let mut flags = 0;
    if common.from_client {
        flags |= FLAG_FROM_CLIENT;
    }
    if common.retransmit {
        flags |= FLAG_RETRANSMIT;
    }
    out.extend_from_slice(&[VERSION, ptype as u8, flags, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&common.rpc_id.to_le_bytes());
    out.extend_from_slice(&common.send_time.to_le_bytes());
    out.extend_from_slice(&common.echo_time.to_le_bytes());
    match body {
        Body::Data { header, payload } => {
            out.extend_from_slice(&header.message_length.to_le_bytes());
            out.extend_from_slice(&header.offset.to_le_bytes());
            out.extend_from_slice(&header.unsched_bytes.to_le_bytes());
            out.extend_from_slice(&header.cutoff_version.to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&header.ack.to_le_bytes());
            out.extend_from_slice(payload);
        }
        Body::Grant(g) => {
            out.extend_from_slice(&g.offset.to_le_bytes());
            out.extend_from_slice(&[g.priority, 0, 0, 0]);
        }
        Body::Resend(r) => {
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.length.to_le_bytes());
            out.extend_from_slice(&[r.priority, 0, 0, 0]);
        }
        Body::RpcUnknown | Body::Busy | Body::NeedAck => {}
        Body::Cutoffs(c) => {
            out.extend_from_slice(&c.version.to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            for v in c.cutoffs {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Body::Ack(ids) => {
            assert!(ids.len() <= MAX_ACKS_PER_PACKET, "too many ACKs for one packet");
            for id in ids.iter() {
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }
    if checksum {
        let sum = compute_checksum(&out[start..]);
        out[start + CHECKSUM_RANGE.start..start + CHECKSUM_RANGE.end]
            .copy_from_slice(&sum.to_le_bytes());
    }
}

/// CRC-32C over the whole packet except the checksum field itself. Never 0, so
/// that 0 can mean "no checksum".
fn compute_checksum(packet: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&packet[..CHECKSUM_RANGE.start]);
    let crc = crc32c::crc32c_append(crc, &packet[CHECKSUM_RANGE.end..]);
    if crc == 0 {
        1
    } else {
        crc
    }
}

/// Checks a datagram's checksum. With `required` unset a zero (absent) checksum
/// is accepted. Datagrams too short to hold a header fail.
pub fn verify_checksum(packet: &[u8], required: bool) -> bool {
    if packet.len() < COMMON_HEADER_LEN {
        return false;
    }
    let stored = u32_at(packet, CHECKSUM_RANGE.start);
    if stored == 0 {
        return !required;
    }
    stored == compute_checksum(packet)
}
