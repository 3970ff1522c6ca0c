//! The store's three services (coordinator, master, backup), the types
//! they exchange, and the wire layout of the two hot calls (read and
//! write), which travel as `Raw` bodies so that values are not re-encoded.

use bytes::{Buf, BufMut, Bytes};
use homa_rpc::{Raw, Status};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// The Homa message limit (`homa_proto::Config::max_message_length`'s
/// default): no request or response may be longer.
pub const MAX_MESSAGE: usize = 1_000_000;
/// The longest key.
pub const MAX_KEY: usize = 256;
/// The longest value: the message limit less 1 KiB for the RPC header,
/// the key and the replication record around it (so that the write, its
/// replication to a backup and the read all fit in one message).
pub const MAX_VALUE: usize = MAX_MESSAGE - 1024;

/// A log record: one write or delete of one key, as a master appends it
/// to its log and replicates it to its backups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The master incarnation that wrote it (the coordinator's epoch).
    pub epoch: u64,
    /// Position in that incarnation's log (0, 1, 2...).
    pub seq: u64,
    /// The object's version after this write (unique per master, growing).
    pub version: u64,
    pub key: Bytes,
    /// `None`: a delete (tombstone).
    pub value: Option<Bytes>,
    /// The client's id of the write (0: none): a retry of a write that
    /// was applied is answered with this entry's version, not applied
    /// again.
    pub write_id: u128,
}

impl Entry {
    /// Bytes it takes in a message, roughly (for chunking).
    pub fn wire_len(&self) -> usize {
        56 + self.key.len() + self.value.as_ref().map_or(0, |v| v.len())
    }
}

/// Replication: entries of master `slot`'s incarnation `epoch`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Append {
    pub slot: u32,
    pub epoch: u64,
    pub entries: Vec<Entry>,
}

/// Recovery: a page of what a backup holds for `slot`, after `after`.
/// Raises the backup's fence for `slot` to `epoch`: appends of older
/// incarnations are refused from then on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fetch {
    pub slot: u32,
    pub epoch: u64,
    /// (epoch, seq) of the last entry of the previous page.
    pub after: Option<(u64, u64)>,
    pub max_bytes: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fetched {
    pub entries: Vec<Entry>,
    pub more: bool,
}

/// After a recovered master has replicated its new log: drop `slot`'s
/// entries of incarnations before `epoch`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DropOlder {
    pub slot: u32,
    pub epoch: u64,
}

/// What a backup holds (for tests and `kv cli stats`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackupStats {
    /// (slot, entries, bytes) per master.
    pub slots: Vec<(u32, u64, u64)>,
}

/// A master asks for its slot and incarnation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EnlistMaster {
    /// The slot to take over (a restart or a replacement); `None`: the
    /// first slot that never had a master.
    pub slot: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Grant {
    pub slot: u32,
    pub epoch: u64,
    /// How many slots the key space is cut into.
    pub slots: u32,
}

/// A master has recovered and serves `slot` at `addr`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ready {
    pub slot: u32,
    pub epoch: u64,
    pub addr: SocketAddr,
}

/// The coordinator's table: who serves each slot (None: nobody yet, or a
/// master recovering), and the live backups.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Table {
    /// Grows with every change.
    pub version: u64,
    pub masters: Vec<Option<SocketAddr>>,
    pub backups: Vec<SocketAddr>,
}

/// A master's read of one object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Versioned {
    pub version: u64,
    pub value: Bytes,
}

homa_rpc::service! {
    /// The coordinator: slots, master incarnations, live backups.
    pub mod coord {
        inline fn enlist_backup(SocketAddr) -> ();
        inline fn enlist_master(EnlistMaster) -> Grant;
        inline fn master_ready(Ready) -> ();
        inline fn table(()) -> Table;
        /// A master could not reach this backup: the coordinator checks
        /// (a ping) and drops it from the table if it does not answer.
        pool fn suspect(SocketAddr) -> bool;
    }
}

homa_rpc::service! {
    /// A master: serves one slot of the key space.
    pub mod master {
        /// Body: the key. Response: `version` (u64 LE), then the value.
        /// `NotFound` when there is no such object.
        inline fn read(Raw) -> Raw;
        /// Body: see [`WriteReq`]. Response: the new version.
        inline fn write(Raw) -> u64;
        /// Several keys at once (all of this master's slot).
        inline fn multi_read(Vec<Bytes>) -> Vec<Option<Versioned>>;
    }
}

homa_rpc::service! {
    /// A backup: holds replicas of masters' logs.
    pub mod backup {
        inline fn append(Append) -> ();
        inline fn fetch(Fetch) -> Fetched;
        inline fn drop_older(DropOlder) -> ();
        inline fn ping(()) -> ();
        inline fn stats(()) -> BackupStats;
    }
}

