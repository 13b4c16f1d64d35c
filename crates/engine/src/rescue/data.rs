//! File data: extents read copy by copy, each sector checked against the csum tree where
//! that survives, a sector bad on every copy left as a hole.

use super::walk::Items;
use crate::io::disk_io::DiskIo;
use oleo_format::compression::decompress;
use oleo_format::items::{Compression, FileExtent, FileExtentBody};
use oleo_format::key::item;
use oleo_format::{CsumType, Key};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The csum tree's EXTENT_CSUM items (objectid EXTENT_CSUM_OBJECTID, -10).
const CSUM_OBJECTID: u64 = -10i64 as u64;
/// Largest piece read at once, so a huge extent does not need its size in memory.
const PIECE: u64 = 1 << 20;
/// btrfs compresses at most 128 KiB per extent; more than this is damage.
const MAX_COMPRESSED: u64 = 1 << 20;
/// Upper bound for one uncompressed extent (btrfs writes at most 128 MiB).
const MAX_EXTENT: u64 = 1 << 30;

/// The data checksums that could be read.
pub(crate) struct Csums {
    items: Items,
    kind: CsumType,
    sectorsize: u64,
    /// Logical ranges `[start, end)` whose checksums are there but cannot be trusted (an
    /// item whose size is no multiple of the checksum size): their data is copied as read
    /// (as btrfs restore copies all data) and counted as unverified.
    unverifiable: Vec<(u64, u64)>,
    /// Bytes copied from `unverifiable` ranges since [`Csums::take_unverified`].
    unverified: std::cell::Cell<u64>,
}

/// What the csum tree says about one sector.
enum SectorCsum<'a> {
    /// No checksum (nodatasum, or its csum leaf is lost): the bytes as read.
    None,
    /// A checksum item covers it, but cannot be trusted: the bytes as read, unverified.
    Unverifiable,
    Known(&'a [u8]),
}

impl Csums {
    /// The csum items `items` (EXTENT_CSUM keys) of a filesystem with checksum `kind` and
    /// sector size `sectorsize`. An item whose size is no multiple of the checksum size
    /// (the tree checker's "bad csum item") is set aside: the data it covers is unverified.
    pub(crate) fn new(mut items: Items, kind: CsumType, sectorsize: u64) -> Csums {
        let size = kind.size().max(1);
        let ss = sectorsize.max(512);
        let mut unverifiable = Vec::new();
        items.retain(|key, data| {
            if data.len() % size == 0 {
                return true;
            }
            let sectors = data.len().div_ceil(size) as u64;
            let end = key.offset.saturating_add(sectors.saturating_mul(ss));
            eprintln!(
                "csum item at logical {} is {} bytes, no multiple of the {size}-byte checksum: \
                 the data of {}..{end} is copied unverified",
                key.offset,
                data.len(),
                key.offset
            );
            unverifiable.push((key.offset, end));
            false
        });
        Csums {
            items,
            kind,
            sectorsize,
            unverifiable,
            unverified: Default::default(),
        }
    }

    /// Bytes copied unverified since the last call.
    pub(crate) fn take_unverified(&self) -> u64 {
        self.unverified.take()
    }

    fn get(&self, logical: u64) -> SectorCsum<'_> {
        if self
            .unverifiable
            .iter()
            .any(|&(a, b)| (a..b).contains(&logical))
        {
            return SectorCsum::Unverifiable;
        }
        self.known(logical)
            .map_or(SectorCsum::None, SectorCsum::Known)
    }

    fn known(&self, logical: u64) -> Option<&[u8]> {
        let size = self.kind.size();
        let (key, data) = self
            .items
            .range(..=Key::new(CSUM_OBJECTID, item::EXTENT_CSUM, logical))
            .next_back()?;
        if key.objectid != CSUM_OBJECTID || key.item_type != item::EXTENT_CSUM {
            return None;
        }
        let idx = ((logical - key.offset) / self.sectorsize) as usize;
        data.get(idx.checked_mul(size)?..idx.checked_add(1)?.checked_mul(size)?)
    }
}

/// Reads `[logical, logical + len)`, sector-aligned, trying every copy for each sector
/// whose checksum fails. Returns the bytes and the bad byte ranges (offsets into them).
fn read_checked(
    io: &DiskIo,
    csums: &Csums,
    logical: u64,
    len: usize,
) -> (Vec<u8>, Vec<(u64, u64)>) {
    let ss = csums.sectorsize.max(512) as usize;
    let mut buf = vec![0u8; len];
    let mirrors = io.num_mirrors(logical).clamp(1, 4);
    let sectors = len.div_ceil(ss);
    let mut good = vec![false; sectors];
    for mirror in 0..mirrors {
        if mirror == 0 {
            if io.read_logical(logical, &mut buf, 0).is_ok() {
                for (s, g) in good.iter_mut().enumerate() {
                    *g = sector_ok(csums, logical, &buf, s, ss);
                }
            }
            continue;
        }
        for (s, g) in good.iter_mut().enumerate() {
            if *g {
                continue;
            }
            let at = s * ss;
            let end = (at + ss).min(len);
            let mut piece = vec![0u8; end - at];
            if io
                .read_logical(logical + at as u64, &mut piece, mirror)
                .is_ok()
            {
                let was = buf[at..end].to_vec();
                buf[at..end].copy_from_slice(&piece);
                if sector_ok(csums, logical, &buf, s, ss) {
                    *g = true;
                } else {
                    buf[at..end].copy_from_slice(&was);
                }
            }
        }
    }
    let mut bad: Vec<(u64, u64)> = Vec::new();
    for (s, g) in good.iter().enumerate() {
        if *g {
            continue;
        }
        let (a, b) = ((s * ss) as u64, ((s + 1) * ss).min(len) as u64);
        buf[a as usize..b as usize].fill(0);
        match bad.last_mut() {
            Some(last) if last.1 == a => last.1 = b,
            _ => bad.push((a, b)),
        }
    }
    (buf, bad)
}

