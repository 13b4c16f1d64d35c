//! File data of a received stream that needs more than one engine call: CLONE (a reflink,
//! within a subvolume or from another one; a copy where sharing is impossible) and
//! ENCODED_WRITE (stored compressed as it comes; decoded and written where the engine
//! cannot take it as it is, as btrfs receive falls back).

use oleo::{Error, FallocMode, Filesystem, InodeId, Result, SetAttr};
use oleo_format::compression::{decompress, MAX_UNCOMPRESSED};
use oleo_format::items::Compression;
use oleo_format::send_stream::Command;

/// BTRFS_IOC_CLONE_RANGE: `len` bytes of `src` at `src_off` to `dst` at `dst_off`.
pub fn clone(
    fs: &Filesystem,
    src: InodeId,
    src_off: u64,
    dst: InodeId,
    dst_off: u64,
    len: u64,
) -> Result<()> {
    let size = fs.getattr(src)?.size;
    // A zero length runs to the source's end, as the ioctl's.
    let len = if len == 0 {
        size.saturating_sub(src_off)
    } else {
        len
    };
    if src_off.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::InvalidArgument(
            "the range runs past the source's end".into(),
        ));
    }
    match fs.reflink(src, src_off, dst, dst_off, len) {
        Err(Error::Unsupported(_)) => {}
        r => return r,
    }
    if src.subvol != dst.subvol {
        return copy_across(fs, src, src_off, dst, dst_off, len);
    }
    let mut done = 0;
    while done < len {
        let n = fs.copy_file_range(src, src_off + done, dst, dst_off + done, len - done)?;
        if n == 0 {
            return Err(Error::InvalidArgument(format!(
                "copied {done} of {len} bytes"
            )));
        }
        done += n;
    }
    Ok(())
}

/// A clone from another subvolume that cannot share (an unaligned range, an inline
/// source) copies the bytes: the same content, not shared on disk. Holes stay holes.
fn copy_across(
    fs: &Filesystem,
    src: InodeId,
    src_off: u64,
    dst: InodeId,
    dst_off: u64,
    len: u64,
) -> Result<()> {
    let end = src_off + len;
    let to = |at: u64| dst_off + (at - src_off);
    let dst_end = dst_off.checked_add(len).ok_or(Error::FileTooBig)?;
    if fs.getattr(dst)?.size < dst_end {
        let grow = SetAttr {
            size: Some(dst_end),
            ..SetAttr::default()
        };
        fs.setattr(dst, &grow)?;
    }
    let mut pos = src_off;
    while pos < end {
        let data = match fs.seek_data_hole(src, pos, true) {
            Ok(d) => d.min(end),
            Err(Error::NoSuchOffset) => end,
            Err(e) => return Err(e),
        };
        if data > pos {
            fs.fallocate(dst, to(pos), data - pos, FallocMode::PunchHole)?;
        }
        if data >= end {
            break;
        }
        let hole = fs.seek_data_hole(src, data, false)?.min(end);
        let mut at = data;
        while at < hole {
            let bytes = fs.read(src, at, (hole - at).min(1 << 20) as u32)?;
            if bytes.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "the source ended at {at}, before {hole}"
                )));
            }
            fs.write(dst, to(at), &bytes)?;
            at += bytes.len() as u64;
        }
        pos = hole;
    }
    Ok(())
}

/// ENCODED_WRITE (protocol 2): the data is decoded first (a stream whose data does not
/// decode is refused), then stored as the compressed extent it came as, as the kernel's
/// BTRFS_IOC_ENCODED_WRITE stores it. Where the engine cannot (an unaligned range, LZO
/// of another sector size, a NODATASUM file, data that belongs inline) the decoded bytes
/// are written, as btrfs receive falls back to its --force-decompress.
pub fn encoded_write(fs: &Filesystem, id: InodeId, c: &Command) -> Result<()> {
    let Command::EncodedWrite {
        offset,
        unencoded_file_len,
        unencoded_len,
        unencoded_offset,
        compression,
        encryption,
        data,
        ..
    } = c
    else {
        return Err(Error::InvalidArgument("not an ENCODED_WRITE".into()));
    };
    if encryption.unwrap_or(0) != 0 {
        return Err(Error::Unsupported("encrypted data".into()));
    }
    // BTRFS_ENCODED_IO_COMPRESSION_*: LZO is numbered by its sector size, 4 KiB to 64 KiB.
    let (kind, sector) = match compression.unwrap_or(0) {
        0 => (Compression::None, 4096),
        1 => (Compression::Zlib, 4096),
        2 => (Compression::Zstd, 4096),
        n @ 3..=7 => (Compression::Lzo, 4096usize << (n - 3)),
        n => return Err(Error::Unsupported(format!("compression {n}"))),
    };
    // A compressed extent decodes to at most 128 KiB: what bounds the buffer here.
    let limit = match kind {
        Compression::None => data.len(),
        _ => MAX_UNCOMPRESSED,
    } as u64;
    let end = unencoded_offset
        .checked_add(*unencoded_file_len)
        .filter(|&end| end <= *unencoded_len && *unencoded_len <= limit)
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{unencoded_file_len} bytes at {unencoded_offset} of an extent of \
                 {unencoded_len} bytes ({limit} at most)"
            ))
        })?;
    let mut plain = decompress(kind, data, *unencoded_len as usize, sector)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    // What the data does not fill reads as zeros, as the kernel's decoders leave it.
    plain.resize(*unencoded_len as usize, 0);
    let fs_sector = fs.superblock().sectorsize as usize;
    if kind != Compression::None && (kind != Compression::Lzo || sector == fs_sector) {
        let r = fs.write_encoded(
            id,
            *offset,
            *unencoded_file_len,
            *unencoded_len,
            *unencoded_offset,
            kind,
            data,
        );
        // btrfs receive falls back on EINVAL too: the engine refused before changing
        // anything, and the data decoded above.
        match r {
            Err(Error::Unsupported(_) | Error::InvalidArgument(_)) => {}
            r => return r,
        }
    }
    fs.write(
        id,
        *offset,
        &plain[*unencoded_offset as usize..end as usize],
    )?;
    Ok(())
}
