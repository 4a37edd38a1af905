//! Fuzz target: `raftlock::fuzz::snapshot_image` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::snapshot_image(data));
