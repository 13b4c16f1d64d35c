//! Writes into preallocated extents (fallocate's unwritten space), in place as the kernel
//! writes them: the data goes where fallocate put the space, then the kernel's
//! btrfs_mark_extent_written turns the written range of the prealloc items into regular
//! items on the same extent (the rest stays prealloc), with checksums for a checksummed
//! file. Only extents this file alone references (`nocow::nocow_target`) qualify; others
//! take the copy-on-write path.
//!
//! Fills share the file's lock with each other and with in-place writes, and each holds
//! its own sector range alone (`NocowWriters::lock_range`), so fills of different parts of
//! a file have their data in flight together; the items change under the filesystem's
//! lock, briefly.

use crate::data::file_write::extent_item;
use crate::data::nocow::Owned;
use crate::error::Result;
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use crate::transaction::space::delayed_ref::DataRef;
use oleo_format::items::Compression;
use oleo_format::key::{item, Key};

/// A write into preallocated extents worked out: the sector-aligned buffer for
/// `[start, start + len)` (zeros around the data, as prealloc reads; None when the data
/// itself is sector-aligned and goes out as it is) and where it goes.
pub(crate) struct FillPlan {
    pub(crate) start: u64,
    pub(crate) buf: Option<crate::io::device::IoBuf>,
    pub(crate) len: usize,
    pub(crate) pieces: Vec<Owned>,
    pub(crate) sums: bool,
}

impl FsCore {
    /// The write of `data` at `offset` into preallocated extents of `id`, if every sector
    /// it touches is one this file alone references (the kernel's can_nocow_extent).
    pub(crate) fn plan_prealloc_fill(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        may_grow: bool,
    ) -> Result<Option<FillPlan>> {
        let attr = self.getattr(id)?;
        let sector = u64::from(self.sb.sectorsize);
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return Ok(None);
        };
        // Growing past a partial last sector needs it zeroed first: the copy path's job.
        if attr.kind != FileKind::File
            || data.is_empty()
            || end > i64::MAX as u64
            || end > attr.size && (!may_grow || !attr.size.is_multiple_of(sector))
        {
            return Ok(None);
        }
        let (a, b) = (offset - offset % sector, end.next_multiple_of(sector));
        let Some(pieces) = self.owned_range(id, a, b, true)? else {
            return Ok(None);
        };
        let len = (b - a) as usize;
        // Only a write that starts or ends inside a sector is staged: the rest of those
        // sectors reads as zeros.
        let buf = (a != offset || b != end).then(|| {
            let mut buf = self.take_staging(len);
            let (from, to) = ((offset - a) as usize, (end - a) as usize);
            buf[..from].fill(0);
            buf[from..to].copy_from_slice(data);
            buf[to..len].fill(0);
            buf
        });
        Ok(Some(FillPlan {
            start: a,
            buf,
            len,
            pieces,
            sums: attr.flags & oleo_format::items::INODE_FLAG_NODATASUM == 0,
        }))
    }
}

