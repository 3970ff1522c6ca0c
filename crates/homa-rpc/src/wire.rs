//! The framework's headers: a 12-byte request header in front of every
//! request body and a 4-byte (plus message) response header in front of
//! every response body. Layout in docs/rpc.md. Decoding is of untrusted
//! bytes: it returns errors, never panics.

use crate::status::{Code, Status};

/// The request header's version byte.
pub const VERSION: u8 = 1;
/// Length of this version's request header; a longer declared length is
/// accepted (later fields skipped), a shorter one refused.
pub const REQUEST_HEADER_LEN: usize = 12;
/// Length of the response header without its message.
pub const RESPONSE_HEADER_LEN: usize = 4;

/// Request flag: this request is a cancel notice for the caller's earlier
/// RPC whose id (u64, little-endian) is the body.
pub const FLAG_CANCEL: u8 = 0x01;
/// Every flag this version knows; others are refused.
pub const KNOWN_FLAGS: u8 = FLAG_CANCEL;

/// A request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub method: u32,
    /// Remaining budget in microseconds when the request left (0: none).
    /// Relative, so client and server clocks need not agree.
    pub budget_us: u32,
    pub flags: u8,
    /// Where the body starts (the declared header length).
    pub body_offset: u16,
}

impl RequestHeader {
    pub fn new(method: u32, budget_us: u32, flags: u8) -> RequestHeader {
        RequestHeader {
            method,
            budget_us,
            flags,
            body_offset: REQUEST_HEADER_LEN as u16,
        }
    }

    /// The header's bytes (this version's 12, whatever `body_offset` says).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut b = [0u8; REQUEST_HEADER_LEN];
        b[0] = VERSION;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&(REQUEST_HEADER_LEN as u16).to_le_bytes());
        b[4..8].copy_from_slice(&self.method.to_le_bytes());
        b[8..12].copy_from_slice(&self.budget_us.to_le_bytes());
        b
    }

    /// Decodes the header at the start of `b` (`total_len`: the whole
    /// message's length, which may exceed `b`'s when only a prefix was
    /// copied out).
    pub fn decode(b: &[u8], total_len: usize) -> Result<RequestHeader, Status> {
        if b.len() < REQUEST_HEADER_LEN {
            return Err(Status::invalid_argument("request shorter than its header"));
        }
        if b[0] != VERSION {
            return Err(Status::invalid_argument("unknown request header version"));
        }
        let flags = b[1];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(Status::invalid_argument("unknown request flags"));
        }
        let hlen = u16::from_le_bytes([b[2], b[3]]);
        if (hlen as usize) < REQUEST_HEADER_LEN || hlen as usize > total_len {
            return Err(Status::invalid_argument("bad request header length"));
        }
        Ok(RequestHeader {
            method: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            budget_us: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            flags,
            body_offset: hlen,
        })
    }
}

/// Writes an OK response header into `out` (which then gets the body).
pub fn put_ok_header(out: &mut Vec<u8>) {
    out.extend_from_slice(&[Code::Ok as u8, 0, 0, 0]);
}

/// A whole error response: header and message (cut at 65,535 bytes, on a
/// character boundary).
pub fn error_response(s: &Status) -> Vec<u8> {
    let mut m = s.message();
    if m.len() > u16::MAX as usize {
        let mut end = u16::MAX as usize;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m = &m[..end];
    }
    let mut out = Vec::with_capacity(RESPONSE_HEADER_LEN + m.len());
    out.push(s.code() as u8);
    out.push(0);
    out.extend_from_slice(&(m.len() as u16).to_le_bytes());
    out.extend_from_slice(m.as_bytes());
    out
}

/// Decodes a response's header from its first bytes `b` (of `total_len`):
/// `Ok(body_offset)` for an OK response, the status otherwise. A response
/// that does not parse is `Internal`.
pub fn decode_response(b: &[u8], total_len: usize) -> Result<usize, Status> {
    if b.len() < RESPONSE_HEADER_LEN {
        return Err(Status::internal("response shorter than its header"));
    }
    let mlen = u16::from_le_bytes([b[2], b[3]]) as usize;
    let body = RESPONSE_HEADER_LEN + mlen;
    if body > total_len {
        return Err(Status::internal("response message overruns the response"));
    }
    let code = Code::from_u8(b[0]);
    if code == Code::Ok {
        return Ok(body);
    }
    let text = b
        .get(RESPONSE_HEADER_LEN..body)
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .unwrap_or_default();
    Err(Status::new(code, text))
}

/// FNV-1a, 32 bits: the method id of `"service/method"`, computed at
/// compile time by [`crate::service!`]. Stable across builds and versions.
pub const fn method_id(name: &str) -> u32 {
    let b = name.as_bytes();
    let mut h: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u32;
        h = h.wrapping_mul(0x0100_0193);
        i += 1;
    }
    h
}

/// Whether all ids differ (a service's methods are checked at compile time).
pub const fn all_distinct(ids: &[u32]) -> bool {
    let mut i = 0;
    while i < ids.len() {
        let mut j = i + 1;
        while j < ids.len() {
            if ids[i] == ids[j] {
                return false;
            }
            j += 1;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_round_trips() {
        let h = RequestHeader::new(0xdead_beef, 1234, FLAG_CANCEL);
        let b = h.encode();
        assert_eq!(RequestHeader::decode(&b, 12), Ok(h));
        assert_eq!(b[..4], [1, 1, 12, 0]);
    }

    #[test]
    fn bad_request_headers_are_invalid_argument() {
        let good = RequestHeader::new(7, 0, 0).encode();
        let cases: Vec<(Vec<u8>, usize)> = vec![
            (vec![], 0),
            (good[..11].to_vec(), 11),
            (
                {
                    let mut b = good;
                    b[0] = 2;
                    b.to_vec()
                },
                12,
            ),
            (
                {
                    let mut b = good;
                    b[1] = 0x80;
                    b.to_vec()
                },
                12,
            ),
            (
                {
                    let mut b = good;
                    b[2] = 11;
                    b.to_vec()
                },
                12,
            ),
            (
                {
                    let mut b = good;
                    b[2] = 13;
                    b.to_vec()
                },
                12,
            ),
        ];
        for (b, len) in cases {
            let e = RequestHeader::decode(&b, len).unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{b:?}");
        }
        // A longer header (a later version's fields) is skipped.
        let mut long = good.to_vec();
        long[2] = 16;
        long.extend_from_slice(&[9; 4]);
        assert_eq!(RequestHeader::decode(&long, 16).unwrap().body_offset, 16);
    }

    #[test]
    fn responses_round_trip() {
        let mut ok = Vec::new();
        put_ok_header(&mut ok);
        ok.extend_from_slice(b"body");
        assert_eq!(decode_response(&ok, ok.len()), Ok(4));
        let e = error_response(&Status::not_found("no such key"));
        assert_eq!(
            decode_response(&e, e.len()),
            Err(Status::not_found("no such key"))
        );
        assert_eq!(
            decode_response(&e[..3], 3).unwrap_err().code(),
            Code::Internal
        );
        assert_eq!(
            decode_response(&e[..6], 6).unwrap_err().code(),
            Code::Internal
        );
        let long = "é".repeat(40_000);
        let e = error_response(&Status::internal(long));
        let s = decode_response(&e, e.len()).unwrap_err();
        assert!(s.message().len() <= u16::MAX as usize && s.message().starts_with('é'));
    }

    #[test]
    fn method_ids_are_fnv1a() {
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_eq!(method_id("a"), 0xe40c_292c);
        assert!(all_distinct(&[1, 2, 3]) && !all_distinct(&[1, 2, 1]));
    }
}