fn sector_ok(csums: &Csums, logical: u64, buf: &[u8], s: usize, ss: usize) -> bool {
    let at = s * ss;
    let Some(bytes) = buf.get(at..(at + ss).min(buf.len())) else {
        return false;
    };
    match csums.get(logical + at as u64) {
        SectorCsum::None => true,
        SectorCsum::Unverifiable => {
            csums
                .unverified
                .set(csums.unverified.get() + bytes.len() as u64);
            true
        }
        SectorCsum::Known(want) => bytes.len() == ss && csums.kind.verify(bytes, want),
    }
}

/// Writes the file whose EXTENT_DATA items are `extents` (key offset, body) into `out`,
/// `size` bytes long. Returns the unreadable file ranges; `out` None only checks.
pub(crate) fn write_file(
    io: &DiskIo,
    csums: &Csums,
    extents: &[(u64, &[u8])],
    size: u64,
    out: Option<&File>,
) -> std::io::Result<Vec<(u64, u64)>> {
    let mut holes = Vec::new();
    let ss = csums.sectorsize.max(512);
    for &(file_off, body) in extents {
        if file_off >= size {
            continue;
        }
        let fe = match FileExtent::parse(body) {
            Ok(fe) => fe,
            Err(_) => {
                // Its length is unknown: up to the next item is lost.
                let next = extents
                    .iter()
                    .map(|e| e.0)
                    .find(|&o| o > file_off)
                    .unwrap_or(size);
                holes.push((file_off, next.min(size)));
                continue;
            }
        };
        let len = fe.file_len().min(size - file_off);
        match fe.body {
            FileExtentBody::Inline { data } => {
                let bytes = if fe.compression == Compression::None {
                    Ok(data.to_vec())
                } else {
                    decompress(
                        fe.compression,
                        data,
                        fe.ram_bytes.min(1 << 16) as usize,
                        ss as usize,
                    )
                };
                match bytes {
                    Ok(b) => put(out, &b[..b.len().min((size - file_off) as usize)], file_off)?,
                    Err(_) => holes.push((file_off, file_off + len)),
                }
            }
            FileExtentBody::Extent {
                prealloc,
                disk_bytenr,
                disk_num_bytes,
                offset,
                ..
            } => {
                if prealloc || disk_bytenr == 0 || len == 0 {
                    continue;
                }
                if fe.compression != Compression::None {
                    let want = offset.saturating_add(len);
                    if disk_num_bytes > MAX_COMPRESSED || want > MAX_COMPRESSED * 8 {
                        holes.push((file_off, file_off + len));
                        continue;
                    }
                    let (raw, bad) = read_checked(io, csums, disk_bytenr, disk_num_bytes as usize);
                    let plain = if bad.is_empty() {
                        decompress(fe.compression, &raw, want as usize, ss as usize).ok()
                    } else {
                        None
                    };
                    match plain {
                        Some(p) => {
                            let from = (offset as usize).min(p.len());
                            let to = (want as usize).min(p.len());
                            put(out, &p[from..to], file_off)?;
                        }
                        None => holes.push((file_off, file_off + len)),
                    }
                    continue;
                }
                // Plain data cannot outrun its disk extent (at most 128 MiB in btrfs).
                let len = len
                    .min(disk_num_bytes.saturating_sub(offset))
                    .min(MAX_EXTENT);
                copy_plain(
                    io,
                    csums,
                    disk_bytenr.saturating_add(offset),
                    file_off,
                    len,
                    out,
                    &mut holes,
                )?;
            }
        }
    }
    Ok(holes)
}

/// Copies an uncompressed range piece by piece.
fn copy_plain(
    io: &DiskIo,
    csums: &Csums,
    logical: u64,
    file_off: u64,
    len: u64,
    out: Option<&File>,
    holes: &mut Vec<(u64, u64)>,
) -> std::io::Result<()> {
    let ss = csums.sectorsize.max(512);
    // Checks run on whole sectors: start at the sector holding `logical`.
    let lead = logical % ss;
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(PIECE);
        let start = logical + done - lead;
        let span = (lead + n).div_ceil(ss) * ss;
        let (buf, bad) = read_checked(io, csums, start, span as usize);
        let from = lead as usize;
        put(out, &buf[from..from + n as usize], file_off + done)?;
        for (a, b) in bad {
            let a = a.saturating_sub(lead).min(n);
            let b = b.saturating_sub(lead).min(n);
            if a < b {
                holes.push((file_off + done + a, file_off + done + b));
            }
        }
        done += n;
    }
    Ok(())
}

fn put(out: Option<&File>, bytes: &[u8], at: u64) -> std::io::Result<()> {
    match out {
        Some(f) => f.write_all_at(bytes, at),
        None => Ok(()),
    }
}
