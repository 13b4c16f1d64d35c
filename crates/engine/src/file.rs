//! File data: walking EXTENT_DATA items, reading extents through the chunk map, verifying
//! data checksums against the csum tree, and decompressing.

use crate::ctree::Cursor;
use crate::error::{Error, Result};
use crate::fs::{FileKind, FsCore, InodeId};
use oleo_format::compression::decompress;
use oleo_format::items::{Compression, FileExtent, FileExtentBody, INODE_FLAG_NODATASUM};
use oleo_format::key::{item, objectid, Key};
use quick_cache::Weighter;
use std::ops::ControlFlow;
use std::sync::Arc;

/// Decompressed extents are weighed by their size in the cache.
#[derive(Clone)]
pub struct ExtentWeight;

impl Weighter<u64, Arc<Vec<u8>>> for ExtentWeight {
    fn weight(&self, _k: &u64, v: &Arc<Vec<u8>>) -> u64 {
        v.len() as u64 + 64
    }
}

/// What one EXTENT_DATA item says, owned so the tree cursor can move on.
struct Mapping {
    file_start: u64,
    file_len: u64,
    compression: Compression,
    ram_bytes: u64,
    kind: MappingKind,
}

enum MappingKind {
    Inline(Vec<u8>),
    Zero,
    Disk {
        bytenr: u64,
        disk_len: u64,
        offset: u64,
    },
}

