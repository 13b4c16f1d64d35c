//! Writing file data: copy-on-write into new data extents (checksummed unless the inode is
//! NODATASUM), small files as inline extents, truncation, hole punching and preallocation.
//! Every change replaces the file extent items over a sector-aligned range
//! (`drop_extents`, the kernel's btrfs_drop_extents), then inserts the new ones.

use crate::data::compression;
use crate::error::{Error, Result};
use crate::inode::inode_item::now;
use crate::transaction::fs::InodeId;
use crate::transaction::space::delayed_ref::DataRef;
use crate::transaction::Transaction;
use oleo_format::items::{
    block_group as bg, Compression, FileExtent, FileExtentBody, InodeItem, INODE_FLAG_NOCOMPRESS,
    INODE_FLAG_NODATASUM,
};
use oleo_format::key::{item, Key};
use oleo_format::superblock::incompat;
use std::ops::ControlFlow;

/// The largest data extent we create (the kernel's limit for uncompressed extents).
pub(crate) const MAX_EXTENT: u64 = 128 << 20;
/// How far past the end of a file's newest extent a write may start and still be placed
/// on disk as its continuation (`Transaction::continuation`).
const MAX_GAP: u64 = 8 << 20;
/// Largest file size: the kernel's MAX_LFS_FILESIZE on 64-bit.
const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// One new data extent of a write: `disk_len` bytes at `bytenr` holding `ram_len` bytes of
/// the file, compressed with `compression` or as they are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub bytenr: u64,
    pub disk_len: u64,
    pub ram_len: u64,
    pub compression: Compression,
}

/// A write whose data went to the device outside the filesystem's lock: file offset
/// `start` (sector-aligned) on, the reserved `pieces` in file order and their checksums
/// (empty for NODATASUM files); the file's size becomes at least `end`. `nocompress`:
/// compression was tried and did not pay, the file is marked NOCOMPRESS.
pub(crate) struct OrderedWrite<'a> {
    pub id: InodeId,
    pub start: u64,
    pub end: u64,
    pub pieces: &'a [Piece],
    pub sums: &'a [Vec<u8>],
    pub nocompress: bool,
    /// mtime and ctime stay (see `Filesystem::write_keep_times`).
    pub keep_times: bool,
}

/// A file extent item as found by `drop_extents`.
struct Found {
    key: Key,
    generation: u64,
    ram_bytes: u64,
    compression: Compression,
    /// None for inline extents.
    ext: Option<(bool, u64, u64, u64, u64)>,
    inline_len: u64,
}

#[allow(clippy::too_many_arguments)] // one per field of the on-disk item
pub(crate) fn extent_item(
    generation: u64,
    ram_bytes: u64,
    compression: Compression,
    prealloc: bool,
    disk_bytenr: u64,
    disk_num_bytes: u64,
    offset: u64,
    num_bytes: u64,
) -> Vec<u8> {
    FileExtent {
        generation,
        ram_bytes,
        compression,
        body: FileExtentBody::Extent {
            prealloc,
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        },
    }
    .to_bytes()
}

