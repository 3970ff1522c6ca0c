//! The Homa wire format (version 4, [`VERSION`]), carried in UDP payloads.
//!
//! Layout and semantics are specified in `docs/wire-format.md`. All integers are
//! little-endian. Decoding borrows from the input buffer (no copies) and every
//! malformed input yields a [`DecodeError`], never a panic.
//!
//! Version 2 makes every packet self-delimiting: DATA states its payload length
//! and ACK its id count, where version 1 left both implied by the datagram's
//! length. So a datagram that UDP GRO coalesced from several packets can be
//! split without the kernel's segment size ([`coalesced_segment`]), e.g. after
//! a plain `recvfrom`. The bytes used were reserved (must be zero) in version 1,
//! so a version-1 receiver rejects version-2 packets rather than misreading
//! them, and the version byte changes anyway.
//!
//! Version 3 adds DATA padding (byte 3). Version 4 changes what `echo_time`
//! means, not the layout: the echoed `send_time` is advanced by the time the
//! echoing host held it, so that RTT samples leave out the peer's service
//! time (`docs/wire-format.md`, *Timestamps*).

use thiserror::Error;

/// Wire-format version carried in the first byte of every packet.
pub const VERSION: u8 = 5;
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

/// Byte of the common header that holds an ACK's id count, or a DATA
/// packet's count of padding bytes after its payload (reserved, zero, in
/// every other type).
const ACK_COUNT_AT: usize = 3;
const DATA_PAD_AT: usize = 3;
/// Most padding bytes one DATA packet may carry (the count is one byte).
pub const MAX_DATA_PAD: usize = u8::MAX as usize;
/// Body bytes of the fixed-size packet types (the decoder requires exactly
/// these; `packet_len` declares them).
const GRANT_BODY_LEN: usize = 8;
const RESEND_BODY_LEN: usize = 12;
const CUTOFFS_BODY_LEN: usize = 4 + 4 * MAX_PRIORITIES;
/// STREAM_DATA's header after the common header (payload follows).
pub const STREAM_DATA_HEADER_LEN: usize = 32;
/// A STREAM_DATA packet's bytes besides its payload.
pub const STREAM_DATA_OVERHEAD: usize = COMMON_HEADER_LEN + STREAM_DATA_HEADER_LEN;
const STREAM_CREDIT_BODY_LEN: usize = 32;
const STREAM_RESET_BODY_LEN: usize = 8;
/// Where STREAM_DATA declares its payload's length.
const STREAM_PAYLOAD_LEN_AT: usize = COMMON_HEADER_LEN + 24;
/// Stream offsets are below 2^62: far beyond any stream's life (146 years
/// at 1 Tbit/s), and sums of two never overflow.
pub const MAX_STREAM_OFFSET: u64 = 1 << 62;
const STREAM_FIN: u8 = 0x02;
/// Where STREAM_DATA declares how many message ends it lists.
const STREAM_ENDS_AT: usize = COMMON_HEADER_LEN + 27;
/// Most message ends one STREAM_DATA lists (its count is a byte).
pub const MAX_STREAM_ENDS: usize = u8::MAX as usize;
const CREDIT_PROBE: u8 = 0x01;
const CREDIT_FIN_RECEIVED: u8 = 0x02;
/// Offset of a DATA packet's `payload_length` (u16) from the packet's start.
/// A u16 suffices: `Config` caps packets at 65,000 bytes.
const PAYLOAD_LEN_AT: usize = COMMON_HEADER_LEN + 14;

const FLAG_FROM_CLIENT: u8 = 0x01;
const FLAG_RETRANSMIT: u8 = 0x02;
const KNOWN_FLAGS: u8 = FLAG_FROM_CLIENT | FLAG_RETRANSMIT;
const CHECKSUM_RANGE: core::ops::Range<usize> = 4..8;

/// Packet types; values as on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum PacketType {
    /// A contiguous range of a message's bytes, sent by the message's sender.
    Data = 1,
    /// The receiver lets the sender transmit more of a message.
    Grant = 2,
    /// The receiver asks for a range again (a client also asks this way for
    /// an overdue response).
    Resend = 3,
    /// "I have no state for this RPC", from either side.
    RpcUnknown = 4,
    /// "I know this RPC and am alive, but have nothing to send now."
    Busy = 5,
    /// A receiver's unscheduled priority cutoffs, to a sender using stale ones.
    Cutoffs = 6,
    /// A server that has sent a whole response asks the client to confirm it.
    NeedAck = 7,
    /// A client lists finished RPCs whose server state may be freed.
    Ack = 8,
    /// A contiguous range of one direction of a stream (version 5).
    StreamData = 9,
    /// A stream's reader: credit, what arrived, what to send again.
    StreamCredit = 10,
    /// "This stream is over": cancelled, unknown, or refused.
    StreamReset = 11,
}

impl PacketType {
    /// Every packet type, in wire-value order.
    pub const ALL: [PacketType; 11] = [
        PacketType::Data,
        PacketType::Grant,
        PacketType::Resend,
        PacketType::RpcUnknown,
        PacketType::Busy,
        PacketType::Cutoffs,
        PacketType::NeedAck,
        PacketType::Ack,
        PacketType::StreamData,
        PacketType::StreamCredit,
        PacketType::StreamReset,
    ];

    /// How many packet types there are (the length of per-type counters).
    pub const COUNT: usize = Self::ALL.len();

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
            PacketType::StreamData => "stream_data",
            PacketType::StreamCredit => "stream_credit",
            PacketType::StreamReset => "stream_reset",
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
    /// The most recent `send_time` the sender has received from this peer,
    /// plus the ns since it arrived (its hold time), so that the receiver
    /// can compute a round-trip time that leaves the hold time out. Zero if
    /// none.
    pub echo_time: u64,
}

/// DATA: a contiguous range of a message's bytes. The payload length is on
/// the wire (bytes 46..48) but not here: the payload slice carries it.
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
    /// The sender may transmit every byte of the message below this offset
    /// (grants are cumulative).
    pub offset: u32,
    /// Priority level (0..8, 7 highest) for the scheduled bytes.
    pub priority: u8,
}

/// RESEND: please retransmit `[offset, offset+length)` at `priority`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend {
    /// First message byte to send again.
    pub offset: u32,
    /// Number of bytes to send again, from `offset`.
    pub length: u32,
    /// Priority level (0..8, 7 highest) for the retransmitted packets.
    pub priority: u8,
}

/// CUTOFFS: the receiver's unscheduled priority cutoffs. `cutoffs[i]` is the
/// largest message length that uses priority level `i`; 0 means the level is not
/// used for unscheduled packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cutoffs {
    /// Version of this set, quoted back in DATA's `cutoff_version`; hosts
    /// use 1..=65535 (0 means "not heard yet").
    pub version: u16,
    /// Indexed by priority level: the largest message length whose
    /// unscheduled packets use that level; 0 if none do.
    pub cutoffs: [u32; MAX_PRIORITIES],
}

/// STREAM_DATA: bytes `[offset, offset + payload)` of one direction of a
/// stream, plus what the sender says about the other direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamDataHeader {
    /// Offset of the payload in this direction's byte sequence.
    pub offset: u64,
    /// Credit for the reverse direction: the peer may send every byte of
    /// it below this offset (0: none stated).
    pub rev_credit: u64,
    /// The first byte of the reverse direction the sender has not yet
    /// received in order: an acknowledgement of everything before it.
    pub rev_received: u64,
    /// This direction ends after the payload.
    pub fin: bool,
}

/// The message ends a STREAM_DATA lists: positions in its payload (1 ..=
/// its length, ascending) after which a stream message ends. Decoded
/// lazily from the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamEnds<'a> {
    raw: &'a [u8],
}

impl<'a> StreamEnds<'a> {
    /// The ends in `raw` (4 bytes each, little-endian), as decoded.
    pub(crate) fn from_raw(raw: &'a [u8]) -> StreamEnds<'a> {
        StreamEnds { raw }
    }

    /// How many ends.
    pub fn len(&self) -> usize {
        self.raw.len() / 4
    }
    /// Whether no message ends in the packet.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    /// The ends, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + 'a {
        self.raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
    }
}

/// STREAM_CREDIT: the reader of one direction of a stream tells its writer
/// how far it may send and what arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamCredit {
    /// The writer may send every byte below this offset.
    pub credit: u64,
    /// Every byte below this offset arrived (an acknowledgement).
    pub received: u64,
    /// When non-zero: send `[received, resend_end)` again (bytes are
    /// missing there); always above `received`.
    pub resend_end: u64,
    /// The sender wants a STREAM_CREDIT back (it has heard nothing for a
    /// while): a loss probe and a keep-alive.
    pub probe: bool,
    /// The direction's end (FIN) arrived, after every byte.
    pub fin_received: bool,
}

/// Why a stream was reset (STREAM_RESET's reason byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ResetReason {
    /// The application at the sender cancelled the stream.
    Cancelled = 1,
    /// The sender has no such stream (it never had it, or it is gone).
    Unknown = 2,
    /// The sender cannot take another stream (its limit).
    Refused = 3,
    /// The sender's endpoint shut down.
    Shutdown = 4,
    /// The sender gave up: it heard the peer but the stream made no
    /// progress for the RPC timeout (the peer lost its state).
    Stuck = 5,
}

impl ResetReason {
    fn from_u8(v: u8) -> Option<ResetReason> {
        Some(match v {
            1 => ResetReason::Cancelled,
            2 => ResetReason::Unknown,
            3 => ResetReason::Refused,
            4 => ResetReason::Shutdown,
            5 => ResetReason::Stuck,
            _ => return None,
        })
    }
}

/// Body of a packet to encode.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    /// A DATA packet.
    Data {
        /// Its DATA header fields.
        header: DataHeader,
        /// The message bytes it carries; their length goes on the wire.
        /// [`encode_headers`] does not append them but still checksums them.
        payload: &'a [u8],
    },
    /// A GRANT packet.
    Grant(Grant),
    /// A RESEND packet.
    Resend(Resend),
    /// An RPC_UNKNOWN packet (no body).
    RpcUnknown,
    /// A BUSY packet (no body).
    Busy,
    /// A CUTOFFS packet.
    Cutoffs(Cutoffs),
    /// A NEED_ACK packet (no body).
    NeedAck,
    /// Ids of completed RPCs; at most [`MAX_ACKS_PER_PACKET`].
    Ack(&'a [u64]),
    /// A STREAM_DATA packet.
    StreamData {
        /// Its STREAM_DATA header fields.
        header: StreamDataHeader,
        /// Positions in the payload after which a message ends (1..=its
        /// length, ascending; at most [`MAX_STREAM_ENDS`]).
        ends: &'a [u32],
        /// The stream bytes it carries; [`encode_headers`] does not append
        /// them but still checksums them.
        payload: &'a [u8],
    },
    /// A STREAM_CREDIT packet.
    StreamCredit(StreamCredit),
    /// A STREAM_RESET packet.
    StreamReset(ResetReason),
}

