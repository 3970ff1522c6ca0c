//! The encoding of one gRPC call in one Homa request and its response
//! (docs/grpc.md, "Encoding"): what the bytes are, and nothing else.
//! Decoding never panics: every length is checked against what is there.

use bytes::{BufMut, Bytes};
use http::{HeaderMap, HeaderName, HeaderValue};

/// First byte of a request: the encoding's version.
pub const REQUEST_V1: u8 = 0x01;
/// First byte of a response.
pub const RESPONSE_V1: u8 = 0x81;
/// First byte of a cancel notice: the client abandoned the unary call
/// whose Homa RPC id follows (8 bytes, little-endian), as gRPC's
/// `RST_STREAM` tells an HTTP/2 server.
pub const CANCEL_V1: u8 = 0x02;
/// A cancel notice's length: the version byte and the id.
pub const CANCEL_LEN: usize = 9;

/// Encodes a cancel notice for the client's RPC `id`.
pub fn encode_cancel(id: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(CANCEL_LEN);
    out.push(CANCEL_V1);
    out.extend_from_slice(&id.to_le_bytes());
    out
}

/// The RPC id of a cancel notice; `None` for any other message (a
/// request, or a notice of the wrong length).
pub fn decode_cancel(msg: &[u8]) -> Option<u64> {
    match msg {
        [CANCEL_V1, id @ ..] => Some(u64::from_le_bytes(id.try_into().ok()?)),
        _ => None,
    }
}

/// The content type every gRPC message carries; left out of the encoding
/// and put back on the other side when absent.
pub const GRPC_CONTENT_TYPE: &str = "application/grpc";

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed gRPC-over-Homa message: {}", self.0)
    }
}

impl std::error::Error for Malformed {}

/// A decoded request: the method path, the headers (metadata) and the
/// gRPC-framed body (a slice of the received message, not a copy).
#[derive(Debug)]
pub struct DecodedRequest {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A decoded response: HTTP status, headers, gRPC-framed body, trailers.
#[derive(Debug)]
pub struct DecodedResponse {
    pub status: http::StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

/// Headers that the encoding leaves out: `te: trailers` (an HTTP/2 matter)
/// and the standard content type (restored by the decoder).
fn skipped(name: &HeaderName, value: &HeaderValue) -> bool {
    name == http::header::TE
        || (name == http::header::CONTENT_TYPE && value.as_bytes() == GRPC_CONTENT_TYPE.as_bytes())
}

fn headers_len(h: &HeaderMap) -> (usize, usize) {
    let mut count = 0;
    let mut bytes = 0;
    for (n, v) in h.iter() {
        if skipped(n, v) {
            continue;
        }
        count += 1;
        bytes += varint_len(n.as_str().len() as u64)
            + n.as_str().len()
            + varint_len(v.len() as u64)
            + v.len();
    }
    (count, bytes)
}

fn put_headers(out: &mut Vec<u8>, h: &HeaderMap) {
    for (n, v) in h.iter() {
        if skipped(n, v) {
            continue;
        }
        put_varint(out, n.as_str().len() as u64);
        out.extend_from_slice(n.as_str().as_bytes());
        put_varint(out, v.len() as u64);
        out.extend_from_slice(v.as_bytes());
    }
}

/// Encodes a request: version, path, headers, then the body.
pub fn encode_request(path: &str, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    let (count, hbytes) = headers_len(headers);
    let mut out = Vec::with_capacity(1 + 10 + path.len() + 5 + hbytes + body.len());
    out.push(REQUEST_V1);
    put_varint(&mut out, path.len() as u64);
    out.extend_from_slice(path.as_bytes());
    put_varint(&mut out, count as u64);
    put_headers(&mut out, headers);
    out.extend_from_slice(body);
    out
}

/// Encodes a response: version, HTTP status, headers, trailers (a count of
/// zero and no trailers are the same: a trailers-only response carries its
/// grpc-status in the headers), then the body.
pub fn encode_response(
    status: http::StatusCode,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    body: &[u8],
) -> Vec<u8> {
    let (hc, hb) = headers_len(headers);
    let (tc, tb) = trailers.map_or((0, 0), headers_len);
    let mut out = Vec::with_capacity(1 + 3 + 10 + hb + tb + body.len());
    out.push(RESPONSE_V1);
    put_varint(&mut out, u64::from(status.as_u16()));
    put_varint(&mut out, hc as u64);
    put_headers(&mut out, headers);
    put_varint(&mut out, tc as u64);
    if let Some(t) = trailers {
        put_headers(&mut out, t);
    }
    out.put_slice(body);
    out
}

/// A reader over the front of a message.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, Malformed> {
        let b = *self.buf.get(self.pos).ok_or(Malformed("truncated"))?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed("varint too long"))
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], Malformed> {
        let len = self.varint()?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| self.pos.checked_add(l))
            .filter(|e| *e <= self.buf.len())
            .ok_or(Malformed(what))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn headers(&mut self) -> Result<HeaderMap, Malformed> {
        let count = self.varint()?;
        // Each header takes at least two bytes: a count beyond that is a lie.
        if count > (self.buf.len() - self.pos) as u64 / 2 {
            return Err(Malformed("header count"));
        }
        let mut h = HeaderMap::with_capacity(count as usize + 1);
        for _ in 0..count {
            let name = HeaderName::from_bytes(self.bytes("header name")?)
                .map_err(|_| Malformed("invalid header name"))?;
            let value = HeaderValue::from_bytes(self.bytes("header value")?)
                .map_err(|_| Malformed("invalid header value"))?;
            h.append(name, value);
        }
        Ok(h)
    }
}