/// Write flags.
pub const W_CONDITIONAL: u8 = 1;
pub const W_DELETE: u8 = 2;

/// A write request (`master/write`'s raw body): flags (u8), write id
/// (u128 LE, unique per client write, the same on every retry; 0: none),
/// expected version (u64 LE; with [`W_CONDITIONAL`], 0 = must not exist),
/// key length (u16 LE), key, value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteReq {
    pub flags: u8,
    pub id: u128,
    pub expected: u64,
    pub key: Bytes,
    pub value: Bytes,
}

const WRITE_HEADER: usize = 27;

impl WriteReq {
    pub fn encode(&self) -> Bytes {
        let mut b = Vec::with_capacity(WRITE_HEADER + self.key.len() + self.value.len());
        b.put_u8(self.flags);
        b.put_u128_le(self.id);
        b.put_u64_le(self.expected);
        b.put_u16_le(self.key.len() as u16);
        b.extend_from_slice(&self.key);
        b.extend_from_slice(&self.value);
        Bytes::from(b)
    }

    /// Decodes a received body, copying the key and value out of the
    /// receive pool (the log keeps them; pool pages must go back).
    pub fn decode(m: homa::Message) -> Result<WriteReq, Status> {
        let bad = || Status::invalid_argument("malformed write");
        let mut h = [0u8; WRITE_HEADER];
        if m.copy_to(0, &mut h) != WRITE_HEADER {
            return Err(bad());
        }
        let mut hb = &h[..];
        let flags = hb.get_u8();
        let id = hb.get_u128_le();
        let expected = hb.get_u64_le();
        let klen = hb.get_u16_le() as usize;
        if m.len() < WRITE_HEADER + klen {
            return Err(bad());
        }
        let all = m.contiguous();
        let key = Bytes::copy_from_slice(&all[WRITE_HEADER..WRITE_HEADER + klen]);
        let value = Bytes::copy_from_slice(&all[WRITE_HEADER + klen..]);
        Ok(WriteReq {
            flags,
            id,
            expected,
            key,
            value,
        })
    }
}

/// A read response's body: version, then value.
pub fn encode_read_reply(version: u64, value: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(8 + value.len());
    b.put_u64_le(version);
    b.extend_from_slice(value);
    Bytes::from(b)
}

/// Decodes a read response (the value stays shared with the message when
/// it lies in one fragment).
pub fn decode_read_reply(mut m: homa::Message) -> Result<Versioned, Status> {
    if m.len() < 8 {
        return Err(Status::internal("short read response"));
    }
    let version = m.get_u64_le();
    let value = m.copy_to_bytes(m.remaining());
    Ok(Versioned { version, value })
}

/// FNV-1a of a key: where it lives (client and master must agree, so it
/// is spelled out rather than taken from std's unstable hasher).
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The slot of a key among `slots`: slot i owns the i-th of `slots` equal
/// ranges of the 64-bit hash space (RAMCloud's tablets, by hash).
pub fn slot_of(key: &[u8], slots: u32) -> u32 {
    ((key_hash(key) as u128 * slots.max(1) as u128) >> 64) as u32
}

/// Refusal messages the client recognises (with their codes).
pub const NOT_OWNER: &str = "not the owner of this key";
pub const VERSION_MISMATCH: &str = "version mismatch, current ";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_the_hash_space_in_order() {
        assert_eq!(slot_of(b"anything", 1), 0);
        let mut seen = [0u32; 4];
        for i in 0..4000 {
            let s = slot_of(format!("k{i}").as_bytes(), 4);
            seen[s as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 700), "{seen:?}");
        // Ranges: a larger hash never lands in a smaller slot.
        let mut ks: Vec<String> = (0..500).map(|i| format!("r{i}")).collect();
        ks.sort_by_key(|k| key_hash(k.as_bytes()));
        let slots: Vec<u32> = ks.iter().map(|k| slot_of(k.as_bytes(), 7)).collect();
        assert!(slots.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!((slots[0], slots[499]), (0, 6));
    }

    #[test]
    fn limits_fit_the_homa_message() {
        let cfg = homa::EndpointConfig::default();
        assert_eq!(cfg.engine.max_message_length as usize, MAX_MESSAGE);
        // A replication record of the largest value and key fits.
        let e = Entry {
            epoch: u64::MAX,
            seq: u64::MAX,
            version: u64::MAX,
            key: Bytes::from(vec![1; MAX_KEY]),
            value: Some(Bytes::from(vec![2; MAX_VALUE])),
            write_id: u128::MAX,
        };
        let a = Append {
            slot: u32::MAX,
            epoch: u64::MAX,
            entries: vec![e],
        };
        let n = postcard::to_stdvec(&a).unwrap().len();
        assert!(n + homa_rpc::wire::REQUEST_HEADER_LEN <= MAX_MESSAGE, "{n}");
    }
}