impl Body<'_> {
    /// The type this body encodes as.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Body::Data { .. } => PacketType::Data,
            Body::Grant(_) => PacketType::Grant,
            Body::Resend(_) => PacketType::Resend,
            Body::RpcUnknown => PacketType::RpcUnknown,
            Body::Busy => PacketType::Busy,
            Body::Cutoffs(_) => PacketType::Cutoffs,
            Body::NeedAck => PacketType::NeedAck,
            Body::Ack(_) => PacketType::Ack,
            Body::StreamData { .. } => PacketType::StreamData,
            Body::StreamCredit(_) => PacketType::StreamCredit,
            Body::StreamReset(_) => PacketType::StreamReset,
        }
    }
}

/// A decoded packet body; borrows the input buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    /// A DATA packet.
    Data {
        /// Its DATA header fields.
        header: DataHeader,
        /// Its payload, borrowed from the datagram (padding excluded).
        payload: &'a [u8],
    },
    /// A GRANT packet.
    Grant(Grant),
    /// A RESEND packet.
    Resend(Resend),
    /// An RPC_UNKNOWN packet (no body).
    RpcUnknown,
    /// A BUSY packet (no body).
    Busy,
    /// A CUTOFFS packet.
    Cutoffs(Cutoffs),
    /// A NEED_ACK packet (no body).
    NeedAck,
    /// An ACK packet's ids.
    Ack(AckList<'a>),
    /// A STREAM_DATA packet.
    StreamData {
        /// Its STREAM_DATA header fields.
        header: StreamDataHeader,
        /// The message ends it lists.
        ends: StreamEnds<'a>,
        /// Its payload, borrowed from the datagram.
        payload: &'a [u8],
    },
    /// A STREAM_CREDIT packet.
    StreamCredit(StreamCredit),
    /// A STREAM_RESET packet.
    StreamReset(ResetReason),
}

impl Packet<'_> {
    /// The type of the decoded packet.
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
            Packet::StreamData { .. } => PacketType::StreamData,
            Packet::StreamCredit(_) => PacketType::StreamCredit,
            Packet::StreamReset(_) => PacketType::StreamReset,
        }
    }
}

/// The RPC ids of an ACK packet, decoded lazily from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckList<'a> {
    raw: &'a [u8],
}

impl<'a> AckList<'a> {
    /// Number of ids, at most [`MAX_ACKS_PER_PACKET`].
    pub fn len(&self) -> usize {
        self.raw.len() / 8
    }
    /// Whether the ACK carries no ids (allowed on the wire).
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    /// The ids, in wire order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
    }
}

/// A decoded packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// The common header's fields.
    pub common: CommonHeader,
    /// The type-specific body.
    pub packet: Packet<'a>,
    /// Zero bytes after a DATA packet's payload (0 for other types).
    pub pad: u8,
}

/// Why a datagram could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The datagram (the value is its length) is shorter than a header, or
    /// than the length its header declares.
    #[error("datagram of {0} bytes is shorter than its header")]
    Truncated(usize),
    /// The first byte (the value) is not [`VERSION`].
    #[error("unsupported wire-format version {0}")]
    BadVersion(u8),
    /// The type byte (the value) is not a [`PacketType`], 1..=11.
    #[error("unknown packet type {0}")]
    UnknownType(u8),
    /// Unknown flag bits are set (the value is the flags byte), or a reserved
    /// byte is not zero (the value is that byte).
    #[error("unknown flag bits or non-zero reserved byte {0:#x}")]
    BadFlags(u8),
    /// The datagram is longer than its header declares (the values: its
    /// type, and the bytes beyond the declared length).
    #[error("{0:?} packet has {1} bytes after its header")]
    TrailingBytes(PacketType, usize),
    /// A DATA payload reaches past the end of its message.
    #[error("DATA range {offset}+{len} exceeds message length {message_length}")]
    DataOutOfRange {
        /// The packet's offset in the message.
        offset: u32,
        /// The packet's payload length.
        len: usize,
        /// The message length the packet declares.
        message_length: u32,
    },
    /// A DATA packet without payload that is not the single packet (offset
    /// 0) of a zero-length message.
    #[error("DATA packet with an empty payload for a non-empty message")]
    EmptyData,
    /// DATA declares more unscheduled bytes than its message has (the
    /// values: `unsched_bytes`, `message_length`).
    #[error("unscheduled bytes {0} exceed message length {1}")]
    BadUnsched(u32, u32),
    /// A GRANT or RESEND names a priority level (the value) of 8 or more.
    #[error("priority {0} out of range")]
    BadPriority(u8),
    /// An ACK declares more ids than [`MAX_ACKS_PER_PACKET`] (the value is
    /// the declared count).
    #[error("ACK declares {0} ids, more than the limit")]
    BadAckList(usize),
    /// The RPC id is 0, which no RPC has.
    #[error("RPC id 0 is reserved")]
    ZeroRpcId,
    /// A stream field is out of range: an offset at or above
    /// [`MAX_STREAM_OFFSET`], an empty STREAM_DATA without FIN, a message
    /// end on an empty payload, a resend range that ends at or below its
    /// start, or an unknown reset reason.
    #[error("stream field out of range")]
    BadStreamField,
    /// [`decode_data_head`] only: not a DATA packet, or one whose padding or
    /// checksum needs its payload's bytes (not malformed: decode it whole).
    #[error("not a DATA packet whose payload can be received elsewhere")]
    NotLandable,
}

/// Reserved bytes must be zero so that a later version can give them a meaning
/// that old decoders reject rather than silently ignore.
fn check_reserved(bytes: &[u8]) -> Result<(), DecodeError> {
    // OR the bytes together eight at a time, with no branch per byte: a
    // padded short DATA packet has up to 69 of them, and a byte-by-byte
    // search cost ~200 instructions per packet. The culprit is looked for
    // only when there is one.
    let mut words = bytes.chunks_exact(8);
    let mut acc = 0u64;
    for w in &mut words {
        acc |= u64::from_ne_bytes(w.try_into().unwrap());
    }
    for &b in words.remainder() {
        acc |= b as u64;
    }
    if acc == 0 {
        return Ok(());
    }
    let b = bytes.iter().find(|b| **b != 0).copied().unwrap_or_default();
    Err(DecodeError::BadFlags(b))
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
// Inlined into the engine's one caller, the result is built where it is
// used instead of being returned in memory and copied.
#[inline]
pub fn decode(buf: &[u8]) -> Result<Decoded<'_>, DecodeError> {
    if buf.len() < COMMON_HEADER_LEN {
        return Err(DecodeError::Truncated(buf.len()));
    }
    if buf[0] != VERSION {
        return Err(DecodeError::BadVersion(buf[0]));
    }
    let ptype = PacketType::from_u8(buf[1]).ok_or(DecodeError::UnknownType(buf[1]))?;
    let flags = buf[2];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::BadFlags(flags));
    }
    // Byte 3 is the ACK's id count; reserved in every other type.
    if ptype == PacketType::Ack {
        if buf[ACK_COUNT_AT] as usize > MAX_ACKS_PER_PACKET {
            return Err(DecodeError::BadAckList(buf[ACK_COUNT_AT] as usize));
        }
    } else if ptype != PacketType::Data {
        check_reserved(&buf[3..4])?;
    }
    let common = common_header(buf, flags)?;
    let body = &buf[COMMON_HEADER_LEN..];
    let exact = |n: usize| exact_body(ptype, buf.len(), n);
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
            // The datagram holds exactly the declared payload and padding:
            // a cut or extended datagram is caught here, not only by the
            // checksum.
            let declared = u16_at(buf, PAYLOAD_LEN_AT) as usize;
            let pad = buf[DATA_PAD_AT] as usize;
            exact(DATA_HEADER_LEN + declared + pad)?;
            // Padding is reserved space: zeros, so that a packet has one
            // encoding.
            check_reserved(&body[DATA_HEADER_LEN + declared..])?;
            let header = data_header(body, declared)?;
            let payload = &body[DATA_HEADER_LEN..DATA_HEADER_LEN + declared];
            Packet::Data { header, payload }
        }
        PacketType::Grant => {
            exact(GRANT_BODY_LEN)?;
            check_reserved(&body[5..8])?;
            Packet::Grant(Grant {
                offset: u32_at(body, 0),
                priority: priority(body[4])?,
            })
        }
        PacketType::Resend => {
            exact(RESEND_BODY_LEN)?;
            check_reserved(&body[9..12])?;
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
            exact(CUTOFFS_BODY_LEN)?;
            check_reserved(&body[2..4])?;
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
            // The count (byte 3) was bounded above.
            exact(8 * buf[ACK_COUNT_AT] as usize)?;
            Packet::Ack(AckList { raw: body })
        }
        PacketType::StreamData => {
            if body.len() < STREAM_DATA_HEADER_LEN {
                return Err(DecodeError::Truncated(buf.len()));
            }
            let declared = u16_at(buf, STREAM_PAYLOAD_LEN_AT) as usize;
            let n_ends = buf[STREAM_ENDS_AT] as usize;
            exact(STREAM_DATA_HEADER_LEN + 4 * n_ends + declared)?;
            let flags = body[26];
            if flags & !STREAM_FIN != 0 {
                return Err(DecodeError::BadFlags(flags));
            }
            check_reserved(&body[28..32])?;
            let header = StreamDataHeader {
                offset: u64_at(body, 0),
                rev_credit: u64_at(body, 8),
                rev_received: u64_at(body, 16),
                fin: flags & STREAM_FIN != 0,
            };
            let ends = StreamEnds {
                raw: &body[STREAM_DATA_HEADER_LEN..STREAM_DATA_HEADER_LEN + 4 * n_ends],
            };
            let end = header.offset.saturating_add(declared as u64);
            // Ends ascend strictly within 1..=len; an empty packet is a
            // FIN alone.
            let mut prev = 0u32;
            let ends_ok = ends.iter().all(|e| {
                let ok = e > prev && e as usize <= declared;
                prev = e;
                ok
            });
            if end >= MAX_STREAM_OFFSET
                || header.rev_credit >= MAX_STREAM_OFFSET
                || header.rev_received >= MAX_STREAM_OFFSET
                || (declared == 0 && !header.fin)
                || !ends_ok
            {
                return Err(DecodeError::BadStreamField);
            }
            let at = STREAM_DATA_HEADER_LEN + 4 * n_ends;
            let payload = &body[at..at + declared];
            Packet::StreamData {
                header,
                ends,
                payload,
            }
        }
        PacketType::StreamCredit => {
            exact(STREAM_CREDIT_BODY_LEN)?;
            let flags = body[24];
            if flags & !(CREDIT_PROBE | CREDIT_FIN_RECEIVED) != 0 {
                return Err(DecodeError::BadFlags(flags));
            }
            check_reserved(&body[25..32])?;
            let credit = StreamCredit {
                credit: u64_at(body, 0),
                received: u64_at(body, 8),
                resend_end: u64_at(body, 16),
                probe: flags & CREDIT_PROBE != 0,
                fin_received: flags & CREDIT_FIN_RECEIVED != 0,
            };
            if credit.credit >= MAX_STREAM_OFFSET
                || credit.received >= MAX_STREAM_OFFSET
                || credit.resend_end >= MAX_STREAM_OFFSET
                || (credit.resend_end != 0 && credit.resend_end <= credit.received)
            {
                return Err(DecodeError::BadStreamField);
            }
            Packet::StreamCredit(credit)
        }
        PacketType::StreamReset => {
            exact(STREAM_RESET_BODY_LEN)?;
            check_reserved(&body[1..8])?;
            Packet::StreamReset(ResetReason::from_u8(body[0]).ok_or(DecodeError::BadStreamField)?)
        }
    };
    // Byte 3 is the padding count in DATA only (checked above).
    let pad = if ptype == PacketType::Data {
        buf[DATA_PAD_AT]
    } else {
        0
    };
    Ok(Decoded {
        common,
        packet,
        pad,
    })
}

