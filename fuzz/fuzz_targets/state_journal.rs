//! Fuzz target: `raftlock::fuzz::state_journal` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::state_journal(data));
