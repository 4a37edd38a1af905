//! The WAL's frames: how a record is laid out in a segment, how a segment is
//! replayed, and how a torn write is told from damage (see the module above
//! for the layout and the recovery rules).

use super::{EntryAt, Recovered, WalRecord};
use crate::storage::framing;

const KIND_ENTRY: u8 = 1;
const KIND_META: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
const KIND_PURGE: u8 = 4;
pub(super) const FRAME_HEADER: usize = framing::HEADER;
/// The unit a disk writes atomically: a crash tears a write at these boundaries.
pub(super) const SECTOR: usize = 512;

pub(super) fn encode(record: &WalRecord, buf: &mut Vec<u8>) {
    framing::append(buf, |buf| match record {
        WalRecord::Entry { index, data } => {
            buf.push(KIND_ENTRY);
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(data);
        }
        WalRecord::Meta { key, data } => {
            buf.push(KIND_META);
            buf.push(*key);
            buf.extend_from_slice(data);
        }
        WalRecord::TruncateFrom(index) => {
            buf.push(KIND_TRUNCATE);
            buf.extend_from_slice(&index.to_le_bytes());
        }
        WalRecord::PurgeUpto(index) => {
            buf.push(KIND_PURGE);
            buf.extend_from_slice(&index.to_le_bytes());
        }
    })
}

/// What replaying one segment found, besides what it added to [`Recovered`].
pub(super) struct SegmentReplay {
    /// Where its valid frames end.
    pub end: usize,
    /// Its highest entry index.
    pub max_index: Option<u64>,
    /// The meta keys it holds a value for.
    pub meta_keys: Vec<u8>,
}

/// Apply every valid frame of a segment to `rec`, and say where the valid
/// frames end, the highest entry index and the meta keys seen.
pub(super) fn replay_segment(bytes: &[u8], seq: u64, rec: &mut Recovered) -> SegmentReplay {
    let mut pos = 0;
    let mut max_index = None;
    let mut meta_keys = Vec::new();
    for body in framing::bodies(bytes) {
        let len = body.len();
        let Some(record) = decode(body) else { break };
        match record {
            WalRecord::Entry { index, data } => {
                if rec.purged_upto.is_none_or(|p| index > p) {
                    rec.entries.insert(index, data);
                    let at = EntryAt { seq, offset: pos as u64, len: (FRAME_HEADER + len) as u32 };
                    rec.places.insert(index, at);
                }
                max_index = Some(max_index.map_or(index, |m: u64| m.max(index)));
            }
            WalRecord::Meta { key, data } => {
                if !meta_keys.contains(&key) {
                    meta_keys.push(key);
                }
                rec.metas.insert(key, data);
            }
            WalRecord::TruncateFrom(index) => {
                rec.entries.split_off(&index);
                rec.places.split_off(&index);
            }
            WalRecord::PurgeUpto(index) => {
                rec.purged_upto = Some(rec.purged_upto.map_or(index, |p| p.max(index)));
                rec.entries = rec.entries.split_off(&(index + 1));
                rec.places = rec.places.split_off(&(index + 1));
            }
        }
        pos += FRAME_HEADER + len;
    }
    SegmentReplay { end: pos, max_index, meta_keys }
}

/// The record of one whole frame (header included), if its checksum holds.
pub(super) fn decode_frame(frame: &[u8]) -> Option<WalRecord> {
    framing::body_at(frame).and_then(decode)
}

fn decode(body: &[u8]) -> Option<WalRecord> {
    let (&kind, rest) = body.split_first()?;
    let u64_at = |b: &[u8]| b.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    Some(match kind {
        KIND_ENTRY => WalRecord::Entry { index: u64_at(rest)?, data: rest[8..].to_vec() },
        KIND_META => WalRecord::Meta { key: *rest.first()?, data: rest[1..].to_vec() },
        KIND_TRUNCATE => WalRecord::TruncateFrom(u64_at(rest)?),
        KIND_PURGE => WalRecord::PurgeUpto(u64_at(rest)?),
        _ => return None,
    })
}

/// Whether the invalid frame at `at` is a torn write: one of the sectors it
/// lies in reads as zeroes from the frame's start (or the sector's) to the
/// sector's end, so that sector never reached the disk (segments are zeroed
/// before frames are written over them); a byte set anywhere after that
/// point shows the sector was written, even where the frame's own bytes in
/// it are zero. A frame whose every sector was written but whose checksum
/// fails is damage, not a tear.
/// A length that runs past the segment was not written whole either, but the
/// writer never writes such a frame: then only the header's sectors count.
pub(super) fn torn_at(bytes: &[u8], at: usize) -> bool {
    let header_end = (at + FRAME_HEADER).min(bytes.len());
    let len = bytes.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    let end = match at + FRAME_HEADER + len {
        end if end <= bytes.len() => end,
        _ => header_end,
    };
    let mut chunk = at;
    while chunk < end {
        let sector_end = (chunk / SECTOR + 1) * SECTOR;
        if is_zero(&bytes[chunk..sector_end.min(bytes.len())]) {
            return true;
        }
        chunk = sector_end;
    }
    false
}

pub(super) fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}
