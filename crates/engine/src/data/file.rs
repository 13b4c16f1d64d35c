//! File data: walking EXTENT_DATA items, reading extents through the chunk map, verifying
//! data checksums against the csum tree, and decompressing.

use crate::ctree::Cursor;
use crate::error::{Error, Result};
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use oleo_format::items::{Compression, FileExtent, FileExtentBody};
use oleo_format::key::{item, Key};
use std::ops::ControlFlow;

/// What one EXTENT_DATA item says, owned so the tree cursor can move on.
pub(crate) struct Mapping {
    pub(crate) file_start: u64,
    pub(crate) file_len: u64,
    pub(crate) compression: Compression,
    pub(crate) ram_bytes: u64,
    pub(crate) kind: MappingKind,
    /// The item's generation and, for regular and prealloc extents, (prealloc,
    /// disk_bytenr, disk_num_bytes, offset) as stored (in-place writes check them).
    pub(crate) generation: u64,
    pub(crate) extent: Option<(bool, u64, u64, u64)>,
}

pub(crate) enum MappingKind {
    Inline(Vec<u8>),
    Zero,
    Disk {
        bytenr: u64,
        disk_len: u64,
        offset: u64,
    },
}

impl FsCore {
    /// The EXTENT_DATA items that overlap `[start, end)`, in file order.
    pub(crate) fn mappings(&self, id: InodeId, start: u64, end: u64) -> Result<Vec<Mapping>> {
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
            // One match over the body: what reads need (`kind`) and the raw fields.
            let (kind, extent) = match fe.body {
                FileExtentBody::Inline { data } => (MappingKind::Inline(data.to_vec()), None),
                FileExtentBody::Extent {
                    prealloc,
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    ..
                } => {
                    let kind = if prealloc || disk_bytenr == 0 {
                        MappingKind::Zero
                    } else {
                        MappingKind::Disk {
                            bytenr: disk_bytenr,
                            disk_len: disk_num_bytes,
                            offset,
                        }
                    };
                    (kind, Some((prealloc, disk_bytenr, disk_num_bytes, offset)))
                }
            };
            let m = Mapping {
                file_start: key.offset,
                file_len: fe.file_len(),
                compression: fe.compression,
                ram_bytes: fe.ram_bytes,
                kind,
                generation: fe.generation,
                extent,
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
    pub(crate) fn seek_data_hole(&self, id: InodeId, offset: u64, data: bool) -> Result<u64> {
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
}

/// One file extent item as `oleo extents` (and FIEMAP) describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtentInfo {
    /// File offset of the range it covers.
    pub file_offset: u64,
    /// Length of that range in bytes (the file bytes it holds, uncompressed).
    pub len: u64,
    /// btrfs logical address of the range's first byte (what btrfs's FIEMAP calls physical);
    /// None for inline data and holes.
    pub logical: Option<u64>,
    /// The data is inline: stored in the EXTENT_DATA item itself, in the tree.
    pub inline: bool,
    /// Preallocated: reads as zeros (FIEMAP's unwritten).
    pub prealloc: bool,
    /// How the extent's data is compressed on disk (`None` for plain data).
    pub compression: Compression,
    /// The item's disk extent: where it starts (0 for inline data) and how long it is on
    /// disk. Two ranges are the same data when these and `extent_offset` match.
    pub disk_bytenr: u64,
    /// Length of the disk extent on disk (compressed size for compressed extents; the
    /// inline item's data length for inline data).
    pub disk_num_bytes: u64,
    /// Where in the disk extent's (uncompressed) bytes this range starts.
    pub extent_offset: u64,
    /// Bytes the disk extent holds uncompressed (ram_bytes).
    pub ram_bytes: u64,
    /// The transaction that wrote the item.
    pub generation: u64,
}

impl FsCore {
    /// The file extent items of `id` in file order, holes (explicit hole items) left out.
    pub(crate) fn file_extents(&self, id: InodeId) -> Result<Vec<ExtentInfo>> {
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
                        disk_bytenr: 0,
                        disk_num_bytes: data.len() as u64,
                        extent_offset: 0,
                        ram_bytes: fe.ram_bytes,
                        generation: fe.generation,
                    },
                    FileExtentBody::Extent { disk_bytenr: 0, .. } => {
                        return Ok(ControlFlow::Continue(()))
                    }
                    FileExtentBody::Extent {
                        prealloc,
                        disk_bytenr,
                        disk_num_bytes,
                        offset,
                        num_bytes,
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
                        disk_bytenr,
                        disk_num_bytes,
                        extent_offset: offset,
                        ram_bytes: fe.ram_bytes,
                        generation: fe.generation,
                    },
                };
                out.push(info);
                Ok(ControlFlow::Continue(()))
            },
        )?;
        Ok(out)
    }
}