impl Transaction<'_> {
    pub(super) fn sector(&self) -> u64 {
        u64::from(self.filesystem().sb.sectorsize)
    }

    fn no_holes(&self) -> bool {
        self.filesystem().sb.has_incompat(incompat::NO_HOLES)
    }

    /// Files up to this size are stored inline in the tree (max_inline, below one sector).
    fn inline_limit(&self) -> u64 {
        self.filesystem().max_inline.min(self.sector() - 1)
    }

    /// Removes file extent items over `[start, end)` (sector-aligned, `end` may be
    /// u64::MAX), keeping the parts of items that reach outside it. Returns the bytes the
    /// inode's nbytes loses.
    pub(crate) fn drop_extents(&mut self, id: InodeId, start: u64, end: u64) -> Result<u64> {
        let found = self.extents_overlapping(id, start, end)?;
        let mut removed = 0u64;
        for f in found {
            let k = f.key.offset;
            let Some((prealloc, disk_bytenr, disk_num_bytes, offset, num_bytes)) = f.ext else {
                // Inline extents start at 0 and end within the first sector.
                self.delete_item(id.subvol, &f.key)?;
                removed += f.inline_len;
                continue;
            };
            let item_end = k + num_bytes;
            let counted = disk_bytenr != 0;
            let r = DataRef {
                root: id.subvol,
                objectid: id.ino,
                offset: k.wrapping_sub(offset),
            };
            let keep_head = k < start;
            let keep_tail = item_end > end;
            let cut_from = k.max(start);
            let cut_to = item_end.min(end);
            if counted {
                removed += cut_to - cut_from;
            }
            if keep_tail {
                let skip = end - k;
                let body = extent_item(
                    f.generation,
                    f.ram_bytes,
                    f.compression,
                    prealloc,
                    disk_bytenr,
                    disk_num_bytes,
                    offset + skip,
                    num_bytes - skip,
                );
                let tail_key = Key::new(id.ino, item::EXTENT_DATA, end);
                if keep_head {
                    self.insert_item(id.subvol, tail_key, &body)?;
                    if counted {
                        self.add_data_ref(disk_bytenr, disk_num_bytes, r)?;
                    }
                } else {
                    self.delete_item(id.subvol, &f.key)?;
                    self.insert_item(id.subvol, tail_key, &body)?;
                }
            }
            if keep_head {
                let body = extent_item(
                    f.generation,
                    f.ram_bytes,
                    f.compression,
                    prealloc,
                    disk_bytenr,
                    disk_num_bytes,
                    offset,
                    start - k,
                );
                self.replace_item(id.subvol, &f.key, &body)?;
            } else if !keep_tail {
                self.delete_item(id.subvol, &f.key)?;
                if counted {
                    self.drop_data_ref(disk_bytenr, disk_num_bytes, r)?;
                }
            }
        }
        Ok(removed)
    }

    fn extents_overlapping(&mut self, id: InodeId, start: u64, end: u64) -> Result<Vec<Found>> {
        let sector = self.sector();
        let mut out = Vec::new();
        let first = self
            .lookup_le(id.subvol, &Key::new(id.ino, item::EXTENT_DATA, start))?
            .map_or(start, |(k, _)| k.offset);
        let mut err = None;
        self.for_each_in_range(
            id.subvol,
            Key::new(id.ino, item::EXTENT_DATA, first),
            Key::new(id.ino, item::EXTENT_DATA, end.saturating_sub(1)),
            |key, body| {
                let fe = match FileExtent::parse(body) {
                    Ok(fe) => fe,
                    Err(e) => {
                        err = Some(Error::corrupt(0, format!("extent {key:?}: {e}")));
                        return Ok(ControlFlow::Break(()));
                    }
                };
                let (ext, len, inline_len) = match fe.body {
                    FileExtentBody::Inline { .. } => (None, sector, fe.ram_bytes),
                    FileExtentBody::Extent {
                        prealloc,
                        disk_bytenr,
                        disk_num_bytes,
                        offset,
                        num_bytes,
                    } => (
                        Some((prealloc, disk_bytenr, disk_num_bytes, offset, num_bytes)),
                        num_bytes,
                        0,
                    ),
                };
                if key.offset.saturating_add(len) > start {
                    out.push(Found {
                        key,
                        generation: fe.generation,
                        ram_bytes: fe.ram_bytes,
                        compression: fe.compression,
                        ext,
                        inline_len,
                    });
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The inline extent item that stores `content` (the whole file, at most a sector),
    /// compressed where the file's policy asks and it pays (compress_file_range's inline
    /// case), or None when neither way fits inline.
    fn inline_body(
        &mut self,
        id: InodeId,
        inode: &InodeItem,
        content: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let body = |t: &Self, compression, data: &[u8]| {
            FileExtent {
                generation: t.transid,
                ram_bytes: content.len() as u64,
                compression,
                body: FileExtentBody::Inline { data },
            }
            .to_bytes()
        };
        if let Some(p) = self.filesystem().compress_policy(id, inode.flags)? {
            let max_inline = self.filesystem().max_inline;
            let sector = self.sector() as usize;
            if let Some(z) = compression::compress_inline(&p, content, sector, max_inline) {
                self.incompat_needed |= crate::inode::props::incompat_bit(p.kind);
                return Ok(Some(body(self, p.kind, &z)));
            }
        }
        Ok((content.len() as u64 <= self.inline_limit())
            .then(|| body(self, Compression::None, content)))
    }

    /// Replaces the file's data (an inline extent, or nothing) by `content`: inline where
    /// it fits, else one regular extent.
    fn store_small(&mut self, id: InodeId, inode: &mut InodeItem, content: &[u8]) -> Result<()> {
        let sector = self.sector();
        inode.nbytes = inode
            .nbytes
            .saturating_sub(self.drop_extents(id, 0, sector)?);
        if content.is_empty() {
            return Ok(());
        }
        match self.inline_body(id, inode, content)? {
            Some(body) => {
                self.insert_item(id.subvol, Key::new(id.ino, item::EXTENT_DATA, 0), &body)?;
                inode.nbytes = inode.nbytes.saturating_add(content.len() as u64);
            }
            None => {
                let mut padded = content.to_vec();
                padded.resize(content.len().next_multiple_of(sector as usize), 0);
                let added = self.insert_data(id, inode, 0, &padded)?;
                inode.nbytes = inode.nbytes.saturating_add(added);
            }
        }
        Ok(())
    }

    /// True if the file has an inline extent (always its only extent).
    pub(super) fn inline_extent(&mut self, id: InodeId) -> Result<bool> {
        let Some(body) = self.lookup(id.subvol, &Key::new(id.ino, item::EXTENT_DATA, 0))? else {
            return Ok(false);
        };
        let fe = FileExtent::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("extent of {}: {e}", id.ino)))?;
        Ok(matches!(fe.body, FileExtentBody::Inline { .. }))
    }

    /// True if the file has any extent that is not inline (holes included).
    fn has_regular_extents(&mut self, id: InodeId) -> Result<bool> {
        let mut any = false;
        self.for_each_in_range(
            id.subvol,
            Key::new(id.ino, item::EXTENT_DATA, 0),
            Key::new(id.ino, item::EXTENT_DATA, u64::MAX),
            |_, body| {
                any = !matches!(
                    FileExtent::parse(body).map(|f| f.body),
                    Ok(FileExtentBody::Inline { .. })
                );
                Ok(if any {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                })
            },
        )?;
        Ok(any)
    }

    /// The file's bytes `[offset, offset + len)` as this transaction sees them (zeros past EOF).
    fn read_range(&mut self, id: InodeId, offset: u64, len: u64, size: u64) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len as usize];
        let end = (offset + len).min(size);
        let mut at = offset;
        while at < end {
            let n = (end - at).min(1 << 30) as u32;
            let got = self.filesystem().read(id, at, n)?;
            if got.is_empty() {
                break;
            }
            out[(at - offset) as usize..(at - offset) as usize + got.len()].copy_from_slice(&got);
            at += got.len() as u64;
        }
        Ok(out)
    }

    /// Writes `data` (sector-aligned length) as new extents at file offset `at`, compressed
    /// where the file's policy asks (under the lock: only writes that reshape the file come
    /// here); the range must have been dropped. Returns the bytes added to nbytes.
    fn insert_data(
        &mut self,
        id: InodeId,
        inode: &mut InodeItem,
        at: u64,
        data: &[u8],
    ) -> Result<u64> {
        let sector = self.sector();
        let policy = if data.len() as u64 > sector {
            self.filesystem().compress_policy(id, inode.flags)?
        } else {
            None
        };
        let Some(policy) = policy else {
            return self.insert_plain(id, inode.flags, at, data);
        };
        let c = compression::compress_chunks(&policy, data, sector as usize);
        if c.incompressible {
            inode.flags |= INODE_FLAG_NOCOMPRESS;
        }
        let mut off = 0usize;
        for chunk in &c.chunks {
            let piece = &data[off..off + chunk.len as usize];
            let file_off = at + off as u64;
            let stored = match &chunk.stream {
                Some(z) => self.insert_compressed(id, file_off, chunk.len, policy.kind, z)?,
                None => false,
            };
            if !stored {
                self.insert_plain(id, inode.flags, file_off, piece)?;
            }
            off += chunk.len as usize;
        }
        Ok(data.len() as u64)
    }

    /// One compressed extent of `ram_len` file bytes at `file_off`; false when free space
    /// has no run of its size (the caller writes the data as it is, as the kernel falls
    /// back).
    fn insert_compressed(
        &mut self,
        id: InodeId,
        file_off: u64,
        ram_len: u64,
        kind: Compression,
        stream: &[u8],
    ) -> Result<bool> {
        let sector = self.sector();
        let disk_len = stream.len() as u64;
        let bytenr = match self.block_groups.alloc_aligned(bg::DATA, disk_len, sector) {
            Ok(b) => b,
            Err(Error::NoSpace) => return Ok(false),
            Err(e) => return Err(e),
        };
        self.spend_data(disk_len);
        self.filesystem().io.write_logical(bytenr, stream)?;
        self.insert_csums(bytenr, stream)?;
        let piece = Piece {
            bytenr,
            disk_len,
            ram_len,
            compression: kind,
        };
        self.insert_piece(id, file_off, &piece)?;
        Ok(true)
    }

    /// The file extent item and backref of a new extent at `file_off`, or the extent
    /// before it grown over the piece (`join_previous`).
    fn insert_piece(&mut self, id: InodeId, file_off: u64, p: &Piece) -> Result<()> {
        let plain = p.compression == Compression::None && p.disk_len == p.ram_len;
        let grown;
        let p = if plain {
            grown = self.absorb_next(id, file_off, p)?;
            if self.join_previous(id, file_off, &grown)? {
                return Ok(());
            }
            self.fresh_data.insert(grown.bytenr, grown.disk_len);
            &grown
        } else {
            p
        };
        let body = extent_item(
            self.transid,
            p.ram_len,
            p.compression,
            false,
            p.bytenr,
            p.disk_len,
            0,
            p.ram_len,
        );
        self.insert_item(
            id.subvol,
            Key::new(id.ino, item::EXTENT_DATA, file_off),
            &body,
        )?;
        self.incompat_needed |= crate::inode::props::incompat_bit(p.compression);
        self.add_data_ref(
            p.bytenr,
            p.disk_len,
            DataRef {
                root: id.subvol,
                objectid: id.ino,
                offset: file_off,
            },
        )
    }

    /// The EXTENT_DATA item of file `id` at or before `file_off` (`exact`: at it) if it is
    /// all of an uncompressed extent written in this transaction, the file not logged
    /// since: (its key offset, disk address, length).
    fn fresh_item(
        &mut self,
        id: InodeId,
        file_off: u64,
        exact: bool,
    ) -> Result<Option<(u64, u64, u64)>> {
        if self.log.inodes.get(&id).is_some_and(|c| c.logged.is_some()) {
            // Its log may name the extent with its old length.
            return Ok(None);
        }
        let key = Key::new(id.ino, item::EXTENT_DATA, file_off);
        let found = if exact {
            self.lookup(id.subvol, &key)?.map(|b| (key, b))
        } else {
            self.lookup_le(id.subvol, &key)?
        };
        let Some((k, body)) = found else {
            return Ok(None);
        };
        if k.objectid != id.ino || k.item_type != item::EXTENT_DATA {
            return Ok(None);
        }
        let Ok(fe) = FileExtent::parse(&body) else {
            return Ok(None);
        };
        let FileExtentBody::Extent {
            prealloc: false,
            disk_bytenr,
            disk_num_bytes,
            offset: 0,
            num_bytes,
        } = fe.body
        else {
            return Ok(None);
        };
        let whole = disk_bytenr != 0
            && fe.compression == Compression::None
            && fe.generation == self.transid
            && num_bytes == disk_num_bytes
            && fe.ram_bytes == disk_num_bytes
            && k.offset.checked_add(num_bytes).is_some()
            && self.fresh_data.len_of(disk_bytenr) == Some(disk_num_bytes);
        Ok(whole.then_some((k.offset, disk_bytenr, disk_num_bytes)))
    }

    /// `fresh_item` of the file bytes right before `file_off`, if its item ends there.
    fn fresh_before(&mut self, id: InodeId, file_off: u64) -> Result<Option<(u64, u64, u64)>> {
        let Some(before) = file_off.checked_sub(1) else {
            return Ok(None);
        };
        Ok(self
            .fresh_item(id, before, false)?
            .filter(|&(at, _, len)| at + len == file_off))
    }

    /// Where a write at `file_off` should put its data: after the extent of the file's
    /// last bytes before it, if that one may still grow (`fresh_item`), as far on as the
    /// write is past its end (up to MAX_GAP). The FUSE writeback hands one file's WRITEs
    /// to several threads, so they come a few MiB out of order: the space left is where
    /// the write that fills the gap goes, and then all three become one extent.
    pub(crate) fn continuation(&mut self, id: InodeId, file_off: u64) -> Result<Option<u64>> {
        let Some(before) = file_off.checked_sub(1) else {
            return Ok(None);
        };
        if self.fresh_data.is_empty() {
            return Ok(None);
        }
        Ok(self
            .fresh_item(id, before, false)?
            .filter(|&(at, _, len)| at + len <= file_off && file_off - (at + len) <= MAX_GAP)
            .filter(|&(at, _, len)| file_off - at < MAX_EXTENT && len < MAX_EXTENT)
            .map(|(at, bytenr, len)| bytenr + len + (file_off - (at + len))))
    }

    /// The kernel's delayed allocation gives data written in order one extent (up to
    /// MAX_EXTENT); oleo allocates per write, and a WRITE carries at most 1 MiB. So a
    /// piece that lies right after the extent of the file bytes before it, where that
    /// extent is new in this transaction and referenced by that one item alone, joins
    /// it: the item and the extent's queued reference grow, and no new item or extent
    /// is made. The checksums and the space accounting are the piece's as before.
    fn join_previous(&mut self, id: InodeId, file_off: u64, p: &Piece) -> Result<bool> {
        if !self.fresh_data.ends_at(p.bytenr) {
            // No new extent ends where the piece begins (random writes): no tree search.
            return Ok(false);
        }
        let Some((at, bytenr, len)) = self.fresh_before(id, file_off)? else {
            return Ok(false);
        };
        let new_len = len + p.disk_len;
        if bytenr + len != p.bytenr
            || new_len > MAX_EXTENT
            || !self.block_groups.within_one_group(bytenr, new_len)
        {
            return Ok(false);
        }
        let r = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: at,
        };
        if !self.refs.grow_new_data(bytenr, len, r, new_len) {
            return Ok(false);
        }
        let body = extent_item(
            self.transid,
            new_len,
            Compression::None,
            false,
            bytenr,
            new_len,
            0,
            new_len,
        );
        self.replace_item(id.subvol, &Key::new(id.ino, item::EXTENT_DATA, at), &body)?;
        self.fresh_data.insert(bytenr, new_len);
        Ok(true)
    }

    /// The piece at `file_off` grown over the extent of the file bytes right after it,
    /// where that one lies right after the piece on disk and could have been joined to it
    /// (`fresh_item`; a write that came out of order): that extent's item and queued
    /// reference go, and the piece takes its place.
    fn absorb_next(&mut self, id: InodeId, file_off: u64, p: &Piece) -> Result<Piece> {
        let next_off = file_off + p.ram_len;
        if self.fresh_data.len_of(p.bytenr + p.disk_len).is_none() {
            return Ok(*p);
        }
        let Some((at, bytenr, len)) = self.fresh_item(id, next_off, true)? else {
            return Ok(*p);
        };
        let new_len = p.disk_len + len;
        if bytenr != p.bytenr + p.disk_len
            || new_len > MAX_EXTENT
            || !self.block_groups.within_one_group(p.bytenr, new_len)
        {
            return Ok(*p);
        }
        let r = DataRef {
            root: id.subvol,
            objectid: id.ino,
            offset: at,
        };
        if !self.refs.take_new_data(bytenr, len, r) {
            return Ok(*p);
        }
        self.delete_item(id.subvol, &Key::new(id.ino, item::EXTENT_DATA, at))?;
        self.fresh_data.remove(bytenr);
        Ok(Piece {
            bytenr: p.bytenr,
            disk_len: new_len,
            ram_len: new_len,
            compression: Compression::None,
        })
    }

    /// `data` as it is, in extents of at most MAX_EXTENT.
    fn insert_plain(&mut self, id: InodeId, flags: u64, at: u64, data: &[u8]) -> Result<u64> {
        let sector = self.sector();
        let mut done = 0usize;
        while done < data.len() {
            let want = ((data.len() - done) as u64).min(MAX_EXTENT);
            let (bytenr, len) = self.alloc_data(want, sector)?;
            let piece = &data[done..done + len as usize];
            self.filesystem().io.write_logical(bytenr, piece)?;
            if flags & INODE_FLAG_NODATASUM == 0 {
                self.insert_csums(bytenr, piece)?;
            }
            let p = Piece {
                bytenr,
                disk_len: len,
                ram_len: len,
                compression: Compression::None,
            };
            self.insert_piece(id, at + done as u64, &p)?;
            done += len as usize;
        }
        Ok(data.len() as u64)
    }

    /// Reserves data space for `len` bytes (sector-aligned) in extents of at most
    /// MAX_EXTENT, smaller where free space is fragmented: (address, length) in order.
    pub(crate) fn reserve_data_extents(&mut self, len: u64) -> Result<Vec<(u64, u64)>> {
        self.reserve_data_extents_after(len, None)
    }

    /// `reserve_data_extents`, starting at `hint` if the space there is free: the end of
    /// the extent the write continues, so that the two lie end to end and become one
    /// (`join_previous`).
    fn reserve_data_extents_after(
        &mut self,
        len: u64,
        hint: Option<u64>,
    ) -> Result<Vec<(u64, u64)>> {
        let sector = self.sector();
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut done = 0;
        if let Some(at) = hint.filter(|at| at.is_multiple_of(sector)) {
            let want = len.min(MAX_EXTENT);
            if len > 0 && self.block_groups.reserve_data_at(at, want) {
                self.spend_data(want);
                out.push((at, want));
                done = want;
            }
        }
        while done < len {
            match self.find_data((len - done).min(MAX_EXTENT), sector, true) {
                Ok((b, got)) => {
                    out.push((b, got));
                    done += got;
                }
                Err(e) => {
                    for &(b, _) in &out {
                        self.block_groups.cancel_reserved(b);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Reserves the extents of a write of `len` bytes: as `chunks` say (compressed ones
    /// one extent each, or as they are when no run of their size is free), else plain.
    pub(crate) fn reserve_write(
        &mut self,
        len: u64,
        compressed: Option<(&[compression::Chunk], Compression)>,
        hint: Option<u64>,
    ) -> Result<Vec<Piece>> {
        let plain = |v: Vec<(u64, u64)>| {
            v.into_iter().map(|(bytenr, l)| Piece {
                bytenr,
                disk_len: l,
                ram_len: l,
                compression: Compression::None,
            })
        };
        let Some((chunks, kind)) = compressed else {
            return Ok(plain(self.reserve_data_extents_after(len, hint)?).collect());
        };
        let sector = self.sector();
        let mut out: Vec<Piece> = Vec::new();
        let mut run = 0u64;
        let mut r = Ok(());
        for c in chunks {
            let got = match &c.stream {
                Some(z) => match self.block_groups.reserve_data(z.len() as u64, sector) {
                    Ok(b) => Some((b, z.len() as u64)),
                    Err(Error::NoSpace) => None,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                },
                None => None,
            };
            let Some((bytenr, disk_len)) = got else {
                run += c.len;
                continue;
            };
            self.spend_data(disk_len);
            if run > 0 {
                match self.reserve_data_extents(run) {
                    Ok(v) => out.extend(plain(v)),
                    Err(e) => {
                        self.block_groups.cancel_reserved(bytenr);
                        r = Err(e);
                        break;
                    }
                }
                run = 0;
            }
            out.push(Piece {
                bytenr,
                disk_len,
                ram_len: c.len,
                compression: kind,
            });
        }
        if r.is_ok() && run > 0 {
            match self.reserve_data_extents(run) {
                Ok(v) => out.extend(plain(v)),
                Err(e) => r = Err(e),
            }
        }
        if let Err(e) = r {
            for p in &out {
                self.block_groups.cancel_reserved(p.bytenr);
            }
            return Err(e);
        }
        Ok(out)
    }

    /// Puts in the items of a write whose data is on the device already (see
    /// `ordered_extent`): the range's old extents go, the reserved pieces become extents
    /// with their checksums, the inode grows to `end` if it was smaller.
    pub(crate) fn finish_ordered_write(&mut self, w: &OrderedWrite<'_>) -> Result<()> {
        let id = w.id;
        let mut inode = self.read_inode(id)?;
        let sector = self.sector();
        let len: u64 = w.pieces.iter().map(|p| p.ram_len).sum();
        let (a, b) = (w.start, w.start + len);
        let old_size = inode.size;
        inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(id, a, b)?);
        let hole_from = old_size.next_multiple_of(sector);
        if hole_from < a {
            inode.nbytes = inode
                .nbytes
                .saturating_sub(self.insert_hole(id, hole_from, a)?);
        }
        let mut at = a;
        for (i, p) in w.pieces.iter().enumerate() {
            self.block_groups.use_reserved(p.bytenr, p.disk_len)?;
            if let Some(sums) = w.sums.get(i).filter(|s| !s.is_empty()) {
                self.insert_csum_bytes(p.bytenr, sums)?;
            }
            self.insert_piece(id, at, p)?;
            at += p.ram_len;
        }
        inode.nbytes = inode.nbytes.saturating_add(len);
        if w.nocompress {
            inode.flags |= INODE_FLAG_NOCOMPRESS;
        }
        inode.size = old_size.max(w.end);
        if !w.keep_times {
            let t = now();
            inode.mtime = t;
            inode.ctime = t;
        }
        self.write_inode(id, &mut inode)
    }

    /// A data extent of up to `want` bytes (less when free space is fragmented).
    pub(crate) fn alloc_data(&mut self, want: u64, sector: u64) -> Result<(u64, u64)> {
        self.find_data(want, sector, false)
    }

    /// `alloc_data`, or with `reserve` set aside for an ordered write (`reserve_data`).
    fn find_data(&mut self, want: u64, sector: u64, reserve: bool) -> Result<(u64, u64)> {
        let mut len = want;
        loop {
            let found = if reserve {
                self.block_groups.reserve_data(len, sector)
            } else {
                self.block_groups.alloc_aligned(bg::DATA, len, sector)
            };
            match found {
                Ok(b) => {
                    self.spend_data(len);
                    return Ok((b, len));
                }
                Err(Error::NoSpace) if len > sector => {
                    len = (len / 2).next_multiple_of(sector);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Without the no-holes feature every gap needs an explicit hole extent. Anything in
    /// the range (preallocated space past EOF) is dropped first; returns the bytes nbytes
    /// loses.
    pub(crate) fn insert_hole(&mut self, id: InodeId, from: u64, to: u64) -> Result<u64> {
        if from >= to || self.no_holes() {
            return Ok(0);
        }
        let removed = self.drop_extents(id, from, to)?;
        let body = extent_item(
            self.transid,
            to - from,
            Compression::None,
            false,
            0,
            0,
            0,
            to - from,
        );
        self.insert_item(id.subvol, Key::new(id.ino, item::EXTENT_DATA, from), &body)?;
        Ok(removed)
    }

    /// Before the file grows past `old_size`: the rest of its last sector must read as
    /// zeros (a truncate may have left old bytes there), and an inline extent becomes a
    /// regular one.
    /// `rewritten_from`: where the caller's own read-modify-write begins (it zeroes the
    /// tail itself if that covers the last sector).
    pub(super) fn prepare_extend(
        &mut self,
        id: InodeId,
        inode: &mut InodeItem,
        old_size: u64,
        rewritten_from: u64,
    ) -> Result<()> {
        let sector = self.sector();
        if self.inline_extent(id)? {
            let data = self.read_range(id, 0, sector, old_size)?;
            inode.nbytes = inode
                .nbytes
                .saturating_sub(self.drop_extents(id, 0, sector)?);
            let added = self.insert_data(id, inode, 0, &data)?;
            inode.nbytes = inode.nbytes.saturating_add(added);
        } else if !old_size.is_multiple_of(sector) && old_size - old_size % sector < rewritten_from
        {
            let from = old_size - old_size % sector;
            let data = self.read_range(id, from, sector, old_size)?;
            inode.nbytes =
                inode
                    .nbytes
                    .saturating_sub(self.drop_extents(id, from, from + sector)?);
            let added = self.insert_data(id, inode, from, &data)?;
            inode.nbytes = inode.nbytes.saturating_add(added);
        }
        Ok(())
    }

    /// Writes `data` at `offset` of regular file `id`.
    pub(crate) fn write_file(
        &mut self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        keep_times: bool,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        if inode.mode & 0o170000 != 0o100000 {
            return Err(if inode.mode & 0o170000 == 0o040000 {
                Error::IsDir
            } else {
                Error::InvalidArgument("not a regular file".into())
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooBig)?;
        let sector = self.sector();
        let old_size = inode.size;
        let new_size = old_size.max(end);
        // A compressed inline extent may hold a whole sector of data.
        let inline_max = if self
            .filesystem()
            .compress_policy(id, inode.flags)?
            .is_some()
        {
            sector
        } else {
            self.inline_limit()
        };
        let inline = if new_size <= inline_max && !self.has_regular_extents(id)? {
            let mut content = self.read_range(id, 0, new_size, old_size)?;
            content[offset as usize..end as usize].copy_from_slice(data);
            self.inline_body(id, &inode, &content)?
        } else {
            None
        };
        if let Some(body) = inline {
            inode.nbytes = inode
                .nbytes
                .saturating_sub(self.drop_extents(id, 0, sector)?);
            self.insert_item(id.subvol, Key::new(id.ino, item::EXTENT_DATA, 0), &body)?;
            inode.nbytes = inode.nbytes.saturating_add(new_size);
        } else {
            let a = offset - offset % sector;
            if end > old_size || self.inline_extent(id)? {
                self.prepare_extend(id, &mut inode, old_size, a)?;
            }
            let b = end.next_multiple_of(sector);
            // Aligned, so the data can go to the device with direct IO; reused between
            // writes (a fresh buffer costs page faults and zeroing every time).
            let len = (b - a) as usize;
            let mut staging = self.filesystem().take_staging(len);
            let buf = &mut staging[..len];
            if a < offset {
                let head = self.read_range(id, a, sector, old_size)?;
                buf[..sector as usize].copy_from_slice(&head);
            }
            if end < b && end < old_size {
                let tail_at = b - sector;
                let tail = self.read_range(id, tail_at, sector, old_size)?;
                buf[(tail_at - a) as usize..].copy_from_slice(&tail);
            } else {
                buf[(end - a) as usize..].fill(0);
            }
            buf[(offset - a) as usize..(end - a) as usize].copy_from_slice(data);
            inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(id, a, b)?);
            let hole_from = old_size.next_multiple_of(sector);
            if hole_from < a {
                inode.nbytes = inode
                    .nbytes
                    .saturating_sub(self.insert_hole(id, hole_from, a)?);
            }
            let added = self.insert_data(id, &mut inode, a, &staging[..len]);
            self.filesystem().give_back_staging(staging);
            inode.nbytes = inode.nbytes.saturating_add(added?);
        }
        inode.size = new_size;
        if !keep_times {
            let t = now();
            inode.mtime = t;
            inode.ctime = t;
        }
        self.write_inode(id, &mut inode)
    }

    /// Sets the size of regular file `id` (ctime/mtime are the caller's).
    pub(crate) fn truncate_file(
        &mut self,
        id: InodeId,
        inode: &mut InodeItem,
        new_size: u64,
    ) -> Result<()> {
        if new_size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let sector = self.sector();
        let old_size = inode.size;
        if new_size > old_size {
            self.prepare_extend(id, inode, old_size, u64::MAX)?;
            inode.nbytes = inode.nbytes.saturating_sub(self.insert_hole(
                id,
                old_size.next_multiple_of(sector),
                new_size.next_multiple_of(sector),
            )?);
        } else if new_size < old_size {
            if self.inline_extent(id)? {
                let content = self.read_range(id, 0, new_size, old_size)?;
                self.store_small(id, inode, &content)?;
            } else {
                inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(
                    id,
                    new_size.next_multiple_of(sector),
                    u64::MAX,
                )?);
            }
        } else if !self.inline_extent(id)? {
            // The same size still drops what lies past EOF (fallocate KEEP_SIZE), as
            // btrfs_setsize does: `truncate -s SIZE` and O_TRUNC of an empty file free it.
            inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(
                id,
                new_size.next_multiple_of(sector),
                u64::MAX,
            )?);
        }
        inode.size = new_size;
        Ok(())
    }

    /// Deallocates `[offset, offset + len)`: whole sectors lose their extents (holes), the
    /// partial sectors at the ends are zeroed in place.
    pub(crate) fn punch_hole(
        &mut self,
        id: InodeId,
        inode: &mut InodeItem,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        let sector = self.sector();
        let end = offset.saturating_add(len).min(inode.size);
        if offset >= end {
            return Ok(());
        }
        let a = offset.next_multiple_of(sector);
        let b = end - end % sector;
        // Partial sectors (or an inline file) get zeros written.
        if self.inline_extent(id)? {
            let mut content = self.read_range(id, 0, inode.size, inode.size)?;
            content[offset as usize..end as usize].fill(0);
            return self.store_small(id, inode, &content);
        }
        let zero = |t: &mut Self, inode: &mut InodeItem, from: u64, to: u64| -> Result<()> {
            if from >= to {
                return Ok(());
            }
            let s = from - from % sector;
            let mut buf = t.read_range(id, s, sector, inode.size)?;
            buf[(from - s) as usize..(to - s) as usize].fill(0);
            inode.nbytes = inode
                .nbytes
                .saturating_sub(t.drop_extents(id, s, s + sector)?);
            let added = t.insert_data(id, inode, s, &buf)?;
            inode.nbytes = inode.nbytes.saturating_add(added);
            Ok(())
        };
        if a > b {
            // Within one sector.
            zero(self, inode, offset, end)?;
            return Ok(());
        }
        zero(self, inode, offset, a)?;
        zero(self, inode, b, end)?;
        if a < b {
            inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(id, a, b)?);
            inode.nbytes = inode.nbytes.saturating_sub(self.insert_hole(id, a, b)?);
        }
        Ok(())
    }

    /// Preallocates `[offset, offset + len)`: holes in it get prealloc extents (reading as
    /// zeros); data already there stays. Grows the size unless `keep_size`.
    pub(crate) fn preallocate(
        &mut self,
        id: InodeId,
        inode: &mut InodeItem,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<()> {
        let sector = self.sector();
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooBig)?;
        if (!keep_size && end > inode.size) || self.inline_extent(id)? {
            let old = inode.size;
            self.prepare_extend(id, inode, old, u64::MAX)?;
        }
        let a = offset - offset % sector;
        let b = end.next_multiple_of(sector);
        if !keep_size && end > inode.size {
            let hole_from = inode.size.next_multiple_of(sector);
            if hole_from < a {
                inode.nbytes = inode
                    .nbytes
                    .saturating_sub(self.insert_hole(id, hole_from, a)?);
            }
        }
        // Find the holes in [a, b) (ranges without a non-hole extent).
        let mut covered: Vec<(u64, u64)> = Vec::new();
        for f in self.extents_overlapping(id, a, b)? {
            if let Some((_, disk_bytenr, _, _, num_bytes)) = f.ext {
                if disk_bytenr != 0 {
                    covered.push((f.key.offset.max(a), (f.key.offset + num_bytes).min(b)));
                }
            } else {
                covered.push((0, sector.min(b)));
            }
        }
        let mut holes = Vec::new();
        let mut at = a;
        for (s, e) in covered {
            if s > at {
                holes.push((at, s));
            }
            at = at.max(e);
        }
        if at < b {
            holes.push((at, b));
        }
        if !holes.is_empty() {
            // As the kernel's btrfs_prealloc_file_range: writes look for prealloc extents.
            inode.flags |= oleo_format::items::INODE_FLAG_PREALLOC;
        }
        for (s, e) in holes {
            inode.nbytes = inode.nbytes.saturating_sub(self.drop_extents(id, s, e)?);
            let mut at = s;
            while at < e {
                let (bytenr, got) = self.alloc_data((e - at).min(MAX_EXTENT), sector)?;
                let body = extent_item(
                    self.transid,
                    got,
                    Compression::None,
                    true,
                    bytenr,
                    got,
                    0,
                    got,
                );
                self.insert_item(id.subvol, Key::new(id.ino, item::EXTENT_DATA, at), &body)?;
                self.add_data_ref(
                    bytenr,
                    got,
                    DataRef {
                        root: id.subvol,
                        objectid: id.ino,
                        offset: at,
                    },
                )?;
                inode.nbytes = inode.nbytes.saturating_add(got);
                at += got;
            }
        }
        if !keep_size && end > inode.size {
            inode.size = end;
        }
        Ok(())
    }
}

impl Transaction<'_> {
    /// Makes `[dst_off, dst_off + len)` of `dst` share the extents of `[src_off, ...)` of
    /// `src` (a reflink). All three numbers are sector-aligned and src has no inline extent.
    pub(crate) fn clone_range(
        &mut self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
        keep_times: bool,
    ) -> Result<()> {
        let sector = self.sector();
        let end = src_off + len;
        let found = self.extents_overlapping(src, src_off, end)?;
        let mut inode = self.read_inode(dst)?;
        let dst_old = inode.size;
        if dst_off > dst_old {
            self.prepare_extend(dst, &mut inode, dst_old, u64::MAX)?;
        }
        inode.nbytes =
            inode
                .nbytes
                .saturating_sub(self.drop_extents(dst, dst_off, dst_off + len)?);
        let mut covered_to = dst_off;
        for f in found {
            let Some((prealloc, disk_bytenr, disk_num_bytes, offset, num_bytes)) = f.ext else {
                return Err(Error::InvalidArgument(
                    "inline extents cannot be cloned".into(),
                ));
            };
            let k = f.key.offset;
            let from = k.max(src_off);
            let to = (k + num_bytes).min(end);
            if from >= to || disk_bytenr == 0 {
                continue;
            }
            let at = dst_off + (from - src_off);
            if covered_to < at {
                inode.nbytes = inode
                    .nbytes
                    .saturating_sub(self.insert_hole(dst, covered_to, at)?);
            }
            let ext_off = offset + (from - k);
            let body = extent_item(
                self.transid,
                f.ram_bytes,
                f.compression,
                prealloc,
                disk_bytenr,
                disk_num_bytes,
                ext_off,
                to - from,
            );
            self.insert_item(dst.subvol, Key::new(dst.ino, item::EXTENT_DATA, at), &body)?;
            self.add_data_ref(
                disk_bytenr,
                disk_num_bytes,
                DataRef {
                    root: dst.subvol,
                    objectid: dst.ino,
                    offset: at.wrapping_sub(ext_off),
                },
            )?;
            inode.nbytes = inode.nbytes.saturating_add(to - from);
            covered_to = at + (to - from);
        }
        let dst_end = dst_off + len;
        if covered_to < dst_end.min(dst_end.next_multiple_of(sector)) {
            inode.nbytes = inode
                .nbytes
                .saturating_sub(self.insert_hole(dst, covered_to, dst_end)?);
        }
        let hole_from = dst_old.next_multiple_of(sector);
        if hole_from < dst_off {
            inode.nbytes = inode
                .nbytes
                .saturating_sub(self.insert_hole(dst, hole_from, dst_off)?);
        }
        inode.size = inode.size.max(dst_end);
        if !keep_times {
            let t = now();
            inode.mtime = t;
            inode.ctime = t;
        }
        self.write_inode(dst, &mut inode)
    }
}
