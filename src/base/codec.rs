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
    #[error("{}", malformed(.0))]
    Malformed(#[from] bincode::Error),
}

/// A malformed input's error, said plainly when it is a variant this binary
/// does not know (a log entry's or a message's kind a later release added):
/// that is no damage, and the remedy is the release that wrote it.
fn malformed(e: &bincode::Error) -> String {
    let text = e.to_string();
    if text.contains("expected variant index") {
        format!(
            "{text}: a kind of entry or message that this raftlock ({}) does not know, written by a later release; \
             run that release (or a later one) on this member",
            super::version::RAFTLOCK
        )
    } else {
        text
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    enum Kinds {
        Old(u8),
    }

    #[derive(Serialize)]
    enum LaterKinds {
        #[allow(dead_code)]
        Old(u8),
        Added(u8),
    }

    #[test]
    fn a_kind_a_later_release_added_is_named_as_such_not_misread() {
        let bytes = encode(&LaterKinds::Added(7));
        let e = decode::<Kinds>(&bytes).unwrap_err().to_string();
        assert!(e.contains("variant index") && e.contains("later release"), "{e}");
        assert!(e.contains(crate::base::version::RAFTLOCK), "{e}");
        // Other damage is said as it is.
        let e = decode::<Kinds>(&[FORMAT_V1]).unwrap_err().to_string();
        assert!(!e.contains("later release"), "{e}");
        assert!(matches!(decode::<Kinds>(&[9, 0]), Err(DecodeError::UnknownFormat(9))));
    }
}
