//! The checksummed frame both of raftlock's append-only files use (the WAL's
//! segments and the state store's journal): a body's length and CRC-32, then
//! the body.
//!
//! ```text
//!   +---------+---------+----------------+
//!   | len u32 | crc u32 | body (len)     |   little-endian; crc = crc32(body)
//!   +---------+---------+----------------+
//! ```
//!
//! Invariant: a body is never empty, so a zeroed (preallocated, unwritten)
//! header never reads as a frame. Reading stops at the first frame that is
//! cut short or whose checksum fails: what follows a torn or damaged write
//! is never trusted.

/// A frame's header: the body's length and CRC-32.
pub const HEADER: usize = 8;

/// Append one frame to `buf`, its body written by `body`.
pub fn append(buf: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER]);
    body(buf);
    let written = &buf[start + HEADER..];
    assert!(!written.is_empty(), "a frame's body is never empty");
    let (len, crc) = (written.len() as u32, crc32fast::hash(written));
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The body of the frame `bytes` starts with, if it is whole and its
/// checksum holds.
pub fn body_at(bytes: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..HEADER)?.try_into().ok()?);
    let body = bytes.get(HEADER..HEADER.checked_add(len)?)?;
    (len > 0 && crc32fast::hash(body) == crc).then_some(body)
}

/// The bodies of the whole, valid frames `bytes` starts with, in order.
pub fn bodies(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let body = body_at(&bytes[at..])?;
        at += HEADER + body.len();
        Some(body)
    })
}