/// Decodes a request; the body is a slice of `msg`.
pub fn decode_request(msg: Bytes) -> Result<DecodedRequest, Malformed> {
    let mut r = Reader { buf: &msg, pos: 0 };
    if r.byte()? != REQUEST_V1 {
        return Err(Malformed("not a version 1 request"));
    }
    let path = std::str::from_utf8(r.bytes("path")?)
        .map_err(|_| Malformed("path is not UTF-8"))?
        .to_owned();
    if !path.starts_with('/') {
        return Err(Malformed("path does not start with '/'"));
    }
    let mut headers = r.headers()?;
    let pos = r.pos;
    headers
        .entry(http::header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static(GRPC_CONTENT_TYPE));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    Ok(DecodedRequest {
        path,
        headers,
        body: msg.slice(pos..),
    })
}

/// Decodes a response; the body is a slice of `msg`.
pub fn decode_response(msg: Bytes) -> Result<DecodedResponse, Malformed> {
    let mut r = Reader { buf: &msg, pos: 0 };
    if r.byte()? != RESPONSE_V1 {
        return Err(Malformed("not a version 1 response"));
    }
    let status = u16::try_from(r.varint()?)
        .ok()
        .and_then(|s| http::StatusCode::from_u16(s).ok())
        .ok_or(Malformed("HTTP status"))?;
    let mut headers = r.headers()?;
    let trailers = r.headers()?;
    let pos = r.pos;
    headers
        .entry(http::header::CONTENT_TYPE)
        .or_insert(HeaderValue::from_static(GRPC_CONTENT_TYPE));
    Ok(DecodedResponse {
        status,
        headers,
        body: msg.slice(pos..),
        trailers: (!trailers.is_empty()).then_some(trailers),
    })
}

/// On a stream (a streaming call, docs/grpc.md §4): a message of gRPC-framed
/// data follows this byte.
pub const STREAM_DATA: u8 = 0x02;
/// On a stream: the trailers (a header list) follow this byte.
pub const STREAM_TRAILERS: u8 = 0x03;

/// A stream message of data: the tag, then the bytes.
pub fn encode_stream_data(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + data.len());
    out.push(STREAM_DATA);
    out.extend_from_slice(data);
    out
}