impl crate::transaction::Transaction<'_> {
    /// The kernel's btrfs_mark_extent_written: the filled ranges of prealloc items become
    /// regular items on the same extents (the rest stays prealloc), with their checksums;
    /// the file grows to `end` if it was smaller.
    pub(crate) fn mark_extent_written(
        &mut self,
        id: InodeId,
        pieces: &[Owned],
        sums: &[Vec<u8>],
        end: u64,
        keep_times: bool,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        // Growing (the file's lock held alone): where the format wants explicit holes, the
        // old end up to the range gets one, as a write past the end gets it.
        if let Some(first) = pieces.first().filter(|_| end > inode.size) {
            let sector = u64::from(self.filesystem().sb.sectorsize);
            let dropped = self.insert_hole(id, inode.size.next_multiple_of(sector), first.at)?;
            inode.nbytes = inode.nbytes.saturating_sub(dropped);
        }
        for (i, p) in pieces.iter().enumerate() {
            let dropped = self.drop_extents(id, p.at, p.at + p.len)?;
            inode.nbytes = inode.nbytes.saturating_sub(dropped);
            self.insert_written(id, p)?;
            inode.nbytes = inode.nbytes.saturating_add(p.len);
            if let Some(s) = sums.get(i).filter(|s| !s.is_empty()) {
                self.insert_csum_bytes(p.bytenr + p.ext_off, s)?;
            }
        }
        inode.size = inode.size.max(end);
        if !keep_times {
            let t = crate::inode::inode_item::now();
            inode.mtime = t;
            inode.ctime = t;
        }
        self.write_inode(id, &mut inode)
    }

    /// The regular item for the written piece `p` (its range emptied by the caller),
    /// joined with a regular neighbour on either side that maps the same extent at the
    /// same shift, as the kernel's btrfs_mark_extent_written merges them (extent_mergeable):
    /// a file filled piece by piece ends as one item, not one per write. Each item holds
    /// one reference to the extent, so a join that leaves one item where there were two
    /// drops one.
    fn insert_written(&mut self, id: InodeId, p: &Owned) -> Result<()> {
        // The file offset at which the extent would begin under this mapping; every
        // item mergeable with this one maps the extent from the same place.
        let base = p.at - p.ext_off;
        let key = |at: u64| Key::new(id.ino, item::EXTENT_DATA, at);
        let prev = match p.at.checked_sub(1) {
            Some(before) => self
                .lookup_le(id.subvol, &key(before))?
                .and_then(|(k, b)| mergeable(&b, p.bytenr, k.offset, base).map(|n| (k, n)))
                .filter(|(k, n)| k.offset + n == p.at),
            None => None,
        };
        let next_key = key(p.at + p.len);
        let next = self
            .lookup(id.subvol, &next_key)?
            .and_then(|b| mergeable(&b, p.bytenr, next_key.offset, base));
        let r = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: base,
        };
        // The item starts where the previous one did, or at the piece.
        let (at, before) = prev.map_or((p.at, 0), |(k, n)| (k.offset, n));
        let body = extent_item(
            self.transid,
            p.disk_len,
            Compression::None,
            false,
            p.bytenr,
            p.disk_len,
            at - base,
            before + p.len + next.unwrap_or(0),
        );
        if next.is_some() {
            self.delete_item(id.subvol, &next_key)?;
        }
        match (prev.is_some(), next.is_some()) {
            // The new piece adds an item and a reference.
            (false, false) => {
                self.insert_item(id.subvol, key(at), &body)?;
                self.add_data_ref(p.bytenr, p.disk_len, r)
            }
            // The next item's reference passes to the one that replaces it.
            (false, true) => self.insert_item(id.subvol, key(at), &body),
            // The previous item grows over the piece.
            (true, false) => self.replace_item(id.subvol, &key(at), &body),
            // ... and over the next one, whose reference goes.
            (true, true) => {
                self.replace_item(id.subvol, &key(at), &body)?;
                self.drop_data_ref(p.bytenr, p.disk_len, r)
            }
        }
    }
}

/// The length of the EXTENT_DATA item `body` at file offset `at` if a written piece of
/// extent `bytenr`, mapped from file offset `base`, may join it: a regular, uncompressed
/// item of the same extent at the same shift (the kernel's extent_mergeable).
fn mergeable(body: &[u8], bytenr: u64, at: u64, base: u64) -> Option<u64> {
    use oleo_format::items::{FileExtent, FileExtentBody};
    let fe = FileExtent::parse(body).ok()?;
    match fe.body {
        FileExtentBody::Extent {
            prealloc: false,
            disk_bytenr,
            offset,
            num_bytes,
            ..
        } if fe.compression == Compression::None
            && disk_bytenr == bytenr
            && at.checked_sub(base) == Some(offset) =>
        {
            Some(num_bytes)
        }
        _ => None,
    }
}
