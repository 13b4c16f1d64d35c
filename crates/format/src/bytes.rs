//! Bounds-checked little-endian field access. All on-disk integers are little-endian and
//! every structure is packed, so a field is just (offset, width) into a byte slice.

use crate::error::{FormatError, Result};

/// Returns `buf[off..off+len]`, or a `Truncated` error instead of panicking.
pub fn slice(buf: &[u8], off: usize, len: usize) -> Result<&[u8]> {
    off.checked_add(len)
        .and_then(|end| buf.get(off..end))
        .ok_or(FormatError::Truncated {
            offset: off,
            need: len,
            have: buf.len(),
        })
}

/// Reads the byte at `off`.
pub fn u8_at(buf: &[u8], off: usize) -> Result<u8> {
    Ok(slice(buf, off, 1)?[0])
}

/// Reads a little-endian u16 at `off`.
pub fn u16_at(buf: &[u8], off: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(array(buf, off)?))
}

/// Reads a little-endian u32 at `off`.
pub fn u32_at(buf: &[u8], off: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(array(buf, off)?))
}

/// Reads a little-endian u64 at `off`.
pub fn u64_at(buf: &[u8], off: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(array(buf, off)?))
}

/// Reads a little-endian i64 at `off` (the seconds of an on-disk timespec).
pub fn i64_at(buf: &[u8], off: usize) -> Result<i64> {
    Ok(i64::from_le_bytes(array(buf, off)?))
}

/// Copies the `N` bytes at `off` (UUIDs, checksum fields).
pub fn array<const N: usize>(buf: &[u8], off: usize) -> Result<[u8; N]> {
    let mut out = [0u8; N];
    out.copy_from_slice(slice(buf, off, N)?);
    Ok(out)
}

/// Formats a UUID the usual 8-4-4-4-12 way.
pub fn uuid_string(uuid: &[u8; 16]) -> String {
    let h: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

// Writers: the inverse of the accessors above, for this crate's `to_bytes` / `write_into`
// methods (the public way to serialize). They append to a Vec, so a writer can never index
// out of bounds; callers that need a fixed-size structure check the final length.

/// Appends one byte.
pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

/// Appends a little-endian u16.
pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian u32.
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian u64.
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a little-endian i64.
pub(crate) fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends `n` zero bytes (reserved and padding fields).
pub(crate) fn put_zeros(out: &mut Vec<u8>, n: usize) {
    out.resize(out.len() + n, 0);
}

/// Overwrites `buf[off..off+src.len()]`, or a `Truncated` error instead of panicking.
pub(crate) fn put_at(buf: &mut [u8], off: usize, src: &[u8]) -> Result<()> {
    let have = buf.len();
    off.checked_add(src.len())
        .and_then(|end| buf.get_mut(off..end))
        .ok_or(FormatError::Truncated {
            offset: off,
            need: src.len(),
            have,
        })?
        .copy_from_slice(src);
    Ok(())
}