/// The common header of a datagram at least [`COMMON_HEADER_LEN`] long
/// whose flags byte (`flags`) has been checked.
#[inline]
fn common_header(buf: &[u8], flags: u8) -> Result<CommonHeader, DecodeError> {
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
    Ok(common)
}

/// A `ptype` datagram of `total` bytes must hold exactly `body` bytes after
/// its common header: a cut or extended datagram is refused.
#[inline]
fn exact_body(ptype: PacketType, total: usize, body: usize) -> Result<(), DecodeError> {
    let have = total.saturating_sub(COMMON_HEADER_LEN);
    if have < body {
        Err(DecodeError::Truncated(total))
    } else if have > body {
        Err(DecodeError::TrailingBytes(ptype, have - body))
    } else {
        Ok(())
    }
}

/// The DATA header at the start of `body` (after the common header), checked
/// against the length of the payload that follows it.
#[inline]
fn data_header(body: &[u8], payload_len: usize) -> Result<DataHeader, DecodeError> {
    let header = DataHeader {
        message_length: u32_at(body, 0),
        offset: u32_at(body, 4),
        unsched_bytes: u32_at(body, 8),
        cutoff_version: u16_at(body, 12),
        ack: u64_at(body, 16),
    };
    // Only a zero-length message has an empty DATA packet (its only one).
    if payload_len == 0 && (header.message_length != 0 || header.offset != 0) {
        return Err(DecodeError::EmptyData);
    }
    if header.offset as u64 + payload_len as u64 > header.message_length as u64 {
        return Err(DecodeError::DataOutOfRange {
            offset: header.offset,
            len: payload_len,
            message_length: header.message_length,
        });
    }
    if header.unsched_bytes > header.message_length {
        return Err(DecodeError::BadUnsched(
            header.unsched_bytes,
            header.message_length,
        ));
    }
    Ok(header)
}

/// Decodes the headers of a DATA datagram of `datagram_len` bytes from its
/// first [`DATA_PACKET_OVERHEAD`] bytes alone, for a driver that receives
/// the payload somewhere else (`Endpoint::landing_site`): the same checks
/// as [`decode`], except the payload's own bytes. Returns the headers and
/// the payload's length. Only packets without padding and without a
/// checksum qualify (both need the payload's bytes); others are
/// [`DecodeError::NotLandable`].
pub fn decode_data_head(
    head: &[u8],
    datagram_len: usize,
) -> Result<(CommonHeader, DataHeader, usize), DecodeError> {
    if head.len() < DATA_PACKET_OVERHEAD {
        return Err(DecodeError::Truncated(head.len()));
    }
    if head[0] != VERSION {
        return Err(DecodeError::BadVersion(head[0]));
    }
    if head[1] != PacketType::Data as u8 {
        return Err(DecodeError::NotLandable);
    }
    let flags = head[2];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::BadFlags(flags));
    }
    if head[DATA_PAD_AT] != 0 || u32_at(head, CHECKSUM_RANGE.start) != 0 {
        return Err(DecodeError::NotLandable);
    }
    let common = common_header(head, flags)?;
    let declared = u16_at(head, PAYLOAD_LEN_AT) as usize;
    exact_body(PacketType::Data, datagram_len, DATA_HEADER_LEN + declared)?;
    let header = data_header(&head[COMMON_HEADER_LEN..], declared)?;
    Ok((common, header, declared))
}

/// The longest headers a driver peeks at to land a payload
/// (`Endpoint::landing_site`): a STREAM_DATA's with one message end.
pub const MAX_LANDING_HEAD: usize = STREAM_DATA_OVERHEAD + 4;

/// Decodes the headers of a STREAM_DATA datagram of `datagram_len` bytes
/// from its first bytes alone (`head`), for a driver that receives the
/// payload elsewhere: the same checks as [`decode`] except the payload's
/// own bytes. Returns the headers, the headers' length and the payload's
/// length. Only packets with at most one message end (whose headers fit
/// [`MAX_LANDING_HEAD`]) and without a checksum qualify; others are
/// [`DecodeError::NotLandable`].
pub fn decode_stream_data_head(
    head: &[u8],
    datagram_len: usize,
) -> Result<(CommonHeader, StreamDataHeader, usize, usize), DecodeError> {
    if head.len() < STREAM_DATA_OVERHEAD {
        return Err(DecodeError::Truncated(head.len()));
    }
    if head[0] != VERSION {
        return Err(DecodeError::BadVersion(head[0]));
    }
    if head[1] != PacketType::StreamData as u8 {
        return Err(DecodeError::NotLandable);
    }
    let n_ends = head[STREAM_ENDS_AT] as usize;
    let header_len = STREAM_DATA_OVERHEAD + 4 * n_ends;
    if n_ends > 1 || head.len() < header_len || u32_at(head, CHECKSUM_RANGE.start) != 0 {
        return Err(DecodeError::NotLandable);
    }
    // The whole decoder's checks on the headers: decode them with an empty
    // payload standing in for the real one (same length check below).
    let declared = u16_at(head, STREAM_PAYLOAD_LEN_AT) as usize;
    exact_body(
        PacketType::StreamData,
        datagram_len,
        STREAM_DATA_HEADER_LEN + 4 * n_ends + declared,
    )?;
    let flags = head[2];
    if flags & !KNOWN_FLAGS != 0 || head[3] != 0 {
        return Err(DecodeError::BadFlags(flags | head[3]));
    }
    let common = common_header(head, flags)?;
    let body = &head[COMMON_HEADER_LEN..header_len];
    let sflags = body[26];
    if sflags & !STREAM_FIN != 0 {
        return Err(DecodeError::BadFlags(sflags));
    }
    check_reserved(&body[28..32])?;
    let header = StreamDataHeader {
        offset: u64_at(body, 0),
        rev_credit: u64_at(body, 8),
        rev_received: u64_at(body, 16),
        fin: sflags & STREAM_FIN != 0,
    };
    let end_ok = n_ends == 0 || {
        let e = u32_at(body, STREAM_DATA_HEADER_LEN) as usize;
        e >= 1 && e <= declared
    };
    if header.offset.saturating_add(declared as u64) >= MAX_STREAM_OFFSET
        || header.rev_credit >= MAX_STREAM_OFFSET
        || header.rev_received >= MAX_STREAM_OFFSET
        || (declared == 0 && !header.fin)
        || !end_ok
    {
        return Err(DecodeError::BadStreamField);
    }
    Ok((common, header, header_len, declared))
}

/// The length of the packet at the start of `buf` as its own header
/// declares it: fixed for most types, 56 + payload_length + padding for DATA,
/// 32 + 8 × count for ACK. `None` if `buf` is shorter than the bytes
/// needed to tell, or its version/type is unknown. Cheap (a few byte
/// reads, no validation beyond that): it is on the receive fast path.
#[inline]
pub fn packet_len(buf: &[u8]) -> Option<usize> {
    if *buf.first()? != VERSION {
        return None;
    }
    Some(match PacketType::from_u8(*buf.get(1)?)? {
        PacketType::Data => {
            let at = buf.get(PAYLOAD_LEN_AT..PAYLOAD_LEN_AT + 2)?;
            DATA_PACKET_OVERHEAD
                + u16::from_le_bytes([at[0], at[1]]) as usize
                + *buf.get(DATA_PAD_AT)? as usize
        }
        PacketType::Grant => COMMON_HEADER_LEN + GRANT_BODY_LEN,
        PacketType::Resend => COMMON_HEADER_LEN + RESEND_BODY_LEN,
        PacketType::RpcUnknown | PacketType::Busy | PacketType::NeedAck => COMMON_HEADER_LEN,
        PacketType::Cutoffs => COMMON_HEADER_LEN + CUTOFFS_BODY_LEN,
        PacketType::Ack => COMMON_HEADER_LEN + 8 * *buf.get(ACK_COUNT_AT)? as usize,
        PacketType::StreamData => {
            let at = buf.get(STREAM_PAYLOAD_LEN_AT..STREAM_PAYLOAD_LEN_AT + 2)?;
            STREAM_DATA_OVERHEAD
                + 4 * *buf.get(STREAM_ENDS_AT)? as usize
                + u16::from_le_bytes([at[0], at[1]]) as usize
        }
        PacketType::StreamCredit => COMMON_HEADER_LEN + STREAM_CREDIT_BODY_LEN,
        PacketType::StreamReset => COMMON_HEADER_LEN + STREAM_RESET_BODY_LEN,
    })
}

