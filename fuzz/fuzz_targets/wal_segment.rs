//! Fuzz target: `raftlock::fuzz::wal_segment` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::wal_segment(data));