impl FsCore {
    /// Reads up to `size` bytes at `offset`; short only at end of file.
    pub fn read(&self, id: InodeId, offset: u64, size: u32) -> Result<Vec<u8>> {
        let attr = self.getattr(id)?;
        if attr.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        let end = offset.saturating_add(size as u64).min(attr.size);
        if offset >= end {
            return Ok(Vec::new());
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let verify = attr.flags & INODE_FLAG_NODATASUM == 0;
        for m in self.mappings(id, offset, end)? {
            let (s, e) = (
                m.file_start.max(offset),
                // Saturating: an inline extent's length is its (unchecked) ram_bytes.
                m.file_start.saturating_add(m.file_len).min(end),
            );
            if s >= e {
                continue;
            }
            let dst = &mut out[(s - offset) as usize..(e - offset) as usize];
            self.fill(id, &m, s, dst, verify)?;
        }
        Ok(out)
    }

    /// The EXTENT_DATA items that overlap `[start, end)`, in file order.
    fn mappings(&self, id: InodeId, start: u64, end: u64) -> Result<Vec<Mapping>> {
        let mut out = Vec::new();
        self.for_each_mapping(id, start, end, &mut |m| {
            out.push(m);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Calls `f` with each EXTENT_DATA item overlapping `[start, end)`, in file order, until
    /// it breaks.
    fn for_each_mapping(
        &self,
        id: InodeId,
        start: u64,
        end: u64,
        f: &mut dyn FnMut(Mapping) -> ControlFlow<()>,
    ) -> Result<()> {
        let tree = self.tree_of(id)?;
        let mut cur = Cursor::search(self, &tree, &Key::new(id.ino, item::EXTENT_DATA, start))?;
        // The item covering `start` may begin before it: step back one if so.
        let at_start = matches!(cur.item()?, Some((k, _)) if k.objectid == id.ino && k.item_type == item::EXTENT_DATA && k.offset == start);
        if !at_start && cur.prev()? {
            match cur.item()? {
                Some((k, _)) if k.objectid == id.ino && k.item_type == item::EXTENT_DATA => {}
                _ => cur.next()?,
            }
        }
        while let Some((key, body)) = cur.item()? {
            if key.objectid != id.ino || key.item_type != item::EXTENT_DATA || key.offset >= end {
                break;
            }
            let fe = FileExtent::parse(body).map_err(|e| {
                Error::corrupt(0, format!("extent {key:?} of subvolume {}: {e}", id.subvol))
            })?;
            let kind = match fe.body {
                FileExtentBody::Inline { data } => MappingKind::Inline(data.to_vec()),
                FileExtentBody::Extent { prealloc: true, .. }
                | FileExtentBody::Extent { disk_bytenr: 0, .. } => MappingKind::Zero,
                FileExtentBody::Extent {
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    ..
                } => MappingKind::Disk {
                    bytenr: disk_bytenr,
                    disk_len: disk_num_bytes,
                    offset,
                },
            };
            let m = Mapping {
                file_start: key.offset,
                file_len: fe.file_len(),
                compression: fe.compression,
                ram_bytes: fe.ram_bytes,
                kind,
            };
            if f(m).is_break() {
                break;
            }
            cur.next()?;
        }
        Ok(())
    }

    /// lseek(2)'s SEEK_DATA (`data` true) and SEEK_HOLE from `offset`. As in the kernel,
    /// holes and prealloc (unwritten) ranges are holes, and there is a hole at end of file.
    pub fn seek_data_hole(&self, id: InodeId, offset: u64, data: bool) -> Result<u64> {
        let attr = self.getattr(id)?;
        if attr.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        let size = attr.size;
        if offset >= size {
            return Err(Error::NoSuchOffset);
        }
        let sector = self.sb.sectorsize as u64;
        let mut found = None;
        // Sector-rounded data ranges; whatever lies between them is hole.
        let mut pos = offset;
        self.for_each_mapping(id, offset, size, &mut |m| {
            if matches!(m.kind, MappingKind::Zero) {
                return ControlFlow::Continue(());
            }
            let start = m.file_start - m.file_start % sector;
            let end = m
                .file_start
                .saturating_add(m.file_len)
                .div_ceil(sector)
                .saturating_mul(sector);
            if end <= pos {
                return ControlFlow::Continue(());
            }
            if data {
                found = Some(start.max(pos));
                return ControlFlow::Break(());
            }
            if start > pos {
                found = Some(pos);
                return ControlFlow::Break(());
            }
            pos = end;
            ControlFlow::Continue(())
        })?;
        match (data, found) {
            (_, Some(at)) if at < size => Ok(at),
            (true, _) => Err(Error::NoSuchOffset),
            (false, _) => Ok(pos.min(size)),
        }
    }

    /// Fills `dst` with file bytes starting at file offset `pos`, all within mapping `m`.
    fn fill(&self, id: InodeId, m: &Mapping, pos: u64, dst: &mut [u8], verify: bool) -> Result<()> {
        let rel = pos - m.file_start;
        match &m.kind {
            MappingKind::Zero => dst.fill(0),
            MappingKind::Inline(data) => {
                let decoded;
                let plain: &[u8] = if m.compression == Compression::None {
                    data
                } else {
                    decoded = decompress(
                        m.compression,
                        data,
                        m.ram_bytes.min(1 << 20) as usize,
                        self.sb.sectorsize as usize,
                    )
                    .map_err(|e| {
                        Error::corrupt(0, format!("inline extent of inode {}: {e}", id.ino))
                    })?;
                    &decoded
                };
                copy_or_zero(plain, rel as usize, dst);
            }
            MappingKind::Disk {
                bytenr,
                disk_len,
                offset,
            } if m.compression == Compression::None => {
                // Checked: disk_bytenr and offset are image fields (sector aligned, any size).
                let logical = bytenr
                    .checked_add(*offset)
                    .and_then(|l| l.checked_add(rel))
                    .ok_or_else(|| {
                        Error::corrupt(
                            *bytenr,
                            format!("extent of inode {} overflows the address space", id.ino),
                        )
                    })?;
                self.read_data(id, pos, logical, dst, verify)?;
                let _ = disk_len;
            }
            MappingKind::Disk {
                bytenr,
                disk_len,
                offset,
            } => {
                let plain = self.decompressed_extent(id, pos, *bytenr, *disk_len, m, verify)?;
                // Saturating: a hostile offset past the decoded extent reads as zeros.
                copy_or_zero(&plain, offset.saturating_add(rel) as usize, dst);
            }
        }
        Ok(())
    }

    fn decompressed_extent(
        &self,
        id: InodeId,
        pos: u64,
        bytenr: u64,
        disk_len: u64,
        m: &Mapping,
        verify: bool,
    ) -> Result<Arc<Vec<u8>>> {
        if let Some(d) = self.extents.get(&bytenr) {
            return Ok(d);
        }
        // Compressed extents are at most 128 KiB decoded; anything larger is hostile.
        if disk_len > (1 << 20) || m.ram_bytes > (1 << 20) {
            return Err(Error::corrupt(
                bytenr,
                format!(
                    "compressed extent of {disk_len} bytes ({} decoded) is too large",
                    m.ram_bytes
                ),
            ));
        }
        let mut raw = vec![0u8; disk_len as usize];
        self.read_data(id, pos, bytenr, &mut raw, verify)?;
        let plain = decompress(
            m.compression,
            &raw,
            m.ram_bytes as usize,
            self.sb.sectorsize as usize,
        )
        .map_err(|e| {
            Error::corrupt(
                bytenr,
                format!("{} extent of inode {}: {e}", m.compression.name(), id.ino),
            )
        })?;
        let plain = Arc::new(plain);
        self.extents.insert(bytenr, plain.clone());
        Ok(plain)
    }

    /// Reads data at `logical` into `dst`, verifying whole sectors against the csum tree and
    /// falling back to other copies on a mismatch.
    fn read_data(
        &self,
        id: InodeId,
        file_pos: u64,
        logical: u64,
        dst: &mut [u8],
        verify: bool,
    ) -> Result<()> {
        let sector = self.sb.sectorsize as u64;
        let start = logical - logical % sector;
        // Checked: `logical` comes from image fields; near the top of the address space the
        // rounded-up end would overflow.
        let end = logical
            .checked_add(dst.len() as u64)
            .and_then(|e| e.checked_next_multiple_of(sector))
            .ok_or_else(|| Error::corrupt(logical, "data range overflows the address space"))?;
        let csums = if verify {
            self.data_csums(start, end)?
        } else {
            Vec::new()
        };
        let mut buf = vec![0u8; (end - start) as usize];
        let csum_type = self.sb.csum_type();
        let mirrors = self.io().num_mirrors(start).max(1);
        let mut bad_at = None;
        for mirror in 0..mirrors {
            self.io().read_logical(start, &mut buf, mirror)?;
            bad_at = csums.iter().enumerate().find_map(|(i, c)| {
                let c = c.as_ref()?;
                let s = &buf[i * sector as usize..(i + 1) * sector as usize];
                (!csum_type.verify(s, c)).then_some(start + i as u64 * sector)
            });
            if bad_at.is_none() {
                break;
            }
        }
        if let Some(bad) = bad_at {
            let err = Error::DataChecksum {
                subvol: id.subvol,
                ino: id.ino,
                offset: file_pos - file_pos % sector + (bad.max(logical) - logical),
                logical: bad,
            };
            log::error!("{err}");
            return Err(err);
        }
        let skip = (logical - start) as usize;
        dst.copy_from_slice(&buf[skip..skip + dst.len()]);
        Ok(())
    }

    /// Per-sector checksums for `[start, end)`; None where the csum tree has none.
    fn data_csums(&self, start: u64, end: u64) -> Result<Vec<Option<Vec<u8>>>> {
        let sector = self.sb.sectorsize as u64;
        let size = self.sb.csum_type().size();
        let mut out = vec![None; ((end - start) / sector) as usize];
        let Some(tree) = self.csum_root() else {
            return Ok(out);
        };
        let mut cur = Cursor::search(
            self,
            &tree,
            &Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, start),
        )?;
        let exact = matches!(cur.item()?, Some((k, _)) if k.objectid == objectid::EXTENT_CSUM && k.item_type == item::EXTENT_CSUM && k.offset == start);
        if !exact
            && cur.prev()?
            && !matches!(cur.item()?, Some((k, _)) if k.objectid == objectid::EXTENT_CSUM && k.item_type == item::EXTENT_CSUM)
        {
            cur.next()?;
        }
        while let Some((key, body)) = cur.item()? {
            if key.objectid != objectid::EXTENT_CSUM
                || key.item_type != item::EXTENT_CSUM
                || key.offset >= end
            {
                break;
            }
            for (i, c) in body.chunks_exact(size).enumerate() {
                // Saturating: a csum item keyed near u64::MAX must not overflow.
                let at = key.offset.saturating_add(i as u64 * sector);
                if at >= end {
                    break;
                }
                if at >= start {
                    out[((at - start) / sector) as usize] = Some(c.to_vec());
                }
            }
            cur.next()?;
        }
        Ok(out)
    }
}

/// Copies `src[from..]` into `dst`, zero-filling what `src` does not have (a decoded extent
/// shorter than its item claims reads as zeros, as in the kernel).
fn copy_or_zero(src: &[u8], from: usize, dst: &mut [u8]) {
    let avail = src.len().saturating_sub(from).min(dst.len());
    dst[..avail].copy_from_slice(&src[from.min(src.len())..from.min(src.len()) + avail]);
    dst[avail..].fill(0);
}

/// One file extent item as `oleo extents` (and FIEMAP) describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentInfo {
    /// File offset and length of the range it covers.
    pub file_offset: u64,
    pub len: u64,
    /// btrfs logical address of the range's first byte (what btrfs's FIEMAP calls physical);
    /// None for inline data and holes.
    pub logical: Option<u64>,
    pub inline: bool,
    /// Preallocated: reads as zeros (FIEMAP's unwritten).
    pub prealloc: bool,
    pub compression: Compression,
}

impl FsCore {
    /// The file extent items of `id` in file order, holes (explicit hole items) left out.
    pub fn file_extents(&self, id: InodeId) -> Result<Vec<ExtentInfo>> {
        let tree = self.tree_of(id)?;
        let mut out = Vec::new();
        crate::ctree::for_each_in_range(
            self,
            &tree,
            Key::new(id.ino, item::EXTENT_DATA, 0),
            Key::new(id.ino, item::EXTENT_DATA, u64::MAX),
            |key, body| {
                let fe = FileExtent::parse(body)
                    .map_err(|e| Error::corrupt(0, format!("extent item {key:?}: {e}")))?;
                let info = match fe.body {
                    FileExtentBody::Inline { data } => ExtentInfo {
                        file_offset: key.offset,
                        len: if fe.compression == Compression::None {
                            data.len() as u64
                        } else {
                            fe.ram_bytes
                        },
                        logical: None,
                        inline: true,
                        prealloc: false,
                        compression: fe.compression,
                    },
                    FileExtentBody::Extent { disk_bytenr: 0, .. } => {
                        return Ok(ControlFlow::Continue(()))
                    }
                    FileExtentBody::Extent {
                        prealloc,
                        disk_bytenr,
                        offset,
                        num_bytes,
                        ..
                    } => ExtentInfo {
                        file_offset: key.offset,
                        len: num_bytes,
                        // A compressed extent is addressed as a whole.
                        logical: Some(if fe.compression == Compression::None {
                            disk_bytenr + offset
                        } else {
                            disk_bytenr
                        }),
                        inline: false,
                        prealloc,
                        compression: fe.compression,
                    },
                };
                out.push(info);
                Ok(ControlFlow::Continue(()))
            },
        )?;
        Ok(out)
    }
}
