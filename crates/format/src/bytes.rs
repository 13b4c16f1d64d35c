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

pub fn u8_at(buf: &[u8], off: usize) -> Result<u8> {
    Ok(slice(buf, off, 1)?[0])
}

pub fn u16_at(buf: &[u8], off: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(array(buf, off)?))
}

pub fn u32_at(buf: &[u8], off: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(array(buf, off)?))
}

pub fn u64_at(buf: &[u8], off: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(array(buf, off)?))
}

pub fn i64_at(buf: &[u8], off: usize) -> Result<i64> {
    Ok(i64::from_le_bytes(array(buf, off)?))
}

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