/// Whether `buf` starts with a packet of a bulk transfer: a DATA packet of
/// a message longer than the packet's payload (a multi-packet message), or
/// a STREAM_DATA with a payload. Cheap, no validation beyond that: for a
/// driver deciding how to receive (whether UDP GRO, or landing, pays).
#[inline]
pub fn is_multi_packet_data(buf: &[u8]) -> bool {
    buf.len() >= DATA_PACKET_OVERHEAD
        && buf[0] == VERSION
        && (buf[1] == PacketType::Data as u8
            && u32_at(buf, COMMON_HEADER_LEN) > u16_at(buf, PAYLOAD_LEN_AT) as u32
            // A stream's data is a bulk transfer too.
            || buf[1] == PacketType::StreamData as u8
                && buf.len() >= STREAM_DATA_OVERHEAD
                && u16_at(buf, STREAM_PAYLOAD_LEN_AT) > 0)
}

/// The segment size to cut a received datagram into when the kernel did not
/// say (no GRO control message): the first packet's declared length if it is
/// shorter than the datagram (GRO coalesced equal-size packets, only the last
/// may be shorter), otherwise the whole datagram. Never 0.
#[inline]
pub fn coalesced_segment(datagram: &[u8]) -> usize {
    match packet_len(datagram) {
        // Every declared length is at least the 32-byte header, never 0.
        Some(n) if n < datagram.len() => n,
        _ => datagram.len().max(1),
    }
}

/// Appends an encoded packet to `out` (which is normally empty) and fills in its
/// checksum if `checksum` is set (otherwise the field is zero).
///
/// Panics only on caller bugs: an ACK list longer than [`MAX_ACKS_PER_PACKET`],
/// or a DATA payload longer than 65,535 bytes.
pub fn encode(out: &mut Vec<u8>, common: &CommonHeader, body: &Body<'_>, checksum: bool) {
    encode_inner(out, common, body, checksum, true, 0)
}

/// [`encode`] with `pad` zero bytes after a DATA packet's payload, declared
/// in its header (ignored for other types). The checksum covers them.
pub fn encode_padded(
    out: &mut Vec<u8>,
    common: &CommonHeader,
    body: &Body<'_>,
    checksum: bool,
    pad: u8,
) {
    encode_inner(out, common, body, checksum, true, pad)
}

/// Like [`encode`], but for DATA packets appends only the headers; the payload
/// is to be sent right after them (e.g. as a second iovec), which saves
/// copying it. The checksum still covers the payload.
pub fn encode_headers(out: &mut Vec<u8>, common: &CommonHeader, body: &Body<'_>, checksum: bool) {
    encode_inner(out, common, body, checksum, false, 0)
}

/// [`encode_headers`] of a DATA packet that will be followed by its payload
/// and then `pad` zero bytes (see [`encode_padded`]).
pub fn encode_headers_padded(
    out: &mut Vec<u8>,
    common: &CommonHeader,
    body: &Body<'_>,
    checksum: bool,
    pad: u8,
) {
    encode_inner(out, common, body, checksum, false, pad)
}

/// A DATA packet's headers as seven little-endian 64-bit words (checksum
/// field zero), so that they can be stored with full-width writes. The
/// byte-by-byte construction in a scratch array that is then copied made
/// every wide load of the copy wait for the narrow stores to retire (store
/// forwarding fails): several ns per packet on the transmit hot path.
/// `payload_len` is the number of payload bytes that will follow; it must fit
/// a u16, which `Config`'s 65,000-byte packet limit guarantees.
#[inline]
pub(crate) fn data_header_words(
    common: &CommonHeader,
    header: &DataHeader,
    payload_len: usize,
    pad: u8,
) -> [u64; 7] {
    debug_assert!(payload_len <= u16::MAX as usize, "DATA payload too long");
    let mut flags = 0u64;
    if common.from_client {
        flags |= FLAG_FROM_CLIENT as u64;
    }
    if common.retransmit {
        flags |= FLAG_RETRANSMIT as u64;
    }
    [
        VERSION as u64 | (PacketType::Data as u64) << 8 | flags << 16 | (pad as u64) << 24,
        common.rpc_id,
        common.send_time,
        common.echo_time,
        header.message_length as u64 | (header.offset as u64) << 32,
        header.unsched_bytes as u64
            | (header.cutoff_version as u64) << 32
            | (payload_len as u64 & 0xffff) << 48,
        header.ack,
    ]
}

/// Stores `words` little-endian at `dst` (56 bytes).
///
/// # Safety
/// `dst` must be valid for 56 bytes of writes.
#[inline]
pub(crate) unsafe fn store_header_words(dst: *mut u8, words: &[u64; 7]) {
    for (i, w) in words.iter().enumerate() {
        // SAFETY: inside the 56 bytes the caller vouches for.
        unsafe { std::ptr::write_unaligned(dst.add(8 * i) as *mut u64, w.to_le()) };
    }
}

/// The checksum of a DATA packet given as header words and payload (and the
/// zero padding its header declares), stored into word 0 (bytes 4..8).
pub(crate) fn checksum_header_words(words: &mut [u64; 7], payload: &[u8]) {
    let mut bytes = [0u8; COMMON_HEADER_LEN + DATA_HEADER_LEN];
    // SAFETY: `bytes` has room for 56.
    unsafe { store_header_words(bytes.as_mut_ptr(), words) };
    let pad = bytes[DATA_PAD_AT] as usize;
    let sum = if pad == 0 {
        compute_checksum_split(&bytes, payload)
    } else {
        checksum_finish(crc32c::crc32c_append(
            checksum_raw(&bytes, payload),
            &[0u8; MAX_DATA_PAD][..pad],
        ))
    };
    words[0] |= (sum as u64) << 32;
}

fn encode_inner(
    out: &mut Vec<u8>,
    common: &CommonHeader,
    body: &Body<'_>,
    checksum: bool,
    with_payload: bool,
    pad: u8,
) {
    let start = out.len();
    if let Body::Data { header, payload } = body {
        assert!(
            payload.len() <= u16::MAX as usize,
            "DATA payload too long for one packet"
        );
        let mut words = data_header_words(common, header, payload.len(), pad);
        if checksum {
            checksum_header_words(&mut words, payload);
        }
        let n = COMMON_HEADER_LEN + DATA_HEADER_LEN;
        out.reserve(n + if with_payload { payload.len() } else { 0 });
        // SAFETY: reserved above; the 56 bytes are initialised before the
        // length covers them.
        unsafe {
            store_header_words(out.as_mut_ptr().add(start), &words);
            out.set_len(start + n);
        }
        if with_payload {
            out.extend_from_slice(payload);
            out.resize(out.len() + pad as usize, 0);
        }
        return;
    }
    let ptype = body.packet_type();
    let mut flags = 0;
    if common.from_client {
        flags |= FLAG_FROM_CLIENT;
    }
    if common.retransmit {
        flags |= FLAG_RETRANSMIT;
    }
    // Headers are built in fixed-size arrays and appended at once: one
    // capacity check per packet rather than one per field.
    let mut h = [0u8; COMMON_HEADER_LEN];
    // Byte 3: the id count of an ACK (checked below), 0 for other types.
    let count = match body {
        Body::Ack(ids) => ids.len() as u8,
        _ => 0,
    };
    h[..4].copy_from_slice(&[VERSION, ptype as u8, flags, count]);
    h[8..16].copy_from_slice(&common.rpc_id.to_le_bytes());
    h[16..24].copy_from_slice(&common.send_time.to_le_bytes());
    h[24..32].copy_from_slice(&common.echo_time.to_le_bytes());
    match body {
        Body::Data { .. } => unreachable!("DATA is encoded above"),
        Body::Grant(g) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&g.offset.to_le_bytes());
            out.extend_from_slice(&[g.priority, 0, 0, 0]);
        }
        Body::Resend(r) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&r.offset.to_le_bytes());
            out.extend_from_slice(&r.length.to_le_bytes());
            out.extend_from_slice(&[r.priority, 0, 0, 0]);
        }
        Body::RpcUnknown | Body::Busy | Body::NeedAck => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
        }
        Body::Cutoffs(c) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&c.version.to_le_bytes());
            out.extend_from_slice(&[0, 0]);
            for v in c.cutoffs {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Body::StreamData {
            header,
            ends,
            payload,
        } => {
            assert!(
                payload.len() <= u16::MAX as usize,
                "STREAM_DATA payload too long for one packet"
            );
            assert!(ends.len() <= MAX_STREAM_ENDS, "too many message ends");
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&header.offset.to_le_bytes());
            out.extend_from_slice(&header.rev_credit.to_le_bytes());
            out.extend_from_slice(&header.rev_received.to_le_bytes());
            out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
            let flags = if header.fin { STREAM_FIN } else { 0 };
            out.extend_from_slice(&[flags, ends.len() as u8, 0, 0, 0, 0]);
            for e in ends.iter() {
                out.extend_from_slice(&e.to_le_bytes());
            }
            if with_payload {
                out.extend_from_slice(payload);
            }
            if checksum {
                let sum = if with_payload {
                    compute_checksum(&out[start..])
                } else {
                    compute_checksum_split(&out[start..], payload)
                };
                out[start + CHECKSUM_RANGE.start..start + CHECKSUM_RANGE.end]
                    .copy_from_slice(&sum.to_le_bytes());
            }
            return;
        }
        Body::StreamCredit(c) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&c.credit.to_le_bytes());
            out.extend_from_slice(&c.received.to_le_bytes());
            out.extend_from_slice(&c.resend_end.to_le_bytes());
            let flags = if c.probe { CREDIT_PROBE } else { 0 }
                | if c.fin_received {
                    CREDIT_FIN_RECEIVED
                } else {
                    0
                };
            out.extend_from_slice(&[flags, 0, 0, 0, 0, 0, 0, 0]);
        }
        Body::StreamReset(r) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            out.extend_from_slice(&[*r as u8, 0, 0, 0, 0, 0, 0, 0]);
        }
        Body::Ack(ids) => {
            out.extend_from_slice(&h[..COMMON_HEADER_LEN]);
            assert!(
                ids.len() <= MAX_ACKS_PER_PACKET,
                "too many ACKs for one packet"
            );
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

/// [`compute_checksum`] of `head` followed by `tail`, without joining them.
fn compute_checksum_split(head: &[u8], tail: &[u8]) -> u32 {
    checksum_finish(checksum_raw(head, tail))
}

/// The CRC of `head` (without its checksum field) followed by `tail`.
fn checksum_raw(head: &[u8], tail: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&head[..CHECKSUM_RANGE.start]);
    let crc = crc32c::crc32c_append(crc, &head[CHECKSUM_RANGE.end..]);
    crc32c::crc32c_append(crc, tail)
}

