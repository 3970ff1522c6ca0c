//! Code shared by the fuzz target and its tests, so that `cargo test` runs
//! the committed seeds through exactly what the fuzzer runs.

use homa_rpc::wire::{
    decode_response, error_response, RequestHeader, FLAG_CANCEL, KNOWN_FLAGS, REQUEST_HEADER_LEN,
    RESPONSE_HEADER_LEN,
};
use homa_rpc::{Code, Status};

/// The checks on one input: the bytes as a request (whole, and as a
/// copied 12-byte prefix of a longer message, as the server decodes it)
/// and as a response.
pub fn check_header(data: &[u8]) {
    let whole = RequestHeader::decode(data, data.len());
    let prefix = &data[..data.len().min(REQUEST_HEADER_LEN)];
    let copied = RequestHeader::decode(prefix, data.len());
    assert_eq!(whole, copied, "a prefix decodes as the whole does");
    match whole {
        Ok(h) => {
            assert!(h.flags & !KNOWN_FLAGS == 0);
            let off = h.body_offset as usize;
            assert!((REQUEST_HEADER_LEN..=data.len()).contains(&off));
            // The fields re-encode to the same bytes (length aside).
            let again = RequestHeader::new(h.method, h.budget_us, h.flags).encode();
            assert_eq!(again[..2], data[..2]);
            assert_eq!(again[4..], data[4..REQUEST_HEADER_LEN]);
        }
        Err(s) => assert_eq!(s.code(), Code::InvalidArgument),
    }
    match decode_response(data, data.len()) {
        Ok(off) => {
            assert!((RESPONSE_HEADER_LEN..=data.len()).contains(&off));
            assert_eq!(data[0], Code::Ok as u8);
        }
        Err(s) => {
            assert!(s.code() != Code::Ok);
            // What the server would send for this status decodes to it.
            let back = error_response(&s);
            assert_eq!(decode_response(&back, back.len()), Err(s));
        }
    }
}

/// The committed seeds: (file name, bytes).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        (
            "req-plain".to_string(),
            RequestHeader::new(0x1234_5678, 0, 0).encode().to_vec(),
        ),
        (
            "req-budget-body".to_string(),
            [&RequestHeader::new(7, 1_000_000, 0).encode()[..], b"body"].concat(),
        ),
        (
            "req-cancel".to_string(),
            [
                &RequestHeader::new(7, 0, FLAG_CANCEL).encode()[..],
                &42u64.to_le_bytes(),
            ]
            .concat(),
        ),
        ("req-long-header".to_string(), {
            let mut b = RequestHeader::new(9, 5, 0).encode().to_vec();
            b[2] = 16;
            b.extend_from_slice(&[0xee; 6]);
            b
        }),
        ("resp-ok".to_string(), vec![0, 0, 0, 0, 1, 2, 3]),
    ];
    let s = Status::new(Code::NotFound, "no such key");
    out.push(("resp-not-found".to_string(), error_response(&s)));
    out.push((
        "resp-truncated".to_string(),
        error_response(&s)[..7].to_vec(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/header")
    }

    /// The committed seeds are what `seeds()` makes
    /// (`HOMA_FUZZ_WRITE_SEEDS=1 cargo test` rewrites them).
    #[test]
    fn committed_seeds_match_the_generator_and_pass() {
        let write = std::env::var_os("HOMA_FUZZ_WRITE_SEEDS").is_some();
        for (name, bytes) in seeds() {
            let path = corpus().join(format!("seed-{name}"));
            if write {
                std::fs::write(&path, &bytes).unwrap();
            }
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} is stale");
            check_header(&bytes);
        }
    }

    /// A cheap stand-in for a fuzzing session: every seed with each byte
    /// set to a few values, and every prefix.
    #[test]
    fn mutants_of_the_seeds_pass() {
        for (_, bytes) in seeds() {
            for i in 0..bytes.len() {
                for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                    let mut m = bytes.clone();
                    m[i] = v;
                    check_header(&m);
                }
                check_header(&bytes[..i]);
            }
        }
    }
}
