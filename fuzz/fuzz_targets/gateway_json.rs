//! Fuzz target: `raftlock::fuzz::gateway_json` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::gateway_json(data));
