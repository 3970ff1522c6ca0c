//! Payloads of every benchmark: slices of one buffer of random bytes, so a
//! response holding the wrong bytes, or another RPC's bytes, does not
//! compare equal, and making a request copies nothing.

use bytes::Bytes;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The source of every payload: a buffer of random bytes.
#[derive(Clone)]
pub struct Payloads {
    bytes: Bytes,
}

/// Offsets into the payloads vary over this range.
const SLACK: usize = 1 << 16;

impl Payloads {
    /// Payloads for messages of up to `max_len` bytes.
    pub fn new(max_len: usize) -> Payloads {
        let mut v = vec![0u8; max_len + SLACK + 8];
        ChaCha8Rng::seed_from_u64(0x5eed_1e55).fill_bytes(&mut v);
        Payloads { bytes: v.into() }
    }
    /// The payload of RPC `seq` of length `len` (a zero-copy slice).
    pub fn payload(&self, seq: u64, len: usize) -> Bytes {
        let off = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % SLACK;
        self.bytes.slice(off..off + len)
    }
    /// Whether `data` is the payload of RPC `seq`.
    pub fn matches(&self, seq: u64, data: &[u8]) -> bool {
        data.len() <= self.max_len() && *data == *self.payload(seq, data.len())
    }
    pub fn max_len(&self) -> usize {
        self.bytes.len() - SLACK - 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_slices_differ_by_seq() {
        let p = Payloads::new(1000);
        assert_eq!(p.payload(1, 1000).len(), 1000);
        assert_eq!(p.payload(7, 100), p.payload(7, 100));
        assert_ne!(p.payload(7, 100), p.payload(8, 100));
        assert!(p.max_len() >= 1000);
    }

    #[test]
    fn corruption_is_caught() {
        let p = Payloads::new(5000);
        let mut v = p.payload(3, 5000).to_vec();
        assert!(p.matches(3, &v));
        assert!(!p.matches(4, &v));
        v[4321] ^= 1;
        assert!(!p.matches(3, &v));
        assert!(!p.matches(3, &vec![0u8; 6000]));
    }
}
