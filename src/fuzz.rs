//! Entry points for the fuzz targets (`fuzz/`, run with `cargo fuzz`,
//! `scripts/fuzz.sh`): each takes bytes as they could arrive from outside
//! or be found on disk, and must return without panicking, whatever they
//! hold, within bounded memory (libFuzzer's `-rss_limit_mb`).
//!
//! Compiled only under `cfg(fuzzing)`, which cargo fuzz sets: the crate's
//! surface does not grow for anyone else.
//!
//! - [`peer_payload`]: every message the peer protocol decodes.
//! - [`command_apply`]: a log entry's command, decoded and applied by two
//!   members to the same state: apply must be total, and both must answer
//!   alike.
//! - [`wal_segment`]: a WAL segment replayed, as found on disk and cut into
//!   frames whose checksums hold.
//! - [`state_journal`]: the state store's journal frames.
//! - [`snapshot_image`]: a snapshot, checkpoint or backup image, decoded
//!   and installed.
//! - [`gateway_json`]: the JSON gateway's streamed request objects.

use crate::base::codec::decode;
use crate::model::command::Command;

/// Every message a member decodes from a peer.
pub fn peer_payload(bytes: &[u8]) {
    crate::raft::fuzz_decode(bytes);
}

/// A command as a log entry holds it, applied by two members whose states
/// are the same: both must return, and return the same.
pub fn command_apply(bytes: &[u8]) {
    let Ok(command) = decode::<Command>(bytes) else { return };
    let (a, b) = (crate::raft::fuzz_state(), crate::raft::fuzz_state());
    let on_a = crate::raft::fuzz_apply(&a, command.clone());
    let on_b = crate::raft::fuzz_apply(&b, command);
    assert_eq!(on_a, on_b, "two members applied one command differently");
    assert_eq!(a.mvcc().revision(), b.mvcc().revision());
}

/// A WAL segment's bytes replayed as found, then cut at every 0xff into
/// frames with good checksums (so that what follows the checksum is
/// reached), replayed too.
pub fn wal_segment(bytes: &[u8]) {
    crate::storage::wal::fuzz_replay(bytes);
    crate::storage::wal::fuzz_replay(&framed(bytes));
}

/// The state store's journal: frames as found, and the same bytes cut
/// into frames with good checksums.
pub fn state_journal(bytes: &[u8]) {
    crate::raft::fuzz_journal(bytes);
    crate::raft::fuzz_journal(&framed(bytes));
}

/// `bytes` cut at every 0xff into frames whose checksums hold (empty pieces
/// left out: a frame's body is never empty).
fn framed(bytes: &[u8]) -> Vec<u8> {
    let mut framed = Vec::new();
    for piece in bytes.split(|b| *b == 0xff).filter(|p| !p.is_empty()) {
        crate::storage::framing::append(&mut framed, |body| body.extend_from_slice(piece));
    }
    framed
}

/// A snapshot (or checkpoint, or backup) image: decoded, and if it
/// decodes, installed.
pub fn snapshot_image(bytes: &[u8]) {
    crate::raft::fuzz_image(bytes);
}

/// A streamed gateway body: its objects found and parsed as requests.
pub fn gateway_json(bytes: &[u8]) {
    crate::api::fuzz_gateway(bytes);
}
