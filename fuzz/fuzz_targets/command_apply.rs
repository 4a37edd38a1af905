//! Fuzz target: `raftlock::fuzz::command_apply` (see its doc).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| raftlock::fuzz::command_apply(data));
