//! An arbitrary script of datagrams, clock advances, polls and application calls
//! run against one `Endpoint`. See `homa_proto_fuzz::run_engine`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    homa_proto_fuzz::run_engine(data);
});
