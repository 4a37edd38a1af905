//! The byte codec of everything raftlock writes for another process or a
//! later one to read: log entries, peer payloads, snapshot and journal
//! frames. bincode with a format byte in front.
//!
//! Invariants: decoding is bounded by the input (no length read from the
//! bytes allocates more than the bytes hold), and a format byte this binary
//! does not know is an error ([`DecodeError::UnknownFormat`]), never a
//! misread.

use serde::{Deserialize, Serialize};

/// The first byte of every encoded log entry and peer payload. Bumped when the
/// encoding changes incompatibly, so that a mismatch is an error, not a misread.
pub const FORMAT_V1: u8 = 1;

/// Encode with the format byte in front.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_onto(&mut out, value);
    out
}

/// Append `value`'s encoding, the format byte in front, to `out` (what
/// [`encode`] returns, written in place: a journal frame's body).
pub fn encode_onto<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    out.push(FORMAT_V1);
    bincode::serialize_into(&mut *out, value).expect("serializing to memory cannot fail");
}

/// Why bytes did not decode: a peer or a file of another version, or not
/// raftlock's at all.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("empty payload")]
    Empty,
    #[error("unknown encoding format {0}")]
    UnknownFormat(u8),
    #[error("{0}")]
    Malformed(#[from] bincode::Error),
}

/// Decode `bytes` whose first byte is `tag` (a format of the caller's own,
/// see `state_machine::layout`) and the rest as [`decode`] reads it; with
/// `exact`, bytes left over are an error.
pub fn decode_tagged<T: for<'de> Deserialize<'de>>(bytes: &[u8], tag: u8, exact: bool) -> Result<T, DecodeError> {
    use bincode::Options;
    match bytes.split_first() {
        Some((&t, rest)) if t == tag => {
            let options = bincode::DefaultOptions::new().with_fixint_encoding().with_limit(rest.len() as u64);
            Ok(if exact { options.deserialize(rest)? } else { options.allow_trailing_bytes().deserialize(rest)? })
        }
        Some((&v, _)) => Err(DecodeError::UnknownFormat(v)),
        None => Err(DecodeError::Empty),
    }
}

/// Decode what [`encode`] produced. Bounded: no length inside may claim more
/// bytes than the input holds (so nothing is allocated for them), and txns
/// nest at most `mvcc::MAX_TXN_DEPTH` deep.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_tagged(bytes, FORMAT_V1, false)
}