/// A CRC as stored: never 0.
fn checksum_finish(crc: u32) -> u32 {
    if crc == 0 {
        1
    } else {
        crc
    }
}

/// CRC-32C over the whole packet except the checksum field itself. Never 0, so
/// that 0 can mean "no checksum".
fn compute_checksum(packet: &[u8]) -> u32 {
    compute_checksum_split(packet, &[])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn common(from_client: bool, retransmit: bool) -> CommonHeader {
        CommonHeader {
            from_client,
            retransmit,
            rpc_id: 0x0102_0304_0506_0708,
            send_time: 0x1111_2222_3333_4444,
            echo_time: 0x5555_6666_7777_8888,
        }
    }

    fn enc(common: &CommonHeader, body: &Body<'_>, checksum: bool) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&mut out, common, body, checksum);
        out
    }

    const PAYLOAD: &[u8] = b"0123456789abcdef";
    const DATA_HDR: DataHeader = DataHeader {
        message_length: 100,
        offset: 40,
        unsched_bytes: 60,
        cutoff_version: 3,
        ack: 0,
    };
    const GRANT: Grant = Grant {
        offset: 70_000,
        priority: 7,
    };
    const RESEND: Resend = Resend {
        offset: 1416,
        length: 2832,
        priority: 5,
    };
    const CUTOFFS: Cutoffs = Cutoffs {
        version: 9,
        cutoffs: [1, 2, 3, 4, 5, 6, 7, u32::MAX],
    };
    const ACKS: [u64; 3] = [11, 12, u64::MAX];

    /// One valid packet of every type, with its expected encoded length.
    fn samples() -> Vec<(Body<'static>, usize)> {
        vec![
            (
                Body::Data {
                    header: DATA_HDR,
                    payload: PAYLOAD,
                },
                DATA_PACKET_OVERHEAD + PAYLOAD.len(),
            ),
            (Body::Grant(GRANT), 40),
            (Body::Resend(RESEND), 44),
            (Body::RpcUnknown, 32),
            (Body::Busy, 32),
            (Body::Cutoffs(CUTOFFS), 68),
            (Body::NeedAck, 32),
            (Body::Ack(&ACKS), 32 + 24),
        ]
    }

    fn body_type(body: &Body<'_>) -> PacketType {
        body.packet_type()
    }

    /// True when a decoded packet carries exactly what `body` encoded.
    fn same(packet: &Packet<'_>, body: &Body<'_>) -> bool {
        match (packet, body) {
            (
                Packet::Data { header, payload },
                Body::Data {
                    header: h,
                    payload: p,
                },
            ) => header == h && payload == p,
            (Packet::Grant(a), Body::Grant(b)) => a == b,
            (Packet::Resend(a), Body::Resend(b)) => a == b,
            (Packet::Cutoffs(a), Body::Cutoffs(b)) => a == b,
            (Packet::Ack(a), Body::Ack(b)) => a.len() == b.len() && a.iter().eq(b.iter().copied()),
            (Packet::RpcUnknown, Body::RpcUnknown)
            | (Packet::Busy, Body::Busy)
            | (Packet::NeedAck, Body::NeedAck) => true,
            _ => false,
        }
    }

    fn round_trip(common: &CommonHeader, body: &Body<'_>) {
        for checksum in [false, true] {
            let bytes = enc(common, body, checksum);
            let d = decode(&bytes).unwrap_or_else(|e| panic!("{body:?}: {e}"));
            assert_eq!(d.common, *common);
            assert!(same(&d.packet, body), "{:?} vs {body:?}", d.packet);
            assert_eq!(d.packet.packet_type(), body_type(body));
            assert_eq!(bytes[0], VERSION);
            assert_eq!(bytes[1], body_type(body) as u8);
            assert_eq!(u32_at(&bytes, 4) != 0, checksum);
        }
    }

    #[test]
    fn every_type_round_trips_with_every_flag_combination() {
        for (body, len) in samples() {
            assert_eq!(enc(&common(false, false), &body, false).len(), len);
            for fc in [false, true] {
                for rt in [false, true] {
                    round_trip(&common(fc, rt), &body);
                }
            }
        }
    }

    #[test]
    fn data_with_and_without_ack() {
        for ack in [0, 1, 0xdead_beef_cafe_f00d, u64::MAX] {
            let header = DataHeader { ack, ..DATA_HDR };
            round_trip(
                &common(true, false),
                &Body::Data {
                    header,
                    payload: PAYLOAD,
                },
            );
        }
    }

    #[test]
    fn data_extremes() {
        // Whole message in one byte; last byte of a maximal message; empty-unsched.
        let one = DataHeader {
            message_length: 1,
            offset: 0,
            unsched_bytes: 1,
            cutoff_version: 0,
            ack: 0,
        };
        round_trip(
            &common(true, false),
            &Body::Data {
                header: one,
                payload: b"x",
            },
        );
        let last = DataHeader {
            message_length: u32::MAX,
            offset: u32::MAX - 1,
            unsched_bytes: 0,
            cutoff_version: u16::MAX,
            ack: 1,
        };
        round_trip(
            &common(false, true),
            &Body::Data {
                header: last,
                payload: b"z",
            },
        );
    }

    #[test]
    fn ack_with_0_1_and_32_ids() {
        let ids: Vec<u64> = (1..=32).map(|i| i * 0x0101_0101_0101).collect();
        for n in [0, 1, 32] {
            let body = Body::Ack(&ids[..n]);
            assert_eq!(enc(&common(true, false), &body, false).len(), 32 + 8 * n);
            round_trip(&common(true, false), &body);
            let bytes = enc(&common(true, false), &body, false);
            match decode(&bytes).unwrap().packet {
                Packet::Ack(list) => {
                    assert_eq!(list.len(), n);
                    assert_eq!(list.is_empty(), n == 0);
                    assert_eq!(list.iter().collect::<Vec<_>>(), ids[..n]);
                }
                p => panic!("{p:?}"),
            }
        }
    }

    #[test]
    #[should_panic(expected = "too many ACKs")]
    fn encoding_33_acks_is_a_caller_bug() {
        let ids = [1u64; MAX_ACKS_PER_PACKET + 1];
        enc(&common(true, false), &Body::Ack(&ids), false);
    }

    #[test]
    fn encode_appends_after_existing_bytes() {
        let mut out = b"prefix".to_vec();
        encode(&mut out, &common(true, false), &Body::Grant(GRANT), true);
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(
            out[6..],
            enc(&common(true, false), &Body::Grant(GRANT), true)
        );
        assert!(verify_checksum(&out[6..], true));
    }

    /// Pins the byte layout documented in docs/wire-format.md.
    #[test]
    fn golden_layouts() {
        let c = CommonHeader {
            from_client: true,
            retransmit: true,
            rpc_id: 0x0807_0605_0403_0201,
            send_time: 0x1817_1615_1413_1211,
            echo_time: 0x2827_2625_2423_2221,
        };
        let mut header = vec![5, 0, 3, 0, 0, 0, 0, 0];
        header.extend(1..=8u8);
        header.extend(0x11..=0x18u8);
        header.extend(0x21..=0x28u8);
        let with = |ptype: u8, body: &[u8]| {
            let mut v = header.clone();
            v[1] = ptype;
            v.extend_from_slice(body);
            v
        };
        let data = DataHeader {
            message_length: 0x0000_0100,
            offset: 0x0000_00f0,
            unsched_bytes: 0x0000_0080,
            cutoff_version: 0x0201,
            ack: 0x3837_3635_3433_3231,
        };
        #[rustfmt::skip]
        let data_body = [
            0x00, 0x01, 0, 0, 0xf0, 0, 0, 0, 0x80, 0, 0, 0, 0x01, 0x02, 2, 0,
            0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, b'h', b'i',
        ];
        assert_eq!(
            enc(
                &c,
                &Body::Data {
                    header: data,
                    payload: b"hi"
                },
                false
            ),
            with(1, &data_body)
        );
        // The same padded by 3: byte 3 says so, three zeros follow.
        let mut padded = with(1, &data_body);
        padded[3] = 3;
        padded.extend_from_slice(&[0, 0, 0]);
        let mut out = Vec::new();
        encode_padded(
            &mut out,
            &c,
            &Body::Data {
                header: data,
                payload: b"hi",
            },
            false,
            3,
        );
        assert_eq!(out, padded);
        let g = Grant {
            offset: 0x0403_0201,
            priority: 6,
        };
        assert_eq!(
            enc(&c, &Body::Grant(g), false),
            with(2, &[1, 2, 3, 4, 6, 0, 0, 0])
        );
        let r = Resend {
            offset: 0x0403_0201,
            length: 0x0807_0605,
            priority: 2,
        };
        assert_eq!(
            enc(&c, &Body::Resend(r), false),
            with(3, &[1, 2, 3, 4, 5, 6, 7, 8, 2, 0, 0, 0])
        );
        assert_eq!(enc(&c, &Body::RpcUnknown, false), with(4, &[]));
        assert_eq!(enc(&c, &Body::Busy, false), with(5, &[]));
        let cut = Cutoffs {
            version: 0x0201,
            cutoffs: [1, 2, 3, 4, 5, 6, 7, 0x0a0b_0c0d],
        };
        let mut cut_body = vec![1, 2, 0, 0];
        for v in 1..=7u8 {
            cut_body.extend_from_slice(&[v, 0, 0, 0]);
        }
        cut_body.extend_from_slice(&[0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(enc(&c, &Body::Cutoffs(cut), false), with(6, &cut_body));
        assert_eq!(enc(&c, &Body::NeedAck, false), with(7, &[]));
        // ACK: byte 3 is the id count.
        let mut ack = with(8, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 0, 0, 0, 0, 0]);
        ack[3] = 2;
        assert_eq!(enc(&c, &Body::Ack(&[0x0807_0605_0403_0201, 9]), false), ack);
        // STREAM_DATA: offset, reverse credit, reverse received (u64 each),
        // payload length (u16), flags (FIN 2), count of message ends (u8),
        // 4 reserved; then the ends (u32 each), then the payload.
        let sd = StreamDataHeader {
            offset: 0x0807_0605_0403_0201,
            rev_credit: 0x100,
            rev_received: 0x7f,
            fin: true,
        };
        #[rustfmt::skip]
        let sd_body = [
            1, 2, 3, 4, 5, 6, 7, 8,
            0, 1, 0, 0, 0, 0, 0, 0,
            0x7f, 0, 0, 0, 0, 0, 0, 0,
            2, 0, 2, 2, 0, 0, 0, 0,
            1, 0, 0, 0, 2, 0, 0, 0,
            b'h', b'i',
        ];
        let got = enc(
            &c,
            &Body::StreamData {
                header: sd,
                ends: &[1, 2],
                payload: b"hi",
            },
            false,
        );
        assert_eq!(got, with(9, &sd_body));
        // STREAM_CREDIT: credit, received, resend_end (u64 each), flags
        // (PROBE 1, FIN_RECEIVED 2), 7 reserved.
        let sc = StreamCredit {
            credit: 0x0807_0605_0403_0201,
            received: 0x10,
            resend_end: 0x20,
            probe: false,
            fin_received: true,
        };
        #[rustfmt::skip]
        let sc_body = [
            1, 2, 3, 4, 5, 6, 7, 8,
            0x10, 0, 0, 0, 0, 0, 0, 0,
            0x20, 0, 0, 0, 0, 0, 0, 0,
            2, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(enc(&c, &Body::StreamCredit(sc), false), with(10, &sc_body));
        assert_eq!(
            enc(&c, &Body::StreamReset(ResetReason::Stuck), false),
            with(11, &[5, 0, 0, 0, 0, 0, 0, 0])
        );
        // Decoding gives the same fields back.
        match decode(&got).unwrap().packet {
            Packet::StreamData {
                header,
                ends,
                payload,
            } => {
                assert_eq!((header, payload), (sd, &b"hi"[..]));
                assert_eq!(ends.iter().collect::<Vec<_>>(), [1, 2]);
            }
            other => panic!("{other:?}"),
        }
        // DATA: payload_length is a u16 at 46..48, e.g. 0x0201 bytes.
        let long = vec![7u8; 0x0201];
        let bytes = enc(
            &c,
            &Body::Data {
                header: DataHeader { offset: 0, ..data },
                payload: &long,
            },
            false,
        );
        assert_eq!(bytes[46..48], [0x01, 0x02]);
        assert_eq!(bytes.len(), 56 + 0x0201);
        // Flag bits individually.
        let only = |from_client, retransmit| {
            enc(
                &CommonHeader {
                    from_client,
                    retransmit,
                    ..c
                },
                &Body::Busy,
                false,
            )[2]
        };
        assert_eq!(
            (only(false, false), only(true, false), only(false, true)),
            (0, 1, 2)
        );
    }

    #[test]
    fn checksum_is_crc32c_of_everything_but_its_field() {
        let bytes = enc(&common(true, false), &Body::Grant(GRANT), true);
        let mut zeroed = bytes.clone();
        zeroed[4..8].fill(0);
        let mut without = bytes[..4].to_vec();
        without.extend_from_slice(&bytes[8..]);
        assert_eq!(u32_at(&bytes, 4), crc32c::crc32c(&without));
        // The checksummed packet equals the unchecksummed one outside 4..8.
        assert_eq!(
            zeroed,
            enc(&common(true, false), &Body::Grant(GRANT), false)
        );
    }

    #[test]
    fn checksum_good_and_absent() {
        for (body, _) in samples() {
            let good = enc(&common(false, false), &body, true);
            assert!(verify_checksum(&good, true));
            assert!(verify_checksum(&good, false));
            let absent = enc(&common(false, false), &body, false);
            assert_eq!(u32_at(&absent, 4), 0);
            assert!(!verify_checksum(&absent, true));
            assert!(verify_checksum(&absent, false));
        }
    }

    #[test]
    fn checksum_detects_every_single_bit_flip() {
        for (body, _) in samples() {
            let good = enc(&common(true, true), &body, true);
            for i in 0..good.len() {
                for bit in 0..8 {
                    let mut bad = good.clone();
                    bad[i] ^= 1 << bit;
                    assert!(!verify_checksum(&bad, true), "{body:?} byte {i} bit {bit}");
                    // A flip in the checksum field can only zero it if it had a
                    // single bit set; anywhere else the mismatch is always caught.
                    if !(4..8).contains(&i) {
                        assert!(!verify_checksum(&bad, false), "{body:?} byte {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn checksum_detects_corruption_in_header_and_payload() {
        let body = Body::Data {
            header: DATA_HDR,
            payload: PAYLOAD,
        };
        let good = enc(&common(true, false), &body, true);
        let mut hdr = good.clone();
        hdr[9] ^= 0xff; // rpc id
        assert!(
            decode(&hdr).is_ok(),
            "still well-formed, only the checksum catches it"
        );
        assert!(!verify_checksum(&hdr, false));
        let mut pay = good.clone();
        *pay.last_mut().unwrap() = b'!';
        assert!(decode(&pay).is_ok());
        assert!(!verify_checksum(&pay, false));
        // Truncation is caught by the checksum as well as (since version 2,
        // which declares the payload length) by the decoder.
        for len in COMMON_HEADER_LEN..good.len() {
            assert!(!verify_checksum(&good[..len], false), "len {len}");
            assert_eq!(decode(&good[..len]), Err(DecodeError::Truncated(len)));
        }
        // Appending bytes is caught too.
        let mut long = good.clone();
        long.push(0);
        assert!(!verify_checksum(&long, false));
    }

    #[test]
    fn checksum_of_short_datagram_fails() {
        let good = enc(&common(true, false), &Body::Busy, true);
        for len in 0..COMMON_HEADER_LEN {
            assert!(!verify_checksum(&good[..len], false));
            assert!(!verify_checksum(&good[..len], true));
        }
    }

    /// Finds 8 ACK-id bytes that make the packet's CRC-32C exactly 0, by solving
    /// the (affine, over GF(2)) CRC equations, then checks that the encoder
    /// writes 1 instead of 0 (which would read as "absent").
    #[test]
    fn checksum_is_never_zero() {
        let c = common(true, false);
        let crc_of = |id: u64| {
            let bytes = enc(&c, &Body::Ack(&[id]), false);
            let mut v = bytes[..4].to_vec();
            v.extend_from_slice(&bytes[8..]);
            crc32c::crc32c(&v)
        };
        // crc(id) = base ^ sum of columns for each set bit in the low 32 bits.
        let base = crc_of(0);
        let mut rows: Vec<(u32, u32)> = (0..32)
            .map(|b| (crc_of(1 << b) ^ base, 1u32 << b))
            .collect();
        // Gaussian elimination: find a set of bits whose columns xor to `base`.
        let mut target = (base, 0u32);
        for bit in (0..32).rev() {
            let Some(p) = rows.iter().position(|r| r.0 >> bit & 1 == 1) else {
                continue;
            };
            let pivot = rows.swap_remove(p);
            for r in rows.iter_mut() {
                if r.0 >> bit & 1 == 1 {
                    r.0 ^= pivot.0;
                    r.1 ^= pivot.1;
                }
            }
            if target.0 >> bit & 1 == 1 {
                target.0 ^= pivot.0;
                target.1 ^= pivot.1;
            }
        }
        assert_eq!(target.0, 0, "32 consecutive bits always suffice for CRC-32");
        let id = target.1 as u64;
        assert_eq!(crc_of(id), 0);
        let bytes = enc(&c, &Body::Ack(&[id]), true);
        assert_eq!(u32_at(&bytes, 4), 1);
        assert!(verify_checksum(&bytes, true));
    }

    fn valid(body: &Body<'_>) -> Vec<u8> {
        enc(&common(true, false), body, false)
    }

    #[test]
    fn truncation_at_every_length() {
        for (body, len) in samples() {
            let full = valid(&body);
            assert_eq!(full.len(), len);
            for cut in 0..len {
                let got = decode(&full[..cut]);
                if cut < COMMON_HEADER_LEN {
                    assert_eq!(got, Err(DecodeError::Truncated(cut)), "{body:?} at {cut}");
                    continue;
                }
                match body_type(&body) {
                    // Every type is now cut short detectably. For a DATA
                    // payload or an ACK list that was new in version 2: in
                    // version 1 a cut at a whole id, or anywhere in the
                    // payload, left a valid shorter packet that only the
                    // checksum could reveal.
                    PacketType::Data
                    | PacketType::Ack
                    | PacketType::Grant
                    | PacketType::Resend
                    | PacketType::Cutoffs
                    | PacketType::StreamData
                    | PacketType::StreamCredit
                    | PacketType::StreamReset => {
                        assert_eq!(got, Err(DecodeError::Truncated(cut)), "{body:?} at {cut}")
                    }
                    PacketType::RpcUnknown | PacketType::Busy | PacketType::NeedAck => {
                        unreachable!("header-only packets have no partial lengths")
                    }
                }
            }
        }
    }

    /// Every type declares its length, so bytes beyond it are rejected. For
    /// DATA and ACK this is new in version 2 (a longer payload inside the
    /// message, or whole extra ids, used to decode as a different packet).
    #[test]
    fn trailing_bytes() {
        for (body, _) in samples() {
            for extra in [1usize, 7, 8, 100] {
                let mut bytes = valid(&body);
                bytes.extend_from_slice(&vec![0xaa; extra]);
                let t = body_type(&body);
                assert_eq!(
                    decode(&bytes),
                    Err(DecodeError::TrailingBytes(t, extra)),
                    "{t:?}"
                );
            }
        }
    }

    #[test]
    fn bad_version() {
        for (body, _) in samples() {
            // 1..=4: older versions' packets are rejected, not half-understood.
            for v in [0u8, 1, 2, 3, 4, 6, 0x81, 255] {
                let mut bytes = valid(&body);
                bytes[0] = v;
                assert_eq!(decode(&bytes), Err(DecodeError::BadVersion(v)));
            }
        }
    }

    #[test]
    fn unknown_type() {
        let bytes = valid(&Body::Busy);
        for t in [0u8, 12, 13, 0x80, 255] {
            let mut b = bytes.clone();
            b[1] = t;
            assert_eq!(decode(&b), Err(DecodeError::UnknownType(t)));
        }
        for t in PacketType::ALL {
            assert_eq!(PacketType::from_u8(t as u8), Some(t));
            assert_eq!(PacketType::ALL[t.index()], t);
        }
        let names: std::collections::HashSet<_> =
            PacketType::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names.len(), PacketType::ALL.len());
    }

    #[test]
    fn padded_data_round_trips_and_declares_its_length() {
        let payload: Vec<u8> = (0..100u8).collect();
        let h = DataHeader {
            message_length: 100,
            offset: 0,
            unsched_bytes: 100,
            ..DATA_HDR
        };
        let body = Body::Data {
            header: h,
            payload: &payload,
        };
        let c = common(true, false);
        for checksum in [false, true] {
            for pad in [0u8, 1, 42, 255] {
                let mut b = Vec::new();
                encode_padded(&mut b, &c, &body, checksum, pad);
                assert_eq!(b.len(), DATA_PACKET_OVERHEAD + 100 + pad as usize);
                assert!(b[DATA_PACKET_OVERHEAD + 100..].iter().all(|&x| x == 0));
                assert!(verify_checksum(&b, checksum), "pad {pad}");
                let d = decode(&b).unwrap();
                assert!(same(&d.packet, &body), "pad {pad}");
                assert_eq!(packet_len(&b), Some(b.len()));
                // A lone padded datagram is one packet, not a GRO batch.
                assert_eq!(coalesced_segment(&b), b.len());
                // Headers alone, then payload and zeros: the same bytes.
                let mut h2 = Vec::new();
                encode_headers_padded(&mut h2, &c, &body, checksum, pad);
                h2.extend_from_slice(&payload);
                h2.resize(h2.len() + pad as usize, 0);
                assert_eq!(h2, b);
                // One byte more or less than declared is refused.
                assert!(decode(&b[..b.len() - 1]).is_err());
                let mut longer = b.clone();
                longer.push(0);
                assert_eq!(
                    decode(&longer).err(),
                    Some(DecodeError::TrailingBytes(PacketType::Data, 1))
                );
                assert_eq!(d.pad, pad);
                // Padding must be zeros (and the checksum covers it).
                if pad > 0 {
                    let mut bad = b.clone();
                    *bad.last_mut().unwrap() = 1;
                    assert_eq!(decode(&bad).err(), Some(DecodeError::BadFlags(1)));
                    if checksum {
                        assert!(!verify_checksum(&bad, true));
                    }
                }
            }
        }
    }

    #[test]
    fn multi_packet_data_is_recognised() {
        let payload = [7u8; 10];
        let pkt = |message_length| {
            let body = Body::Data {
                header: DataHeader {
                    message_length,
                    offset: 0,
                    unsched_bytes: message_length.min(10),
                    ..DATA_HDR
                },
                payload: &payload,
            };
            valid(&body)
        };
        assert!(is_multi_packet_data(&pkt(11)));
        assert!(is_multi_packet_data(&pkt(100_000)));
        assert!(!is_multi_packet_data(&pkt(10)));
        assert!(!is_multi_packet_data(&valid(&Body::Grant(GRANT))));
        assert!(!is_multi_packet_data(&pkt(11)[..DATA_PACKET_OVERHEAD - 1]));
        assert!(!is_multi_packet_data(&[]));
    }

    #[test]
    fn bad_flags_and_reserved_header_byte() {
        for (body, _) in samples() {
            let good = valid(&body);
            for bit in 2..8 {
                let mut b = good.clone();
                b[2] |= 1 << bit;
                assert_eq!(decode(&b), Err(DecodeError::BadFlags(b[2])));
            }
            if body_type(&body) == PacketType::Ack {
                continue;
            }
            if body_type(&body) == PacketType::Data {
                // Byte 3 is the padding count: padding the datagram does
                // not have is a cut datagram.
                for v in [1u8, 0x80] {
                    let mut b = good.clone();
                    b[3] = v;
                    assert_eq!(decode(&b), Err(DecodeError::Truncated(b.len())));
                }
                continue;
            }
            for v in [1u8, 0x80] {
                let mut b = good.clone();
                b[3] = v;
                assert_eq!(decode(&b), Err(DecodeError::BadFlags(v)));
            }
        }
        // In an ACK, byte 3 is the id count: it must agree with the body (3
        // ids, 24 bytes) and stay within the limit.
        let good = valid(&Body::Ack(&ACKS));
        assert_eq!(good[3], 3);
        let with_count = |n: u8| {
            let mut b = good.clone();
            b[3] = n;
            decode(&b).map(|_| ())
        };
        assert_eq!(
            with_count(0),
            Err(DecodeError::TrailingBytes(PacketType::Ack, 24))
        );
        assert_eq!(
            with_count(2),
            Err(DecodeError::TrailingBytes(PacketType::Ack, 8))
        );
        assert_eq!(with_count(4), Err(DecodeError::Truncated(good.len())));
        assert_eq!(with_count(32), Err(DecodeError::Truncated(good.len())));
        for n in [33u8, 0x80, 255] {
            assert_eq!(with_count(n), Err(DecodeError::BadAckList(n as usize)));
        }
    }

    #[test]
    fn reserved_body_bytes_must_be_zero() {
        // DATA's bytes 14..16 were reserved in version 1; now they are its
        // payload length (see `wrong_payload_length`).
        let cases: [(Body<'static>, &[usize]); 3] = [
            (Body::Grant(GRANT), &[5, 6, 7]),
            (Body::Resend(RESEND), &[9, 10, 11]),
            (Body::Cutoffs(CUTOFFS), &[2, 3]),
        ];
        for (body, offsets) in cases {
            let good = valid(&body);
            for &at in offsets {
                let mut b = good.clone();
                b[COMMON_HEADER_LEN + at] = 0x40;
                assert_eq!(
                    decode(&b),
                    Err(DecodeError::BadFlags(0x40)),
                    "{body:?} +{at}"
                );
            }
        }
    }

    /// A DATA packet's declared payload length must match the datagram's.
    #[test]
    fn wrong_payload_length() {
        let good = valid(&Body::Data {
            header: DATA_HDR,
            payload: PAYLOAD,
        });
        let n = PAYLOAD.len() as u16;
        assert_eq!(u16_at(&good, 46), n);
        let declaring = |declared: u16| {
            let mut b = good.clone();
            b[46..48].copy_from_slice(&declared.to_le_bytes());
            decode(&b).map(|_| ())
        };
        assert!(declaring(n).is_ok());
        for (d, extra) in [(0, 16), (1, 15), (n - 1, 1)] {
            assert_eq!(
                declaring(d),
                Err(DecodeError::TrailingBytes(PacketType::Data, extra)),
                "{d}"
            );
        }
        for d in [n + 1, 0x0100, 0x1000, u16::MAX] {
            assert_eq!(declaring(d), Err(DecodeError::Truncated(good.len())), "{d}");
        }
    }

    #[test]
    fn bad_priority() {
        for p in [7u8, 8, 9, 255] {
            let ok = p < 8;
            let g = decode(&valid(&Body::Grant(Grant {
                priority: p,
                ..GRANT
            })))
            .map(|_| ());
            let r = decode(&valid(&Body::Resend(Resend {
                priority: p,
                ..RESEND
            })))
            .map(|_| ());
            let want = if ok {
                Ok(())
            } else {
                Err(DecodeError::BadPriority(p))
            };
            assert_eq!((g, r), (want, want));
        }
    }

    #[test]
    fn data_out_of_range_and_empty() {
        let data = |header: DataHeader, payload: &[u8]| {
            decode(&valid(&Body::Data { header, payload })).map(|_| ())
        };
        let h = |message_length, offset| DataHeader {
            message_length,
            offset,
            unsched_bytes: 0,
            cutoff_version: 0,
            ack: 0,
        };
        assert_eq!(data(h(10, 0), b"0123456789"), Ok(()));
        assert_eq!(
            data(h(10, 1), b"0123456789"),
            Err(DecodeError::DataOutOfRange {
                offset: 1,
                len: 10,
                message_length: 10
            })
        );
        assert_eq!(
            data(h(0, 0), b"x"),
            Err(DecodeError::DataOutOfRange {
                offset: 0,
                len: 1,
                message_length: 0
            })
        );
        // offset + len overflows u32: must be caught, not wrap.
        assert_eq!(
            data(h(u32::MAX, u32::MAX), b"xy"),
            Err(DecodeError::DataOutOfRange {
                offset: u32::MAX,
                len: 2,
                message_length: u32::MAX
            })
        );
        assert_eq!(data(h(10, 3), b""), Err(DecodeError::EmptyData));
    }

    /// A zero-length message travels as one DATA packet with an empty payload
    /// at offset 0; that is the only empty DATA packet accepted.
    #[test]
    fn zero_length_message() {
        let empty = DataHeader {
            message_length: 0,
            offset: 0,
            unsched_bytes: 0,
            cutoff_version: 1,
            ack: 5,
        };
        for fc in [false, true] {
            round_trip(
                &common(fc, false),
                &Body::Data {
                    header: empty,
                    payload: b"",
                },
            );
        }
        assert_eq!(
            valid(&Body::Data {
                header: empty,
                payload: b""
            })
            .len(),
            DATA_PACKET_OVERHEAD
        );
        let at = |offset| Body::Data {
            header: DataHeader { offset, ..empty },
            payload: b"",
        };
        assert_eq!(decode(&valid(&at(1))), Err(DecodeError::EmptyData));
        let unsched = Body::Data {
            header: DataHeader {
                unsched_bytes: 1,
                ..empty
            },
            payload: b"",
        };
        assert_eq!(decode(&valid(&unsched)), Err(DecodeError::BadUnsched(1, 0)));
        // Any byte after the header is beyond the declared (empty) payload.
        let mut one = valid(&Body::Data {
            header: empty,
            payload: b"",
        });
        one.push(0);
        assert_eq!(
            decode(&one),
            Err(DecodeError::TrailingBytes(PacketType::Data, 1))
        );
        // Declared too: then it lies beyond the message.
        one[46] = 1;
        assert_eq!(
            decode(&one),
            Err(DecodeError::DataOutOfRange {
                offset: 0,
                len: 1,
                message_length: 0
            })
        );
    }

    #[test]
    fn unsched_above_length() {
        let body = |unsched_bytes| Body::Data {
            header: DataHeader {
                unsched_bytes,
                ..DATA_HDR
            },
            payload: PAYLOAD,
        };
        assert!(decode(&valid(&body(100))).is_ok());
        assert_eq!(
            decode(&valid(&body(101))),
            Err(DecodeError::BadUnsched(101, 100))
        );
        assert_eq!(
            decode(&valid(&body(u32::MAX))),
            Err(DecodeError::BadUnsched(u32::MAX, 100))
        );
    }

    #[test]
    fn zero_rpc_id() {
        for (body, _) in samples() {
            let c = CommonHeader {
                rpc_id: 0,
                ..common(true, false)
            };
            assert_eq!(decode(&enc(&c, &body, true)), Err(DecodeError::ZeroRpcId));
        }
    }

    #[test]
    fn ack_list_shape() {
        let ids = [7u64; MAX_ACKS_PER_PACKET];
        let full = valid(&Body::Ack(&ids));
        assert_eq!(full[3] as usize, MAX_ACKS_PER_PACKET);
        // A partial last id: the body is shorter than the 32 declared.
        for extra in 1..8 {
            let mut b = full[..full.len() - 8].to_vec();
            b.extend_from_slice(&vec![0; extra]);
            assert_eq!(decode(&b), Err(DecodeError::Truncated(b.len())));
        }
        // A 33rd id behind a count of 32 is trailing; a count of 33 is over
        // the limit whatever the body.
        let mut too_long = full.clone();
        too_long.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(
            decode(&too_long),
            Err(DecodeError::TrailingBytes(PacketType::Ack, 8))
        );
        too_long[3] = 33;
        assert_eq!(decode(&too_long), Err(DecodeError::BadAckList(33)));
    }

    /// Checks happen in a fixed order (documented): length, version, type,
    /// flags, header byte 3 (reserved, or an ACK's count limit), RPC id, then
    /// per-type rules (length first, then reserved bytes, then values).
    #[test]
    fn error_precedence() {
        let mut b = valid(&Body::Grant(Grant {
            priority: 9,
            ..GRANT
        }));
        b[0] = 1;
        b[1] = 99;
        b[2] = 0xff;
        b[3] = 0x10;
        b[8..16].fill(0);
        b[COMMON_HEADER_LEN + 5] = 0x20;
        b.push(0);
        assert_eq!(decode(&b[..31]), Err(DecodeError::Truncated(31)));
        assert_eq!(decode(&b), Err(DecodeError::BadVersion(1)));
        b[0] = VERSION;
        assert_eq!(decode(&b), Err(DecodeError::UnknownType(99)));
        b[1] = 2;
        assert_eq!(decode(&b), Err(DecodeError::BadFlags(0xff)));
        b[2] = 0;
        assert_eq!(decode(&b), Err(DecodeError::BadFlags(0x10)));
        b[3] = 0;
        assert_eq!(decode(&b), Err(DecodeError::ZeroRpcId));
        b[8] = 1;
        assert_eq!(
            decode(&b),
            Err(DecodeError::TrailingBytes(PacketType::Grant, 1))
        );
        b.pop();
        assert_eq!(decode(&b), Err(DecodeError::BadFlags(0x20)));
        b[COMMON_HEADER_LEN + 5] = 0;
        assert_eq!(decode(&b), Err(DecodeError::BadPriority(9)));

        // ACK: the count limit comes where other types check byte 3 (before
        // the RPC id), the body length after it.
        let mut a = valid(&Body::Ack(&ACKS));
        a[3] = 40;
        a[8..16].fill(0);
        a.push(0);
        assert_eq!(decode(&a), Err(DecodeError::BadAckList(40)));
        a[3] = 3;
        assert_eq!(decode(&a), Err(DecodeError::ZeroRpcId));
        a[8] = 1;
        assert_eq!(
            decode(&a),
            Err(DecodeError::TrailingBytes(PacketType::Ack, 1))
        );

        // DATA: the payload length before the range and unscheduled checks.
        let mut d = valid(&Body::Data {
            header: DataHeader {
                offset: 99,
                unsched_bytes: 1000,
                ..DATA_HDR
            },
            payload: PAYLOAD,
        });
        d.push(0);
        assert_eq!(
            decode(&d),
            Err(DecodeError::TrailingBytes(PacketType::Data, 1))
        );
        d.pop();
        assert!(matches!(
            decode(&d),
            Err(DecodeError::DataOutOfRange { .. })
        ));
        d[36] = 0;
        assert_eq!(decode(&d), Err(DecodeError::BadUnsched(1000, 100)));
    }

    #[test]
    fn errors_display() {
        let all = [
            DecodeError::Truncated(3),
            DecodeError::BadVersion(2),
            DecodeError::UnknownType(9),
            DecodeError::BadFlags(4),
            DecodeError::TrailingBytes(PacketType::Busy, 1),
            DecodeError::DataOutOfRange {
                offset: 1,
                len: 2,
                message_length: 2,
            },
            DecodeError::EmptyData,
            DecodeError::BadUnsched(3, 2),
            DecodeError::BadPriority(8),
            DecodeError::BadAckList(9),
            DecodeError::ZeroRpcId,
        ];
        let texts: std::collections::HashSet<_> = all.iter().map(|e| e.to_string()).collect();
        assert_eq!(texts.len(), all.len());
    }

    #[test]
    fn packet_len_of_every_type() {
        for (body, len) in samples() {
            for checksum in [false, true] {
                let bytes = enc(&common(true, false), &body, checksum);
                assert_eq!(packet_len(&bytes), Some(len), "{body:?}");
                // The header alone says it; for DATA the first 48 bytes.
                let needed = match body_type(&body) {
                    PacketType::Data => PAYLOAD_LEN_AT + 2,
                    PacketType::Ack => ACK_COUNT_AT + 1,
                    _ => 2,
                };
                assert_eq!(packet_len(&bytes[..needed]), Some(len), "{body:?}");
                assert_eq!(packet_len(&bytes[..needed - 1]), None, "{body:?}");
                // Whatever follows it does not matter.
                let mut more = bytes.clone();
                more.extend_from_slice(&[0xee; 100]);
                assert_eq!(packet_len(&more), Some(len));
            }
        }
        let ids = [5u64; MAX_ACKS_PER_PACKET];
        for n in [0, 1, MAX_ACKS_PER_PACKET] {
            assert_eq!(packet_len(&valid(&Body::Ack(&ids[..n]))), Some(32 + 8 * n));
        }
        let big = vec![1u8; 60_000];
        let header = DataHeader {
            message_length: 60_000,
            offset: 0,
            ..DATA_HDR
        };
        let body = Body::Data {
            header,
            payload: &big,
        };
        assert_eq!(packet_len(&valid(&body)), Some(60_056));
        let mut headers = Vec::new();
        encode_headers(&mut headers, &common(true, false), &body, true);
        assert_eq!(packet_len(&headers), Some(60_056));
    }

    #[test]
    fn packet_len_of_garbage() {
        assert_eq!(packet_len(&[]), None);
        assert_eq!(packet_len(&[VERSION]), None);
        let busy = valid(&Body::Busy);
        for v in [0u8, 1, 2, 3, 4, 6, 255] {
            let mut b = busy.clone();
            b[0] = v;
            assert_eq!(packet_len(&b), None);
        }
        for t in [0u8, 12, 255] {
            let mut b = busy.clone();
            b[1] = t;
            assert_eq!(packet_len(&b), None);
        }
        // No validation beyond version and type: an over-long ACK count is
        // still a length (the decoder rejects the packet).
        let mut ack = valid(&Body::Ack(&ACKS));
        ack[3] = 255;
        assert_eq!(packet_len(&ack), Some(32 + 8 * 255));
    }

    /// Packets back to back, as GRO hands them over in one datagram.
    fn coalesce(packets: &[Vec<u8>]) -> Vec<u8> {
        packets.concat()
    }

    #[test]
    fn coalesced_segment_splits_gro_batches() {
        let c = common(false, false);
        let message: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let header = |offset| DataHeader {
            message_length: message.len() as u32,
            offset,
            unsched_bytes: 10_000,
            cutoff_version: 1,
            ack: 0,
        };
        let per = 1416;
        let packets: Vec<Vec<u8>> = (0..message.len())
            .step_by(per)
            .map(|at| {
                let end = (at + per).min(message.len());
                enc(
                    &c,
                    &Body::Data {
                        header: header(at as u32),
                        payload: &message[at..end],
                    },
                    true,
                )
            })
            .collect();
        assert_eq!(packets.len(), 8);
        assert!(packets.last().unwrap().len() < packets[0].len());
        // Every run of consecutive packets ending anywhere (the short one
        // included) splits back into the same packets.
        for first in 0..packets.len() {
            for last in first + 1..=packets.len() {
                let run = &packets[first..last];
                let datagram = coalesce(run);
                let seg = coalesced_segment(&datagram);
                let want = if run.len() == 1 { datagram.len() } else { 1472 };
                assert_eq!(seg, want, "{first}..{last}");
                let cut: Vec<&[u8]> = datagram.chunks(seg).collect();
                assert_eq!(cut.len(), run.len());
                for (got, want) in cut.iter().zip(run) {
                    assert_eq!(got, &want.as_slice());
                    assert!(decode(got).is_ok() && verify_checksum(got, true));
                }
            }
        }
        // ACKs of equal size, and a shorter last one.
        let ids: Vec<u64> = (1..=10).collect();
        let acks = vec![
            valid(&Body::Ack(&ids[..4])),
            valid(&Body::Ack(&ids[4..8])),
            valid(&Body::Ack(&ids[8..])),
        ];
        let datagram = coalesce(&acks);
        assert_eq!(coalesced_segment(&datagram), 64);
        let cut: Vec<&[u8]> = datagram.chunks(64).collect();
        assert_eq!(cut, acks.iter().map(|a| a.as_slice()).collect::<Vec<_>>());
        // Fixed-size control packets.
        let grants = vec![valid(&Body::Grant(GRANT)); 5];
        assert_eq!(coalesced_segment(&coalesce(&grants)), 40);
    }

    #[test]
    fn coalesced_segment_of_single_packets_and_garbage() {
        for (body, len) in samples() {
            assert_eq!(coalesced_segment(&valid(&body)), len);
        }
        assert_eq!(coalesced_segment(&[]), 1);
        assert_eq!(coalesced_segment(&[VERSION]), 1);
        assert_eq!(coalesced_segment(&[0xff; 3]), 3);
        assert_eq!(coalesced_segment(&[0u8; 2000]), 2000);
        // A header that declares more than the datagram holds: not split.
        let mut data = valid(&Body::Data {
            header: DATA_HDR,
            payload: PAYLOAD,
        });
        data[46] = 200;
        assert_eq!(coalesced_segment(&data), data.len());
        // Declaring less: split at the declared length (the pieces then fail
        // to decode on their own), never at 0.
        data[46] = 0;
        assert_eq!(coalesced_segment(&data), DATA_PACKET_OVERHEAD);
        let mut ack = valid(&Body::Ack(&ACKS));
        ack[3] = 0;
        assert_eq!(coalesced_segment(&ack), COMMON_HEADER_LEN);
    }
}
