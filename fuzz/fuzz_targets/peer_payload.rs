//! Fuzz target: `raftlock::fuzz::peer_payload` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::peer_payload(data));