/// A stream message of trailers: the tag, then the header list.
pub fn encode_stream_trailers(trailers: &HeaderMap) -> Vec<u8> {
    let (count, bytes) = headers_len(trailers);
    let mut out = Vec::with_capacity(1 + 5 + bytes);
    out.push(STREAM_TRAILERS);
    put_varint(&mut out, count as u64);
    put_headers(&mut out, trailers);
    out
}

/// Decodes the trailers of a `STREAM_TRAILERS` message.
pub fn decode_stream_trailers(msg: &[u8]) -> Result<HeaderMap, Malformed> {
    let mut r = Reader { buf: msg, pos: 0 };
    if r.byte()? != STREAM_TRAILERS {
        return Err(Malformed("not a trailers message"));
    }
    let h = r.headers()?;
    if r.pos != msg.len() {
        return Err(Malformed("bytes after the trailers"));
    }
    Ok(h)
}

/// The `grpc-timeout` header as a duration (`<up to 8 digits><unit>`,
/// units H M S m u n); None when absent or malformed.
pub fn grpc_timeout(headers: &HeaderMap) -> Option<std::time::Duration> {
    use std::time::Duration;
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_notices_round_trip_and_nothing_else_is_one() {
        for id in [0, 1, u64::MAX, 0x0102_0304_0506_0708] {
            assert_eq!(decode_cancel(&encode_cancel(id)), Some(id));
        }
        let mut short = encode_cancel(7);
        short.pop();
        assert_eq!(decode_cancel(&short), None);
        let mut long = encode_cancel(7);
        long.push(0);
        assert_eq!(decode_cancel(&long), None);
        assert_eq!(decode_cancel(&[]), None);
        let req = encode_request("/a.B/C", &HeaderMap::new(), b"x");
        assert_eq!(decode_cancel(&req), None);
    }

    #[test]
    fn request_round_trip() {
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static(GRPC_CONTENT_TYPE));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.append("x-a", HeaderValue::from_static("1"));
        h.append("x-a", HeaderValue::from_static("2"));
        h.insert("grpc-timeout", HeaderValue::from_static("250m"));
        let enc = encode_request("/p.S/M", &h, b"\0\0\0\0\x01z");
        let d = decode_request(Bytes::from(enc)).unwrap();
        assert_eq!(d.path, "/p.S/M");
        assert_eq!(d.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(d.headers["content-type"], GRPC_CONTENT_TYPE);
        assert_eq!(d.headers["te"], "trailers");
        assert_eq!(&d.body[..], b"\0\0\0\0\x01z");
        assert_eq!(
            grpc_timeout(&d.headers),
            Some(std::time::Duration::from_millis(250))
        );
    }

    #[test]
    fn response_round_trip() {
        let h = HeaderMap::new();
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let enc = encode_response(http::StatusCode::OK, &h, Some(&t), b"body");
        let d = decode_response(Bytes::from(enc)).unwrap();
        assert_eq!(d.status, http::StatusCode::OK);
        assert_eq!(d.trailers.unwrap()["grpc-status"], "0");
        assert_eq!(&d.body[..], b"body");
    }

    #[test]
    fn stream_trailers_round_trip() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("5"));
        t.insert("grpc-message", HeaderValue::from_static("gone"));
        let d = decode_stream_trailers(&encode_stream_trailers(&t)).unwrap();
        assert_eq!(d, t);
        assert!(decode_stream_trailers(b"\x03\x05").is_err());
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        let enc = encode_request("/p.S/M", &HeaderMap::new(), b"xyz");
        for cut in 0..enc.len() {
            let _ = decode_request(Bytes::copy_from_slice(&enc[..cut]));
        }
        let mut seed = 0x1234_5678u32;
        for len in 0..200 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 24) as u8
                })
                .collect();
            let _ = decode_request(Bytes::from(junk.clone()));
            let _ = decode_response(Bytes::from(junk));
        }
        assert!(decode_request(Bytes::from_static(b"\x01\xff\xff\xff\xff\xff")).is_err());
        assert!(decode_request(Bytes::from_static(b"\x01\x01x\x00")).is_err());
    }
}
