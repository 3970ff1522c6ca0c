//! Arbitrary bytes as a request and as a response: the framework's header
//! decoders never panic, and what decodes re-encodes to the same fields.
//! See `homa_rpc_fuzz::check_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| homa_rpc_fuzz::check_header(data));
