//! Arbitrary bytes into `wire::decode` and `wire::verify_checksum`; whatever
//! decodes must re-encode to the same bytes. See `homa_proto_fuzz::check_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| homa_proto_fuzz::check_decode(data));
